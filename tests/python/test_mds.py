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


def _zstd_raw(data):
    """data as one zstd frame of raw (stored) blocks, written by hand: no zstd package needed (RFC 8878)."""
    head = struct.pack("<IBI", 0xFD2FB528, 0xA0, len(data))  # single segment, a 4-byte content size
    blocks = [data[i:i + (1 << 17)] for i in range(0, len(data), 1 << 17)] or [b""]
    return head + b"".join(struct.pack("<I", (len(b) << 3) | (k == len(blocks) - 1))[:3] + b
                           for k, b in enumerate(blocks))


def _write(d, shards, names=("text", "raw"), encodings=("str", "bytes"), sizes=(None, None), patch=None,
           codec=None, subdir=""):
    """shards under d as Streaming writes them; codec "zstd", "gz" or "bz2": each shard only compressed (zip_data), as
    Streaming leaves them before a reader decompresses them; subdir: every shard below it, as a merged index's."""
    import bz2
    import gzip
    d.mkdir(parents=True, exist_ok=True)
    index = {"version": 2, "shards": []}
    for k, samples in enumerate(shards):
        name = f"{subdir}shard.{k:05}.mds"
        raw = _shard(samples)
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        zip_data = None
        if codec:
            packed = _zstd_raw(raw) if codec == "zstd" else gzip.compress(raw) if codec == "gz" else bz2.compress(raw)
            (d / f"{name}.{codec}").write_bytes(packed)
            zip_data = {"basename": f"{name}.{codec}", "bytes": (d / f"{name}.{codec}").stat().st_size, "hashes": {}}
        else:
            (d / name).write_bytes(raw)
        index["shards"].append({"column_encodings": list(encodings), "column_names": list(names),
                                "column_sizes": list(sizes), "compression": codec, "format": "mds",
                                "hashes": [], "raw_data": {"basename": name, "bytes": len(raw), "hashes": {}},
                                "samples": len(samples), "size_limit": 1 << 26, "version": 2, "zip_data": zip_data})
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
    ("compressed", "without a raw_data basename"),
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
        assert bytes(got["text"]).decode() == want["text"] and got["label"] == want["label"]
        assert np.array_equal(got["vec"], want["vec"]) and got["u8"] == want["u8"] and got["f"] == want["f"]
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


@pytest.mark.parametrize("codec", ["zstd", "gz", "bz2"])
def test_compressed_shards_are_decompressed_once_beside_them(tmp_path, codec):
    """Shards only compressed (zip_data; Streaming's compression="zstd", "gz" or "bz2" before a reader decompresses them)
    are read (every one failed as "shard.00000.mds: cannot open: No such file"): decompressed once beside them under
    the raw name index.json gives, as Streaming does with its local copies, then read in place; a second open
    decompresses nothing."""
    shards = [_samples(40, 1), _samples(25, 2)]
    _write(tmp_path / "ds", shards, codec=codec)
    ds = sluice.Dataset(str(tmp_path / "ds"))
    flat = [s for sh in shards for s in sh]
    assert len(ds) == 65 and all(bytes(ds[i]["text"]) == t and bytes(ds[i]["raw"]) == r for i, (t, r) in
                                 enumerate(flat))
    raw = tmp_path / "ds" / "shard.00000.mds"
    assert raw.read_bytes() == _shard(shards[0])
    seen = raw.stat().st_mtime_ns
    again = sluice.Dataset(str(tmp_path / "ds"))
    assert bytes(again[64]["text"]) == flat[64][0] and raw.stat().st_mtime_ns == seen
    assert not [p for p in os.listdir(tmp_path / "ds") if ".tmp" in p]


@pytest.mark.parametrize("harm,words", [
    ("br", "compressed with br"),
    ("mislabelled", "not bz2, as index.json says it is"),
    ("bomb", "decompresses to more than the"),
    ("short", "decompresses to 10 bytes, index.json says"),
    ("cut", "not zstd, or damaged: Truncated"),
    ("garbage", "not zstd, as index.json says it is"),
    ("huge", "an MDS shard is under 4 GiB"),
])
def test_hostile_compressed_shards_are_refused_by_name(tmp_path, harm, words):
    """A codec sluice does not read is named (it said no such file), a file of another codec than the index says is
    refused (only that codec's decoder is asked: none runs an outside program); a frame that decompresses to more
    than the index's raw size (a bomb) stops there, one that gives less or is cut short is refused; nothing
    half-written is left for a later open to read."""
    d = tmp_path / "ds"
    patch = None
    if harm in ("br", "mislabelled"):
        def patch(ix):
            ix["shards"][0]["compression"] = "br:11" if harm == "br" else "bz2:9"
    elif harm == "bomb":
        def patch(ix):
            ix["shards"][0]["raw_data"]["bytes"] = 100
    elif harm == "huge":
        def patch(ix):
            ix["shards"][0]["raw_data"]["bytes"] = 1 << 40
    _write(d, [_samples(40, 1)], codec="zstd", patch=patch)
    z = d / "shard.00000.mds.zstd"
    if harm == "short":
        z.write_bytes(_zstd_raw(bytes(10)))
    elif harm == "cut":
        z.write_bytes(z.read_bytes()[:-30])
    elif harm == "garbage":
        z.write_bytes(b"not a zstd frame at all")
    with pytest.raises(sluice.SluiceError, match=words) as e:
        sluice.Dataset(str(d))
    assert "shard.00000.mds" in str(e.value)
    assert sorted(os.listdir(d)) == ["index.json", "shard.00000.mds.zstd"]


def test_a_merged_index_names_shards_in_subdirectories(tmp_path):
    """Streaming's merge_index: one index.json above the writers' directories, each shard named by its path below
    ("0/shard.00000.mds"); they were refused as names that leave the directory."""
    d = tmp_path / "ds"
    parts = [[_samples(30, 1), _samples(5, 2)], [_samples(12, 3)]]
    shards = []
    for k, part in enumerate(parts):
        _write(d / str(k), part)
        sub = json.loads((d / str(k) / "index.json").read_text())["shards"]
        for sh in sub:
            sh["raw_data"]["basename"] = f"{k}/{sh['raw_data']['basename']}"
        shards += sub
    (d / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    ds = sluice.Dataset(str(d))
    flat = [s for part in parts for sh in part for s in sh]
    assert len(ds) == 47 and ds.shards == 3
    assert all(bytes(ds[i]["text"]) == t and bytes(ds[i]["raw"]) == r for i, (t, r) in enumerate(flat))
    # compressed below a subdirectory too, decompressed beside each
    _write(tmp_path / "z", [_samples(9, 4)], codec="zstd", subdir="w0/")
    assert bytes(sluice.Dataset(str(tmp_path / "z"))[8]["text"]) == b"s4-8"
    assert (tmp_path / "z" / "w0" / "shard.00000.mds").exists()


@pytest.mark.parametrize("name", ["0/../../secret.mds", "/etc/passwd", "0//shard.mds", "./shard.00000.mds",
                                  "0/./shard.mds", "0/..", "a\\b.mds", "0/%2e%2e/x.mds", "sub/"])
def test_merged_names_that_leave_the_directory_are_refused(tmp_path, name):
    def patch(ix):
        ix["shards"][0]["raw_data"]["basename"] = name
    _write(tmp_path / "ds", [_samples(3, 1)], patch=patch)
    with pytest.raises(sluice.SluiceError, match="is not a file of the directory"):
        sluice.Dataset(str(tmp_path / "ds"))


@pytest.mark.parametrize("how", ["file", "dir"])
def test_a_shard_that_links_out_of_the_directory_is_refused(tmp_path, how):
    """A shard (or a merged index's subdirectory) that is a symbolic link out of the dataset's directory is refused
    naming where it leads (a downloaded dataset could read ~/.ssh/id_rsa out as sample bytes); a link that stays
    inside, and a dataset directory reached through a link, are read."""
    out = tmp_path / "outside"
    _write(out, [_samples(3, 9)], subdir="0/" if how == "dir" else "")
    d = tmp_path / "ds"
    _write(d, [_samples(3, 1)], subdir="0/" if how == "dir" else "")
    target = d / ("0" if how == "dir" else "0/shard.00000.mds" if how == "dir" else "shard.00000.mds")
    if how == "dir":
        import shutil
        shutil.rmtree(d / "0")
        (d / "0").symlink_to(out / "0")
    else:
        target.unlink()
        target.symlink_to(out / "shard.00000.mds")
    with pytest.raises(sluice.SluiceError, match="outside the dataset's directory") as e:
        sluice.Dataset(str(d))
    assert str(out) in str(e.value)
    inside = tmp_path / "in"
    _write(inside, [_samples(3, 1)])
    (inside / "real.mds").write_bytes((inside / "shard.00000.mds").read_bytes())
    (inside / "shard.00000.mds").unlink()
    (inside / "shard.00000.mds").symlink_to("real.mds")
    (tmp_path / "via").symlink_to(inside)
    assert bytes(sluice.Dataset(str(tmp_path / "via"))[2]["text"]) == b"s1-2"


@pytest.mark.parametrize("codec", ["zstd", "gz"])
def test_a_compressed_shard_is_never_decompressed_through_a_link_out(tmp_path, codec):
    """A compressed shard whose raw file is absent is decompressed under its raw name: where that name's directory is
    a link out of the dataset's (a merged index's "0/" linked to another tree), the open is refused naming where it
    leads, and nothing is written there (the decompressed bytes were written outside, then read); a subdirectory
    that is a link inside the tree decompresses as before."""
    out = tmp_path / "outside"
    out.mkdir()
    d = tmp_path / "ds"
    _write(d, [_samples(3, 1)], codec=codec, subdir="0/")
    (d / "z").mkdir()
    (d / "0" / f"shard.00000.mds.{codec}").rename(d / "z" / f"shard.00000.mds.{codec}")
    (d / "0").rmdir()
    index = json.loads((d / "index.json").read_text())
    index["shards"][0]["zip_data"]["basename"] = f"z/shard.00000.mds.{codec}"
    (d / "index.json").write_text(json.dumps(index))
    (d / "0").symlink_to(out)
    with pytest.raises(sluice.SluiceError, match="outside the dataset's directory") as e:
        sluice.Dataset(str(d))
    assert "0/shard.00000.mds" in str(e.value) and str(out) in str(e.value), str(e.value)
    assert os.listdir(out) == []
    (d / "0").unlink()
    (d / "0").symlink_to("z")
    assert bytes(sluice.Dataset(str(d))[2]["text"]) == b"s1-2"
    assert (d / "z" / "shard.00000.mds").is_file() and os.listdir(out) == []


def test_streamings_compressed_and_merged_datasets(tmp_path):
    """Streaming's own writer, every codec it has: zstd, gz and bz2 read equal to its StreamingDataset, br and snappy
    refused naming the codec; and a merge_index of two writers' directories read equal to it."""
    streaming = pytest.importorskip("streaming", reason="MosaicML Streaming (it needs torch)")
    from streaming.base.util import merge_index
    cols = {"text": "str", "label": "int", "raw": "bytes"}

    def write(out, n, seed, **kw):
        with streaming.MDSWriter(out=str(out), columns=cols, size_limit=1 << 12, **kw) as w:
            for i in range(n):
                w.write({"text": f"t{seed}-{i} é", "label": i - 50, "raw": bytes([i % 256]) * (i % 17)})

    def theirs(out):
        ref = streaming.StreamingDataset(local=str(out), batch_size=1, shuffle=False)
        return [ref[i] for i in range(len(ref))]

    for codec in ("zstd", "zstd:7", "gz", "gz:1", "bz2", "br", "snappy"):
        out = tmp_path / codec.replace(":", "_")
        write(out, 300, 1, compression=codec)
        assert not any(p.endswith(".mds") for p in os.listdir(out))  # only compressed: what sluice meets first
        if codec.split(":")[0] in ("br", "snappy"):
            with pytest.raises(sluice.SluiceError, match=f"compressed with {codec}"):
                sluice.Dataset(str(out))
            continue
        ds = sluice.Dataset(str(out))
        want = theirs(out)
        assert len(ds) == len(want) == 300 and ds.shards > 1
        for i, w in enumerate(want):
            r = ds[i]
            assert bytes(r["text"]).decode() == w["text"] and r["label"] == w["label"]
            assert bytes(r["raw"]) == w["raw"]
    m = tmp_path / "merged"
    write(m / "0", 120, 2)
    write(m / "1", 80, 3, compression="zstd")
    merge_index(str(m), keep_local=True)
    assert any("/" in sh["raw_data"]["basename"] for sh in json.loads((m / "index.json").read_text())["shards"])
    ds = sluice.Dataset(str(m))
    want = theirs(m)
    assert len(ds) == len(want) == 200
    assert all(bytes(ds[i]["text"]).decode() == w["text"] and ds[i]["label"][0] == w["label"]
               for i, w in enumerate(want))


def test_compressed_shards_over_http_are_decompressed_beside_their_cached_copies(tmp_path, monkeypatch):
    """A zstd MDS dataset on a web server: each shard fetched into the cache and decompressed beside its copy there
    (the server is never written to), then read as the local one reads."""
    import webserver
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    shards = [_samples(30, 1), _samples(20, 2)]
    _write(tmp_path / "www" / "ds", shards, codec="zstd")
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx") as w:
        ds = sluice.Dataset(w.url("ds/"))
        flat = [s for sh in shards for s in sh]
        assert len(ds) == 50 and all(bytes(ds[i]["text"]) == t and bytes(ds[i]["raw"]) == r
                                     for i, (t, r) in enumerate(flat))
        ids = sorted(int(i) for b in sluice.Loader(ds, 10, seed=1, rank=0, world_size=1) for i in b["ids"])
        assert ids == list(range(50))
    assert sorted(os.listdir(tmp_path / "www" / "ds")) == ["index.json", "shard.00000.mds.zstd", "shard.00001.mds.zstd"]


def test_what_lies_under_a_compressed_shards_raw_name(tmp_path):
    """A temporary file a killed decompression left is ignored (the raw file appears whole, by rename, or not at
    all); a FIFO or directory under the raw name is refused by name, never renamed over."""
    _write(tmp_path / "ds", [_samples(5, 1)], codec="zstd")
    (tmp_path / "ds" / "shard.00000.mds.tmp4242").write_bytes(b"half a shard")
    assert bytes(sluice.Dataset(str(tmp_path / "ds"))[4]["text"]) == b"s1-4"
    for kind in ("fifo", "dir"):
        d = tmp_path / kind
        _write(d, [_samples(5, 1)], codec="zstd")
        os.mkfifo(d / "shard.00000.mds") if kind == "fifo" else (d / "shard.00000.mds").mkdir()
        with pytest.raises(sluice.SluiceError, match="shard.00000.mds"):
            sluice.Dataset(str(d))
        assert (d / "shard.00000.mds").exists() and not (d / "shard.00000.mds").is_file()
