"""The fault suite for object storage: every read and write path of sluice through a proxy that breaks the
server's answers (tests/remote/s3server.py's FaultProxy: 5xx and 429, a connection reset mid-body, a body cut
short under a full Content-Length, a stall, another range than asked, an unreadable Content-Range, a flipped
byte, and the object replaced between requests).

What must hold, whatever the fault: a read gives the object's bytes or fails with an error that names the
object; never other bytes, and never a loop that does not end.  A fault on the first attempt only is
recovered by a retry.  A write leaves the object as it was or whole and new.

Each case runs in a child process (sluice's S3 client is made once per process, from the environment), with
few retries so that the persistent faults end quickly."""
import base64
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sluice  # noqa: F401  (the library the children load)

from conftest import READ, SLUICE

crc32c = pytest.importorskip("crc32c")
boto3 = pytest.importorskip("boto3")
botocore = pytest.importorskip("botocore.config").__name__ and __import__("botocore")

SIZE = (6 << 20) + 123  # two download chunks of 5 MiB, seven engine segments of 1 MiB
FAULTS = ("503", "429", "stall", "reset", "truncate", "shift", "garble", "flip")


@pytest.fixture(scope="module")
def obj(s3):
    data = np.random.default_rng(22).integers(0, 256, size=SIZE, dtype=np.uint8).tobytes()
    s3.put_object(Bucket="pytest", Key="faults/obj.bin", Body=data, ChecksumAlgorithm="CRC32")
    return data


@pytest.fixture(autouse=True, params=["direct", "curl"])
def receive(request, monkeypatch):
    """Every case both ways a body is received: straight into place (every GET, SLUICE_HTTP_RECV_MIN=1) and
    through curl's buffer (0)."""
    monkeypatch.setenv("SLUICE_HTTP_RECV_MIN", "1" if request.param == "direct" else "0")
    return request.param


def _env(s3, endpoint, tmp_path):
    return dict(os.environ, AWS_ENDPOINT_URL=endpoint, SLUICE_S3_RETRIES="3", SLUICE_S3_PART_SIZE="5M",
                SLUICE_MAX_TRANSFER_SIZE="1M", SLUICE_CACHE_DIR=str(tmp_path / "cache"), SLUICE_LOG="error")


def _proxy(s3, fault, every):
    return s3.sluice_server.fault_proxy(faults=(fault,), every=every, stall_s=0.3)


def _read(env, off, n, target="host"):
    return subprocess.run([sys.executable, "-c", READ, str(off), str(n), "s3://pytest/faults/obj.bin", target],
                          env=env, capture_output=True, timeout=120)


def _gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _cp(env, src, dst):
    return subprocess.run([SLUICE, "cp", "--json", src, dst], env=env, capture_output=True, text=True, timeout=120)


def _check(r, want, ok_to_fail, what):
    """A read's result: the right bytes, or (where allowed) an error naming the object, never other bytes."""
    if r.returncode == 0:
        assert r.stdout == want, f"{what}: WRONG BYTES returned"
        return "ok"
    err = r.stderr.decode() if isinstance(r.stderr, bytes) else r.stderr
    assert ok_to_fail, f"{what}: failed where a retry should have recovered: {err[-800:]}"
    assert "s3://pytest/faults/obj.bin" in err, f"{what}: the error does not name the object: {err[-800:]}"
    return "error"


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_on_first_attempt_is_recovered(s3, obj, fault, tmp_path):
    """Each request's first attempt broken: every read path gives the right bytes after a retry."""
    p = _proxy(s3, fault, every=False)
    env = _env(s3, p.endpoint, tmp_path)
    _check_reads(p, env, obj, fault, tmp_path, "host")
    r = _cp(env, "s3://pytest/faults/obj.bin", str(tmp_path / "copy.bin"))
    assert r.returncode == 0, r.stderr
    assert open(tmp_path / "copy.bin", "rb").read() == obj


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_on_first_attempt_is_recovered_into_gpu(s3, obj, fault, tmp_path):
    """The same into GPU memory: bytes move on to the GPU while a GET still receives, so a failed attempt's
    bytes (another range, say) must be moved again by the retry, not kept."""
    if not _gpu():
        pytest.skip("no GPU (torch with CUDA)")
    p = _proxy(s3, fault, every=False)
    _check_reads(p, _env(s3, p.endpoint, tmp_path), obj, fault, tmp_path, "gpu")


def _check_reads(p, env, obj, fault, tmp_path, target):
    _check(_read(env, 0, SIZE, target), obj, False, f"{fault}: whole object ({target})")
    _check(_read(env, 0, SIZE), obj, False, f"{fault}: whole object")
    if fault != "flip":  # a range has no checksum to match (see below)
        _check(_read(env, 1_000_003, 2_500_000, target), obj[1_000_003:3_500_003], False, f"{fault}: a range")
        _check(_read(env, SIZE - 1000, 1000, target), obj[-1000:], False, f"{fault}: the tail")
    assert p.faulted > 0


@pytest.mark.parametrize("fault", FAULTS)
def test_persistent_fault_fails_cleanly(s3, obj, fault, tmp_path):
    """Every attempt broken: the right bytes (a stall only slows) or an error naming the object, within the
    retries; never other bytes.  A flipped byte inside a range cannot be seen (S3 has no checksum for a range;
    https protects it on the wire), so ranges are not read through "flip"."""
    p = _proxy(s3, fault, every=True)
    env = _env(s3, p.endpoint, tmp_path)
    may_fail = fault != "stall"
    _check(_read(env, 0, SIZE), obj, may_fail, f"{fault}: whole object")
    if fault != "flip":
        _check(_read(env, 1_000_003, 2_500_000), obj[1_000_003:3_500_003], may_fail, f"{fault}: a range")
    r = _cp(env, "s3://pytest/faults/obj.bin", str(tmp_path / "copy.bin"))
    if r.returncode == 0:
        assert open(tmp_path / "copy.bin", "rb").read() == obj
    else:
        assert may_fail and "s3://pytest/faults/obj.bin" in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "copy.bin"), "a failed copy left a file behind"


GET_MANY = """
import sys, sluice
try:
    got = sluice.Client().get_many("pytest", ["faults/obj.bin", "faults/obj.bin"], max_size=int(sys.argv[1]))
except sluice.SluiceError as e:
    print("ERROR", e.code, e, file=sys.stderr)
    sys.exit(3)
sys.stdout.buffer.write(b"".join(g.tobytes() for g in got))
"""


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("every", [False, True])
def test_many_objects_through_faults(s3, obj, fault, every, tmp_path):
    """sluice.Client.get_many (whole objects, no Range; the object's CRC32 checked): a fault on the first
    attempt is recovered, a persistent one gives the right bytes or an error naming the object; a buffer
    smaller than the object reads it again at its size."""
    p = _proxy(s3, fault, every=every)
    env = _env(s3, p.endpoint, tmp_path)
    for cap in (SIZE + 100, 4096):
        r = subprocess.run([sys.executable, "-c", GET_MANY, str(cap)], env=env, capture_output=True, timeout=120)
        _check(r, obj + obj, every and fault != "stall", f"{fault}: get_many, {cap}-byte buffers")
    assert p.faulted > 0


def test_flipped_byte_is_named_as_a_checksum_mismatch(s3, obj, tmp_path):
    env = _env(s3, _proxy(s3, "flip", every=True).endpoint, tmp_path)
    r = _read(env, 0, SIZE)
    assert r.returncode == 3 and b"the crc32 of the" in r.stderr, r.stderr
    r = _cp(env, "s3://pytest/faults/obj.bin", str(tmp_path / "copy.bin"))
    assert r.returncode != 0 and "crc32" in r.stderr and "downloaded twice" in r.stderr, r.stderr


def test_reads_say_what_was_verified(s3, obj, tmp_path):
    """cp counts the downloads matched against the object's checksum: boto3's CRC32 and sluice's own CRC32C;
    an object without one reads as before."""
    env = _env(s3, s3.sluice_server.endpoint, tmp_path)
    r = _cp(env, "s3://pytest/faults/obj.bin", str(tmp_path / "a.bin"))
    assert r.returncode == 0 and '"files_verified":1' in r.stdout, r.stdout + r.stderr
    r = _cp(env, str(tmp_path / "a.bin"), "s3://pytest/faults/by-sluice.bin")
    assert r.returncode == 0, r.stderr
    r = _cp(env, "s3://pytest/faults/by-sluice.bin", str(tmp_path / "c.bin"))
    assert r.returncode == 0 and '"files_verified":1' in r.stdout, r.stdout + r.stderr
    assert open(tmp_path / "c.bin", "rb").read() == obj
    # In this process (the s3 fixture's endpoint): a whole object matched, a range not.
    out, rep = np.zeros(SIZE, dtype=np.uint8), {}
    assert sluice.read("s3://pytest/faults/by-sluice.bin", out, report=rep) == SIZE and rep["bytes_verified"] == SIZE
    assert out.tobytes() == obj
    assert sluice.read("s3://pytest/faults/by-sluice.bin", out[:100], offset=5, report=rep) == 100
    assert rep["bytes_verified"] == 0
    plain = boto3.client("s3", endpoint_url=s3.sluice_server.endpoint, region_name="us-east-1",
                         aws_access_key_id=s3.sluice_server.access_key,
                         aws_secret_access_key=s3.sluice_server.secret_key,
                         config=botocore.config.Config(request_checksum_calculation="when_required"))
    plain.put_object(Bucket="pytest", Key="faults/nosum.bin", Body=obj[:1000])
    r = _cp(env, "s3://pytest/faults/nosum.bin", str(tmp_path / "b.bin"))
    assert r.returncode == 0 and '"files_verified":0' in r.stdout, r.stdout + r.stderr
    assert open(tmp_path / "b.bin", "rb").read() == obj[:1000]


def test_object_replaced_between_requests(s3, obj, tmp_path):
    """Another writer replaces the object after sluice's HEAD: every GET is pinned to the ETag seen first, so
    the read fails naming the object (or, had it finished first, gives the old bytes); never a mix."""
    new = bytes(reversed(obj))
    done = []

    def replace(path):
        if "faults/obj.bin" in path and not done:
            done.append(1)
            s3.put_object(Bucket="pytest", Key="faults/obj.bin", Body=new, ChecksumAlgorithm="CRC32")

    p = s3.sluice_server.fault_proxy(faults=(), before_get=replace)
    env = _env(s3, p.endpoint, tmp_path)
    try:
        for r in (_read(env, 0, SIZE), _read(env, 0, SIZE)):
            if r.returncode == 0:
                assert r.stdout in (obj, new), "a mix of two versions"
            else:
                assert b"s3://pytest/faults/obj.bin" in r.stderr and (b"412" in r.stderr or b"changed" in r.stderr), \
                    r.stderr
            done.clear()
    finally:
        s3.put_object(Bucket="pytest", Key="faults/obj.bin", Body=obj, ChecksumAlgorithm="CRC32")


@pytest.mark.parametrize("fault", ("503", "429", "stall", "reset"))
@pytest.mark.parametrize("size", (1 << 20, (11 << 20) + 7), ids=("put", "multipart"))
def test_writes_through_faults(s3, fault, size, tmp_path):
    """A write through faults on the first attempt lands whole, with its CRC32C; through faults on every
    attempt it fails and the object is as it was."""
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8).tobytes()
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    key = f"faults/w-{fault}-{size}"
    for every in (False, True):
        s3.put_object(Bucket="pytest", Key=key, Body=b"the old object")
        p = _proxy(s3, fault, every)
        r = _cp(_env(s3, p.endpoint, tmp_path), str(src), f"s3://pytest/{key}")
        body = s3.get_object(Bucket="pytest", Key=key)["Body"].read()
        if r.returncode == 0:
            assert body == data
            head = s3.head_object(Bucket="pytest", Key=key, ChecksumMode="ENABLED")
            want = crc32c.crc32c(data).to_bytes(4, "big")
            assert head.get("ChecksumCRC32C") == base64.b64encode(want).decode(), head
        else:
            assert every and fault != "stall", r.stderr
            assert body == b"the old object", "a failed write changed the object"
            assert f"s3://pytest/{key}" in r.stderr, r.stderr


# ---- Every checksum algorithm S3 keeps, verified on whole-object reads; a flipped byte is an error ----

ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
SUM_SIZE = (2 << 20) + 77  # three engine segments of 1 MiB, one download chunk


def _crc64nvme(data):
    """CRC-64/NVME, the reference way (RevEng's catalogue: check value 0xae8b14860a799888), for uploads where
    awscrt (which boto3 and moto need to compute it) is absent."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x9A6C9329AC4BC9B5 if c & 1 else c >> 1
        table.append(c)
    crc = (1 << 64) - 1
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ ((1 << 64) - 1)


def test_crc64nvme_reference():
    assert _crc64nvme(b"123456789") == 0xAE8B14860A799888


def _put_with(s3, key, data, algorithm):
    """Uploads data with boto3's own checksum of the algorithm; where boto3 needs awscrt for it (CRC32C,
    CRC64NVME) and awscrt is absent, with the value computed here (crc32c's package, the reference above)."""
    try:
        s3.put_object(Bucket="pytest", Key=key, Body=data, ChecksumAlgorithm=algorithm)
    except (ImportError, botocore.exceptions.MissingDependencyException):
        value = crc32c.crc32c(data).to_bytes(4, "big") if algorithm == "CRC32C" else _crc64nvme(data).to_bytes(8, "big")
        s3.put_object(Bucket="pytest", Key=key, Body=data, ChecksumAlgorithm=algorithm,
                      **{"Checksum" + algorithm: base64.b64encode(value).decode()})
    head = s3.head_object(Bucket="pytest", Key=key, ChecksumMode="ENABLED")
    assert head.get("Checksum" + algorithm), (algorithm, head)


READ_REPORT = """
import json, sys, numpy as np, sluice
out = np.zeros(int(sys.argv[2]), dtype=np.uint8)
rep = {}
try:
    sluice.read(sys.argv[1], out, report=rep)
except sluice.SluiceError as e:
    print("ERROR", e.code, e, file=sys.stderr)
    sys.exit(3)
print(json.dumps(rep))
sys.stdout.flush()
sys.stdout.buffer.write(out.tobytes())
"""


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_checksum_algorithm_is_verified(s3, algorithm, tmp_path):
    """An object uploaded by boto3 with each ChecksumAlgorithm: a whole read (sluice.read into host memory,
    sluice cp, get_many) matches its bytes against it and says which algorithm it used; through a proxy that
    flips a byte of every answer, each of them fails with SLUICE_EVERIFY naming the object and the algorithm
    (boto3 raises there too), on both receive paths."""
    data = np.random.default_rng(len(algorithm)).integers(0, 256, size=SUM_SIZE, dtype=np.uint8).tobytes()
    key = f"faults/sum-{algorithm}.bin"
    url = f"s3://pytest/{key}"
    _put_with(s3, key, data, algorithm)
    for endpoint, flipped in ((s3.sluice_server.endpoint, False), (_proxy(s3, "flip", every=True).endpoint, True)):
        env = _env(s3, endpoint, tmp_path)
        r = subprocess.run([sys.executable, "-c", READ_REPORT, url, str(SUM_SIZE)], env=env, capture_output=True,
                           timeout=120)
        cp = _cp(env, url, str(tmp_path / "copy.bin"))
        many = subprocess.run([sys.executable, "-c", GET_MANY.replace("faults/obj.bin", key), str(SUM_SIZE)],
                              env=env, capture_output=True, timeout=120)
        if not flipped:
            assert r.returncode == 0, r.stderr.decode()[-800:]
            head, body = r.stdout.split(b"\n", 1)
            rep = json.loads(head)
            assert body == data and rep["bytes_verified"] == SUM_SIZE and rep["checksum"] == algorithm.lower(), rep
            assert cp.returncode == 0 and '"files_verified":1' in cp.stdout, cp.stdout + cp.stderr
            assert f'"checksum":"{algorithm.lower()}"' in cp.stdout, cp.stdout
            assert open(tmp_path / "copy.bin", "rb").read() == data
            assert many.returncode == 0 and many.stdout == data + data, many.stderr.decode()[-800:]
            os.unlink(tmp_path / "copy.bin")
        else:
            for what, p, err in (("read", r, r.stderr.decode()), ("cp", cp, cp.stderr),
                                 ("get_many", many, many.stderr.decode())):
                assert p.returncode != 0, f"{algorithm}, {what}: a flipped byte returned as success"
                assert url in err and algorithm.lower() in err, f"{algorithm}, {what}: {err[-800:]}"
            assert f"ERROR {sluice.EVERIFY if hasattr(sluice, 'EVERIFY') else -100008}" in r.stderr.decode()
            assert not os.path.exists(tmp_path / "copy.bin"), "a failed copy left a file behind"
    # A part of the object has no checksum to match: the report says so.
    out, rep = np.zeros(1000, dtype=np.uint8), {}
    sluice.read(url, out, offset=10, report=rep)
    assert rep["bytes_verified"] == 0 and rep["checksum"].startswith("none (a part"), rep


def test_composite_checksum_says_it_is_not_verified(s3, tmp_path):
    """A multipart upload's composite checksum (a checksum of the parts' checksums, "-N" after it) cannot be
    recomputed without the part sizes: reads succeed and say so, never claim a verification."""
    from boto3.s3.transfer import TransferConfig
    import io
    data = np.random.default_rng(31).integers(0, 256, size=(11 << 20) + 5, dtype=np.uint8).tobytes()
    s3.upload_fileobj(io.BytesIO(data), "pytest", "faults/composite.bin", ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                      Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    out, rep = np.zeros(len(data), dtype=np.uint8), {}
    assert sluice.read("s3://pytest/faults/composite.bin", out, report=rep) == len(data)
    assert out.tobytes() == data and rep["bytes_verified"] == 0, rep
    assert rep["checksum"] == "sha256 composite (not verified)", rep
    r = _cp(_env(s3, s3.sluice_server.endpoint, tmp_path), "s3://pytest/faults/composite.bin", str(tmp_path / "c"))
    assert r.returncode == 0 and '"files_verified":0' in r.stdout and "composite (not verified)" in r.stdout, r.stdout


def test_trickling_body_is_a_stall_not_a_hang(s3, obj, tmp_path, receive):
    """A GET whose body trickles (a byte every 0.3 s) is a stall after SLUICE_HTTP_STALL_TIME (1 s here) under
    1 KiB/s, on both receive paths: tried again, then an error naming the object; never a read held forever."""
    p = _proxy(s3, "trickle", every=True)
    env = dict(_env(s3, p.endpoint, tmp_path), SLUICE_HTTP_STALL_TIME="1", SLUICE_S3_RETRIES="1")
    r = subprocess.run([sys.executable, "-c", READ, "1000", "300000", "s3://pytest/faults/obj.bin", "host"], env=env,
                       capture_output=True, timeout=40)
    err = r.stderr.decode()
    assert r.returncode == 3 and "s3://pytest/faults/obj.bin" in err and "2 attempts" in err, err[-800:]
    assert f"ERROR {-errno.ETIMEDOUT}" in err, err[-800:]


GPU_SUMS = {"CRC32": "crc32", "CRC32C": "crc32c", "CRC64NVME": "crc64nvme",
            "SHA1": "sha1 (verified: read back from GPU memory)",
            "SHA256": "sha256 (verified: read back from GPU memory)"}


def test_gpu_reads_say_which_checksums_they_verified(s3, tmp_path):
    """Into GPU memory: CRC32C, CRC32 and CRC64NVME are folded from the pieces' CRCs and verified; a SHA
    cannot be folded from pieces, so the object is read back from GPU memory in order and hashed (one
    device-to-host pass), and the report says so."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU (torch with CUDA)")
    data = np.random.default_rng(41).integers(0, 256, size=SUM_SIZE, dtype=np.uint8).tobytes()
    for algorithm, said in GPU_SUMS.items():
        key = f"faults/gpu-{algorithm}.bin"
        _put_with(s3, key, data, algorithm)
        out, rep = torch.zeros(SUM_SIZE, dtype=torch.uint8, device="cuda"), {}
        assert sluice.read(f"s3://pytest/{key}", out, report=rep) == SUM_SIZE
        assert out.cpu().numpy().tobytes() == data
        assert rep["bytes_verified"] == SUM_SIZE and rep["checksum"] == said, (algorithm, rep)


def test_gpu_reads_of_a_flipped_byte_are_an_error(s3, tmp_path):
    """Into GPU memory, through a proxy that flips a byte of every answer: a whole read of an object with each
    checksum fails with SLUICE_EVERIFY naming the object and the algorithm (read once more first), never the
    damaged bytes returned as success."""
    if not _gpu():
        pytest.skip("no GPU (torch with CUDA)")
    data = np.random.default_rng(43).integers(0, 256, size=SUM_SIZE, dtype=np.uint8).tobytes()
    env = _env(s3, _proxy(s3, "flip", every=True).endpoint, tmp_path)
    for algorithm in GPU_SUMS:
        key = f"faults/gpu-flip-{algorithm}.bin"
        url = f"s3://pytest/{key}"
        _put_with(s3, key, data, algorithm)
        r = subprocess.run([sys.executable, "-c", READ, "0", str(SUM_SIZE), url, "gpu"], env=env,
                           capture_output=True, timeout=120)
        err = r.stderr.decode()
        assert r.returncode == 3, f"{algorithm}: a flipped byte into GPU memory returned as success: {err[-800:]}"
        assert url in err and algorithm.lower() in err and "ERROR -100008" in err, f"{algorithm}: {err[-800:]}"


def test_a_copy_of_several_algorithms_names_each(s3, tmp_path):
    """A tree whose objects carry CRC32C and CRC32 (one name inside the other): the copy's report names both,
    whichever download finished first."""
    data = b"several algorithms" * 100
    _put_with(s3, "algs/a.bin", data, "CRC32C")
    _put_with(s3, "algs/b.bin", data, "CRC32")
    for order in range(2):
        rep = sluice.copy("s3://pytest/algs/", str(tmp_path / f"out{order}"), recursive=True)
        assert rep["files_verified"] == 2 and sorted(rep["checksum"].split(", ")) == ["crc32", "crc32c"], rep
