"""WebDataset tars read as webdataset's own reader reads them, sample by sample and field by field: tars written
by Python's tarfile and by webdataset's TarWriter with what real shards hold (links, directories, dotfiles,
names without a field, __index__ metadata, upper-case and multi-dot extensions, directories with dots)."""
import io
import os
import subprocess
import tarfile

import numpy as np
import pytest

import sluice

wds = pytest.importorskip("webdataset")


def _add(t, name, data=None, kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if data is not None else 0
    t.addfile(info, io.BytesIO(data) if data is not None else None)


def _tricky(path, seed):
    rng = np.random.default_rng(seed)
    blob = lambda: rng.integers(0, 256, size=int(rng.integers(1, 3000)), dtype=np.uint8).tobytes()  # noqa: E731
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        _add(t, "__index__", blob())
        _add(t, "train", kind=tarfile.DIRTYPE)
        _add(t, "train/000.jpg", blob())
        _add(t, "train/000.cls", b"3")
        _add(t, "train/000.seg.png", blob())
        _add(t, "train/001.JPG", blob())
        _add(t, "train/001.cls", b"1")
        _add(t, "train/001.link.jpg", kind=tarfile.SYMTYPE, link="000.jpg")
        _add(t, "train/002.jpg", blob())
        _add(t, "train/002.hard.jpg", kind=tarfile.LNKTYPE, link="train/002.jpg")
        _add(t, "train/README", blob())
        _add(t, ".hidden", blob())
        _add(t, "train/.DS_Store", blob())
        _add(t, "v1.2/003.Json", blob())
        _add(t, "v1.2/003.tar.gz", blob())
        _add(t, "__meta__/info.txt", blob())
        _add(t, "004.jpg", blob())


def _writer(path, seed):
    rng = np.random.default_rng(seed)
    with wds.TarWriter(str(path)) as w:
        for i in range(20):
            w.write({"__key__": f"s/{i:05d}", "jpg": rng.integers(0, 256, 500 + i, dtype=np.uint8).tobytes(),
                     "cls": str(i % 3).encode(), "json": b'{"i": %d}' % i})


def _theirs(paths):
    """Samples as webdataset yields them: {field: bytes} with the sample's __key__, without where it came from
    (__url__, __local_path__)."""
    out = []
    urls = paths if isinstance(paths, str) else [str(p) for p in paths]  # a string: webdataset expands its braces
    for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        out.append({k: v.encode() if k == "__key__" else bytes(v) for k, v in s.items()
                    if k == "__key__" or not k.startswith("__")})
    return out


def _ours(path):
    ds = sluice.Dataset(str(path))
    return [{k: bytes(v) for k, v in ds[i].items() if len(v)} for i in range(len(ds))]


@pytest.mark.parametrize("make", (_tricky, _writer), ids=("tarfile", "TarWriter"))
def test_reads_what_webdataset_reads(tmp_path, make):
    d = tmp_path / "shards"
    d.mkdir()
    paths = [d / f"part-{i:06d}.tar" for i in range(2)]
    for i, p in enumerate(paths):
        make(p, i)
    theirs = _theirs(paths)
    assert theirs and _ours(d) == theirs
    for p in paths:
        assert _ours(p) == _theirs([p])


def test_sparse_member_is_refused(tmp_path):
    """A GNU sparse member's bytes are not stored in place: refused, naming it (webdataset, through Python's
    tarfile, expands it; sluice reads in place and will not serve its stored chunks instead)."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "a.bin", "wb") as f:
        f.truncate(1 << 20)
        f.seek(512 << 10)
        f.write(b"data")
    if os.system(f"tar --sparse --format=gnu -C {src} -cf {tmp_path / 'sp.tar'} a.bin 2>/dev/null") != 0:
        pytest.skip("no GNU tar")
    with pytest.raises(sluice.SluiceError, match="sparse"):
        len(sluice.Dataset(str(tmp_path / "sp.tar")))


def test_the_key_reaches_the_loader_and_a_packed_copy(tmp_path):
    """__key__ is a field of every sample, through the loader and kept by pack, and a field named "ids" is the
    tar's, while the loader's record ids stay batch.ids."""
    p = tmp_path / "a.tar"
    with tarfile.open(p, "w") as t:
        for i in range(12):
            _add(t, f"dir/k{i:03d}.ids", b"user %d" % i)
            _add(t, f"dir/k{i:03d}.txt", b"x" * i)
    keys = [f"dir/k{i:03d}".encode() for i in range(12)]
    assert [bytes(s["__key__"]) for s in _ours_iter(p)] == keys == [s["__key__"] for s in _theirs([p])]
    for src in (p, tmp_path / "packed"):
        if src != p:
            sluice.pack(str(src), dataset=str(p))
        seen = {}
        for b in sluice.Loader(sluice.Dataset(str(src)), 4, seed=1, rank=0, world_size=1):
            kd, ko = b["__key__"]
            idd, ido = b["ids"]
            for j, i in enumerate(b.ids):
                seen[int(i)] = (bytes(kd[ko[j]:ko[j + 1]]), bytes(idd[ido[j]:ido[j + 1]]))
        assert seen == {i: (keys[i], b"user %d" % i) for i in range(12)}


def _ours_iter(path):
    ds = sluice.Dataset(str(path))
    return [ds[i] for i in range(len(ds))]


def test_brace_shard_names_expand_as_webdataset_expands_them(tmp_path):
    for i in range(12):
        _writer(tmp_path / f"train-{i:06d}.tar", i)
    for pattern in ("train-{000000..000004}.tar", "train-{000009..000011}.tar", "train-{000001,000003}.tar",
                    "train-0000{00..10..5}.tar"):
        path = str(tmp_path / pattern)
        assert _ours(path) == _theirs(path), pattern
    ds = sluice.Dataset(str(tmp_path / "train-{000000..000004}.tar"))
    assert len(ds) == 100 and len(list(sluice.Loader(ds, 10, rank=0, world_size=1))) == 10
    with pytest.raises(sluice.SluiceError, match="train-000012.tar"):
        sluice.Dataset(str(tmp_path / "train-{000010..000012}.tar"))
    with pytest.raises(sluice.SluiceError, match="more than"):
        sluice.Dataset(str(tmp_path / "train-{0..9999999}.tar"))


def test_compressed_tars_are_refused_by_name_and_cause(tmp_path):
    import gzip
    _writer(tmp_path / "plain.tar", 0)
    raw = (tmp_path / "plain.tar").read_bytes()
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(raw))
    with pytest.raises(sluice.SluiceError, match=r"a\.tar\.gz.*compressed.*decompress"):
        sluice.Dataset(str(tmp_path / "a.tar.gz"))
    d = tmp_path / "dir"
    d.mkdir()
    (d / "b-000000.tar.gz").write_bytes(gzip.compress(raw))
    with pytest.raises(sluice.SluiceError, match=r"b-000000\.tar\.gz.*compressed"):
        sluice.Dataset(str(d))
    (tmp_path / "c.tar").write_bytes(gzip.compress(raw))  # gzip under a .tar name
    with pytest.raises(sluice.SluiceError, match=r"c\.tar.*compressed"):
        sluice.Dataset(str(tmp_path / "c.tar"))


def test_a_file_of_another_format_is_not_taken_for_a_tar(tmp_path):
    """A regular file that is no tar (a JSON lines file given as a dataset) is left to the native reader, whose
    message names the dataset it looked for, not libarchive's 'Unrecognized archive format'."""
    (tmp_path / "data.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Dataset(str(tmp_path / "data.jsonl"))
    assert "archive" not in str(e.value) and "index.sli" in str(e.value), str(e.value)


def test_a_pipe_shard_spec_is_refused_never_run(tmp_path):
    """webdataset's "pipe:CMD" runs CMD in a shell: sluice refuses it by name (it opened "pipe:..." as a local file
    and said no such file), runs nothing, and does not echo the command, which may hold a token."""
    made = tmp_path / "ran"
    for spec in (f"pipe:touch {made}", "pipe:curl -s -H 'Authorization: Bearer SECRET42' http://h/train-{000..001}.tar",
                 f"pipe:cat {tmp_path}/train-000000.tar"):
        with pytest.raises(sluice.SluiceError) as e:
            sluice.Dataset(spec)
        msg = str(e.value)
        assert "shell command" in msg and "pipe:" + spec[5:].split()[0] in msg and "SECRET42" not in msg, msg
    assert not made.exists()


def test_a_tar_compressed_by_an_outside_program_runs_no_program(tmp_path):
    """libarchive decodes lrzip, lzop and grzip by running that program: a .tar that starts like one made sluice run
    whatever `lrzip` was first on PATH.  It is refused by its magic now, naming the codec, and nothing runs; bzip2
    and xz tars are named as such too."""
    import bz2
    import lzma
    import stat
    import sys
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ran = tmp_path / "ran"
    for prog in ("lrzip", "lzop", "grzip"):
        (bindir / prog).write_text(f"#!/bin/sh\ntouch {ran}\ncat\n")
        (bindir / prog).chmod(stat.S_IRWXU)
    _writer(tmp_path / "plain.tar", 0)
    raw = (tmp_path / "plain.tar").read_bytes()
    cases = {"lrzip": b"LRZI\x00\x06" + bytes(18) + raw[:200], "lzop": b"\x89LZO\x00\r\n\x1a\n" + raw[:200],
             "grzip": b"GRZipII\x00\x02\x04:)" + raw[:200], "bzip2": bz2.compress(raw), "xz": lzma.compress(raw)}
    for codec, data in cases.items():
        (tmp_path / f"{codec}.tar").write_bytes(data)
        code = f"import sluice\ntry:\n    sluice.Dataset({str(tmp_path / (codec + '.tar'))!r})\nexcept sluice.SluiceError as e:\n    print(e)\n"
        env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
        assert f"a compressed tar ({codec})" in out, (codec, out)
        assert not ran.exists(), codec
