"""sluice.save / sluice.load in the safetensors layout, checked against the format itself."""
import json
import os
import struct

import numpy as np
import pytest

import sluice
from st_header import read_header
from conftest import run_ranks


def tensors():
    rng = np.random.default_rng(4)
    return {"w": rng.standard_normal((3, 4)).astype(np.float32), "step": np.array([7, 8, 9, 10, 11], np.int64),
            "empty": np.zeros(0, np.uint8), "mask": np.array([True, False]), "h": rng.standard_normal(7).astype(np.float16)}


def test_save_load_roundtrip(tmp_path):
    p = tmp_path / "ck.safetensors"
    t = tensors()
    sluice.save(t, str(p), metadata={"format": "pt"})
    back = sluice.load(str(p), device="numpy")
    assert sorted(back) == sorted(t)
    for k in t:
        assert back[k].dtype == t[k].dtype and np.array_equal(back[k], t[k])
    # The file is the format, read here without sluice.
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    # The data starts 4 KiB aligned (the header padded with spaces), so sluice writes it with O_DIRECT.
    assert (8 + n) % 4096 == 0 and raw[8:8 + n].rstrip(b" ").endswith(b"}") and header["__metadata__"] == {"format": "pt"}
    for k, v in t.items():
        b, e = header[k]["data_offsets"]
        assert raw[8 + n + b:8 + n + e] == v.tobytes() and header[k]["shape"] == list(v.shape)
    assert not [f for f in os.listdir(tmp_path) if "sluice-tmp" in f]


def test_load_foreign_unaligned(tmp_path):
    """A file laid out by hand, a f32 tensor at an odd offset: read right (copied out)."""
    a, b = np.arange(3, dtype=np.uint8), np.array([1.5, -2.25], np.float32)
    h = json.dumps({"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]}}).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + a.tobytes() + b.tobytes())
    back = sluice.load(str(p), device="numpy")
    assert np.array_equal(back["a"], a) and np.array_equal(back["b"], b)


def test_bad_files_named(tmp_path):
    p = tmp_path / "bad.safetensors"
    h = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.load(str(p), device="numpy")
    assert "'a'" in str(e.value) and "bad.safetensors" in str(e.value)
    p.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(sluice.SluiceError, match="not JSON"):
        sluice.load(str(p), device="numpy")
    p.write_bytes(b"\1\2")
    with pytest.raises(sluice.SluiceError, match="shorter than 8"):
        sluice.load(str(p), device="numpy")


def test_failed_save_keeps_the_old_file(tmp_path):
    p = tmp_path / "ck.safetensors"
    sluice.save({"x": np.ones(4, np.float32)}, str(p))
    with pytest.raises(ValueError):
        sluice.save({"x": np.array(["text"], dtype=object)}, str(p))
    assert np.array_equal(sluice.load(str(p), device="numpy")["x"], np.ones(4, np.float32))
    assert not [f for f in os.listdir(tmp_path) if "sluice-tmp" in f]


def test_interop_with_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    t = tensors()
    del t["empty"]
    st.save_file(t, str(tmp_path / "theirs.safetensors"))
    mine = sluice.load(str(tmp_path / "theirs.safetensors"), device="numpy")
    sluice.save(t, str(tmp_path / "ours.safetensors"))
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    for k in t:
        assert np.array_equal(mine[k], t[k]) and np.array_equal(theirs[k], t[k])


def test_zero_dimensional_arrays_keep_their_shape(tmp_path):
    """A 0-d array (and a numpy scalar) is shape [] in the file, as safetensors writes it, and reads back 0-d by
    safetensors' own reader and by sluice (it was written as shape [1]); torch's 0-d tensors the same."""
    st = pytest.importorskip("safetensors.numpy")
    t = {"step": np.array(7, np.int64), "lr": np.float32(0.5), "mask": np.array(True), "v": np.arange(3, dtype=np.int16)}
    sluice.save(t, str(tmp_path / "ours.safetensors"))
    st.save_file({k: np.asarray(v) for k, v in t.items()}, str(tmp_path / "theirs.safetensors"))
    ours, _ = read_header(str(tmp_path / "ours.safetensors"))
    theirs, _ = read_header(str(tmp_path / "theirs.safetensors"))
    assert {k: ours[k]["shape"] for k in t} == {k: theirs[k]["shape"] for k in t} == {
        "step": [], "lr": [], "mask": [], "v": [3]}
    for back in (st.load_file(str(tmp_path / "ours.safetensors")),
                 sluice.load(str(tmp_path / "ours.safetensors"), device="numpy"),
                 sluice.load(str(tmp_path / "theirs.safetensors"), device="numpy")):
        for k, v in t.items():
            assert back[k].shape == np.shape(v) and back[k].dtype == np.asarray(v).dtype and np.array_equal(back[k], v), k
    try:
        import torch
    except ImportError:
        return
    sluice.save({"s": torch.tensor(3.5)}, str(tmp_path / "torch.safetensors"))
    assert st.load_file(str(tmp_path / "torch.safetensors"))["s"].shape == ()
    assert sluice.load(str(tmp_path / "torch.safetensors"), device="cpu")["s"].shape == torch.Size([])


def _file(p, entries, data, extra=None):
    """A safetensors file by hand: entries {name: (dtype, shape, [begin, end])}, then data."""
    h = {k: {"dtype": d, "shape": s, "data_offsets": o} for k, (d, s, o) in entries.items()}
    h.update(extra or {})
    hj = json.dumps(h).encode()
    p.write_bytes(struct.pack("<Q", len(hj)) + hj + data)


BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
        "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
        "I64": 64, "U64": 64}


def test_every_dtype_of_the_specification(tmp_path):
    """Each of the specification's 20 dtypes is read (float8, float4 and float6 included: modern checkpoints
    hold them); its bytes come back whole."""
    rng = np.random.default_rng(11)
    entries, data = {}, b""
    for name, bits in BITS.items():
        count = 8  # 8 elements fill whole bytes at 4 and 6 bits too
        blob = rng.integers(0, 256, count * bits // 8, dtype=np.uint8).tobytes()
        entries[name.lower()] = (name, [2, 4], [len(data), len(data) + len(blob)])
        data += blob
    p = tmp_path / "all.safetensors"
    _file(p, entries, data)
    back = sluice.load(str(p), device="numpy")
    for k, (_, _, (b, e)) in entries.items():
        assert back[k].tobytes() == data[b:e], k


@pytest.mark.parametrize("case,entries,data,extra,want", [
    ("unknown dtype", {"a": ("F7", [2], [0, 2])}, b"\0" * 2, None, "dtype 'F7', unknown"),
    ("overlap", {"a": ("U8", [4], [0, 4]), "b": ("U8", [4], [2, 6])}, b"\0" * 6, None, "overlaps"),
    ("gap", {"a": ("U8", [4], [0, 4]), "b": ("U8", [4], [6, 10])}, b"\0" * 10, None, "a gap of 2 bytes"),
    ("trailing bytes", {"a": ("U8", [4], [0, 4])}, b"\0" * 9, None, "trailing bytes"),
    ("overflowing shape", {"a": ("F32", [2 ** 62, 2 ** 62], [0, 0])}, b"", None, "overflows 64 bits"),
    ("real in a shape", {"a": ("U8", [2.0], [0, 2])}, b"\0" * 2, None, "not a list of non-negative integers"),
    ("bool in a shape", {"a": ("U8", [True], [0, 1])}, b"\0", None, "not a list of non-negative integers"),
    ("negative dimension", {"a": ("U8", [-1], [0, 0])}, b"", None, "not a list of non-negative integers"),
    ("part of a byte", {"a": ("F4", [3], [0, 2])}, b"\0" * 2, None, "whole bytes"),
    ("wrong length", {"a": ("F32", [2], [0, 4])}, b"\0" * 4, None, "do not hold 2 F32"),
    ("metadata not strings", {"a": ("U8", [1], [0, 1])}, b"\0", {"__metadata__": {"k": 1}}, "__metadata__"),
])
def test_headers_checked_as_safetensors_does(tmp_path, case, entries, data, extra, want):
    p = tmp_path / "bad.safetensors"
    _file(p, entries, data, extra)
    with pytest.raises(sluice.SluiceError, match=want) as e:
        sluice.load(str(p), device="numpy")
    assert "bad.safetensors" in str(e.value), case


def test_float8_with_torch(tmp_path):
    """Where torch is installed: float8 tensors saved and loaded as torch's float8 dtypes, and the file read by
    safetensors itself when it is installed."""
    torch = pytest.importorskip("torch")
    t = {"e4m3": torch.randn(4, 8).to(torch.float8_e4m3fn), "e5m2": torch.randn(3).to(torch.float8_e5m2),
         "bf": torch.randn(5).to(torch.bfloat16)}
    p = tmp_path / "f8.safetensors"
    sluice.save(t, str(p))
    back = sluice.load(str(p), device="cpu")
    for k in t:
        assert back[k].dtype == t[k].dtype and torch.equal(back[k].view(torch.uint8), t[k].view(torch.uint8))
    st = pytest.importorskip("safetensors.torch")
    theirs = st.load_file(str(p))
    for k in t:
        assert torch.equal(theirs[k].view(torch.uint8), t[k].view(torch.uint8))


# Whole checkpoints: several files, an index, some tensors, one rank's slices, into a caller's tensors.

def model(seed=11):
    """A small model's tensors of several shapes and dtypes, as a transformer has them."""
    rng = np.random.default_rng(seed)
    t = {"embed.weight": rng.standard_normal((50, 16)).astype(np.float32), "norm.weight": np.ones(16, np.float16)}
    for i in range(3):
        t[f"layers.{i}.qkv.weight"] = rng.standard_normal((48, 16)).astype(np.float32)
        t[f"layers.{i}.proj.weight"] = rng.standard_normal((16, 16)).astype(np.float32)
        t[f"layers.{i}.proj.bias"] = rng.standard_normal(16).astype(np.float32)
        t[f"layers.{i}.experts"] = rng.integers(-99, 99, size=(4, 10, 7), dtype=np.int16)
    return t


def same(a, b):
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


def test_sharded_save_writes_what_hugging_face_reads(tmp_path):
    """max_shard_size: files model-0000K-of-0000N-MARK (MARK the save's own) holding at most that many data
    bytes (a larger tensor alone), and the index naming each tensor's file with the total size; each file a
    valid safetensors file."""
    t = model()
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    idx = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in (tmp_path / "ck").glob("*.safetensors"))
    n = len(files)
    mark = files[0][-len("0123456789ab.safetensors"):-len(".safetensors")]
    assert n > 3 and files == [f"model-{k:05d}-of-{n:05d}-{mark}.safetensors" for k in range(1, n + 1)]
    assert set(idx["weight_map"]) == set(t) and set(idx["weight_map"].values()) == set(files)
    assert idx["metadata"]["total_size"] == sum(a.nbytes for a in t.values())
    for f in files:
        h, _ = read_header(str(tmp_path / "ck" / f))
        held = [k for k in h if k != "__metadata__"]
        assert all(idx["weight_map"][k] == f for k in held)
        size = sum(t[k].nbytes for k in held)
        assert size <= 3000 or len(held) == 1, (f, size)
    with pytest.raises(ValueError, match="max_shard_size"):
        sluice.save(t, str(tmp_path / "bad"), max_shard_size=0)


def test_whole_checkpoint_from_a_directory_an_index_or_a_list(tmp_path):
    t = model()
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    d = tmp_path / "ck"
    rep = {}
    same(sluice.load(str(d), device="numpy", report=rep), t)
    assert rep["files"] == len(list(d.glob("*.safetensors"))) and rep["tensors"] == len(t)
    assert rep["bytes"] == sum(a.nbytes for a in t.values())
    same(sluice.load(str(d / "model.safetensors.index.json"), device="numpy"), t)
    same(sluice.load(sorted(str(p) for p in d.glob("*.safetensors")), device="numpy"), t)
    (d / "model.safetensors.index.json").unlink()  # without an index: every .safetensors of the directory
    same(sluice.load(str(d), device="numpy"), t)
    with pytest.raises(sluice.SluiceError, match="no .safetensors"):
        sluice.load(str(tmp_path), device="numpy")


def test_a_tensor_in_two_files_is_an_error_naming_both(tmp_path):
    sluice.save({"a": np.ones(3, np.float32), "b": np.zeros(2, np.int64)}, str(tmp_path / "one.safetensors"))
    sluice.save({"b": np.zeros(2, np.int64)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(sluice.SluiceError) as e:
        sluice.load(str(tmp_path), device="numpy")
    assert "'b'" in str(e.value) and "one.safetensors" in str(e.value) and "two.safetensors" in str(e.value)


def test_an_index_naming_files_elsewhere_is_refused(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(sluice.SluiceError, match="beside the index"):
        sluice.load(str(tmp_path), device="numpy")
    (tmp_path / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(sluice.SluiceError, match="not a safetensors index"):
        sluice.load(str(tmp_path), device="numpy")


def test_keys_read_only_those_tensors(tmp_path):
    """Names and globs pick tensors; only their bytes are read (the report's payload); a name the checkpoint
    lacks is an error naming it."""
    t = model()
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    rep = {}
    got = sluice.load(str(tmp_path / "ck"), device="numpy", keys=["layers.1.*", "norm.weight"], report=rep)
    want = {k: v for k, v in t.items() if k.startswith("layers.1.") or k == "norm.weight"}
    same(got, want)
    assert rep["bytes"] == sum(a.nbytes for a in want.values())
    assert sluice.load(str(tmp_path / "ck"), device="numpy", keys=["nothing.*"]) == {}
    with pytest.raises(KeyError, match="'layers.9.qkv.weight'"):
        sluice.load(str(tmp_path / "ck"), device="numpy", keys=["layers.9.qkv.weight"])


def test_a_key_the_checkpoint_holds_as_a_name_is_that_name(tmp_path):
    """A tensor named like a glob ("a[0]") is picked by its name alone (not also "a0", which the glob matches);
    a key that is no name stays a glob."""
    sluice.save({"a[0]": np.ones(2, np.float32), "a0": np.zeros(2, np.float32)}, str(tmp_path / "g.safetensors"))
    got = sluice.load(str(tmp_path / "g.safetensors"), device="numpy", keys=["a[0]"])
    assert list(got) == ["a[0]"] and got["a[0]"].tolist() == [1, 1]
    assert list(sluice.load(str(tmp_path / "g.safetensors"), device="numpy", keys=["a?"])) == ["a0"]


def chunk(a, dim, rank, world):
    """torch.chunk's cut of a along dim: ceil(n / world) each."""
    step = -(-a.shape[dim] // world)
    return np.take(a, range(min(rank * step, a.shape[dim]), min(rank * step + step, a.shape[dim])), axis=dim)


@pytest.mark.parametrize("dim,world", [(0, 4), (1, 4), (-1, 3), (1, 8), (0, 1)])
def test_one_ranks_slices_read_only_their_bytes(tmp_path, dim, world):
    """(dim, rank, world): each tensor with that dim cut as torch.chunk cuts it (uneven sizes and empty parts
    included), the others whole; the ranks' parts put together are the tensor; each rank reads only its part."""
    t = model()
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=4000)
    parts = []
    for rank in range(world):
        rep = {}
        got = sluice.load(str(tmp_path / "ck"), device="numpy", shard=(dim, rank, world), report=rep)
        want = {k: (chunk(v, dim, rank, world) if -v.ndim <= dim < v.ndim else v) for k, v in t.items()}
        same(got, want)
        assert rep["bytes"] == sum(a.nbytes for a in want.values())
        # What the I/Os spanned: the gaps a coalesced read reads through, none for the whole checkpoint.
        assert rep["bytes_storage"] >= rep["bytes"] and (world > 1 or rep["bytes_storage"] == rep["bytes"]), rep
        parts.append(got)
    for k, v in t.items():
        if -v.ndim <= dim < v.ndim:
            assert np.array_equal(np.concatenate([p[k] for p in parts], axis=dim), v), k


def test_slices_chosen_per_tensor(tmp_path):
    """A callable picks each tensor's cut, as tensor parallelism does: column-parallel weights by rows,
    row-parallel ones by columns, the rest whole."""
    t = model()
    sluice.save(t, str(tmp_path / "ck.safetensors"))

    def tp(name, shape):
        if name.endswith("qkv.weight"):
            return (0, 1, 2)
        if name.endswith("proj.weight"):
            return (1, 1, 2)
        return None
    got = sluice.load(str(tmp_path / "ck.safetensors"), device="numpy", shard=tp)
    for k, v in t.items():
        want = chunk(v, 0, 1, 2) if k.endswith("qkv.weight") else chunk(v, 1, 1, 2) if k.endswith("proj.weight") else v
        assert np.array_equal(got[k], want), k
    with pytest.raises(ValueError, match="rank 2 of world 2"):
        sluice.load(str(tmp_path / "ck.safetensors"), device="numpy", shard=(0, 2, 2))


def test_into_a_callers_tensors(tmp_path):
    """into: the checkpoint lands in the caller's own arrays (no other buffer), which come back (strict=False:
    some of the checkpoint's); a shape or dtype that differs is an error naming the tensor, before anything is
    read."""
    t = model()
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    into = {k: np.zeros_like(v) for k, v in t.items() if k.startswith("layers.2.")}
    got = sluice.load(str(tmp_path / "ck"), into=into, strict=False)
    assert all(got[k] is into[k] for k in into) and set(got) == set(into)
    same(into, {k: t[k] for k in into})
    rows = {"layers.0.qkv.weight": np.zeros((12, 16), np.float32)}  # rank 3 of 4's rows
    sluice.load(str(tmp_path / "ck"), into=rows, shard=(0, 3, 4), strict=False)
    assert np.array_equal(rows["layers.0.qkv.weight"], t["layers.0.qkv.weight"][36:])
    for wrong, what, strict in (({"norm.weight": np.zeros(16, np.float32)}, "float32", False),
                                ({"norm.weight": np.zeros(15, np.float16)}, "shape", False),
                                ({"nope": np.zeros(1, np.float16)}, "'nope'", True)):
        with pytest.raises((ValueError, KeyError), match=what):
            sluice.load(str(tmp_path / "ck"), into=wrong, strict=strict)


def test_into_a_model_with_tied_weights(tmp_path):
    """A model whose output layer shares the embedding's weight (GPT-2, Llama with tie_word_embeddings), from a
    checkpoint holding the embedding only, as transformers saves it: filled once, nothing missing; a key the
    model lacks is named (strict), or reported (strict=False)."""
    torch = pytest.importorskip("torch")

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.embed.weight
    torch.manual_seed(3)
    src, dst = Tied(), Tied()
    with torch.no_grad():
        dst.embed.weight.zero_()
    sluice.save({"embed.weight": src.embed.weight.detach().contiguous()}, str(tmp_path / "ck.safetensors"))
    got = sluice.load(str(tmp_path / "ck.safetensors"), into=dst.state_dict())
    assert set(got) == {"embed.weight", "lm_head.weight"}
    assert torch.equal(dst.lm_head.weight, src.embed.weight) and torch.equal(dst.embed.weight, src.embed.weight)
    sluice.save({"embed.weight": src.embed.weight.detach().contiguous(), "extra": torch.zeros(2)},
                str(tmp_path / "more.safetensors"))
    with pytest.raises(ValueError, match="unexpected keys.*'extra'"):
        sluice.load(str(tmp_path / "more.safetensors"), into=dst.state_dict())
    rep = {}
    sluice.load(str(tmp_path / "more.safetensors"), into=dst.state_dict(), strict=False, report=rep)
    assert rep["unexpected_keys"] == ["extra"] and rep["missing_keys"] == []


def test_unaligned_tensors_across_files_land_aligned(tmp_path):
    """Tensors at offsets that do not suit their dtype (another writer's files), in several files, come back
    right and aligned, each read into its own place (no copy of a file)."""
    a = np.arange(5, dtype=np.float64)
    b = np.arange(3, dtype=np.int32)
    for name, entries in (("x.safetensors", {"u": ("U8", [3], [0, 3]), "d": ("F64", [5], [3, 43])}),
                          ("y.safetensors", {"v": ("U8", [1], [0, 1]), "i": ("I32", [3], [1, 13])})):
        data = (bytes([1, 2, 3]) + a.tobytes()) if name == "x.safetensors" else (bytes([9]) + b.tobytes())
        _file(tmp_path / name, entries, data)
    got = sluice.load(str(tmp_path), device="numpy")
    assert np.array_equal(got["d"], a) and np.array_equal(got["i"], b) and got["u"].tolist() == [1, 2, 3]
    assert got["d"].ctypes.data % 8 == 0 and got["i"].ctypes.data % 4 == 0


def test_sharded_checkpoint_read_by_safetensors(tmp_path):
    """Where safetensors is installed: every file of a sharded save opens with safe_open and holds what the
    index says, byte for byte."""
    st = pytest.importorskip("safetensors")
    t = model()
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    wm = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())["weight_map"]
    seen = set()
    for f in set(wm.values()):
        with st.safe_open(str(tmp_path / "ck" / f), framework="numpy") as h:
            for k in h.keys():
                assert wm[k] == f and np.array_equal(h.get_tensor(k), t[k])
                seen.add(k)
    assert seen == set(t)


def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch


def test_into_a_models_parameters_on_the_gpu(tmp_path):
    """A module's state_dict() on the GPU as into=: its parameters hold the checkpoint after, and the load
    allocated no GPU memory of its own (peak at most 5% of the model above what was allocated before)."""
    torch = _cuda()
    torch.manual_seed(5)
    src = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(torch.bfloat16)
    sluice.save({k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "ck"), max_shard_size=4 << 20)
    dst = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(torch.bfloat16).cuda()
    for p in dst.parameters():
        p.data.zero_()
    model_bytes = sum(p.numel() * p.element_size() for p in dst.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    sluice.load(str(tmp_path / "ck"), into=dst.state_dict())
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= 0.05 * model_bytes
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b.cpu()), k


def test_one_ranks_slices_on_the_gpu(tmp_path):
    """bf16 tensors, column and row slices into GPU memory, equal to torch.chunk of the whole."""
    torch = _cuda()
    torch.manual_seed(6)
    t = {"a": torch.randn(300, 200).to(torch.bfloat16), "b": torch.randn(7, 64, 33).to(torch.bfloat16)}
    sluice.save(t, str(tmp_path / "ck.safetensors"))
    for dim in (0, 1, -1):
        for rank in range(3):
            got = sluice.load(str(tmp_path / "ck.safetensors"), device="cuda", shard=(dim, rank, 3))
            for k, v in t.items():
                want = torch.chunk(v, 3, dim=dim)[rank] if rank < len(torch.chunk(v, 3, dim=dim)) else None
                assert got[k].is_cuda and want is not None and torch.equal(got[k].cpu(), want), (k, dim, rank)


def test_tensors_side_by_side_in_gpu_memory_but_in_two_allocations(tmp_path):
    """Tensors of 20 MiB each get an allocation of their own from torch, often side by side in the address
    space, and lie side by side in the file: a copy must not span two allocations (the driver refuses it), so
    saving and loading them works and gives the bytes back."""
    torch = _cuda()
    t = {f"t{i:02d}": torch.full((5 << 20,), i, dtype=torch.int32, device="cuda") for i in range(16)}
    ptrs = [t[k].data_ptr() for k in sorted(t)]
    if not any(b == a + (20 << 20) for a, b in zip(ptrs, ptrs[1:])):
        pytest.skip("torch placed no two of the tensors side by side")
    sluice.save(t, str(tmp_path / "ck.safetensors"))
    back = {k: torch.zeros_like(v) for k, v in t.items()}
    sluice.load(str(tmp_path / "ck.safetensors"), into=back)
    assert all(torch.equal(back[k], t[k]) for k in t)


def test_neighbouring_tensors_are_one_read(tmp_path):
    """Whole tensors that follow one another in a file land as they lie there and are read together: 300 small
    tensors of one file (299 KB) in the few I/Os of its shares among the engine's workers (128 KiB or more each)
    rather than one each; every other one of them, each in a place of its own, only their bytes."""
    t = {f"t{i:03d}": np.full(100 + i, i, np.int32) for i in range(300)}
    sluice.save(t, str(tmp_path / "ck.safetensors"))
    rep = {}
    same(sluice.load(str(tmp_path / "ck.safetensors"), device="numpy", report=rep), t)
    assert rep["ios"] <= 3, rep
    half = sluice.load(str(tmp_path / "ck.safetensors"), device="numpy", keys=[f"t{i:03d}" for i in range(0, 300, 2)],
                       report=rep)
    same(half, {k: t[k] for k in half})
    assert len(half) == 150 and rep["bytes"] == sum(t[k].nbytes for k in half)


def test_replicated_on_several_gpus(tmp_path):
    """device as a list: read once into the first GPU, copied to the others; every copy equal to the file."""
    torch = _cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("fewer than two GPUs")
    t = {k: torch.from_numpy(v) for k, v in model().items()}
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    devs = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    rep = {}
    got = sluice.load(str(tmp_path / "ck"), device=devs, report=rep)
    assert len(got) == len(devs) and rep["bytes"] == sum(v.numel() * v.element_size() for v in t.values())
    for d, g in zip(devs, got):
        for k, v in t.items():
            assert g[k].device == torch.device(d) and torch.equal(g[k].cpu(), v), (d, k)


def test_a_list_of_devices_is_checked():
    with pytest.raises(ValueError, match="at least one"):
        sluice.load("unused", device=[])
    with pytest.raises(ValueError, match="into="):
        sluice.load("unused", device=["cuda:0"], into={})


# One rank of a process group loading a checkpoint with process_group=; prints its report and whether every
# tensor equals the checkpoint read alone (argv: checkpoint, backend, device or "rank" for cuda:RANK, shard dim
# or "none", the bytes a rank reads of a round or "default").
GROUP_RANK = """
import json, os, sys, torch, torch.distributed as dist, sluice, sluice.checkpoint
path, backend, dev, dim, rnd = sys.argv[1:6]
if rnd != "default":
    sluice.checkpoint._ROUND = int(rnd)
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
dev = f"cuda:{rank}" if dev == "rank" else dev
shard = None if dim == "none" else (int(dim), rank, world)
alone = sluice.load(path, device="cpu", shard=shard)
rep = {}
got = sluice.load(path, device=dev, shard=shard, process_group=dist.group.WORLD, report=rep)
bad = [k for k in alone if not (got[k].device == torch.device(dev) and torch.equal(got[k].cpu(), alone[k]))]
into, rep_into = {k: torch.zeros_like(v).to(dev) for k, v in alone.items()}, {}  # into a model's tensors
sluice.load(path, into=into, shard=shard, process_group=dist.group.WORLD, report=rep_into)
bad += [f"into:{k}" for k in alone if not torch.equal(into[k].cpu(), alone[k])]
print(json.dumps({"rank": rank, "bad": bad, "n": len(got), **rep, "into": rep_into}))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # past torch's teardown, which once aborted a gloo rank at exit ("terminate called ...")
"""


def _group_load(path, world, backend, dev, dim, rnd):
    """Runs world ranks of GROUP_RANK; returns their reports."""
    return run_ranks(GROUP_RANK, (path, backend, dev, dim, rnd), world)


def _group_case(tmp_path, world, backend, dev, rnd="default"):
    torch = pytest.importorskip("torch")
    t = {k: torch.from_numpy(v) for k, v in model().items()}
    t["odd.bytes"] = torch.arange(37, dtype=torch.uint8)  # an odd length: pieces end mid-tensor
    sluice.save(t, str(tmp_path / "ck"), max_shard_size=3000)
    whole = sum(v.numel() * v.element_size() for v in t.values())
    reps = _group_load(tmp_path / "ck", world, backend, dev, "none", rnd)
    assert all(r["bad"] == [] and r["n"] == len(t) for r in reps), reps
    for rs in (reps, [r["into"] for r in reps]):  # into load's buffer, and into a model's tensors
        assert sum(r["bytes"] for r in rs) == whole, rs  # the group read each byte once
        assert all(r["bytes"] < whole for r in rs) and all(r["bytes_exchanged"] > 0 for r in rs), rs
    reps = _group_load(tmp_path / "ck", world, backend, dev, 0, rnd)  # slices: each rank its own; whole ones shared
    assert all(r["bad"] == [] for r in reps), reps


@pytest.mark.parametrize("world,rnd", [(2, "default"), (3, "1024")])
def test_a_process_group_reads_each_byte_once(tmp_path, world, rnd):
    """process_group=: the ranks read disjoint parts and all-gather them (gloo, host memory), a round at a time
    (one round, or rounds of 1 KiB a rank: a round's all-gather runs while the next is read), or with into= each
    tensor's owner reads and broadcasts it; every rank holds every tensor, equal to the checkpoint, and the
    group's reads add up to the checkpoint's bytes."""
    _group_case(tmp_path, world, "gloo", "cpu", rnd)


def test_a_process_group_over_nccl(tmp_path):
    """The same over NCCL, one GPU a rank (the in-place all-gather)."""
    torch = _cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("fewer than two GPUs")
    _group_case(tmp_path, 2, "nccl", "rank", "1024")


# One rank of a group whose rank 1 fails its read (argv: checkpoint, "buffer" or "into", rounds' bytes): prints
# whether its load returned or the SluiceError it raised.
GROUP_FAILS = """
import errno, json, os, sys, torch, torch.distributed as dist, sluice, sluice.checkpoint as ck
path, mode, rnd = sys.argv[1:4]
ck._ROUND = int(rnd)
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    def failing(*a, **k):
        raise sluice.SluiceError(-errno.ESTALE, "injected: rank 1's read failed")
    ck._read_ranges = failing
kw = {}
if mode == "into":
    kw["into"] = {k: torch.zeros(sh, dtype=getattr(torch, ck.DT[dt][1])) for k, (dt, sh) in ck._listing(path).items()}
try:
    sluice.load(path, device="cpu", process_group=dist.group.WORLD, **kw)
    out = {"rank": rank, "returned": True}
except sluice.SluiceError as e:
    out = {"rank": rank, "returned": False, "code": e.code, "msg": str(e)}
print(json.dumps(out))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("mode,rnd", [("buffer", 1024), ("buffer", 1 << 30), ("into", 1024)])
def test_a_rank_whose_read_fails_fails_the_whole_group(tmp_path, mode, rnd):
    """process_group=: one rank's read fails (a file changed under it): every rank's load fails, none hangs on a
    collective the failing rank left, and none returns tensors holding that rank's part unread."""
    torch = pytest.importorskip("torch")
    sluice.save({k: torch.from_numpy(v) for k, v in model().items()}, str(tmp_path / "ck"), max_shard_size=3000)
    reps = run_ranks(GROUP_FAILS, (tmp_path / "ck", mode, rnd), 3)
    assert [r["returned"] for r in reps] == [False] * 3, reps
    assert "injected" in reps[1]["msg"] and all("another rank of the group failed" in r["msg"]
                                                for r in (reps[0], reps[2])), reps


def test_a_process_group_is_checked():
    with pytest.raises(ValueError, match="process_group"):
        sluice.load("unused", device=["cuda:0"], process_group=object())
