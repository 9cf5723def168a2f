"""LitData's optimized chunks (its PyTreeLoader format) read in place, held against LitData's own writer and
reader where the package is installed (it needs torch: skipped, saying so, where it is not); and, everywhere,
against chunks written here as LitData lays them out (index.json's chunks and config; a chunk's u32 count and
u32 offsets; a sample's u32 leaf sizes, then its leaves).  Hostile ones are refused by name: compressed chunks,
another item loader, nested samples, a chunk name that leaves the directory, an int leaf of the wrong size."""
import json
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
        assert bytes(r["text"]) == t and r["label"][0] == struct.unpack("<q", lab)[0]
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
        assert bytes(got["text"]).decode() == want["text"] and got["label"][0] == want["label"]
        assert got["score"][0] == want["score"] and bool(got["flag"][0]) == want["flag"]
        assert np.array_equal(got["vec"], want["vec"]) and bytes(got["raw"]) == want["raw"]
