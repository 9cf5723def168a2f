"""Names over http(s):// through the registry of stores, as over s3:// (store/store.h's name ops): a web
server's directory is listed (nginx's autoindex), a dataset on it opens and reads like the local one, through
the cache (a second process fetches nothing), a checkpoint directory is listed and loaded, files are removed
and written with WebDAV's DELETE and PUT, and `sluice cp` copies between any two stores.  A server that gives
no listing or takes no writes fails with a clear error (or, for a checkpoint, its names are probed)."""
import contextlib
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
    return [(int(r["n"]), bytes(r["pad"])) for r in (ds[i] for i in range(len(ds)))]


@contextlib.contextmanager
def _listing(page):
    """A web server that answers every GET with page (a listing as some server writes it), or with page(path)
    where page is a function of the request's path; its directory's URL."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = page(self.path) if callable(page) else page
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/d/"
    finally:
        srv.shutdown()


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
            "print(sum(int(ds[i]['n']) for i in range(len(ds))))")
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
    page = ('<a href="../">up</a><a href="%2e%2e/x">dots</a><a href="/etc/passwd">abs</a><a href="http://e/x">h</a>'
            '<a href="?C=N">sort</a><a href="a%2fb">slash</a><a href="ok.bin">ok</a>').encode()
    with _listing(page) as base:
        assert sluice.listdir(base) == [base + "ok.bin"]


# ---- What a stranger's attack found, each kept fixed ----

def _megatron(prefix, seqs):
    """A Megatron .idx/.bin pair of int32 sequences (its format: MMIDIDX, version 1, dtype code 4)."""
    with open(f"{prefix}.bin", "wb") as f:
        for q in seqs:
            f.write(np.asarray(q, np.int32).tobytes())
    lens = np.array([len(q) for q in seqs], np.int32)
    ptrs = np.concatenate([[0], np.cumsum(lens[:-1], dtype=np.int64)]).astype(np.int64) * 4
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + np.uint64(1).tobytes() + bytes([4]) + np.uint64(len(seqs)).tobytes() +
                np.uint64(len(seqs) + 1).tobytes() + lens.tobytes() + ptrs.tobytes() +
                np.arange(len(seqs) + 1, dtype=np.int64).tobytes())


def test_a_file_republished_under_an_open_dataset_is_stale_never_mixed(tmp_path, cache):
    """A Megatron pair (no record CRC) republished with a .bin of the same size after the dataset opened: a read
    fails with -ESTALE instead of cutting the new bytes at the old boundaries; and a second Dataset that reads the
    new version leaves the first one's copy (a copy never changes once made) as it was."""
    import time
    (tmp_path / "www" / "m").mkdir(parents=True)
    _megatron(tmp_path / "www" / "m" / "data", [[100 + d] * 4 for d in range(8)])
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx") as w:
        first = sluice.Dataset(w.url("m/data"))
        assert list(first[0]["tokens"]) == [100] * 4
        stale = sluice.Dataset(w.url("m/data"))  # opened at version 1, its .bin not read yet
        time.sleep(1.1)  # nginx's ETag is mtime-size: a new second
        _megatron(tmp_path / "www" / "m" / "data", [[200 + d] * 2 for d in range(16)])
        with pytest.raises(sluice.SluiceError) as e:
            stale[0]
        assert e.value.code == -errno.ESTALE and "changed on the server" in str(e.value)
        second = sluice.Dataset(w.url("m/data"))
        assert list(second[0]["tokens"]) == [200] * 2
        ids = [int(i) for b in sluice.Loader(first, 8, seed=1, rank=0, world_size=1) for i in b["ids"]]
        batch = next(iter(sluice.Loader(first, 8, seed=1, rank=0, world_size=1)))
        assert sorted(ids) == list(range(8)) and set(batch["tokens"][0].tolist()) <= set(range(100, 108))


def test_names_cross_between_stores_as_names(web, tmp_path):
    """Local names that look like escapes ('%2e%2e', 'a%2F..') are encoded for a web server, so they land inside
    the destination under their own names; names from a listing ('a%20b.bin') arrive decoded; a URL's query never
    names a copy."""
    src = tmp_path / "src"
    for name in ("%2e%2e", "a%2F..%2F..", "sub"):
        (src / name).mkdir(parents=True)
    (src / "%2e%2e" / "evil.txt").write_bytes(b"1")
    (src / "a%2F..%2F.." / "evil2.txt").write_bytes(b"2")
    (src / "sub" / "a b.bin").write_bytes(b"3")
    sluice.copy(str(src), web.url("names/"), recursive=True)
    assert (web.root / "names" / "%2e%2e" / "evil.txt").read_bytes() == b"1"
    assert (web.root / "names" / "a%2F..%2F.." / "evil2.txt").read_bytes() == b"2"
    assert not (web.root / "evil.txt").exists() and not (web.root / "evil2.txt").exists()
    back = tmp_path / "back"
    sluice.copy(web.url("names/"), str(back), recursive=True)
    assert sorted(str(p.relative_to(back)) for p in back.rglob("*") if p.is_file()) == \
        ["%2e%2e/evil.txt", "a%2F..%2F../evil2.txt", "sub/a b.bin"]
    (tmp_path / "out").mkdir()
    sluice.copy(web.url("names/sub/a%20b.bin") + "?X-Amz-Signature=SECRET/x", str(tmp_path / "out") + "/")
    assert os.listdir(tmp_path / "out") == ["a b.bin"]


def test_listing_follows_links_and_names_each_file_once(tmp_path):
    """A Hugging Face snapshot is links into its blobs: they are listed and copied; a listing that links a file
    twice (Apache's icon and name) gives it once."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "x").write_bytes(b"weights")
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors").symlink_to(tmp_path / "blobs" / "x")
    assert sluice.listdir(str(snap)) == [str(snap / "model.safetensors")]
    page = b'<a href="a.bin"><img></a> <a href="a.bin">a.bin</a> <a href="./b.bin">b.bin</a>'
    with _listing(page) as base:
        assert sluice.listdir(base) == [base + "a.bin", base + "b.bin"]


def test_a_listing_that_makes_up_directories_ends_naming_its_bound(tmp_path):
    """A server whose every page links two subdirectories (25 deep, under the depth bound of 32) holds 2^25 pages:
    the walk read them for ever; it reads SLUICE_HTTP_LIST_DIRS directories at most (30 here), then is an error
    naming the listing and the setting."""
    def made_up(path):
        deep = path.count("/") > 25
        return b'<a href="f.bin">f</a>' + (b"" if deep else b'<a href="a/">a/</a> <a href="b/">b/</a>')

    with _listing(made_up) as base:
        code = f"import sluice\ntry:\n    sluice.listdir({base!r}, recursive=True)\nexcept sluice.SluiceError as e:\n" \
               "    print(e)\n"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, SLUICE_HTTP_LIST_DIRS="30"))
        assert f"{base}: its listing holds more than 30 directories (SLUICE_HTTP_LIST_DIRS)" in r.stdout, r
    with _listing(b'<a href="x/">x/</a> <a href="y.bin">y</a>') as url:  # 32 deep: the depth bound first
        with pytest.raises(sluice.SluiceError, match="more than 32 deep"):
            sluice.listdir(url, recursive=True)


def test_the_cache_keeps_no_credential_and_no_orphan(tmp_path, monkeypatch):
    """A URL's password never reaches the cache's .meta (copies are the user's alone, 0600); a copy whose .meta is
    gone (a download that failed after it) is the first the cache lets go."""
    (tmp_path / "www" / "m").mkdir(parents=True)
    _megatron(tmp_path / "www" / "m" / "d", [[1, 2, 3, 4]] * 4)
    cache = tmp_path / "cache"
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(cache))
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx") as w:
        url = w.url("m/d").replace("http://", "http://alice:S3CRETPW@")
        assert list(sluice.Dataset(url)[0]["tokens"]) == [1, 2, 3, 4]
    metas = [p for p in os.listdir(cache) if p.endswith(".meta")]
    assert metas and all("S3CRETPW" not in (cache / p).read_text() for p in metas)
    assert all(os.stat(cache / p).st_mode & 0o077 == 0 for p in os.listdir(cache) if p.endswith((".meta", ".data")))
    orphan = cache / ("f" * 32 + ".data")
    orphan.write_bytes(b"x" * 100_000)
    total = sum(os.path.getsize(cache / p) for p in os.listdir(cache) if p.endswith(".data"))
    monkeypatch.setenv("SLUICE_CACHE_LIMIT", str(total - 50_000 + 8192))
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx2") as w:
        sluice.Dataset(w.url("m/d"))[0]  # another endpoint: new copies, room made first from the orphan
    assert not orphan.exists()


def test_a_redirect_to_a_file_is_a_file_and_a_directory_url_without_slash_loads(web, tmp_path):
    (web.root / "rd").mkdir(exist_ok=True)
    (web.root / "rd" / "f.bin").write_bytes(b"redirected")
    sluice.copy(web.url("go/rd/f.bin"), str(tmp_path / "f.bin"))  # /go/NAME answers 302 to /NAME
    assert (tmp_path / "f.bin").read_bytes() == b"redirected"
    got = sluice.load(web.url("ck"))
    assert np.array_equal(got["a"], np.arange(10, dtype=np.float32))


def test_listing_links_are_read_as_a_browser_reads_them(tmp_path, capfd):
    """A link's character references are decoded before its %XX, as a browser does (Apache writes the file a&b.bin
    as href="a&amp;b.bin"; it was requested literally); every name comes in one canonical escaped form, so a page
    that spells a file two ways names it once; a link whose name cannot be a file's is named in a warning, never
    dropped without a word (a file whose name holds a backslash was skipped so); navigation is passed over."""
    links = ["a&amp;b.bin", "a%26b.bin", "lt&lt;gt&gt;.bin", "q&quot;t.bin", "s&#39;q.bin", "&#65;&#x42;.bin",
             "./c:d.bin", "%5Cback.bin", "sp%20ace.bin", "caf&#233;.bin", "e%CC%81.bin", "c1&#150;.bin",
             "&#0;z.bin", "sub/", "HREF-upper", "raw\\slash.bin", "a%2Fb.bin", "nul%00.bin", "bad%zz.bin",
             "x" * 256 + ".bin", "../", "./", "?C=N;O=D", "/abs.bin", "http://other/x.bin", "#top", "deep/er.bin",
             "&amp;amp;.bin"]
    page = "".join(f'<a href="{h}">x</a>\n' if h != "HREF-upper" else "<A HREF='upper.bin'>u</A>\n" for h in links)
    page += "<a href=unquoted.bin>u</a> <a data-href=\"not-an-href.bin\">n</a>"
    with _listing(page.encode()) as base:
        got = sluice.listdir(base)
    err = capfd.readouterr().err
    want = ["%26amp%3B.bin", "%5Cback.bin", "%EF%BF%BDz.bin", "AB.bin", "a%26b.bin", "c%3Ad.bin",
            "c1%E2%80%93.bin", "caf%C3%A9.bin", "e%CC%81.bin", "lt%3Cgt%3E.bin", "q%22t.bin", "s%27q.bin",
            "sp%20ace.bin", "unquoted.bin", "upper.bin"]
    assert got == sorted(base + w for w in want), got
    for shown, why in (("raw\\x5cslash.bin", "which a browser reads as '/'"), ("a%2Fb.bin", "a '/' inside one name"),
                       ("nul%00.bin", "a NUL byte"), ("bad%zz.bin", "a '%' that is no escape"),
                       ("x" * 100, "longer than a file name can be")):
        assert shown in err and why in err, (shown, err)
    assert "../" not in err and "deep" not in err and "other" not in err


def test_a_copy_of_an_apache_style_listing_gets_every_file(tmp_path):
    """The whole copy of a directory whose listing escapes names for HTML only (Apache's mod_autoindex: a&amp;b.bin,
    ./c:d.bin): every file arrives under its own name with its own bytes (one link requested literally was a 404
    that failed the whole copy)."""
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    d = tmp_path / "www" / "d"
    d.mkdir(parents=True)
    names = {"a&b.bin": "a&amp;b.bin", "x<y>.bin": "x&lt;y&gt;.bin", 'q"t.bin': "q&quot;t.bin",
             "s'q.bin": "s&#39;q.bin", "c:d.bin": "./c:d.bin", "café.bin": "caf&#xE9;.bin", "sp ace.bin": "sp ace.bin",
             "b\\s.bin": "b%5Cs.bin"}
    for k, name in enumerate(names):
        (d / name).write_bytes(bytes([k]) * (100 + k))
    # nginx serves d/index.html as the directory's page: a listing as Apache writes it.
    (d / "index.html").write_text("<html><body><ul>" + "".join(f'<li><a href="{h}">{h}</a></li>' for h in
                                                              names.values()) + "</ul></body></html>")
    with webserver.WebServer(tmp_path / "www", tmp_path / "nginx", listing=False) as w:
        sluice.copy(w.url("d/"), str(tmp_path / "out"), recursive=True)
    got = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert got == {name: bytes([k]) * (100 + k) for k, name in enumerate(names)}
