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
