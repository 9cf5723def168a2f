"""WebDataset tars read as webdataset's own reader reads them, sample by sample and field by field: tars written
by Python's tarfile and by webdataset's TarWriter with what real shards hold (links, directories, dotfiles,
names without a field, __index__ metadata, upper-case and multi-dot extensions, directories with dots)."""
import io
import os
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
    """Samples as webdataset yields them: {field: bytes} without its own __key__/__url__ entries."""
    out = []
    for s in wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False):
        out.append({k: bytes(v) for k, v in s.items() if not k.startswith("__")})
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
