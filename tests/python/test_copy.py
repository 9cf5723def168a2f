"""`sluice cp` and sluice.copy: a local tree's links as `sluice pack --from-dir` takes them, to local,
s3:// and WebDAV destinations alike (a link out of the tree is skipped and named, never uploaded; one inside is
copied as its target, or kept with --links where the destination can hold links); what a killed copy left is
removed by the next; progress on a terminal, nothing elsewhere unless asked; --cold evicting the files read and
no other.  shutil.copytree is the peer where the trees agree: sluice differs only on links out of the tree."""
import contextlib
import ctypes
import http.server
import json
import mmap
import os
import pty
import select
import shutil
import subprocess
import threading
import time

import pytest

import sluice

import webserver
from conftest import SLUICE


def _tree(tmp_path):
    """A tree with a file and links of every kind, and outside it a secret file, /etc/passwd and /etc/ssl."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "credentials").write_text("aws_secret_access_key = SECRET\n")
    t = tmp_path / "tree"
    (t / "sub").mkdir(parents=True)
    (t / "a.txt").write_text("A")
    (t / "sub" / "f.txt").write_text("F")
    os.symlink("/etc/passwd", t / "passwd")
    os.symlink("/etc/ssl", t / "ssl")
    os.symlink("../outside/credentials", t / "creds")
    os.symlink("creds", t / "creds_again")
    os.symlink("sub/f.txt", t / "f_link")
    os.symlink(str(t / "a.txt"), t / "a_abs")
    os.symlink("..", t / "sub" / "up")
    return t


LEAVING = ("passwd", "ssl", "creds", "creds_again")


def _no_secret(names, what):
    for n in names:
        assert not any(n == x or n.startswith(x + "/") for x in LEAVING), f"{what}: {n} was copied"


def test_cp_r_skips_links_out_of_the_tree_to_a_local_copy(tmp_path):
    """A link to /etc/passwd, to /etc/ssl, to a credentials file outside (and a link to that link): none copied,
    each named; links inside copied as their files; the tree copied once (sub/up leads back above)."""
    t = _tree(tmp_path)
    r = subprocess.run([SLUICE, "cp", "-r", str(t), str(tmp_path / "dst")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    got = sorted(str(p.relative_to(tmp_path / "dst")) for p in (tmp_path / "dst").rglob("*"))
    assert got == ["a.txt", "a_abs", "f_link", "sub", "sub/f.txt"], got
    for n in LEAVING:
        assert f"tree/{n}: links out of {t}" in r.stderr, r.stderr
    assert "tree/sub/up: a link back to a directory above it" in r.stderr
    assert "skipped: 5 links or special files" in r.stdout
    assert (tmp_path / "dst" / "a_abs").read_text() == "A" and not (tmp_path / "dst" / "a_abs").is_symlink()
    rep = sluice.copy(str(t), str(tmp_path / "dst2"), recursive=True)
    assert rep["files"] == 4 and rep["skipped"] == 5
    _no_secret([str(p.relative_to(tmp_path / "dst2")) for p in (tmp_path / "dst2").rglob("*")], "sluice.copy")


def test_cp_r_skips_links_out_of_the_tree_to_s3(s3, tmp_path):
    """The same into s3://: no object of a link out of the tree (on 2026-11-25 /etc/ssl brought 291 files)."""
    t = _tree(tmp_path)
    r = subprocess.run([SLUICE, "cp", "-r", "--json", str(t), "s3://pytest/links/"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["skipped"] == 5
    keys = sorted(o["Key"][len("links/"):] for o in s3.list_objects_v2(Bucket="pytest", Prefix="links/")["Contents"])
    assert keys == ["a.txt", "a_abs", "f_link", "sub/f.txt"], keys
    assert "tree/creds: links out of" in r.stderr
    # Links cannot be kept in S3: refused before anything is sent, saying why.
    r = subprocess.run([SLUICE, "cp", "-r", "--links", str(t), "s3://pytest/links-kept/"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "links cannot be kept" in r.stderr and "s3 store holds files alone" in r.stderr
    assert "Contents" not in s3.list_objects_v2(Bucket="pytest", Prefix="links-kept/")


@pytest.fixture(scope="module")
def dav(tmp_path_factory):
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    root = tmp_path_factory.mktemp("www")
    with webserver.WebServer(root, tmp_path_factory.mktemp("nginx"), dav=True) as w:
        w.root = root
        yield w


def test_cp_r_skips_links_out_of_the_tree_to_webdav(dav, tmp_path):
    t = _tree(tmp_path)
    rep = sluice.copy(str(t), dav.url("links/"), recursive=True)
    assert rep["files"] == 4 and rep["skipped"] == 5
    got = sorted(str(p.relative_to(dav.root / "links")) for p in (dav.root / "links").rglob("*") if p.is_file())
    assert got == ["a.txt", "a_abs", "f_link", "sub/f.txt"], got
    with pytest.raises(sluice.SluiceError, match="links cannot be kept.*http store holds files alone"):
        sluice.copy(str(t), dav.url("kept/"), recursive=True, symlinks=True)
    assert not (dav.root / "kept").exists()


def test_links_kept_with_links_option(tmp_path):
    """--links (-P): links inside stay links, relative (an absolute one into the tree made relative, so that it
    leads into the copy, not back into the source); links out of the tree still skipped."""
    t = _tree(tmp_path)
    for opt, d in (("--links", "d1"), ("-P", "d2")):
        r = subprocess.run([SLUICE, "cp", "-r", opt, str(t), str(tmp_path / d)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        dst = tmp_path / d
        assert os.readlink(dst / "f_link") == "sub/f.txt" and os.readlink(dst / "a_abs") == "a.txt"
        assert os.readlink(dst / "sub" / "up") == ".."
        assert (dst / "a_abs").read_text() == "A"
        _no_secret([str(p.relative_to(dst)) for p in dst.rglob("*")], opt)
    r = subprocess.run([SLUICE, "cp", "--links", str(t / "a.txt"), str(tmp_path / "x")], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "go with -r" in r.stderr


def test_dereference_takes_links_out_too(tmp_path):
    """-L: the links out of the tree copied as their targets (as cp -L; pack's --follow-symlinks)."""
    t = tmp_path / "tree"
    t.mkdir()
    (tmp_path / "secret").write_text("S")
    os.symlink("../secret", t / "s")
    r = subprocess.run([SLUICE, "cp", "-r", "-L", str(t), str(tmp_path / "d")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "d" / "s").read_text() == "S"


def test_a_missing_directory_above_dst_is_an_error_as_cp_makes_it(tmp_path):
    """cp(1)'s rule: the directory that receives a file must exist, and a tree's copy makes DST but not the
    directories above it; a mistyped DST was made without a word, with every directory on its way."""
    (tmp_path / "a").write_text("a")
    t = tmp_path / "t"
    (t / "sub").mkdir(parents=True)
    (t / "sub" / "f").write_text("f")
    for args, missing in [(["a", "nope/dir/x"], "nope/dir"), (["a", "nope/"], "nope"),
                          (["-r", "t", "nope/new"], "nope"), (["a", "a/x"], "a")]:
        ours = subprocess.run([os.path.abspath(SLUICE), "cp", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        theirs = subprocess.run(["cp", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert ours.returncode != 0 and theirs.returncode != 0, (args, ours.stdout)
        assert f"{args[-1]}: {missing}: " in ours.stderr, ours.stderr
        assert not (tmp_path / "nope").exists()
    assert sorted(os.listdir(tmp_path)) == ["a", "t"]
    for args in (["a", "x"], ["a", "t/"], ["-r", "t", "new"], ["-r", "t", "t/sub/"]):
        r = subprocess.run([os.path.abspath(SLUICE), "cp", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stderr)
    assert (tmp_path / "t" / "a").read_text() == "a" and (tmp_path / "new" / "sub" / "f").read_text() == "f"


def test_agrees_with_shutil_copytree_inside_the_tree(tmp_path):
    """Where every link stays inside the tree (no loop), sluice.copy gives what shutil.copytree gives: with
    symlinks=False the same files with the same bytes, with symlinks=True the same links."""
    t = tmp_path / "tree"
    (t / "d" / "e").mkdir(parents=True)
    (t / "d" / "e" / "x.bin").write_bytes(os.urandom(100000))
    (t / "top.txt").write_text("top")
    os.symlink("d/e/x.bin", t / "lx")
    os.symlink("../../top.txt", t / "d" / "e" / "ltop")
    os.symlink("d", t / "ld")

    def tree_of(root):
        out = {}
        for dirpath, dirnames, files in os.walk(root):
            for n in files + [x for x in dirnames if os.path.islink(os.path.join(dirpath, x))]:
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, root)
                out[rel] = ("link", os.readlink(p)) if os.path.islink(p) else ("file", open(p, "rb").read())
        return out

    for symlinks in (False, True):
        peer, mine = tmp_path / f"peer{symlinks}", tmp_path / f"mine{symlinks}"
        shutil.copytree(t, peer, symlinks=symlinks)
        sluice.copy(str(t), str(mine), recursive=True, symlinks=symlinks)
        assert tree_of(mine) == tree_of(peer)


class _Stalling(http.server.ThreadingHTTPServer):
    """A web server of one 16 MiB file (HEAD, ranges, a strong ETag): a GET past its first 8 MiB waits while
    .stall is set."""
    daemon_threads = True

    def __init__(self, data):
        self.data, self.stall = data, threading.Event()
        self.waiting = threading.Event()
        super().__init__(("127.0.0.1", 0), _StallingHandler)

    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/big.bin"


class _StallingHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.answer(head=True)

    def do_GET(self):
        self.answer(head=False)

    def answer(self, head):
        d = self.server.data
        a, b = 0, len(d) - 1
        rng = self.headers.get("Range")
        if rng:
            a, b = (int(x) for x in rng.split("=")[1].split("-"))
            b = min(b, len(d) - 1)
        self.send_response(206 if rng else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"v1"')
        if rng:
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(d)}")
        self.send_header("Content-Length", str(b - a + 1))
        self.end_headers()
        if head:
            return
        if a >= 8 << 20:
            while self.server.stall.is_set():
                self.server.waiting.set()
                time.sleep(0.05)
        try:
            self.wfile.write(d[a:b + 1])
        except OSError:
            pass


@contextlib.contextmanager
def _stalling():
    srv = _Stalling(os.urandom(16 << 20))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.stall.clear()
        srv.shutdown()
        srv.server_close()


def test_a_killed_copys_temporary_is_removed_by_the_next(tmp_path, monkeypatch):
    """kill -9 in the middle of a download leaves its temporary (half the file) beside the destination; the next
    copy there removes it, and a live copy's temporary is left alone."""
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    dst = tmp_path / "dst"
    dst.mkdir()
    with _stalling() as srv:
        srv.stall.set()
        p = subprocess.Popen([SLUICE, "cp", srv.url(), str(dst / "big.bin")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        assert srv.waiting.wait(60), "the download never reached its second half"
        p.kill()
        p.wait()
        left = [n for n in os.listdir(dst) if ".sluice-tmp-" in n]
        assert len(left) == 1 and left[0].startswith(".big.bin.sluice-tmp-") and f"-{p.pid}-" in left[0], left
        assert os.path.getsize(dst / left[0]) == 8 << 20  # the first half, written
        live = dst / left[0].replace(f"-{p.pid}-", f"-{os.getpid()}-")
        live.write_bytes(b"a live copy's")
        srv.stall.clear()
        r = subprocess.run([SLUICE, "cp", srv.url(), str(dst / "big.bin")], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert (dst / "big.bin").read_bytes() == srv.data
        assert sorted(n for n in os.listdir(dst) if ".sluice-tmp-" in n) == [live.name]


def _on_a_terminal(args, srv, until=b"8.4 MB of 16.8 MB (50%)"):
    """`sluice cp ARGS` with its stderr on a terminal (a pty): what it wrote there, read while the server stalls
    until a progress line shows part of the file (until; None: once the copy waits and a second has gone), then
    released."""
    master, slave = pty.openpty()
    p = subprocess.Popen([SLUICE, "cp"] + args, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen, released = b"", False
    deadline = time.time() + 60
    while time.time() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        if not released and (until in seen if until else srv.waiting.wait(0) and time.time() > deadline - 59):
            srv.stall.clear()
            released = True
        if p.poll() is not None and not select.select([master], [], [], 0.1)[0]:
            break
    srv.stall.clear()
    out = p.communicate(timeout=60)[0]
    os.close(master)
    return p.returncode, out, seen.decode(errors="replace")


def test_progress_on_a_terminal_and_nowhere_else(tmp_path, monkeypatch):
    """On a terminal a progress line (bytes of the total, rate, time left) shows while the copy waits, rewritten
    in place, ending at 100%; into a pipe nothing unless --progress; --quiet says nothing; --json's output is
    the report alone."""
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    with _stalling() as srv:
        srv.stall.set()
        rc, out, err = _on_a_terminal([srv.url(), str(tmp_path / "a.bin")], srv)
        assert rc == 0, err
        assert "\rsluice cp: 8.4 MB of 16.8 MB (50%)" in err and "left, 0 of 1 file" in err, err
        assert "16.8 MB of 16.8 MB (100%)" in err and err.rstrip("\r\n").endswith("1 of 1 file\x1b[K"), err
        assert out.startswith("copied 1 file, 16.8 MB")
        # Not a terminal: silent unless asked.
        r = subprocess.run([SLUICE, "cp", srv.url(), str(tmp_path / "b.bin")], capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("copied 1 file")
        r = subprocess.run([SLUICE, "cp", "--progress", srv.url(), str(tmp_path / "c.bin")], capture_output=True,
                           text=True)
        assert r.returncode == 0 and r.stderr.splitlines()[-1].startswith("sluice cp: 16.8 MB of 16.8 MB (100%)")
        assert "\r" not in r.stderr
        r = subprocess.run([SLUICE, "cp", "--quiet", srv.url(), str(tmp_path / "d.bin")], capture_output=True,
                           text=True)
        assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
        srv.stall.set()
        srv.waiting.clear()
        rc, out, err = _on_a_terminal(["--json", srv.url(), str(tmp_path / "e.bin")], srv, until=None)
        assert rc == 0 and "sluice cp:" not in err
        assert json.loads(out)["bytes"] == 16 << 20
    for n in "abcde":
        assert (tmp_path / f"{n}.bin").read_bytes() == srv.data


def _cached_pages(path):
    """The pages of path in the page cache: mincore over a mapping of it (mapping brings none in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * ((size + 4095) // 4096))()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def test_cold_evicts_the_files_read_and_no_other(tmp_path):
    """bench --cold and load --cold: the file read leaves the page cache (no root needed), another file read as
    recently stays (they no longer drop the whole machine's cache)."""
    if subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip() in (
            "tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on tmpfs, which keeps its files in memory alone: eviction needs a disk")
    import numpy as np
    a, b = tmp_path / "a.safetensors", tmp_path / "b.bin"
    sluice.save({"w": np.arange(1 << 20, dtype=np.float32)}, str(a))
    b.write_bytes(os.urandom(4 << 20))
    os.sync()
    for cmd in (["bench", "--target", "host", "--cold", "--json", str(a)],
                ["load", "--host", "--bench", "--reps", "1", "--cold", "--json", str(a)]):
        for _ in range(5):  # another process on the machine may drop the whole cache meanwhile: tried again
            b.read_bytes()
            a.read_bytes()
            r = subprocess.run([SLUICE] + cmd, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            if _cached_pages(b) * 4096 >= (4 << 20) // 2:
                break
        else:
            pytest.fail(f"sluice {cmd[0]} --cold evicted another file too")
        rep = json.loads(r.stdout)
        assert rep.get("page_cache_dropped", 1) == 1 and rep.get("bench", {}).get("pages", "cold") == "cold", rep
