"""`sluice pack --from-dir` takes an ImageFolder tree as torchvision.datasets.ImageFolder does: the same classes
and labels (hidden directories such as .ipynb_checkpoints included, as torchvision has them), the same files
(image extensions, any case) in the same order; the class map travels in the dataset's metadata.  Links that
lead out of the tree are skipped unless --follow-symlinks, dangling ones skipped, each with a warning."""
import os
import subprocess

import pytest

import sluice
from conftest import SLUICE


def _tree(root, outside):
    """Classes with nested folders whose sorted paths interleave ('a/sub', 'a/sub-x', 'a/sub/x'), mixed-case
    and non-image extensions, hidden files and folders, links within the tree."""
    files = ["a/1.jpg", "a/2.JPG", "a/notes.txt", "a/sub/3.png", "a/sub-x/4.jpeg", "a/sub/x/5.webp", "a/.h.jpg",
             "b/6.bmp", "b/7.tif", "b/8.TIFF", "a-x/9.ppm", "a-x/deep/er/10.pgm", ".ipynb_checkpoints/11.jpg",
             "c/readme", "é/12.png"]
    for i, f in enumerate(files):
        p = root / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes([i]) * (100 + i))
    os.symlink("../a/1.jpg", root / "b" / "linked.jpg")   # a file link within the tree
    os.symlink("../a/sub", root / "b" / "subdir")          # a folder link within the tree
    (outside / "x.jpg").write_bytes(b"outside")
    os.mkdir(outside / "cls")
    (outside / "cls" / "y.jpg").write_bytes(b"outside too")


def _pack(src, out, *extra):
    return subprocess.run([SLUICE, "pack", "--from-dir", str(src), "--quiet", *extra, str(out)], capture_output=True,
                          text=True, timeout=120)


def _ours(ds_path):
    ds = sluice.Dataset(str(ds_path))
    return ds, [(bytes(ds[i]["key"]).decode(), int(ds[i]["label"])) for i in range(len(ds))]


def test_links_out_of_the_tree_are_not_followed(tmp_path):
    src, outside = tmp_path / "src", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    _tree(src, outside)
    os.symlink(str(outside / "x.jpg"), src / "a" / "escape.jpg")
    os.symlink("/etc/passwd", src / "a" / "passwd.jpg")
    os.symlink(str(outside / "cls"), src / "linked-class")
    os.symlink(str(tmp_path / "nothing.jpg"), src / "a" / "dangling.jpg")
    r = _pack(src, tmp_path / "ds")
    assert r.returncode == 0, r.stderr
    for name in ("escape.jpg", "passwd.jpg", "linked-class", "dangling.jpg"):
        assert name in r.stderr, r.stderr
    ds, got = _ours(tmp_path / "ds")
    keys = [k for k, _ in got]
    assert not any(k.endswith(("escape.jpg", "passwd.jpg", "dangling.jpg")) for k in keys)
    assert "linked-class" not in ds.class_to_idx
    assert "b/linked.jpg" in keys and "b/subdir/3.png" in keys  # links within the tree are followed
    r = _pack(src, tmp_path / "ds2", "--follow-symlinks")
    assert r.returncode == 0, r.stderr
    ds2, got2 = _ours(tmp_path / "ds2")
    keys2 = [k for k, _ in got2]
    assert "a/escape.jpg" in keys2 and "a/passwd.jpg" in keys2  # asked for: every link is followed
    assert "linked-class" in ds2.class_to_idx and "linked-class/y.jpg" in keys2


def test_labels_and_order_are_torchvisions(tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    src, outside = tmp_path / "src", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    _tree(src, outside)
    r = _pack(src, tmp_path / "ds")
    assert r.returncode == 0, r.stderr
    ds, ours = _ours(tmp_path / "ds")
    # A class with no image file ("c") is kept, with a warning: torchvision raises unless allow_empty.
    tv = datasets.ImageFolder(str(src), allow_empty=True)
    theirs = [(os.path.relpath(p, src), label) for p, label in tv.samples]
    assert ds.class_to_idx == tv.class_to_idx
    assert ".ipynb_checkpoints" in ds.class_to_idx
    assert ours == theirs
    for i in (0, len(ours) - 1):  # the bytes are the file's
        assert bytes(ds[i]["data"]) == open(src / ours[i][0], "rb").read()


def test_all_files_and_hidden(tmp_path):
    """--all-files takes every regular file; without it only image names, as torchvision."""
    src, outside = tmp_path / "src", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    _tree(src, outside)
    assert _pack(src, tmp_path / "img").returncode == 0
    assert _pack(src, tmp_path / "all", "--all-files").returncode == 0
    _, img = _ours(tmp_path / "img")
    _, every = _ours(tmp_path / "all")
    assert "a/notes.txt" not in [k for k, _ in img] and "a/notes.txt" in [k for k, _ in every]
    assert "a/.h.jpg" in [k for k, _ in img]  # hidden files are samples, as torchvision has them
    assert "c/readme" in [k for k, _ in every]


def test_a_class_folder_name_that_is_not_utf8_is_refused_by_name(tmp_path):
    """The class map is JSON, which holds UTF-8 names only: such a folder is refused, named, with the cause."""
    src = tmp_path / "src"
    (src / "dog").mkdir(parents=True)
    (src / "dog" / "b.jpg").write_bytes(b"img")
    bad = os.path.join(os.fsencode(src), b"cl\xffass")
    os.mkdir(bad)
    with open(os.path.join(bad, b"a.jpg"), "wb") as f:
        f.write(b"img")
    r = _pack(src, tmp_path / "ds")
    assert r.returncode != 0
    assert "cl\\xffass" in r.stderr and "UTF-8" in r.stderr, r.stderr
    assert not (tmp_path / "ds" / "index.sli").exists()


def test_one_skipped_link_is_warned_about_and_counted_once(tmp_path):
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "ok.jpg").write_bytes(b"img")
    os.symlink("/dev/zero", src / "cat" / "zero.jpg")
    flat = tmp_path / "flat"  # no classes: the files of DIR itself
    flat.mkdir()
    (flat / "ok.jpg").write_bytes(b"img")
    os.symlink("/dev/zero", flat / "zero.jpg")
    for tree, out in ((src, "ds"), (flat, "ds2")):
        r = subprocess.run([SLUICE, "pack", "--from-dir", str(tree), str(tmp_path / out)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("zero.jpg: links out of") == 1, r.stderr
        assert "1 links skipped" in r.stderr, r.stderr
