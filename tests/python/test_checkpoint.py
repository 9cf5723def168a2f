"""sluice.save / sluice.load in the safetensors layout, checked against the format itself."""
import json
import os
import struct

import numpy as np
import pytest

import sluice


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
    assert (8 + n) % 8 == 0 and header["__metadata__"] == {"format": "pt"}
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
