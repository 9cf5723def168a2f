"""LitData's optimized chunks (its PyTreeLoader format) read in place, held against LitData's own writer and
reader where the package is installed (it needs torch: skipped, saying so, where it is not); and, everywhere,
against chunks written here as LitData lays them out (index.json's chunks and config; a chunk's u32 count and
u32 offsets; a sample's u32 leaf sizes, then its leaves).  Hostile ones are refused by name: compressed chunks,
another item loader, nested samples, a chunk name that leaves the directory, an int leaf of the wrong size."""
import json
import os
import struct

import numpy as np
import pytest

import sluice


def _chunk(samples):
    head = 4 + 4 * (len(samples) + 1)
    body = [struct.pack(f"<{len(s)}I", *map(len, s)) + b"".join(s) for s in samples]
    offs, at = [], head
    for b in body:
        offs.append(at)
        at += len(b)
    offs.append(at)
    return struct.pack("<I", len(samples)) + struct.pack(f"<{len(offs)}I", *offs) + b"".join(body)


def _spec(keys):
    leaf = {"type": None, "context": None, "children_spec": []}
    return json.dumps([1, {"type": "builtins.dict", "context": json.dumps(keys), "children_spec": [leaf] * len(keys)}])


def _write(d, chunks, config=None, names=None):
    d.mkdir(exist_ok=True)
    index = {"chunks": [], "config": {"chunk_bytes": 1 << 20, "chunk_size": None, "compression": None,
                                      "data_format": ["str", "int", "no_header_numpy:9", "bytes"],
                                      "data_spec": _spec(["text", "label", "vec", "raw"]), "encryption": None,
                                      "item_loader": "PyTreeLoader"}, "updated_at": "0"}
    index["config"].update(config or {})
    for k, samples in enumerate(chunks):
        name = (names or {}).get(k, f"chunk-0-{k}.bin")
        (d / f"chunk-0-{k}.bin").write_bytes(_chunk(samples))
        index["chunks"].append({"chunk_bytes": 0, "chunk_size": len(samples), "dim": None, "filename": name})
    (d / "index.json").write_text(json.dumps(index))


def _samples(n, seed):
    rng = np.random.default_rng(seed)
    return [[f"t{seed}-{i}".encode(), struct.pack("<q", i - 5), rng.random(int(rng.integers(0, 6))).astype(
        np.float32).tobytes(), rng.bytes(int(rng.integers(0, 20)))] for i in range(n)]


def test_chunks_read_as_laid_out(tmp_path):
    chunks = [_samples(30, 1), _samples(12, 2)]
    _write(tmp_path / "ds", chunks)
    ds = sluice.Dataset(str(tmp_path / "ds"))
    assert ds.format == "litdata" and len(ds) == 42
    assert dict((n, (t, s)) for n, t, s in ds.fields) == {"text": ("bytes", ()), "label": ("i64", ()),
                                                          "vec": ("f32", (-1,)), "raw": ("bytes", ())}
    for i, (t, lab, vec, raw) in enumerate(s for c in chunks for s in c):
        r = ds[i]
        assert bytes(r["text"]) == t and r["label"] == struct.unpack("<q", lab)[0]
        assert r["vec"].tobytes() == vec and bytes(r["raw"]) == raw


@pytest.mark.parametrize("harm,words", [
    ("compressed", "compressed or encrypted"),
    ("loader", "PyTreeLoader"),
    ("nested", "nested container"),
    ("escape", "is not a file of the directory"),
    ("int_size", "not whole values of 8 bytes"),
])
def test_hostile_chunks_are_refused_by_name(tmp_path, harm, words):
    d = tmp_path / "ds"
    samples = _samples(10, 1)
    config, names = None, None
    if harm == "compressed":
        config = {"compression": "zstd"}
    elif harm == "loader":
        config = {"item_loader": "TokensLoader"}
    elif harm == "nested":
        spec = json.loads(_spec(["text", "label", "vec", "raw"]))
        spec[1]["children_spec"][1] = json.loads(_spec(["x"]))[1]
        config = {"data_spec": json.dumps(spec)}
    elif harm == "escape":
        names = {0: "../chunk-0-0.bin"}
    else:
        samples[3][1] = b"\x01\x02\x03"
    _write(d, [samples], config=config, names=names)
    if harm == "int_size":
        ds = sluice.Dataset(str(d))
        with pytest.raises(sluice.SluiceError, match=words):
            ds[3]
        return
    with pytest.raises(sluice.SluiceError, match=words):
        sluice.Dataset(str(d))


def test_litdatas_own_writer_and_reader(tmp_path):
    pytest.importorskip("litdata", reason="LitData (it needs torch)")
    from litdata import StreamingDataset
    from litdata.streaming.writer import BinaryWriter
    w = BinaryWriter(str(tmp_path / "out"), chunk_bytes="16KB")
    rng = np.random.default_rng(0)
    for i in range(300):
        w[i] = {"text": f"t{i} é", "label": i % 5 - 2, "score": i / 3, "flag": bool(i % 2),
                "vec": rng.random(int(rng.integers(1, 6))).astype(np.float32), "raw": bytes([i % 256]) * (i % 9)}
    w.done()
    w.merge()
    ds = sluice.Dataset(str(tmp_path / "out"))
    theirs = StreamingDataset(str(tmp_path / "out"))
    assert len(ds) == len(theirs) == 300
    for i in range(300):
        want, got = theirs[i], ds[i]
        assert bytes(got["text"]).decode() == want["text"] and got["label"] == want["label"]
        assert got["score"] == want["score"] and bool(got["flag"]) == want["flag"]
        assert np.array_equal(got["vec"], want["vec"]) and bytes(got["raw"]) == want["raw"]


# ---- Chunks whose samples are only in their Arrow row footer (LitData's default for flat dicts of strings and
# numbers: the items are empty, the rows an Arrow IPC table after them, its u32 length, then b"LDARW01\0") ----

def _arrow_chunk(rows, stream=False, **ipc):
    """A chunk as LitData's writer lays out such rows: u32 count, count + 1 offsets all at the header's end (every
    item empty), then the rows as an Arrow IPC file (stream: an IPC stream, as older LitData wrote), in record
    batches of 256 rows, its length and the magic."""
    pa = pytest.importorskip("pyarrow")
    n = len(rows)
    head = 4 + 4 * (n + 1)
    keys = list(dict.fromkeys(k for r in rows for k in r))  # every row's keys, as LitData unifies them
    table = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])
    sink = pa.BufferOutputStream()
    opts = {"options": pa.ipc.IpcWriteOptions(**ipc)} if ipc else {}
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema, **opts) as w:
        for s in range(0, n, 256):
            w.write_table(table.slice(s, min(256, n - s)))
    blob = sink.getvalue().to_pybytes()
    return struct.pack(f"<{n + 2}I", n, *[head] * (n + 1)) + blob + struct.pack("<I", len(blob)) + b"LDARW01\0"


def _arrow_rows(n, seed):
    rng = np.random.default_rng(seed)
    return [{"text": f"r{seed}-{i} é" * int(rng.integers(0, 4)), "label": int(rng.integers(-1 << 40, 1 << 40)),
             "score": float(rng.random()), "flag": bool(i % 3), "raw": rng.bytes(int(rng.integers(0, 30)))}
            for i in range(n)]


def _write_arrow(d, chunks, keys=("text", "label", "score", "flag", "raw"),
                 formats=("str", "int", "float", "bool", "bytes"), **kw):
    """chunks: lists of rows (dicts) written as Arrow-footer chunks, or bytes written as they are."""
    d.mkdir(exist_ok=True)
    index = {"chunks": [], "config": {"chunk_bytes": 1 << 20, "chunk_size": None, "compression": None,
                                      "data_format": list(formats), "data_spec": _spec(list(keys)),
                                      "encryption": None, "item_loader": "PyTreeLoader",
                                      "types": {k: f for k, f in zip(keys, formats)}}, "updated_at": "0"}
    for k, rows in enumerate(chunks):
        data = rows if isinstance(rows, bytes) else _arrow_chunk(rows, **kw)
        (d / f"chunk-0-{k}.bin").write_bytes(data)
        n = struct.unpack_from("<I", data)[0]
        index["chunks"].append({"chunk_bytes": len(data), "chunk_size": n, "dim": None, "filename": f"chunk-0-{k}.bin"})
    (d / "index.json").write_text(json.dumps(index))


def _same_rows(ds, rows):
    assert len(ds) == len(rows)
    for i, want in enumerate(rows):
        got = ds[i]
        assert bytes(got["text"]).decode() == want["text"] and got["label"] == want["label"], i
        assert got["score"] == want["score"] and bool(got["flag"]) == want["flag"]
        assert bytes(got["raw"]) == want["raw"]


@pytest.mark.parametrize("kind", ["file", "stream", "zstd"])
def test_arrow_footer_chunks_are_read(tmp_path, kind):
    """Each row is the record LitData's reader gives (it failed every read: "0 bytes cannot hold its 2 sizes"):
    strings and bytes, i64, f64, bool as u8; IPC files, the streams older LitData wrote, zstd-compressed buffers
    (its compression="zstd"); several record batches a chunk, several chunks; the loader reads every one once."""
    chunks = [_arrow_rows(700, 1), _arrow_rows(3, 2), _arrow_rows(256, 3)]
    kw = {"stream": True} if kind == "stream" else {"compression": "zstd"} if kind == "zstd" else {}
    _write_arrow(tmp_path / "ds", chunks, **kw)
    ds = sluice.Dataset(str(tmp_path / "ds"))
    assert ds.format == "litdata" and ds.shards == 3
    assert [(n, t) for n, t, _ in ds.fields] == [("text", "bytes"), ("label", "i64"), ("score", "f64"),
                                                   ("flag", "u8"), ("raw", "bytes")]
    rows = [r for c in chunks for r in c]
    _same_rows(ds, rows)
    seen = []
    for b in sluice.Loader(ds, 32, seed=4, rank=0, world_size=1, drop_last=False):
        for j, i in enumerate(b["ids"]):
            seen.append(int(i))
            assert b["label"][j] == rows[int(i)]["label"] and bool(b["flag"][j]) == rows[int(i)]["flag"]
    assert sorted(set(seen)) == list(range(len(rows)))
    import subprocess
    r = subprocess.run([os.environ.get("SLUICE_BIN", "build/sluice"), "verify", str(tmp_path / "ds")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_arrow_and_item_chunks_in_one_dataset(tmp_path):
    """A chunk LitData wrote with items (a sample it could not put in Arrow) beside Arrow-footer ones: both read."""
    rows = _arrow_rows(40, 5)
    items = [[r["text"].encode(), struct.pack("<q", r["label"]), struct.pack("<d", r["score"]), bytes([r["flag"]]),
              r["raw"]] for r in rows[:15]]
    _write_arrow(tmp_path / "ds", [_chunk(items), rows[15:]])
    ds = sluice.Dataset(str(tmp_path / "ds"))
    _same_rows(ds, rows)
    ids = sorted(int(i) for b in sluice.Loader(ds, 8, seed=1, rank=0, world_size=1) for i in b["ids"])
    assert ids == list(range(40))


@pytest.mark.parametrize("harm,words", [
    ("null", "row 7: column 'text' is null"),
    ("list", "column 'tok' is of Arrow type list"),
    ("uint64", "uint64, which sluice has no type for"),
    ("extra", "a sample with keys the first did not have"),
    ("lz4", "compressed with LZ4"),
    ("count", "rows in its Arrow footer, 10 samples"),
    ("length", "runs past the chunk"),
    ("cut", "Arrow"),
    ("no_footer", "no Arrow row footer"),
])
def test_hostile_arrow_chunks_are_refused_by_name(tmp_path, harm, words):
    pa = pytest.importorskip("pyarrow")
    rows = _arrow_rows(10, 6)
    keys, formats = ("text", "label", "score", "flag", "raw"), ("str", "int", "float", "bool", "bytes")
    kw = {}
    if harm == "null":
        rows[7]["text"] = None
    elif harm == "list":
        for r in rows:
            r["tok"] = [1, 2]
        keys, formats = keys + ("tok",), formats + ("int",)
    elif harm == "uint64":
        data = _arrow_chunk(rows)
    elif harm == "extra":
        rows[3]["more"] = "x"
    elif harm == "lz4":
        kw = {"compression": "lz4"}
    data = _arrow_chunk(rows, **kw) if harm != "uint64" else None
    if harm == "uint64":
        table = pa.table({"text": [r["text"] for r in rows], "label": pa.array(range(10), pa.uint64()),
                          "score": [r["score"] for r in rows], "flag": [r["flag"] for r in rows],
                          "raw": [r["raw"] for r in rows]})
        data = _arrow_chunk(table.to_pylist())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        blob = sink.getvalue().to_pybytes()
        data = data[:4 * 12] + blob + struct.pack("<I", len(blob)) + b"LDARW01\0"
    elif harm == "count":
        data = struct.pack("<12I", 10, *[4 * 12] * 11) + _arrow_chunk(rows[:9])[4 * 11:]  # 10 items, 9 rows
    elif harm == "length":
        data = data[:-12] + struct.pack("<I", len(data)) + data[-8:]
    elif harm == "cut":
        blob_len = struct.unpack_from("<I", data, len(data) - 12)[0]
        start = len(data) - 12 - blob_len
        data = data[:start] + data[start:start + blob_len // 2] + struct.pack("<I", blob_len // 2) + b"LDARW01\0"
    elif harm == "no_footer":
        data = data[:4 * 12]
    _write_arrow(tmp_path / "ds", [data], keys=keys, formats=formats)
    with pytest.raises(sluice.SluiceError, match=words) as e:
        sluice.Dataset(str(tmp_path / "ds"))
    assert "chunk-0-0.bin" in str(e.value)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_litdatas_own_arrow_chunks(tmp_path, compression):
    """LitData's own writer and reader for what the issue met: a flat dict of strings and ints (and floats, bools,
    bytes), which its writer keeps only in the Arrow footer; every record equal to its StreamingDataset's."""
    pytest.importorskip("litdata", reason="LitData (it needs torch)")
    from litdata import StreamingDataset
    from litdata.streaming.writer import BinaryWriter
    w = BinaryWriter(str(tmp_path / "out"), chunk_bytes="16KB", compression=compression)
    for i in range(1500):
        w[i] = {"text": f"t{i} é" * (i % 4), "label": i % 5 - 2, "score": i / 3, "flag": bool(i % 2),
                "raw": bytes([i % 256]) * (i % 9)}
    w.done()
    w.merge()
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert len(index["chunks"]) > 1 and index["config"].get("types")
    first = (tmp_path / "out" / index["chunks"][0]["filename"]).read_bytes()
    assert first.endswith(b"LDARW01\0")  # the layout the test is about
    ds = sluice.Dataset(str(tmp_path / "out"))
    theirs = StreamingDataset(str(tmp_path / "out"))
    assert len(ds) == len(theirs) == 1500
    for i in range(1500):
        want, got = theirs[i], ds[i]
        assert set(want) == {n for n, _, _ in ds.fields}
        assert bytes(got["text"]).decode() == want["text"] and got["label"] == want["label"]
        assert got["score"] == want["score"] and bool(got["flag"]) == want["flag"]
        assert bytes(got["raw"]) == want["raw"]
    ids = sorted(int(i) for b in sluice.Loader(ds, 50, seed=2, rank=0, world_size=1) for i in b["ids"])
    assert ids == list(range(1500))


def test_an_arrow_chunk_replaced_after_open_is_stale_not_laid_out_wrong(tmp_path):
    """The chunk rewritten (other rows, its size kept or not) after the dataset opened: a read fails -ESTALE, never
    rows laid out from the old batches' places."""
    import time
    rows = _arrow_rows(30, 7)
    _write_arrow(tmp_path / "ds", [rows])
    ds = sluice.Dataset(str(tmp_path / "ds"))
    time.sleep(0.01)
    new = tmp_path / "ds" / "new.bin"
    new.write_bytes(_arrow_chunk(_arrow_rows(30, 8)))
    os.replace(new, tmp_path / "ds" / "chunk-0-0.bin")
    with pytest.raises(sluice.SluiceError, match="replaced or rewritten since the dataset was opened"):
        ds[0]
