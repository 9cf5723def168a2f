"""TFRecord files read in place, held against the tfrecord package's own writer and reader (TFRecordWriter,
tfrecord_iterator, and protobuf's tf.train.Example): the same records, byte for byte and in file order; every
record's data CRC checked as it is read; tf_example decodes what protobuf decodes.  Hostile files (cut short, a
length whose CRC fails, a length past the end, a flipped data byte, compressed, a FIFO) are refused by name."""
import errno
import os
import struct
import subprocess

import crc32c

import numpy as np
import pytest

import sluice
from conftest import SLUICE

tfrecord = pytest.importorskip("tfrecord", reason="the tfrecord package (tests/requirements.txt)")
from tfrecord.reader import example_pb2, tfrecord_iterator  # noqa: E402


def _write(path, n, seed):
    rng = np.random.default_rng(seed)
    w = tfrecord.TFRecordWriter(str(path))
    for i in range(n):
        w.write({"image": (rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes(), "byte"),
                 "label": (int(i % 10) - 3, "int"),
                 "box": (rng.random(4).astype(np.float32).tolist(), "float"),
                 "ids": (rng.integers(-2**40, 2**40, int(rng.integers(0, 6))).tolist(), "int")})
    w.close()


@pytest.fixture(scope="module")
def tfdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfr")
    _write(d / "train-00000-of-00002.tfrecord", 300, 1)
    _write(d / "train-00001-of-00002.tfrecord", 211, 2)
    (d / "README").write_text("not a record file")
    return d


def _theirs(d):
    return [bytes(r) for f in sorted(p for p in os.listdir(d) if p.endswith(".tfrecord"))
            for r in tfrecord_iterator(str(d / f))]


def test_records_are_the_writers_byte_for_byte(tfdir):
    ds = sluice.Dataset(str(tfdir))
    theirs = _theirs(tfdir)
    assert ds.format == "tfrecord" and len(ds) == len(theirs) == 511 and ds.shards == 2
    assert [bytes(ds[i]["record"]) for i in range(len(ds))] == theirs
    one = sluice.Dataset(str(tfdir / "train-00001-of-00002.tfrecord"))
    assert len(one) == 211 and bytes(one[0]["record"]) == theirs[300]


def test_tf_example_decodes_what_protobuf_decodes(tfdir):
    ds = sluice.Dataset(str(tfdir))
    for i in (0, 1, 299, 300, 510):
        raw = bytes(ds[i]["record"])
        ours, ref = sluice.tf_example(ds[i]["record"]), example_pb2.Example.FromString(raw).features.feature
        assert set(ours) == set(ref)
        for k, f in ref.items():
            kind = f.WhichOneof("kind")
            want = list(getattr(f, kind).value)
            got = ours[k]
            assert (list(got) == want) if kind == "bytes_list" else np.array_equal(got, np.array(want, got.dtype))


def test_the_loader_reads_every_record_once(tfdir):
    ds = sluice.Dataset(str(tfdir))
    ids, recs = [], {}
    for b in sluice.Loader(ds, 32, seed=4, rank=0, world_size=1, drop_last=True):
        data, off = b["record"]
        for j, i in enumerate(b["ids"]):
            ids.append(int(i))
            recs[int(i)] = bytes(data[off[j]:off[j + 1]])
    theirs = _theirs(tfdir)
    assert len(ids) == len(set(ids)) == 511 // 32 * 32 and all(recs[i] == theirs[i] for i in recs)


def _mask(data):
    """TFRecord's masked CRC32C of data, as 4 bytes."""
    c = crc32c.crc32c(data)
    return struct.pack("<I", ((c >> 15 | c << 17) + 0xa282ead8) & 0xFFFFFFFF)


def _record(data, length=None):
    head = struct.pack("<Q", len(data) if length is None else length)
    return head + _mask(head) + data + _mask(data)


@pytest.mark.parametrize("harm,code,words", [
    ("cut", "EFORMAT", "cut short"),
    ("length_crc", "EFORMAT", "length's CRC"),
    ("past_end", "EFORMAT", "past the file's end"),
])
def test_hostile_files_are_refused_at_open(tmp_path, harm, code, words):
    good = _record(b"a" * 100) + _record(b"b" * 50)
    if harm == "cut":
        bad = good[:116 + 5]  # the second record's header
    elif harm == "length_crc":
        bad = good[:8] + bytes([good[8] ^ 1]) + good[9:]
    else:  # a length of 1 GiB, its CRC right
        bad = good + _record(b"c" * 10, length=1 << 30)
    p = tmp_path / "x.tfrecord"
    p.write_bytes(bad)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Dataset(str(p))
    assert e.value.code == getattr(sluice._lib, code) and words in str(e.value) and "x.tfrecord" in str(e.value)


def test_a_flipped_data_byte_fails_its_record_by_name(tmp_path):
    p = tmp_path / "x.tfrecord"
    good = _record(b"a" * 100) + _record(b"b" * 5000)
    p.write_bytes(good[:12 + 100 + 4 + 12 + 77] + bytes([good[12 + 100 + 4 + 12 + 77] ^ 4]) + good[12 + 100 + 4 + 12 + 78:])
    ds = sluice.Dataset(str(p))
    assert bytes(ds[0]["record"]) == b"a" * 100
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Loader(ds, 2, shuffle=False).__iter__().__next__()
    assert e.value.code == sluice._lib.ECRC and "record 1" in str(e.value)
    r = subprocess.run([SLUICE, "verify", str(p)], capture_output=True, text=True)
    assert r.returncode != 0 and "record 1" in (r.stdout + r.stderr)


@pytest.mark.parametrize("codec", ["gzip", "zlib"])
def test_a_compressed_file_under_a_plain_name_is_named_as_compressed(tmp_path, codec):
    """TFRecordOptions(compression_type="GZIP") under train.tfrecord: the error says gzip (it said the length's CRC
    failed), naming the file; a damaged uncompressed file still says it is damaged."""
    import gzip
    import zlib
    good = _record(b"a" * 100) + _record(b"b" * 50)
    p = tmp_path / "train.tfrecord"
    p.write_bytes(gzip.compress(good) if codec == "gzip" else zlib.compress(good))
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Dataset(str(p))
    assert e.value.code == sluice._lib.EFORMAT and f"compressed with {codec}" in str(e.value)
    assert "train.tfrecord" in str(e.value)
    p.write_bytes(b"\x1f" + good[1:])  # one byte of a real file's length changed: damage, not gzip
    with pytest.raises(sluice.SluiceError, match="length's CRC does not match") as e:
        sluice.Dataset(str(p))
    assert "gzip" not in str(e.value)


def test_what_is_not_a_record_file_is_refused_by_name(tmp_path):
    (tmp_path / "x.tfrecord.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(sluice.SluiceError, match="compressed TFRecord"):
        sluice.Dataset(str(tmp_path / "x.tfrecord.gz"))
    # In a directory of them too: named as compressed, not read as a damaged uncompressed file.
    d = tmp_path / "dir"
    d.mkdir()
    (d / "a.tfrecord").write_bytes(b"")
    (d / "b.tfrecord.gz").write_bytes(b"\x1f\x8b" + bytes(20))
    with pytest.raises(sluice.SluiceError, match="b.tfrecord.gz: a compressed TFRecord"):
        sluice.Dataset(str(d))
    os.mkfifo(tmp_path / "f.tfrecord")
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Dataset(str(tmp_path / "f.tfrecord"))
    assert "f.tfrecord" in str(e.value)
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert len(sluice.Dataset(str(tmp_path / "empty.tfrecord"))) == 0
    with pytest.raises(ValueError, match="offset"):
        sluice.tf_example(b"\x0a\xff\xff\xff\xff\x0f")


def test_a_directory_of_them_on_a_web_server(tfdir, tmp_path, monkeypatch):
    import webserver
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    with webserver.WebServer(tfdir.parent, tmp_path / "nginx") as web:
        ds = sluice.Dataset(web.url(tfdir.name + "/"))
        assert ds.format == "tfrecord" and [bytes(ds[i]["record"]) for i in range(len(ds))] == _theirs(tfdir)
        # One file by a presigned URL (a query the server checks, nginx ignores): read as that one file
        one = sorted(tfdir.glob("*.tfrecord"))[0]
        ds = sluice.Dataset(web.url(f"{tfdir.name}/{one.name}") + "?X-Amz-Signature=s3cret&X-Amz-Expires=60")
        assert ds.format == "tfrecord" and [bytes(ds[i]["record"]) for i in range(len(ds))] == \
            [r for r, _ in zip(_theirs(tfdir), range(len(ds)))] and len(ds) == 300
        # A directory cannot be named so (its files would need URLs of their own): said, the signature hidden
        with pytest.raises(sluice.SluiceError, match="a URL with a query names one object") as e:
            sluice.Dataset(web.url(tfdir.name) + "?X-Amz-Signature=s3cret")
        assert "s3cret" not in str(e.value)


def test_tf_example_merges_as_protobuf_does():
    """Serialized Examples concatenated are one Example to protobuf: Features merged, a key given again replaced,
    a Feature's lists concatenated, the last kind of its oneof kept; groups skipped; a key not UTF-8 refused."""
    e1, e2 = example_pb2.Example(), example_pb2.Example()
    e1.features.feature["a"].bytes_list.value.append(b"x")
    e1.features.feature["n"].int64_list.value.extend([1, 2])
    e2.features.feature["a"].int64_list.value.append(7)
    e2.features.feature["m"].float_list.value.extend([0.5])
    for raw in (e1.SerializeToString() + e2.SerializeToString(),
                e1.SerializeToString() + b"\x1b\x08\x05\x1c"):  # an unknown group, field 3
        ref = example_pb2.Example.FromString(raw).features.feature
        ours = sluice.tf_example(raw)
        assert set(ours) == set(ref)
        for k, f in ref.items():
            want = list(getattr(f, f.WhichOneof("kind")).value)
            assert [x for x in ours[k]] == want if f.WhichOneof("kind") == "bytes_list" else \
                np.array_equal(ours[k], np.array(want, ours[k].dtype))
    feature = b"\x0a\x03\x0a\x01a"  # a bytes_list [b"a"]
    entry = b"\x0a\x02\xff\xfe" + b"\x12" + bytes([len(feature)]) + feature
    bad = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    with pytest.raises(ValueError, match="not UTF-8"):
        sluice.tf_example(bad)


def _one_feature(packed):
    """An Example of one feature "a": an Int64List whose packed varints are the bytes given."""
    il = bytes([0x0A, len(packed)]) + packed
    feat = bytes([0x1A, len(il)]) + il
    entry = bytes([0x0A, 1]) + b"a" + bytes([0x12, len(feat)]) + feat
    feats = bytes([0x0A, len(entry)]) + entry
    return bytes([0x0A, len(feats)]) + feats


def test_packed_int64_lists_decode_as_protobuf_decodes_them():
    """Long token lists (decoded at once, not a varint at a time): every value protobuf gives, the extremes and
    10-byte varints included; a varint cut short or over 10 bytes is refused naming its offset."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(0, 3000))
        vals = np.concatenate([rng.integers(-2**63, 2**63 - 1, n // 2, dtype=np.int64),
                               rng.integers(-300, 300, n - n // 2), [-2**63, 2**63 - 1, 0, -1, 127, 128]]).tolist()
        ex = example_pb2.Example()
        ex.features.feature["ids"].int64_list.value.extend(vals)
        raw = ex.SerializeToString()
        assert sluice.tf_example(raw)["ids"].tolist() == list(example_pb2.Example.FromString(raw).features
                                                               .feature["ids"].int64_list.value) == vals
    top = bytes([0xFF] * 9 + [0x7F])  # bits past the 64th dropped, as protobuf drops them
    assert sluice.tf_example(_one_feature(top))["a"].tolist() == \
        list(example_pb2.Example.FromString(_one_feature(top)).features.feature["a"].int64_list.value) == [-1]
    for bad, words in ((bytes([0x80]), "cut short at offset 13"), (bytes([0x01, 0x80]), "cut short at offset 14"),
                       (bytes([0xFF] * 11 + [0x01]), "over 10 bytes at offset 13")):
        with pytest.raises(ValueError, match=words):
            sluice.tf_example(_one_feature(bad))


def test_entries_of_a_directory_that_are_no_files_are_skipped_with_a_word(tfdir, tmp_path, capfd):
    """A link to nothing or a FIFO named like a record file is no file to read: the dataset is the files there
    are, and each skipped entry is named once on stderr (a missing shard is not dropped without a word)."""
    d = tmp_path / "d"
    d.mkdir()
    for p in sorted(tfdir.glob("*.tfrecord"))[:1]:
        (d / p.name).write_bytes(p.read_bytes())
    os.symlink(tmp_path / "gone.tfrecord", d / "z-gone.tfrecord")
    os.mkfifo(d / "z-fifo.tfrecord")
    capfd.readouterr()
    n = len(sluice.Dataset(str(d)))
    err = capfd.readouterr().err
    assert n == 300, n  # the one file's records
    assert err.count("z-gone.tfrecord: a link to nothing, skipped") == 1, err
    assert err.count("z-fifo.tfrecord: not a regular file") == 1, err
