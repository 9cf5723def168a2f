"""`sluice load` (the C checkpoint readers) against the Python ones on the same checkpoints: the same tensors, dtypes,
shapes and byte ranges from sluice.save's files, one file and sharded; a tensor's bytes as sluice.load gives them;
errors that name the file; --bench's comparison (warm here: the page cache is not dropped without root)."""
import json
import os
import subprocess

import numpy as np
import pytest

import sluice
from st_header import read_header
from conftest import SLUICE


def _run(*args):
    return subprocess.run([SLUICE, "load", *args], capture_output=True, text=True)


def _made(tmp_path):
    t = {f"layers.{i}.w": np.arange(1000 * (i + 1), dtype=np.float32).reshape(-1, 10) for i in range(4)}
    t["tiny"] = np.arange(3, dtype=np.int8)  # the tensor after it lands unaligned in the file
    t["h"] = np.ones((7,), np.float16)
    one, sharded = tmp_path / "one.safetensors", tmp_path / "sharded"
    sluice.save(t, one)
    sluice.save(t, sharded, max_shard_size=12000)
    return t, one, sharded


@pytest.mark.parametrize("which", ["one", "sharded"])
def test_the_c_table_is_the_python_one(tmp_path, which):
    t, one, sharded = _made(tmp_path)
    src = one if which == "one" else sharded
    r = _run("--json", "--list", "--host", str(src))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["format"] == "safetensors" and got["tensors"] == len(t)
    assert got["bytes"] == sum(a.nbytes for a in t.values())
    files = sorted(p for p in (src.iterdir() if src.is_dir() else [src]) if p.name.endswith(".safetensors"))
    assert got["files"] == len(files)
    want = {}
    for f in files:
        header, start = read_header(str(f))
        for name, v in header.items():
            if name != "__metadata__":
                want[name] = (v["dtype"], v["shape"], start + v["data_offsets"][0],
                              v["data_offsets"][1] - v["data_offsets"][0])
    assert {e["name"]: (e["dtype"], e["shape"], e["offset"], e["bytes"]) for e in got["list"]} == want
    loaded = sluice.load(src, device="numpy")
    for name, a in t.items():
        assert np.array_equal(loaded[name], a)


def test_bench_compares_with_a_plain_read(tmp_path):
    _, _, sharded = _made(tmp_path)
    r = _run("--json", "--host", "--bench", "--reps", "3", str(sharded))
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["bench"]
    assert b["reps"] == 3 and b["plain_seconds"] > 0 and b["ratio"] > 0 and b["pages"] in ("warm", "cold")


def test_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    h = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    bad.write_bytes(len(h).to_bytes(8, "little") + h + b"\0" * 12)  # 4 trailing bytes
    r = _run(str(bad))
    assert r.returncode == 1 and "bad.safetensors" in r.stderr and "trailing" in r.stderr
    r = _run("--reps", "2", str(bad))
    assert r.returncode == 2 and "--bench" in r.stderr
    r = _run(str(tmp_path / "absent"))
    assert r.returncode == 1 and "absent" in r.stderr


_HOSTILE = {  # header text after the length, then the data's bytes
    "a name twice": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                     b'"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"\0\0"),
    "unknown dtype": (b'{"a":{"dtype":"F7","shape":[2],"data_offsets":[0,2]}}', b"\0\0"),
    "a bool in a shape": (b'{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', b"\0"),
    "overlap": (b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                b'"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', b"\0" * 6),
    "trailing bytes": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0\0"),
    "not JSON": (b'{"a":', b""),
    "deep": (b'{"__metadata__":' + b'[' * 5000 + b']' * 5000 + b'}', b""),
    "torch.save": None,
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_c_and_python_refuse_every_hostile_header_alike(tmp_path, case):
    """One parser: `sluice load` (C) and sluice.load (Python, through sluice_st_header_read) refuse each hostile
    header with the same message naming the file (a name given twice in one header too, which Python's json
    would have taken the last of)."""
    p = tmp_path / "bad.safetensors"
    if _HOSTILE[case] is None:
        p.write_bytes(b"PK\x03\x04" + b"\0" * 200)
    else:
        head, data = _HOSTILE[case]
        p.write_bytes(len(head).to_bytes(8, "little") + head + data)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.load(str(p), device="numpy")
    r = _run("--list", "--host", str(p))
    assert r.returncode != 0 and str(p) in r.stderr, r.stderr
    py = e.value.detail
    assert py.startswith(f"{p}: ") and r.stderr.rstrip("\n").endswith(py), (py, r.stderr)
