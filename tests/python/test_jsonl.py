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
    assert [float(ds[i]["x"]) for i in range(3)] == [2.5, 3.0, -1.0]
    assert np.array_equal(ds[1]["v"], np.array([3, 4], np.float32))
    # Kept as written, not re-serialised (0.1 would become 0.10000000000000001).
    assert bytes(ds[1]["raw"]) == b"0.1"
    assert bytes(ds[2]["raw"]) == json.dumps(lines[2]["raw"]).encode()


def test_what_cannot_convert_is_named(tmp_path):
    r, _ = _pack(tmp_path, b'{"x": 3}\n{"x": 2.5}\n', "x")
    assert r.returncode != 0 and "in.jsonl:2" in r.stderr and "'x'" in r.stderr, r.stderr


def _pack_limited(tmp_path, src, *, limit=None, address_space=None):
    """`sluice pack --from-jsonl src` in a child (SLUICE_MAX_RECORD=limit, RLIMIT_AS=address_space bytes):
    the result, and whether a dataset opens at the output."""
    import os
    import resource

    def cap():
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    env = dict(os.environ)
    if limit:
        env["SLUICE_MAX_RECORD"] = str(limit)
    out = tmp_path / "ds"
    r = subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "t", "--quiet", str(out)],
                       capture_output=True, text=True, timeout=120, env=env, preexec_fn=cap)
    return r, (out / "index.sli").exists()


def test_a_line_past_the_limit_is_an_error_naming_file_and_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"t": "a"}\n{"t": "b"}\n{"t": "' + b"x" * 10000 + b'"}\n{"t": "c"}\n')
    r, made = _pack_limited(tmp_path, src, limit=4096)
    assert r.returncode != 0 and not made, r.stderr
    assert "in.jsonl:3" in r.stderr and "SLUICE_MAX_RECORD" in r.stderr, r.stderr
    # Under the limit the same file packs whole.
    r, made = _pack_limited(tmp_path, src, limit=65536)
    assert r.returncode == 0 and made and len(sluice.Dataset(str(tmp_path / "ds"))) == 4, r.stderr


def test_a_file_without_a_newline_is_refused_at_the_limit(tmp_path):
    # A JSON array on one line, with no newline at all: bigger than the limit, so never held whole.
    src = tmp_path / "array.json"
    src.write_bytes(json.dumps([{"t": "x" * 100}] * 200).encode())
    r, made = _pack_limited(tmp_path, src, limit=4096)
    assert r.returncode != 0 and not made and "array.json:1" in r.stderr and "4096" in r.stderr, r.stderr


def test_dev_zero_is_refused_not_read_forever(tmp_path):
    # NULs without end: read up to the limit, then refused (the address space cap bounds the test either way).
    r, made = _pack_limited(tmp_path, "/dev/zero", limit=1 << 20, address_space=1 << 30)
    assert r.returncode != 0 and not made and "/dev/zero:1" in r.stderr and "SLUICE_MAX_RECORD" in r.stderr, r.stderr


def test_a_line_too_long_for_memory_is_an_error_not_the_end_of_the_file(tmp_path):
    # Two records, then 3 GB of NULs (a sparse file) under a 1 GiB address space: with the default limit the
    # third line is refused by name; it was once an allocation failure taken for the end (2 records, rc 0).
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"t": "a"}\n{"t": "b"}\n')
    with open(src, "r+b") as f:
        f.truncate(3 << 30)
    r, made = _pack_limited(tmp_path, src, address_space=1 << 30)
    assert r.returncode != 0 and not made, (r.returncode, r.stderr)
    assert "in.jsonl:3" in r.stderr and "SLUICE_MAX_RECORD" in r.stderr, r.stderr


def test_a_read_error_is_an_error(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    r, made = _pack_limited(tmp_path, d)
    assert r.returncode != 0 and not made and "adir" in r.stderr, r.stderr


def test_integer_options_that_would_wrap_in_c_are_refused_by_name(tmp_path):
    """Every integer handed to C through ctypes is range-checked first: 2**32 + 512 into an unsigned int field
    would be 512 (pack_context packed rows of 512), -1 a huge count."""
    import pytest
    tok = tmp_path / "tok.npy"
    np.save(tok, np.arange(2000, dtype=np.uint16))
    lens = tmp_path / "lens.npy"
    np.save(lens, np.full(20, 100, np.int64))
    with pytest.raises(ValueError, match="pack_context=4294967808"):
        sluice.pack(str(tmp_path / "rows"), tokens=str(tok), doc_lengths=str(lens), pack_context=2**32 + 512)
    assert not (tmp_path / "rows").exists()
    for kw in ({"threads": -1}, {"shard_size": 2**64}, {"zstd": 2**31}, {"block_size": -5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            sluice.pack(str(tmp_path / "x"), tokens=str(tok), doc_lengths=str(lens), **kw)
    with pytest.raises(ValueError, match="context"):
        sluice.Packer(2**32 + 8)
    with pytest.raises(ValueError, match="pad_id"):
        sluice.Packer(8, pad_id=2**31)
    with pytest.raises(TypeError, match="context"):
        sluice.Packer(8.5)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"t": "x" * i}) + "\n" for i in range(10)))
    sluice.pack(str(tmp_path / "ds"), jsonl=str(src), fields="t")
    ds = sluice.Dataset(str(tmp_path / "ds"))
    for kw in ({"batch_size": 2**32 + 2}, {"seed": -1}, {"rank": 2**32}, {"world_size": -2}, {"prefetch": 2**40},
               {"window_bytes": 2**64}, {"epoch": -3}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            sluice.Loader(ds, **{"batch_size": 2, **kw})
    ld = sluice.Loader(ds, 2)
    with pytest.raises(ValueError, match="epoch"):
        ld.set_epoch(-1)
    with pytest.raises(ValueError, match="position"):
        ld.load_state_dict({"seed": 0, "epoch": 0, "position": 2**64 + 4})
    with pytest.raises(IndexError):
        ds[2**64 + 3]
    with pytest.raises(IndexError):
        ds[-11]
    assert bytes(ds[-1]["t"]) == b"x" * 9
    assert [bytes(r["t"]) for r in ds] == [b"x" * i for i in range(10)]  # the sequence protocol ends at IndexError
    with pytest.raises(ValueError, match="s=-1"):
        ds.shard_bytes(-1)


def test_an_empty_output_path_is_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"t": "a"}\n')
    import pytest
    with pytest.raises(sluice.SluiceError, match="OUT"):
        sluice.pack("", jsonl=str(src), fields="t")
    r = subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "t", "--quiet", ""], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "OUT" in r.stderr, r.stderr


def test_a_list_element_out_of_f32_range_is_refused_as_a_scalar_is(tmp_path):
    """An f32[*] element past float32's range would become inf: refused naming file:line and field, as a
    scalar past float64's range is."""
    for text in (b'{"v": [1.5]}\n{"v": [1e39]}\n', b'{"v": [-1e39, 2.5]}\n', b'{"v": [1.5]}\n{"v": [1, -3.5e38]}\n'):
        r, _ = _pack(tmp_path, text, "v")
        line = text.count(b"\n")
        assert r.returncode != 0 and f"in.jsonl:{line}" in r.stderr and "'v'" in r.stderr, (text, r.stderr)
    r, ds = _pack(tmp_path, b'{"v": [3.4028234e38, 1e-50]}\n', "v")  # the largest float32; tiny ones round to 0
    assert r.returncode == 0, r.stderr
    assert ds[0]["v"][0] == np.finfo(np.float32).max


def test_packing_over_a_dataset_names_the_output_not_the_input_line(tmp_path):
    r, _ = _pack(tmp_path, b'{"x": 1}\n', "x")
    assert r.returncode == 0, r.stderr
    r, _ = _pack(tmp_path, b'{"x": 1}\n', "x")
    assert r.returncode != 0
    assert "in.jsonl" not in r.stderr and str(tmp_path / "ds") in r.stderr and "already holds" in r.stderr, r.stderr
