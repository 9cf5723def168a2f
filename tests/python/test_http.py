"""The http store: files of a real web server (nginx, tests/remote/webserver.py) read by http:// URL through
the engine, as ranged GETs checked against their request; and the same reads through the fault proxy
(tests/remote/s3server.py's FaultProxy, in front of nginx instead of the S3 server).

What must hold: a read gives the file's bytes or fails with an error naming the URL (its query hidden);
never other bytes, never a loop that does not end.  A fault on the first attempt is recovered by a retry.
A file replaced on the server while it is read fails with -ESTALE (the ETag pinned with If-Match), not a mix
of two versions.  Over plain http a byte flipped inside a body is not detectable (no checksum covers a
range of a web server's file; https's TLS does): that fault is left out here, and docs/RELIABILITY.md says so."""
import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sluice

import s3server
import webserver
from conftest import READ

SIZE = (6 << 20) + 123  # seven engine segments of 1 MiB in the children below
FAULTS = ("503", "429", "stall", "reset", "truncate", "shift", "garble")


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    root = tmp_path_factory.mktemp("www")
    data = np.random.default_rng(23).integers(0, 256, size=SIZE, dtype=np.uint8).tobytes()
    (root / "f.bin").write_bytes(data)
    (root / "empty.bin").write_bytes(b"")
    with webserver.WebServer(root, tmp_path_factory.mktemp("nginx")) as w:
        w.data, w.root = data, root
        yield w


@pytest.fixture(autouse=True, params=["direct", "curl"])
def receive(request, monkeypatch):
    """Every case both ways a body is received (the children read it from their environment): straight into
    place (every GET, SLUICE_HTTP_RECV_MIN=1) and through curl's buffer (0)."""
    monkeypatch.setenv("SLUICE_HTTP_RECV_MIN", "1" if request.param == "direct" else "0")
    return request.param


@pytest.fixture(scope="module")
def tls_web(tmp_path_factory, web):
    """nginx over https with a certificate of its own, serving the same files."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make the server's certificate")
    with webserver.WebServer(web.root, tmp_path_factory.mktemp("nginx-tls"), tls=True) as w:
        w.data = web.data
        yield w


def _gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _read(url, off, n, env=None, target="host", timeout=120):
    env = dict(os.environ, **dict(dict(SLUICE_HTTP_RETRIES="3", SLUICE_MAX_TRANSFER_SIZE="1M", SLUICE_LOG="error"),
                                  **(env or {})))
    return subprocess.run([sys.executable, "-c", READ, str(off), str(n), url, target], env=env,
                          capture_output=True, timeout=timeout)


def test_reads_whole_files_and_ranges(web):
    """Whole, unaligned, tail and one-byte ranges, of many segments and of none; the path names the store."""
    for off, n in ((0, SIZE), (1, SIZE - 1), (4095, 3 << 20), (SIZE - 7, 7), (SIZE - 1, 1), (123456, 1)):
        out, rep = np.zeros(n, dtype=np.uint8), {}
        assert sluice.read(web.url("f.bin"), out, offset=off, report=rep) == n
        assert out.tobytes() == web.data[off:off + n], (off, n)
        assert rep["path"].startswith("http:buffered>"), rep
    assert sluice.read(web.url("empty.bin"), np.zeros(0, dtype=np.uint8)) == 0


def test_many_segments_in_parallel_give_the_right_bytes(web):
    r = _read(web.url("f.bin"), 0, SIZE)
    assert r.returncode == 0, r.stderr.decode()
    bad = np.nonzero(np.frombuffer(r.stdout, np.uint8) != np.frombuffer(web.data, np.uint8))[0] if len(r.stdout) == SIZE else []
    assert r.stdout == web.data, (len(r.stdout), len(bad), bad[:4], bad[-4:])


def test_redirects_are_followed(web):
    out = np.zeros(5000, dtype=np.uint8)
    assert sluice.read(web.url("go/f.bin"), out, offset=1000) == 5000
    assert out.tobytes() == web.data[1000:6000]


def test_errors_name_the_url_and_hide_its_query(web):
    with pytest.raises(sluice.SluiceError) as e:
        sluice.read(web.url("absent.bin"), np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.ENOENT and web.url("absent.bin") in str(e.value) and "404" in str(e.value)
    with pytest.raises(sluice.SluiceError) as e:  # past the end: refused before any GET
        sluice.read(web.url("f.bin?X-Amz-Signature=s3cr3t"), np.zeros(SIZE + 1, dtype=np.uint8))
    assert web.url("f.bin?...") in str(e.value) and "s3cr3t" not in str(e.value)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.read(f"http://127.0.0.1:{s3server.free_port()}/f.bin", np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.ECONNREFUSED


def test_http_files_are_read_only(web):
    with pytest.raises(sluice.SluiceError) as e:
        sluice.write(web.url("new.bin"), np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.EROFS and "new.bin" in str(e.value)
    assert not (web.root / "new.bin").exists()


@pytest.mark.skipif(not _gpu(), reason="no GPU (torch with CUDA)")
def test_reads_into_gpu_memory(web):
    r = _read(web.url("f.bin"), 77, SIZE - 77, target="gpu")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == web.data[77:]


def _proxy(web, fault, every, before_get=None):
    p = s3server.FaultProxy(("127.0.0.1", web.port), faults=(fault,) if fault else (), every=every, stall_s=0.3,
                            before_get=before_get).start()
    return p, f"{p.endpoint}/f.bin"


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_on_first_attempt_is_recovered(web, fault):
    p, url = _proxy(web, fault, every=False)
    try:
        for off, n in ((0, SIZE), (12345, 2 << 20)):
            r = _read(url, off, n, target="gpu" if _gpu() else "host")
            assert r.returncode == 0, f"{fault}: {r.stderr.decode()[-800:]}"
            assert r.stdout == web.data[off:off + n], f"{fault}: WRONG BYTES"
        assert p.faulted > 0
    finally:
        p.shutdown()


@pytest.mark.parametrize("fault", FAULTS)
def test_persistent_fault_fails_cleanly(web, fault):
    """Every attempt broken: a clear error naming the URL after the retries, or (stall) the right bytes late."""
    p, url = _proxy(web, fault, every=True)
    try:
        r = _read(url, 4096, 3 << 20)
        if r.returncode == 0:
            assert fault == "stall" and r.stdout == web.data[4096:4096 + (3 << 20)], f"{fault}: WRONG BYTES"
        else:
            err = r.stderr.decode()
            assert r.returncode == 3 and url in err and "attempts" in err, err[-800:]
    finally:
        p.shutdown()


def test_file_replaced_while_read_is_an_error_not_a_mix(web):
    """The file is replaced (same size, other bytes, another mtime) after the HEAD, before the GETs: every GET
    carries If-Match, so nginx answers 412 and the read fails with -ESTALE naming the URL."""
    other = bytes(b ^ 0xFF for b in web.data[:4096]) + web.data[4096:]
    path = web.root / "g.bin"
    path.write_bytes(web.data)
    done = []

    def replace(_):
        if not done:
            path.write_bytes(other)
            st = os.stat(path)
            os.utime(path, (st.st_atime, st.st_mtime + 5))
            done.append(1)

    p = s3server.FaultProxy(("127.0.0.1", web.port), faults=(), before_get=replace).start()
    try:
        r = _read(f"{p.endpoint}/g.bin", 0, SIZE)
        err = r.stderr.decode()
        assert r.returncode == 3, "the read gave bytes of a file replaced while it was read"
        assert f"ERROR {-errno.ESTALE}" in err and "changed on the server" in err, err[-800:]
        assert all(h.get("if-match", "").startswith('"') for m, _, h in p.headers if m == "GET")
    finally:
        p.shutdown()


def test_checkpoint_over_http(web):
    """A sharded checkpoint served by a web server loads from its URL prefix (the index, then its files), as
    model files are often served."""
    rng = np.random.default_rng(24)
    t = {f"m{i}": rng.standard_normal((40, 24)).astype(np.float32) for i in range(5)}
    sluice.save(t, str(web.root / "ck"), max_shard_size=8000)
    back = sluice.load(web.url("ck/"), device="numpy")
    assert set(back) == set(t) and all(np.array_equal(back[k], t[k]) for k in t)
    cols = sluice.load(web.url("ck/model.safetensors.index.json"), device="numpy", shard=(1, 2, 3))
    assert all(np.array_equal(cols[k], t[k][:, 16:24]) for k in t)


def test_https_with_a_private_certificate(tls_web, receive):
    """https: each body decrypted by TLS straight into place (the direct receive) or through curl's buffer, the
    server's certificate checked against AWS_CA_BUNDLE (else SSL_CERT_FILE): trusted, the file's bytes; not
    trusted, an error naming the URL and no bytes."""
    url = tls_web.url("f.bin")
    base = dict(os.environ, SLUICE_HTTP_RETRIES="1", SLUICE_MAX_TRANSFER_SIZE="1M", SLUICE_LOG="debug")
    for var in ("AWS_CA_BUNDLE", "SSL_CERT_FILE"):
        env = dict(base, **{"AWS_CA_BUNDLE": "", "SSL_CERT_FILE": "", var: tls_web.cert})
        r = subprocess.run([sys.executable, "-c", READ, "0", str(SIZE), url, "host"], env=env, capture_output=True,
                           timeout=120)
        assert r.returncode == 0 and r.stdout == tls_web.data, (var, r.stderr.decode()[-800:])
        direct = r.stderr.decode().count("received straight into place")
        assert (direct >= 6) if receive == "direct" else direct == 0, (var, direct)
    env = dict(base, AWS_CA_BUNDLE="", SSL_CERT_FILE="")
    r = subprocess.run([sys.executable, "-c", READ, "0", "1000", url, "host"], env=env, capture_output=True,
                       timeout=120)
    assert r.returncode == 3 and not r.stdout and url in r.stderr.decode(), r.stderr.decode()[-800:]
    # A hashed directory of certificates (OpenSSL's SSL_CERT_DIR), beside the bundle.
    certs = os.path.join(os.path.dirname(tls_web.cert), "hashed")
    os.makedirs(certs, exist_ok=True)
    shutil.copy(tls_web.cert, os.path.join(certs, "private.pem"))
    subprocess.run(["openssl", "rehash", certs], check=True, capture_output=True, timeout=60)
    r = subprocess.run([sys.executable, "-c", READ, "0", "1000", url, "host"], env=dict(env, SSL_CERT_DIR=certs),
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout == tls_web.data[:1000], r.stderr.decode()[-800:]


# ---- Servers nginx will not play: tests/remote/webserver.py's PlainServer (Python; no nginx needed) ----

def _plain_file(tmp_path, name="p.bin", data=None):
    root = tmp_path / "www"
    root.mkdir(exist_ok=True)
    data = data if data is not None else np.random.default_rng(25).integers(0, 256, size=SIZE, dtype=np.uint8).tobytes()
    (root / name).write_bytes(data)
    return root, data


def _replacing(path, new, on_get):
    """A before_get hook that replaces path with new just before the on_get-th GET (1: the first)."""
    seen = []

    def hook(_):
        seen.append(1)
        if len(seen) == on_get:
            tmp = str(path) + ".new"
            with open(tmp, "wb") as f:
                f.write(new)
            st = os.stat(path)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # another second: another version
            os.replace(tmp, path)
    return hook


def _stale_or_old(r, old, url, what):
    """A read through a replacement: -ESTALE naming the URL, or the old bytes whole; never a mix."""
    err = r.stderr.decode()
    if r.returncode == 0:
        assert r.stdout == old, f"{what}: a MIX of two versions returned as success"
        return "old"
    assert r.returncode == 3 and f"ERROR {-errno.ESTALE}" in err and url in err, f"{what}: {err[-800:]}"
    assert "changed on the server since it was opened" in err, err[-800:]
    return "stale"


@pytest.mark.parametrize("change", ("longer", "shorter", "same-size"))
@pytest.mark.parametrize("kind", ("no-validators", "ignores-if-match", "honours-if-match"))
def test_file_replaced_mid_read_is_stale_never_a_mix(tmp_path, kind, change):
    """One open, then its ranged GETs: the file is replaced before the third. Every answer is checked against
    what the open saw (its ETag and Last-Modified where the server sends them, and always the size: a 206's
    Content-Range total, a 200's length), so the read fails with -ESTALE naming the URL whether or not the
    server honours If-Match, on both receive paths.  Without validators, only a change of size can be seen: a
    same-size rewrite there is what no client can detect (docs/guides/object-storage.md), so it is left out."""
    if kind == "no-validators" and change == "same-size":
        pytest.skip("a same-size rewrite without validators is undetectable by any client (documented)")
    root, old = _plain_file(tmp_path)
    # Bytes shifted: a mix of the two versions would show.
    new = {"longer": b"x" * 3000 + old, "shorter": old[3000:], "same-size": bytes(b ^ 0x5A for b in old)}[change]
    with webserver.PlainServer(root, validators=kind != "no-validators",
                               conditional=kind == "honours-if-match") as w:
        p = s3server.FaultProxy(w.server_address, faults=(), before_get=_replacing(root / "p.bin", new, 3)).start()
        try:
            url = f"{p.endpoint}/p.bin"
            r = _read(url, 0, SIZE, env={"SLUICE_THREADS": "1"})
            assert _stale_or_old(r, old, url, f"{kind}, {change}") == "stale"
        finally:
            p.shutdown()


def test_size_checked_on_every_answer_without_validators(tmp_path):
    """No ETag, no Last-Modified, and a file that grows between the open's HEAD and the first GET: the 206's
    Content-Range total differs from the size seen at open, so even a range wholly inside both versions fails
    -ESTALE (its bytes may be the new version's at the old offsets)."""
    root, old = _plain_file(tmp_path)
    with webserver.PlainServer(root, validators=False) as w:
        p = s3server.FaultProxy(w.server_address, faults=(),
                                before_get=_replacing(root / "p.bin", b"\0" * 100 + old, 1)).start()
        try:
            url = f"{p.endpoint}/p.bin"
            r = _read(url, 1000, 5000)
            assert r.returncode == 3 and f"ERROR {-errno.ESTALE}" in r.stderr.decode(), r.stderr.decode()[-800:]
            assert "then" in r.stderr.decode() and "Content-Range" in r.stderr.decode()
        finally:
            p.shutdown()


def test_server_without_ranges(tmp_path):
    """A server that answers a ranged GET with 200 and the whole file: a read of the whole file (one GET) gives
    its bytes; a part of it is a clear error naming the URL, at once (no retries), never the wrong bytes."""
    root, data = _plain_file(tmp_path, data=bytes(range(256)) * 16)
    with webserver.PlainServer(root, ranges=False) as w:
        r = _read(w.url("p.bin"), 0, len(data))
        assert r.returncode == 0 and r.stdout == data, r.stderr.decode()[-800:]
        before = w.gets
        r = _read(w.url("p.bin"), 100, 1000)
        err = r.stderr.decode()
        assert r.returncode == 3 and not r.stdout, "a part of a file read from a server without ranges"
        assert "does not serve byte ranges" in err and w.url("p.bin") in err and "attempts" not in err, err[-800:]
        assert w.gets - before == 1, "tried again where no retry can help"


def test_trickling_body_is_a_stall_not_a_hang(tmp_path, receive):
    """A body that comes a byte at a time (every 0.3 s) never ends a read: under 1 KiB/s for
    SLUICE_HTTP_STALL_TIME (1 s here) is a timeout, on both receive paths; retried, then an error naming
    the URL."""
    root, data = _plain_file(tmp_path)
    with webserver.PlainServer(root) as w:
        p = s3server.FaultProxy(w.server_address, faults=("trickle",), every=True, stall_s=0.3).start()
        try:
            url = f"{p.endpoint}/p.bin"
            # Two attempts of about a second each: far inside the limit (curl's default rule would take 60 s).
            r = _read(url, 0, 200_000, env={"SLUICE_HTTP_STALL_TIME": "1", "SLUICE_HTTP_RETRIES": "1"}, timeout=30)
            err = r.stderr.decode()
            assert r.returncode == 3 and f"ERROR {-errno.ETIMEDOUT}" in err and url in err, err[-800:]
            assert "2 attempts" in err, err[-800:]
        finally:
            p.shutdown()
        # Only the first attempt trickling: the retry reads the bytes.
        p = s3server.FaultProxy(w.server_address, faults=("trickle",), every=False, stall_s=0.3).start()
        try:
            r = _read(f"{p.endpoint}/p.bin", 0, 200_000, env={"SLUICE_HTTP_STALL_TIME": "1"})
            assert r.returncode == 0 and r.stdout == data[:200_000], r.stderr.decode()[-800:]
        finally:
            p.shutdown()


def test_password_in_url_is_hidden(tmp_path):
    """https://user:PASSWORD@host/...: the password never reaches a message (as a query does not); the user
    does, and the bytes are read with it."""
    root, data = _plain_file(tmp_path)
    with webserver.PlainServer(root) as w:
        port = w.server_address[1]
        ok = f"http://alice:s3cr3t-pw@127.0.0.1:{port}/p.bin"
        r = _read(ok, 10, 3000)
        assert r.returncode == 0 and r.stdout == data[10:3010], r.stderr.decode()[-800:]
        for url in (f"http://alice:s3cr3t-pw@127.0.0.1:{port}/absent.bin",
                    f"http://alice:s3cr3t-pw@127.0.0.1:{port}/p.bin?sig=qs3cr3t"):
            r = _read(url, 0, SIZE + 1)
            err = r.stderr.decode()
            assert r.returncode == 3 and "s3cr3t" not in err, err[-800:]
            assert f"http://alice:***@127.0.0.1:{port}/" in err, err[-800:]


def test_password_in_url_is_hidden_when_written_to():
    """An http(s) URL opened for writing is refused before any request; that message hides the password too."""
    with pytest.raises(sluice.SluiceError) as e:
        sluice.write("http://alice:s3cr3t-pw@127.0.0.1:9/w.bin", np.zeros(8, np.uint8))
    assert "s3cr3t" not in str(e.value) and "alice:***@127.0.0.1:9/w.bin" in str(e.value), str(e.value)


def test_certificate_refused_once_not_retried(tmp_path):
    """A server whose certificate is not trusted: one attempt, and an error naming the URL that says the
    certificate was refused and how to trust a private CA; never a retry (none can make it trusted)."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make the server's certificate")
    root, data = _plain_file(tmp_path)
    with webserver.PlainServer(root, tls=True) as w:
        env = {"AWS_CA_BUNDLE": "", "SSL_CERT_FILE": "", "SLUICE_HTTP_RETRIES": "4"}
        r = _read(w.url("p.bin"), 0, 1000, env=env)
        err = r.stderr.decode()
        assert r.returncode == 3 and not r.stdout and w.url("p.bin") in err, err[-800:]
        assert f"ERROR {-errno.EKEYREJECTED}" in err and "certificate" in err and "SSL_CERT_FILE" in err, err[-800:]
        assert "attempts" not in err, err[-800:]
        r = _read(w.url("p.bin"), 0, 1000, env=dict(env, SSL_CERT_FILE=w.cert))
        assert r.returncode == 0 and r.stdout == data[:1000], r.stderr.decode()[-800:]


def test_credentials_never_reach_the_packages_own_messages(tmp_path):
    """The messages the package raises itself (a checkpoint's header or index at fault, a directory without a
    checkpoint, keys or into= that do not match, DCP metadata, a record out of range) name a URL as the
    library's do: no password, no query (a presigned URL's signature)."""
    import struct
    from sluice import _dcpmeta
    sluice.save({"w": np.ones(4, np.float32)}, str(tmp_path / "good.safetensors"))
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 8) + b"not json")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../x.safetensors"}}')
    (tmp_path / "sub").mkdir()
    with webserver.PlainServer(tmp_path) as w:
        base = w.url("").replace("http://", "http://alice:s3cr3t-pw@")
        q = "?X-Amz-Signature=s3cr3t-sig"
        for fn in (lambda: sluice.load(base + "bad.safetensors" + q, device="numpy"),
                   lambda: sluice.load(base + "model.safetensors.index.json", device="numpy"),
                   lambda: sluice.load(base + "sub/", device="numpy"),
                   lambda: sluice.load(base + "good.safetensors" + q, device="numpy", keys=["zz"]),
                   lambda: sluice.load([base + "good.safetensors" + q], into={"q": np.ones(4, np.float32)}),
                   lambda: _dcpmeta.decode(b"x", base + "ck/.metadata" + q)):
            with pytest.raises(Exception) as e:
                fn()
            assert "s3cr3t" not in str(e.value) and "alice:***@127.0.0.1" in str(e.value), str(e.value)
