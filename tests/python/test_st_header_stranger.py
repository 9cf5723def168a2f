"""A stranger's attacks on the safetensors header reader (sluice_st_header_read, through
sluice._safetensors.read_header, sluice.load, sluice.checkpoint._listing and `sluice load --list`): lengths
without a bound, short and special files, hostile JSON, files that change between the header and the data,
names that escape, credentials in messages.  Every bad input must be a SluiceError (or the CLI's non-zero exit)
naming the file and what is wrong; a valid file loads with every byte right.  The bugs these found (a crash on a
header read that failed, a path cut at a NUL, a file rewritten in place loaded mixed, deep nesting and empty
tensors of impossible shapes ending in Python's or numpy's own errors, a size bound left unsaid) are fixed and
each is kept as the test that found it."""
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sluice
from sluice import checkpoint
from sluice import _safetensors as st
from st_header import read_header
from sluice._lib import lib

import webserver
from conftest import ROOT, SLUICE

ERR = sluice.SluiceError


def _st(path, header=None, data=b"", raw=None):
    """Writes a safetensors file: the header dict (or raw JSON bytes), then data; returns its path as a str."""
    hj = raw if raw is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + data)
    return str(path)


def _refused(fn, path, *words):
    """fn(path) raises a SluiceError naming path and every one of words; returns the message."""
    with pytest.raises(ERR) as e:
        fn(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


def _all_refuse(path, *words):
    """read_header, load and _listing all refuse path with a message naming it and holding words."""
    for fn in (read_header, lambda p: sluice.load(p, device="numpy"), checkpoint._listing):
        _refused(fn, path, *words)


def _cli(*args, timeout=20):
    return subprocess.run([SLUICE, "load", *args], capture_output=True, text=True, timeout=timeout)


def _child(code, timeout=30):
    """Runs code in a fresh Python (a crash there is a return code, not a dead test run)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                       os.path.dirname(os.path.abspath(__file__))]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


ONE = b'{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}'


# ---------------------------------------------------------------- lengths without a bound, short files

@pytest.mark.parametrize("n", [2**63, 2**64 - 1, 1 << 40, 10**12, 3])
def test_header_length_claims_more_than_the_file(tmp_path, n):
    """A header length field of 2^63, 2^64-1, 1 TB, 10^12 or one byte past the file's end is refused at once."""
    p = tmp_path / "len.safetensors"
    p.write_bytes(struct.pack("<Q", n) + b"{}")
    _all_refuse(str(p), "not a safetensors file", f"a header of {n} bytes" + (
        ", more than the 104857600 a header may hold" if n > 100 << 20 else " in a file of 10"))
    r = _cli("--list", "--host", str(p))
    assert r.returncode != 0 and str(p) in r.stderr and f"header of {n} bytes" in r.stderr


@pytest.mark.parametrize("body", [b"", b"\x02", b"1234567"])
def test_files_shorter_than_8_bytes(tmp_path, body):
    """An empty file and files of 1 and 7 bytes are refused as shorter than the length field."""
    p = tmp_path / "short.safetensors"
    p.write_bytes(body)
    _all_refuse(str(p), "shorter than 8 bytes")
    r = _cli("--list", "--host", str(p))
    assert r.returncode != 0 and "shorter than 8 bytes" in r.stderr


def test_length_zero_and_empty_object(tmp_path):
    """A zero header length is 'not JSON'; an 8-byte file '{}' header is a valid empty checkpoint."""
    p = tmp_path / "zero.safetensors"
    p.write_bytes(bytes(8))
    _all_refuse(str(p), "header is not JSON")
    q = _st(tmp_path / "empty.safetensors", raw=b"{}")
    assert read_header(q) == ({}, 10) and sluice.load(q, device="numpy") == {}


def test_torch_save_files_are_named_as_such(tmp_path):
    """A torch.save zip and a pickle are named as such, with what to do, not as garbage lengths."""
    z = tmp_path / "zip.safetensors"
    z.write_bytes(b"PK\x03\x04" + bytes(60))
    _all_refuse(str(z), "a torch.save file (a zip archive)", "torch.load")
    k = tmp_path / "pkl.safetensors"
    k.write_bytes(b"\x80\x02}q\x00" + bytes(60))
    _all_refuse(str(k), "a pickle")


def test_header_of_exactly_100_mib_loads(tmp_path):
    """A header of exactly 100 MiB (the bound) is read whole and the data after it is right."""
    n = 100 << 20
    p = _st(tmp_path / "big.safetensors", raw=ONE + b" " * (n - len(ONE)), data=b"xyz")
    h, start = read_header(p)
    assert start == 8 + n and h == json.loads(ONE)
    assert bytes(sluice.load(p, device="numpy")["a"]) == b"xyz"


def _just_over(tmp_path):
    n = (100 << 20) + 1
    p = tmp_path / "over.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", n) + b"{")
    os.truncate(p, 8 + n + 3)  # sparse: the file does hold the header it claims
    return str(p)


def test_header_just_over_100_mib_is_refused(tmp_path):
    """A header of 100 MiB + 1 byte, which the file does hold, is refused before any of it is read."""
    p = _just_over(tmp_path)
    _all_refuse(p, "not a safetensors file", "a header of 104857601 bytes")


def test_header_over_the_bound_names_the_bound(tmp_path):
    """The refusal of a header over 100 MiB says that is the bound."""
    msg = _refused(read_header, _just_over(tmp_path))
    assert "104857600" in msg or "100 MiB" in msg, msg


@pytest.mark.parametrize("n", [65527, 65528, 65529, 200000])
def test_headers_around_the_first_read(tmp_path, n):
    """Headers that end just before, at and after the first 64 KiB read (and far past it) load every byte right."""
    data = bytes(range(256)) * 3
    hj = b'{"a":{"dtype":"U8","shape":[768],"data_offsets":[0,768]}}'
    p = _st(tmp_path / "h.safetensors", raw=hj + b" " * (n - len(hj)), data=data)
    assert read_header(p)[1] == 8 + n
    assert bytes(sluice.load(p, device="numpy")["a"]) == data
    assert checkpoint._listing(p) == {"a": ("U8", (768,))}


# ---------------------------------------------------------------- special files where a regular one is expected

@pytest.mark.parametrize("which", ["dir", "devzero", "devnull", "link_to_devzero", "dangling", "loop"])
def test_special_files_are_refused(tmp_path, which):
    """A directory, /dev/zero, /dev/null, a symlink to /dev/zero, a dangling link and a link loop are refused."""
    p = tmp_path / "x.safetensors"
    words = {"dir": "is a directory", "devzero": "is a character device", "devnull": "is a character device",
             "link_to_devzero": "is a character device", "dangling": "No such file",
             "loop": "Too many levels of symbolic links"}[which]
    if which == "dir":
        p.mkdir()
    elif which in ("devzero", "devnull"):
        p = "/dev/zero" if which == "devzero" else "/dev/null"
    elif which == "link_to_devzero":
        p.symlink_to("/dev/zero")
    elif which == "dangling":
        p.symlink_to(tmp_path / "nowhere")
    else:
        p.symlink_to(p)
    _refused(read_header, str(p), words)
    if which != "dir":  # a directory is a checkpoint directory to load: refused as holding no files
        _refused(lambda q: sluice.load(q, device="numpy"), str(p), words)
    r = _cli("--list", "--host", str(p))
    assert r.returncode != 0 and str(p) in r.stderr


def test_fifo_is_refused_without_hanging(tmp_path):
    """A FIFO named like a checkpoint file is refused by read_header, load, _listing and the CLI, never waited on."""
    p = tmp_path / "fifo.safetensors"
    os.mkfifo(p)
    r = _child(f"""
        import sluice
        from sluice import _safetensors as st, checkpoint
        from st_header import read_header
        for fn in (read_header, lambda p: sluice.load(p, device="numpy"), checkpoint._listing):
            try:
                fn({str(p)!r})
                print("LOADED")
            except sluice.SluiceError as e:
                print("ERR", e)
        """, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"ERR {p}: is a FIFO, not a regular file") == 3, r.stdout
    c = _cli("--list", "--host", str(p), timeout=10)
    assert c.returncode != 0 and "is a FIFO" in c.stderr


# ---------------------------------------------------------------- hostile JSON

U8 = '"dtype":"U8","shape":[1],"data_offsets":[0,1]'
HOSTILE = [
    ("nan", '{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,1]}}', "header is not JSON"),
    ("infinity", '{"a":{%s,"x":Infinity}}' % U8, "header is not JSON"),
    ("minus_infinity", '{"a":{%s,"x":-Infinity}}' % U8, "header is not JSON"),
    ("overflowing_real", '{"a":{%s,"x":1e400}}' % U8, "real number overflow"),
    ("huge_int_shape", '{"a":{"dtype":"U8","shape":[111111111111111111111111111111],"data_offsets":[0,1]}}',
     "too big integer"),
    ("int_2_63_offset", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,9223372036854775808]}}',
     "too big integer"),
    ("int_2_64_shape", '{"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]}}',
     "too big integer"),
    ("negative_shape", '{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', "non-negative integers"),
    ("negative_zero_real_shape", '{"a":{"dtype":"U8","shape":[-0.0],"data_offsets":[0,1]}}',
     "non-negative integers"),
    ("negative_zero_shape", '{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,1]}}', "do not hold 0 U8"),
    ("float_shape", '{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', "non-negative integers"),
    ("bool_shape", '{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', "non-negative integers"),
    ("negative_offset", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}', "two non-negative integers"),
    ("three_offsets", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}', "two non-negative integers"),
    ("far_offsets", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,9223372036854775807]}}',
     "a gap of 9223372036854775806 bytes"),
    ("size_overflows", '{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}}',
     "overflows 64 bits"),
    ("65_dims", '{"a":{"dtype":"U8","shape":[%s],"data_offsets":[0,1]}}' % ",".join(["1"] * 65), "at most 64"),
    ("f4_half_byte", '{"a":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}}', "does not fill whole bytes"),
    ("unknown_dtype", '{"a":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}', "unknown to the safetensors"),
    ("dtype_not_string", '{"a":{"dtype":8,"shape":[1],"data_offsets":[0,1]}}', "not a string"),
    ("entry_null", '{"a":null}', "lacks dtype, shape or data_offsets"),
    ("entry_lacks_shape", '{"a":{"dtype":"U8","data_offsets":[0,1]}}', "lacks dtype, shape or data_offsets"),
    ("duplicate_name", '{"a":{%s},"a":{%s}}' % (U8, U8), "duplicate object key"),
    ("duplicate_escaped_name", '{"a":{%s},"\\u0061":{%s}}' % (U8, U8), "duplicate object key"),
    ("duplicate_in_entry", '{"a":{"dtype":"F64",%s}}' % U8, "duplicate object key"),
    ("duplicate_in_metadata", '{"__metadata__":{"k":"1","k":"2"},"a":{%s}}' % U8, "duplicate object key"),
    ("nul_in_name", '{"a\\u0000b":{%s}}' % U8, "NUL byte"),
    ("nul_in_metadata", '{"__metadata__":{"k":"a\\u0000b"},"a":{%s}}' % U8, "header is not JSON"),
    ("lone_surrogate", '{"a\\ud800":{%s}}' % U8, "invalid Unicode"),
    ("metadata_not_strings", '{"__metadata__":{"k":1},"a":{%s}}' % U8, "__metadata__ is not an object"),
    ("metadata_array", '{"__metadata__":[],"a":{%s}}' % U8, "__metadata__ is not an object"),
    ("array_root", '[]', "not a JSON object"),
    ("string_root", '"a"', "header is not JSON"),
    ("empty_header", '', "header is not JSON"),
    ("trailing_junk", '{"a":{%s}} x' % U8, "end of file expected"),
    ("deeper_than_2048", '{"a":{%s,"x":%s}}' % (U8, "[" * 5000 + "]" * 5000), "maximum parsing depth"),
    ("gap", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', "a gap of 1 bytes"),
    ("past_the_end", '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', "past the 1 data bytes"),
    ("trailing_bytes", '{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', "trailing bytes"),
    ("overlap", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                '"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "overlaps the one before"),
]


@pytest.mark.parametrize("raw,words", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_json_is_refused(tmp_path, raw, words):
    """Hostile headers (NaN, huge integers, -0, duplicates, NUL, bad tilings, ...) are refused naming the file."""
    p = _st(tmp_path / "h.safetensors", raw=raw.encode(), data=b"Z")
    _all_refuse(p, words)


@pytest.mark.parametrize("bad", [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
                                 b"\xef\xbb\xbf"], ids=["ff", "overlong", "surrogate", "past_10ffff",
                                                        "cut_sequence", "bom_inside"])
def test_names_not_utf8_are_refused(tmp_path, bad):
    """A tensor name holding bytes that are not UTF-8 (or a BOM before the object) is refused, named."""
    raw = b'{"a' + bad + b'":{' + U8.encode() + b'}}' if bad != b"\xef\xbb\xbf" else bad + b'{"a":{' + \
        U8.encode() + b'}}'
    p = _st(tmp_path / "u.safetensors", raw=raw, data=b"Z")
    _all_refuse(p, "header is not JSON")


def test_strange_but_valid_names_and_shapes_load_right(tmp_path):
    """Empty, 1 MB long, non-BMP and U+FFFF names, 64 dims, a scalar and empty tensors sharing an offset load right."""
    long = "n" * (1 << 20)
    header = {"": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              long: {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]},
              "a\U0001F600": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]},
              "b\uffff": {"dtype": "U8", "shape": [1], "data_offsets": [3, 4]},
              "deep": {"dtype": "U8", "shape": [1] * 64, "data_offsets": [4, 5]},
              "scalar": {"dtype": "F32", "shape": [], "data_offsets": [5, 9]},
              "e1": {"dtype": "U8", "shape": [0], "data_offsets": [9, 9]},
              "e2": {"dtype": "F32", "shape": [0, 7], "data_offsets": [9, 9]},
              "huge_empty": {"dtype": "U8", "shape": [0, 2**63 - 1], "data_offsets": [9, 9]},
              "__metadata__": {"k": "v\u00e9"}}
    data = b"ABCDE" + np.float32(2.5).tobytes()
    p = _st(tmp_path / "odd.safetensors", header, data)
    h, start = read_header(p)
    assert h == header and start == os.path.getsize(p) - len(data)
    got = sluice.load(p, device="numpy")
    assert bytes(got[""]) == b"A" and bytes(got[long]) == b"B" and bytes(got["a\U0001F600"]) == b"C"
    assert bytes(got["b\uffff"]) == b"D" and got["deep"].shape == (1,) * 64 and got["deep"].item() == ord("E")
    assert got["scalar"].shape == () and got["scalar"] == np.float32(2.5)
    assert got["e1"].size == 0 and got["e2"].shape == (0, 7) and got["huge_empty"].shape == (0, 2**63 - 1)


def _deep(tmp_path, depth):
    raw = ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":%s}}' % ("[" * depth + "]" * depth)).encode()
    return _st(tmp_path / "deep.safetensors", raw=raw, data=b"Z")


def test_nesting_past_serde_jsons_limit_is_refused_by_the_cli_too(tmp_path):
    """A header nested 1500 deep in a tensor's extra key: the CLI refuses it as Python does (safetensors' serde_json
    stops at 128 levels), naming the file; 100 deep it lists it."""
    p = _deep(tmp_path, 1500)
    r = _cli("--list", "--host", p)
    assert r.returncode != 0 and p in r.stderr and "nested deeper than 128 levels" in r.stderr, r.stderr
    r = _cli("--list", "--host", _deep(tmp_path, 100))
    assert r.returncode == 0 and r.stdout.startswith("a "), r.stderr


def test_nesting_past_pythons_limit_is_read_or_refused_named(tmp_path):
    """A header nested 1500 deep (past Python's recursion limit, within jansson's) loads, or is a named error."""
    p = _deep(tmp_path, 1500)
    try:
        got = sluice.load(p, device="numpy")
    except ERR as e:
        assert p in str(e)
    else:
        assert bytes(got["a"]) == b"Z"


def test_empty_tensor_with_huge_dims_loads_or_is_named(tmp_path):
    """An empty tensor of shape [0, 2^62, 2^62] (accepted by the header check) loads, or is a SluiceError named."""
    p = _st(tmp_path / "zh.safetensors", {"t": {"dtype": "U8", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}})
    _all_refuse(p, "'t'", "span more than 2^63 - 1 bytes")
    try:
        got = sluice.load(p, device="numpy")
    except ERR as e:
        assert p in str(e) and "'t'" in str(e)
    else:
        assert got["t"].size == 0


def test_huge_dims_before_a_zero_are_refused(tmp_path):
    """[2^62, 2^62, 0] (an overflow met before the zero) is refused, named, not wrapped to a wrong size."""
    p = _st(tmp_path / "hz.safetensors", {"t": {"dtype": "U8", "shape": [2**62, 2**62, 0], "data_offsets": [0, 0]}})
    _all_refuse(p, "'t'", "overflows 64 bits")


# ---------------------------------------------------------------- the file changes between two reads

CUT_AFTER_OPEN = """
    import json, os, struct, sluice
    from sluice import _safetensors as st
    from st_header import read_header
    from sluice._lib import lib
    p, hdrlen, cut = {p!r}, {n}, {cut}
    hj = {one!r}
    hj += b" " * (hdrlen - len(hj))
    open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + b"xyz")
    f = st.open_file(p, 0)
    os.truncate(p, cut)
    try:
        print("HEADER", read_header(p, f))
    except sluice.SluiceError as e:
        print("ERR", e.code, e)
    lib.sluice_file_close(f)
"""


@pytest.mark.parametrize("n,cut", [(100, 20), (100, 0), (100, 108), (200000, 70000), (200000, 100)],
                         ids=["into_header", "to_empty", "data_only", "big_header_past_first_read",
                              "big_header_in_first_read"])
def test_file_cut_short_between_open_and_header_read(tmp_path, n, cut):
    """A file cut short after its handle was opened and before read_header reads through it: a SluiceError."""
    r = _child(CUT_AFTER_OPEN.format(p=str(tmp_path / "c.safetensors"), n=n, cut=cut, one=ONE))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.startswith("ERR ") and str(tmp_path / "c.safetensors") in r.stdout, r.stdout


def test_file_cut_after_its_header_read_keeps_a_header_read_through_the_handle(tmp_path):
    """A big header read through a handle whose file lost only data bytes since: the header read is still right."""
    r = _child(CUT_AFTER_OPEN.format(p=str(tmp_path / "c.safetensors"), n=200000, cut=200008, one=ONE))
    assert r.returncode == 0 and r.stdout.startswith("HEADER ({'a'"), (r.stdout, r.stderr)


def test_file_replaced_by_rename_after_open_reads_the_old_header(tmp_path):
    """A file replaced by rename between open and header read: the header read is the opened (old) file's."""
    p = _st(tmp_path / "m.safetensors", raw=ONE, data=b"xyz")
    f = st.open_file(p, 0)
    try:
        _st(tmp_path / "new", {"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"q")
        os.replace(tmp_path / "new", p)
        assert read_header(p, f) == (json.loads(ONE), 8 + len(ONE))
    finally:
        lib.sluice_file_close(f)


H1 = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [4],
                                                                       "data_offsets": [4, 8]}}
H2 = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}, "b": {"dtype": "U8", "shape": [4],
                                                                       "data_offsets": [0, 4]}}


def _between_header_and_data(monkeypatch, change):
    """Runs change() once, after load has read the headers and before it reads the data."""
    orig, done = checkpoint._read_ranges, []

    def wrapped(*a, **k):
        if not done:
            done.append(1)
            change()
        return orig(*a, **k)
    monkeypatch.setattr(checkpoint, "_read_ranges", wrapped)


def test_replaced_by_rename_between_header_and_data_loads_the_old_whole(tmp_path, monkeypatch):
    """A file replaced by rename after its header was read: load gives the old version whole."""
    p = _st(tmp_path / "m.safetensors", H1, b"AAAABBBB")
    _between_header_and_data(monkeypatch, lambda: (_st(tmp_path / "n", H2, b"XXXXYYYY"),
                                                    os.replace(tmp_path / "n", p)))
    got = sluice.load(p, device="numpy")
    assert bytes(got["a"]) == b"AAAA" and bytes(got["b"]) == b"BBBB"


def test_grown_between_header_and_data_is_read_again_and_named(tmp_path, monkeypatch):
    """A file appended to after its header was read (written to in place, as sluice_ckpt_load sees it): load starts
    again, and the file as it is now (trailing bytes) is an error naming it, never a short or mixed tensor."""
    p = _st(tmp_path / "m.safetensors", H1, b"AAAABBBB")

    def grow():
        with open(p, "ab") as f:
            f.write(b"more")
    _between_header_and_data(monkeypatch, grow)
    _refused(lambda q: sluice.load(q, device="numpy"), p, "trailing bytes")


def test_cut_short_between_header_and_data_is_an_error_naming_it(tmp_path, monkeypatch):
    """A file cut short after its header was read: load starts again and fails naming the file, no short tensor."""
    p = _st(tmp_path / "m.safetensors", H1, b"AAAABBBB")
    _between_header_and_data(monkeypatch, lambda: os.truncate(p, os.path.getsize(p) - 3))
    _refused(lambda q: sluice.load(q, device="numpy"), p, "'b' ends at 8, past the 5 data bytes")


def test_rewritten_in_place_between_header_and_data_is_never_mixed(tmp_path, monkeypatch):
    """A file rewritten in place after its header was read: an error, or one version whole, never a mix."""
    p = _st(tmp_path / "m.safetensors", H1, b"AAAABBBB")
    new = open(_st(tmp_path / "n", H2, b"BBBBAAAA"), "rb").read()
    assert len(new) == os.path.getsize(p)

    def rewrite():
        with open(p, "r+b") as f:
            f.write(new)
    _between_header_and_data(monkeypatch, rewrite)
    try:
        got = sluice.load(p, device="numpy")
    except ERR as e:
        assert p in str(e)
    else:
        assert (bytes(got["a"]), bytes(got["b"])) == (b"AAAA", b"BBBB"), {k: bytes(v) for k, v in got.items()}


# ---------------------------------------------------------------- over http: credentials, changes, bytes

def test_no_credential_in_any_message(tmp_path):
    """Bad, short, missing and over-long-header files over http with user:password@ and a query: no secret shown."""
    www = tmp_path / "www"
    www.mkdir()
    _st(www / "bad.safetensors", raw=b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}}', data=b"Z")
    (www / "short.safetensors").write_bytes(b"123")
    (www / "len.safetensors").write_bytes(struct.pack("<Q", 2**63) + b"{}")
    _st(www / "nan.safetensors", raw=b'{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,1]}}', data=b"Z")
    with webserver.PlainServer(www) as w:
        for name, words in (("bad", "do not hold 2 U8"), ("short", "shorter than 8"), ("missing", "HTTP 404"),
                            ("len", "header of 9223372036854775808"), ("nan", "header is not JSON")):
            url = w.url(f"{name}.safetensors").replace("http://", "http://alice:s3cr3tpw@") + \
                "?X-Amz-Signature=t0k3nvalue&sig=zz"
            for fn in (read_header, lambda u: sluice.load(u, device="numpy"), checkpoint._listing):
                with pytest.raises(ERR) as e:
                    fn(url)
                msg = str(e.value)
                assert words in msg and "alice:***@" in msg and f"/{name}.safetensors" in msg, msg
                assert "s3cr3tpw" not in msg and "t0k3n" not in msg and "sig=" not in msg, msg
            r = _cli("--list", "--host", url)
            assert r.returncode != 0 and words in r.stderr, r.stderr
            assert "s3cr3tpw" not in r.stdout + r.stderr and "t0k3n" not in r.stdout + r.stderr


def test_valid_file_over_http_loads_every_byte(tmp_path):
    """A file with a header past the first 64 KiB read, over http with a password: every byte loads right."""
    www = tmp_path / "www"
    www.mkdir()
    rng = np.random.default_rng(7)
    want = {"w": rng.standard_normal((33, 17)).astype(np.float32), "i": rng.integers(-9, 9, 1001, dtype=np.int64)}
    sluice.save(want, str(www / "m.safetensors"), metadata={"pad": "p" * 100000})
    with webserver.PlainServer(www) as w:
        url = w.url("m.safetensors").replace("http://", "http://u:pw@")
        h, start = read_header(url)
        assert h["__metadata__"]["pad"] == "p" * 100000 and start > 65536
        got = sluice.load(url, device="numpy")
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
        r = _cli("--list", "--host", url)
        assert r.returncode == 0 and "pw@" not in r.stdout + r.stderr


SERVER = """
    import http.server, struct, sys, threading
    import sluice
    from sluice import _safetensors as st, checkpoint
    from st_header import read_header
    mode, call = {mode!r}, {call!r}
    hj = {one!r}
    body = struct.pack("<Q", len(hj)) + hj + b"xyz"
    seen = [0]

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass
        def do_HEAD(self):
            self.answer(False)
        def do_GET(self):
            self.answer(True)
        def answer(self, get):
            seen[0] += 1
            etag = '"v%d"' % (seen[0] if mode == "etag" else 1)  # "etag": a new version at every request
            if get and (mode == "500" or (mode == "etag" and self.headers.get("If-Match", etag) != etag)):
                self.send_response(500 if mode == "500" else 412)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            b, status = body, 200
            rng = self.headers.get("Range")
            if rng and get:
                a, z = (int(x) for x in rng.split("=")[1].split("-"))
                z = min(z, len(body) - 1)
                b, status = body[a:z + 1], 206
            self.send_response(status)
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (a, z, len(body)))
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            if get:
                self.wfile.write(b[:5] if mode == "short" else b)  # "short": the body cut off mid-way
                if mode == "short":
                    self.close_connection = True

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://u:s3cr3t@127.0.0.1:%d/m.safetensors" % srv.server_address[1]
    fn = dict(header=read_header, load=lambda u: sluice.load(u, device="numpy"), listing=checkpoint._listing)[call]
    try:
        fn(url)
        print("LOADED")
    except sluice.SluiceError as e:
        print("ERR", e.code, e)
"""


@pytest.mark.parametrize("mode,call", [("etag", "header"), ("etag", "load"), ("500", "listing"), ("short", "load")])
def test_header_read_failing_over_http_is_an_error(mode, call):
    """A header read that fails over http (object changed since open, 500, body cut short): a SluiceError, no crash."""
    r = _child(SERVER.format(mode=mode, call=call, one=ONE), timeout=60)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.startswith("ERR ") and "m.safetensors" in r.stdout and "s3cr3t" not in r.stdout, r.stdout


# ---------------------------------------------------------------- names from outside

@pytest.mark.parametrize("name", ["../secret.safetensors", "/abs/secret.safetensors", "%2e%2e%2fsecret.safetensors",
                                  "..\\secret.safetensors", "sub/../../secret.safetensors", "a\nb.safetensors", ""])
def test_index_names_that_escape_are_refused(tmp_path, name):
    """An index naming a file outside its directory (.., absolute, encoded, backslash, control char) is refused."""
    sluice.save({"w": np.arange(3, dtype=np.float32)}, str(tmp_path / "secret.safetensors"))
    (tmp_path / "ck").mkdir()
    idx = tmp_path / "ck" / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": {"w": name}}))
    _refused(lambda q: sluice.load(q, device="numpy"), str(idx), "not a file beside the index")
    _refused(checkpoint._listing, str(idx), "not a file beside the index")


def test_path_with_a_nul_byte_is_refused(tmp_path):
    """A path with an embedded NUL byte is refused, not cut short to name another file."""
    good = str(tmp_path / "good.safetensors")
    sluice.save({"w": np.arange(3, dtype=np.float32)}, good)
    for fn in (read_header, lambda q: sluice.load(q, device="numpy"), checkpoint._listing):
        try:
            got = fn(good + "\0.index.json")
        except (ValueError, ERR):
            continue
        raise AssertionError(f"read {good!r} for a name with a NUL: {got!r}"[:300])


def test_cli_shows_control_characters_in_names_harmlessly(tmp_path):
    """A tensor name holding a newline and an escape sequence is listed with them replaced, not forging lines."""
    p = _st(tmp_path / "esc.safetensors", {"a\nfake F32 [9]\x1b[31m": {"dtype": "U8", "shape": [1],
                                                                          "data_offsets": [0, 1]}}, b"Z")
    r = _cli("--list", "--host", p)
    assert r.returncode == 0 and "\x1b" not in r.stdout and r.stdout.splitlines()[0].startswith("a?fake"), r.stdout
    assert checkpoint._listing(p) == {"a\nfake F32 [9]\x1b[31m": ("U8", (1,))}


# ---------------------------------------------------------------- valid files load right

def test_files_written_by_safetensors_load_every_byte(tmp_path):
    """Files the safetensors package writes (unaligned data, many dtypes) load byte for byte, header as written."""
    sfn = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(3)
    want = {"f64": rng.standard_normal((3, 5)), "f32": rng.standard_normal(7).astype(np.float32),
            "f16": rng.standard_normal((2, 2)).astype(np.float16), "i8": rng.integers(-128, 127, 9, dtype=np.int8),
            "u16": rng.integers(0, 60000, 5, dtype=np.uint16), "i64": rng.integers(-2**62, 2**62, 3, dtype=np.int64),
            "b": rng.integers(0, 2, 6).astype(np.bool_), "c64": (rng.standard_normal(4) + 1j).astype(np.complex64),
            "empty": np.zeros((0, 3), np.float32), "scalar": np.array(7, np.int32)}
    p = str(tmp_path / "hf.safetensors")
    sfn.save_file(want, p, metadata={"m": "1"})
    h, start = read_header(p)
    assert h == json.loads(open(p, "rb").read(start)[8:]) and h["__metadata__"] == {"m": "1"}
    got = sluice.load(p, device="numpy")
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes(), k
    assert checkpoint._listing(p) == {k: (h[k]["dtype"], tuple(v.shape)) for k, v in want.items()}
