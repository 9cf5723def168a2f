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


def _read(url, off, n, env=None, target="host"):
    env = dict(os.environ, SLUICE_HTTP_RETRIES="3", SLUICE_MAX_TRANSFER_SIZE="1M", SLUICE_LOG="error", **(env or {}))
    return subprocess.run([sys.executable, "-c", READ, str(off), str(n), url, target], env=env,
                          capture_output=True, timeout=120)


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
