"""MosaicML Streaming's MDS datasets read in place, held against Streaming's own writer and reader where the
package is installed (it needs torch: skipped, saying so, where it is not); and, everywhere, against MDS files
written here as the format lays them out (index.json; a shard's u32 count, u32 offsets, the writer's config, the
samples: each the u32 sizes of its variable columns, then its columns).  Hostile indexes and shards are refused
by name: a shard name that leaves the directory, a count that differs from the file's, offsets out of order or
past the file, a sample whose sizes run past it, uint64 and compressed shards."""
import json
import os
import struct

import numpy as np
import pytest

import sluice


def _shard(samples):
    """A shard file's bytes: samples are lists of column bytes; variable columns (all here) carry their sizes."""
    config = b'{"version": 2}'
    head = 4 + 4 * (len(samples) + 1)
    body = [struct.pack(f"<{len(s)}I", *map(len, s)) + b"".join(s) for s in samples]
    offs, at = [], head + len(config)
    for b in body:
        offs.append(at)
        at += len(b)
    offs.append(at)
    return struct.pack("<I", len(samples)) + struct.pack(f"<{len(offs)}I", *offs) + config + b"".join(body)


def _write(d, shards, names=("text", "raw"), encodings=("str", "bytes"), sizes=(None, None), patch=None):
    d.mkdir(exist_ok=True)
    index = {"version": 2, "shards": []}
    for k, samples in enumerate(shards):
        name = f"shard.{k:05}.mds"
        (d / name).write_bytes(_shard(samples))
        index["shards"].append({"column_encodings": list(encodings), "column_names": list(names),
                                "column_sizes": list(sizes), "compression": None, "format": "mds",
                                "hashes": [], "raw_data": {"basename": name, "bytes": 0, "hashes": {}},
                                "samples": len(samples), "size_limit": 1 << 26, "version": 2, "zip_data": None})
    if patch:
        patch(index)
    (d / "index.json").write_text(json.dumps(index))


def _samples(n, seed):
    rng = np.random.default_rng(seed)
    return [[f"s{seed}-{i}".encode(), rng.bytes(int(rng.integers(0, 50)))] for i in range(n)]


def test_mds_files_read_as_laid_out(tmp_path):
    shards = [_samples(40, 1), _samples(25, 2), _samples(1, 3)]
    _write(tmp_path / "ds", shards)
    ds = sluice.Dataset(str(tmp_path / "ds"))
    flat = [s for sh in shards for s in sh]
    assert ds.format == "mds" and len(ds) == 66 and ds.shards == 3
    assert all(bytes(ds[i]["text"]) == t and bytes(ds[i]["raw"]) == r for i, (t, r) in enumerate(flat))
    ids = sorted(int(i) for b in sluice.Loader(ds, 8, seed=2, rank=0, world_size=1, drop_last=True) for i in b["ids"])
    assert len(ids) == len(set(ids)) == 64


@pytest.mark.parametrize("harm,words", [
    ("escape", "is not a file of the directory"),
    ("count", "samples in the file"),
    ("order", "out of order or outside the file"),
    ("uint64", "uint64"),
    ("compressed", "compressed shards"),
    ("sizes", "run past"),
])
def test_hostile_mds_is_refused_by_name(tmp_path, harm, words):
    d = tmp_path / "ds"
    patch = None
    if harm == "escape":
        def patch(ix):
            ix["shards"][0]["raw_data"]["basename"] = "../../etc/passwd"
    elif harm == "count":
        def patch(ix):
            ix["shards"][0]["samples"] = 41
    elif harm == "uint64":
        def patch(ix):
            ix["shards"][0]["column_encodings"][1] = "uint64"
            ix["shards"][0]["column_sizes"][1] = 8
    elif harm == "compressed":
        def patch(ix):
            ix["shards"][0]["raw_data"] = None
            ix["shards"][0]["zip_data"] = {"basename": "shard.00000.mds.zstd", "bytes": 1, "hashes": {}}
    _write(d, [_samples(40, 1)], patch=patch)
    if harm == "order":
        b = bytearray((d / "shard.00000.mds").read_bytes())
        b[4 + 4 * 5:4 + 4 * 6] = struct.pack("<I", 10 ** 6)  # sample 4's end, far past the file
        (d / "shard.00000.mds").write_bytes(bytes(b))
    if harm == "sizes":
        b = bytearray((d / "shard.00000.mds").read_bytes())
        first = struct.unpack("<I", b[4:8])[0]
        b[first:first + 4] = struct.pack("<I", 10 ** 6)  # sample 0's text size
        (d / "shard.00000.mds").write_bytes(bytes(b))
        ds = sluice.Dataset(str(d))
        with pytest.raises(sluice.SluiceError, match=words):
            ds[0]
        return
    with pytest.raises(sluice.SluiceError, match=words):
        sluice.Dataset(str(d))


def test_streamings_own_writer_and_reader(tmp_path):
    streaming = pytest.importorskip("streaming", reason="MosaicML Streaming (it needs torch)")
    from PIL import Image
    from streaming.base.format import reader_from_json
    from streaming.base.format.mds.encodings import mds_decode
    cols = {"text": "str", "label": "int", "img": "jpeg", "vec": "ndarray:float32:4", "tok": "ndarray",
            "raw": "bytes", "u8": "uint8", "f": "float64"}
    rng = np.random.default_rng(0)
    with streaming.MDSWriter(out=str(tmp_path / "out"), columns=cols, size_limit=1 << 16) as w:
        for i in range(300):
            w.write({"text": f"sample {i} é", "label": i % 7 - 3,
                     "img": Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)),
                     "vec": rng.random(4).astype(np.float32), "tok": np.arange(1 + i % 9, dtype=np.int32),
                     "raw": bytes([i % 256]) * (i % 30), "u8": i % 256, "f": i / 3})
    ds = sluice.Dataset(str(tmp_path / "out"))
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    readers = [reader_from_json(str(tmp_path / "out"), None, sh) for sh in index["shards"]]
    theirs = [r.decode_sample(r.get_sample_data(j)) for r in readers for j in range(r.samples)]
    assert len(ds) == len(theirs) == 300
    for i, want in enumerate(theirs):
        got = ds[i]
        assert bytes(got["text"]).decode() == want["text"] and got["label"][0] == want["label"]
        assert np.array_equal(got["vec"], want["vec"]) and got["u8"][0] == want["u8"] and got["f"][0] == want["f"]
        assert bytes(got["raw"]) == want["raw"]
        assert np.array_equal(mds_decode("ndarray", bytes(got["tok"])), want["tok"])
        assert np.array_equal(np.asarray(mds_decode("jpeg", bytes(got["img"]))), np.asarray(want["img"]))


def test_a_shard_replaced_after_open_is_stale_not_read_through_old_offsets(tmp_path):
    import time
    _write(tmp_path / "ds", [_samples(10, 1)])
    ds = sluice.Dataset(str(tmp_path / "ds"))
    time.sleep(0.01)
    tmp = tmp_path / "ds" / "new.mds"
    tmp.write_bytes(_shard(_samples(10, 9)))
    os.replace(tmp, tmp_path / "ds" / "shard.00000.mds")
    with pytest.raises(sluice.SluiceError) as e:
        ds[0]
    assert "replaced or rewritten since the dataset was opened" in str(e.value)


@pytest.mark.parametrize("name", ["..%2Fsecret.mds", "%2e%2e%2fsecret.mds", "shard.mds?x=1", "shard.mds#f"])
def test_shard_names_that_a_server_would_read_elsewhere_are_refused(tmp_path, name):
    def patch(ix):
        ix["shards"][0]["raw_data"]["basename"] = name
    _write(tmp_path / "ds", [_samples(3, 1)], patch=patch)
    with pytest.raises(sluice.SluiceError, match="is not a file of the directory"):
        sluice.Dataset(str(tmp_path / "ds"))


def test_an_ndarray_shape_that_wraps_is_refused(tmp_path):
    def patch(ix):
        ix["shards"][0]["column_encodings"][1] = "ndarray:uint8:4294967297,4294967295,4294967297,4294967295"
        ix["shards"][0]["column_sizes"][1] = 1
    _write(tmp_path / "ds", [_samples(3, 1)], patch=patch)
    with pytest.raises(sluice.SluiceError, match="at most 4 dimensions of at most 4 GiB"):
        sluice.Dataset(str(tmp_path / "ds"))


def test_a_malformed_index_json_is_named(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "index.json").write_text("{not json")
    with pytest.raises(sluice.SluiceError, match="index.json: not the index sluice expects"):
        sluice.Dataset(str(tmp_path / "ds"))
