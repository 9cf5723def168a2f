"""Names over http(s):// through the registry of stores, as over s3:// (store/store.h's name ops): a web
server's directory is listed (nginx's autoindex), a dataset on it opens and reads like the local one, through
the cache (a second process fetches nothing), a checkpoint directory is listed and loaded, files are removed
and written with WebDAV's DELETE and PUT, and `sluice cp` copies between any two stores.  A server that gives
no listing or takes no writes fails with a clear error (or, for a checkpoint, its names are probed)."""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sluice

import webserver
from conftest import SLUICE

N = 600


def _pack(src_dir, out, shard="8K"):
    src = src_dir / "in.jsonl"
    src.write_text("".join(json.dumps({"n": i, "pad": "y" * (i % 51)}) + "\n" for i in range(N)))
    r = subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,pad", "--shard-size", shard,
                        "--quiet", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    root = tmp_path_factory.mktemp("www")
    _pack(tmp_path_factory.mktemp("src"), root / "ds")
    (root / "ck").mkdir()
    sluice.save({"a": np.arange(10, dtype=np.float32)}, str(root / "ck" / "first.safetensors"))
    sluice.save({"b": np.ones((3, 4), dtype=np.int64)}, str(root / "ck" / "second.safetensors"))
    with webserver.WebServer(root, tmp_path_factory.mktemp("nginx"), dav=True) as w:
        w.root = root
        yield w


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _records(ds):
    return [(int(r["n"][0]), bytes(r["pad"])) for r in (ds[i] for i in range(len(ds)))]


def test_listing_a_web_directory(web):
    local = sorted(p for p in os.listdir(web.root / "ds"))
    assert sluice.listdir(web.url("ds")) == [web.url("ds/") + n for n in local]
    assert sluice.listdir(web.url("ds/")) == [web.url("ds/") + n for n in local]
    everything = sluice.listdir(web.url(""), recursive=True)
    assert web.url("ck/first.safetensors") in everything and web.url("ds/") + local[0] in everything


def test_dataset_over_http_reads_like_the_local_one(web, cache):
    here = sluice.Dataset(str(web.root / "ds"))
    there = sluice.Dataset(web.url("ds/"))
    assert len(there) == len(here) == N and there.format == "sluice" and there.shards == here.shards > 2
    assert _records(there) == _records(here)
    ids = sorted(int(x) for b in sluice.Loader(there, 7, seed=3, rank=0, world_size=1) for x in b["ids"])
    assert sorted(set(ids)) == list(range(N)) and N <= len(ids) < N + 7


def test_a_second_process_finds_the_copies(web, cache):
    """The cache is keyed on the store and the path and checked by the file's version (its ETag): a second
    process reads the dataset with no GET at all, only HEADs."""
    code = ("import sys, sluice; ds = sluice.Dataset(sys.argv[1]); "
            "print(sum(int(ds[i]['n'][0]) for i in range(len(ds))))")
    env = dict(os.environ, SLUICE_CACHE_DIR=str(cache))
    before = web.sent("/ds/")
    first = subprocess.run([sys.executable, "-c", code, web.url("ds")], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    fetched = web.sent("/ds/") - before
    total = sum(os.path.getsize(web.root / "ds" / n) for n in os.listdir(web.root / "ds"))
    assert int(first.stdout) == N * (N - 1) // 2 and total <= fetched <= 1.05 * total
    again = subprocess.run([sys.executable, "-c", code, web.url("ds")], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert web.sent("/ds/") - before == fetched  # nothing more came


def test_inspect_contacts_the_server(web, cache):
    r = subprocess.run([SLUICE, "inspect", "--json", web.url("ds")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == N


def test_checkpoint_directory_listed_and_loaded(web):
    got = sluice.load(web.url("ck/"))
    assert np.array_equal(got["a"], np.arange(10, dtype=np.float32)) and got["b"].shape == (3, 4)


def test_without_listing_a_checkpoint_is_probed_and_listdir_says_why(tmp_path):
    (tmp_path / "www").mkdir()
    sluice.save({"w": np.arange(6, dtype=np.float32)}, str(tmp_path / "www" / "model.safetensors"))
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx", listing=False) as w:
        with pytest.raises(sluice.SluiceError) as e:
            sluice.listdir(w.url(""))
        assert e.value.code == -errno.EOPNOTSUPP and "no listing" in str(e.value)
        assert np.array_equal(sluice.load(w.url(""))["w"], np.arange(6, dtype=np.float32))


def test_write_remove_and_copy_both_ways(web, tmp_path):
    data = np.random.default_rng(5).integers(0, 256, 300_000, dtype=np.uint8)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "x.bin").write_bytes(data.tobytes())
    (tmp_path / "up" / "sub").mkdir()
    (tmp_path / "up" / "sub" / "y.bin").write_bytes(b"why")
    rep = sluice.copy(str(tmp_path / "up"), web.url("put/"), recursive=True)
    assert rep["files"] == 2 and rep["bytes"] == data.nbytes + 3
    assert (web.root / "put" / "x.bin").read_bytes() == data.tobytes()
    assert (web.root / "put" / "sub" / "y.bin").read_bytes() == b"why"
    back = tmp_path / "back"
    assert sluice.copy(web.url("put"), str(back), recursive=True)["files"] == 2
    assert (back / "x.bin").read_bytes() == data.tobytes() and (back / "sub" / "y.bin").read_bytes() == b"why"
    r = subprocess.run([SLUICE, "cp", web.url("put/x.bin"), str(tmp_path / "one.bin")], capture_output=True, text=True)
    assert r.returncode == 0 and (tmp_path / "one.bin").read_bytes() == data.tobytes(), r.stderr
    sluice.remove(web.url("put/sub/y.bin"))
    assert not (web.root / "put" / "sub" / "y.bin").exists()
    assert sluice.listdir(web.url("put"), recursive=True) == [web.url("put/x.bin")]


def test_copy_between_s3_and_http(web, s3, tmp_path):
    s3.put_object(Bucket="pytest", Key="web/a.bin", Body=b"a" * 70_000)
    assert sluice.copy("s3://pytest/web/a.bin", web.url("froms3/a.bin"))["files"] == 1
    assert (web.root / "froms3" / "a.bin").read_bytes() == b"a" * 70_000
    assert sluice.copy(web.url("ds"), "s3://pytest/fromweb/", recursive=True)["files"] == len(os.listdir(web.root / "ds"))
    ds = sluice.Dataset("s3://pytest/fromweb")
    assert len(ds) == N


def test_a_read_only_server_refuses_writes_clearly(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "f").write_bytes(b"12")
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx") as w:
        for call in (lambda: sluice.copy(str(tmp_path / "f"), w.url("f")), lambda: sluice.remove(w.url("f"))):
            with pytest.raises(sluice.SluiceError) as e:
                call()
            assert e.value.code == -errno.EROFS and "WebDAV" in str(e.value)


def test_names_that_leave_the_directory_are_not_listed(tmp_path):
    """A listing is a page the server sends: links that lead outside the directory ('..', '%2e%2e', absolute,
    another host, a query) are not names in it, so a copy cannot write outside its destination."""
    import http.server
    import threading

    page = ('<a href="../">up</a><a href="%2e%2e/x">dots</a><a href="/etc/passwd">abs</a><a href="http://e/x">h</a>'
            '<a href="?C=N">sort</a><a href="a%2fb">slash</a><a href="ok.bin">ok</a>').encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}/d/"
        assert sluice.listdir(base) == [base + "ok.bin"]
    finally:
        srv.shutdown()
