"""`sluice pack --from-jsonl` takes the JSON lines real corpora hold: strings with \\u0000, a float column whose
later rows are integers, a byte order mark, blank lines; values kept as bytes stay as written."""
import json
import subprocess

import numpy as np

import sluice
from conftest import SLUICE


def _pack(tmp_path, text, fields):
    src = tmp_path / "in.jsonl"
    src.write_bytes(text)
    r = subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", fields, "--quiet", str(tmp_path / "ds")],
                       capture_output=True, text=True, timeout=60)
    return r, (sluice.Dataset(str(tmp_path / "ds")) if r.returncode == 0 else None)


def test_valid_lines_are_taken(tmp_path):
    lines = [{"t": "a\u0000b", "x": 2.5, "v": [0.5, 1.5], "raw": "s"},
             {"t": "c", "x": 3, "v": [3, 4], "raw": 0.1},
             {"t": "d", "x": -1, "v": [], "raw": {"a": 1e-7, "b": [0.30000000000000004]}}]
    text = b"\xef\xbb\xbf" + b"\n  \n\t\n".join(json.dumps(x).encode() for x in lines) + b"\n\n"
    r, ds = _pack(tmp_path, text, "t,x,v,raw")
    assert r.returncode == 0, r.stderr
    assert len(ds) == 3
    assert [bytes(ds[i]["t"]) for i in range(3)] == [b"a\x00b", b"c", b"d"]
    assert [float(ds[i]["x"][0]) for i in range(3)] == [2.5, 3.0, -1.0]
    assert np.array_equal(ds[1]["v"], np.array([3, 4], np.float32))
    # Kept as written, not re-serialised (0.1 would become 0.10000000000000001).
    assert bytes(ds[1]["raw"]) == b"0.1"
    assert bytes(ds[2]["raw"]) == json.dumps(lines[2]["raw"]).encode()


def test_what_cannot_convert_is_named(tmp_path):
    r, _ = _pack(tmp_path, b'{"x": 3}\n{"x": 2.5}\n', "x")
    assert r.returncode != 0 and "in.jsonl:2" in r.stderr and "'x'" in r.stderr, r.stderr
