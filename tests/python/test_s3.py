"""s3:// paths through the Python package, against the S3 test server (tests/remote/s3server.py: moto on
127.0.0.1, signatures checked).  Objects are written with boto3 (moto's own dependency), an independent
client; sluice reads them into numpy arrays and, with a GPU, torch tensors."""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sluice
from conftest import small_tmpfs


boto3 = pytest.importorskip("boto3")


def test_read_object_into_numpy(s3):
    data = np.random.default_rng(5).integers(0, 256, size=(5 << 20) + 333, dtype=np.uint8)
    s3.put_object(Bucket="pytest", Key="a/b.bin", Body=data.tobytes())
    out = np.zeros_like(data)
    assert sluice.read("s3://pytest/a/b.bin", out) == data.nbytes
    assert np.array_equal(out, data)
    part = np.zeros(1000, dtype=np.uint8)
    assert sluice.read("s3://pytest/a/b.bin", part, offset=4_000_001) == 1000
    assert np.array_equal(part, data[4_000_001:4_001_001])


@pytest.mark.parametrize("recv_min", ["1M", "0"])
def test_bodies_received_straight_into_place(s3, recv_min):
    """Ranged GETs of SLUICE_HTTP_RECV_MIN bytes or more are received into their destination (the request and
    its SigV4 signature sluice's own, checked by the server); 0 takes them through curl. The same bytes."""
    data = np.random.default_rng(9).integers(0, 256, size=(3 << 20) + 77, dtype=np.uint8)
    s3.put_object(Bucket="pytest", Key="direct/obj.bin", Body=data.tobytes())
    code = ("import numpy as np, sys, sluice\n"
            "out = np.zeros(int(sys.argv[1]), np.uint8)\n"
            "n = sluice.read('s3://pytest/direct/obj.bin', out)\n"
            "sys.stdout.buffer.write(out[:n].tobytes())\n")
    env = dict(os.environ, SLUICE_HTTP_RECV_MIN=recv_min, SLUICE_LOG="debug", SLUICE_MAX_TRANSFER_SIZE="1M")
    r = subprocess.run([sys.executable, "-c", code, str(data.nbytes)], env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-800:]
    assert r.stdout == data.tobytes()
    direct = r.stderr.decode().count("received straight into place")
    assert (direct >= 3) if recv_min == "1M" else direct == 0, r.stderr.decode()[-800:]


def test_write_then_read(s3):
    data = np.random.default_rng(7).integers(0, 256, size=(11 << 20) + 5, dtype=np.uint8)
    assert sluice.write("s3://pytest/w/obj.bin", data) == data.nbytes
    assert s3.get_object(Bucket="pytest", Key="w/obj.bin")["Body"].read() == data.tobytes()
    out = np.zeros_like(data)
    sluice.read("s3://pytest/w/obj.bin", out)
    assert np.array_equal(out, data)


def test_failed_upload_leaves_nothing(s3, tmp_path):
    """Through the faulty proxy with no retries, a multipart upload fails; it is aborted: no object, no
    upload left in the store.  A child process, so that its engine's S3 client takes these settings."""
    srv = s3.sluice_server
    env = dict(os.environ, AWS_ENDPOINT_URL=srv.faulty, SLUICE_S3_RETRIES="0", SLUICE_S3_PART_SIZE="5M",
               SLUICE_S3_CONCURRENCY="2")
    # The proxy breaks the first attempt of every request: the first try fails creating the upload, the
    # others in its parts (those are aborted); none succeeds.
    code = ("import numpy as np, sluice\n"
            "for _ in range(4):\n"
            "    try:\n"
            "        sluice.write('s3://pytest/doomed.bin', np.ones(24 << 20, dtype=np.uint8))\n"
            "        print('written')\n"
            "    except sluice.SluiceError as e:\n"
            "        print('failed:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and all(x.startswith("failed: s3://pytest/doomed.bin") for x in lines), out.stdout + out.stderr
    assert any("the upload was aborted" in x for x in lines), out.stdout
    assert "Contents" not in s3.list_objects_v2(Bucket="pytest", Prefix="doomed")
    assert not s3.list_multipart_uploads(Bucket="pytest").get("Uploads")


def test_errors_name_the_object(s3):
    with pytest.raises(sluice.SluiceError) as e:
        sluice.read("s3://pytest/missing.bin", np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.ENOENT and "s3://pytest/missing.bin" in str(e.value)
    s3.put_object(Bucket="pytest", Key="small", Body=b"x" * 10)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.read("s3://pytest/small", np.zeros(11, dtype=np.uint8))
    assert "s3://pytest/small" in str(e.value)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.write("s3://no-such-bucket-here/new", np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.ENOENT and "NoSuchBucket" in str(e.value)


def test_read_object_into_gpu(s3):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    data = np.random.default_rng(6).integers(0, 256, size=(9 << 20) + 7, dtype=np.uint8)
    s3.put_object(Bucket="pytest", Key="gpu.bin", Body=data.tobytes())
    t = torch.empty(data.nbytes, dtype=torch.uint8, device="cuda")
    assert sluice.read("s3://pytest/gpu.bin", t) == data.nbytes
    assert np.array_equal(t.cpu().numpy(), data)
    # And back: a multipart upload (two 8 MiB parts) of GPU memory, copied out part by part.
    t2 = torch.flip(t, dims=[0]).contiguous()
    assert sluice.write("s3://pytest/from-gpu.bin", t2) == data.nbytes
    assert s3.get_object(Bucket="pytest", Key="from-gpu.bin")["Body"].read() == data[::-1].tobytes()
    # The client, by bucket and key, into GPU memory.
    srv = s3.sluice_server
    with sluice.Client(srv.endpoint, srv.access_key, srv.secret_key) as c:
        t3 = torch.zeros(4096, dtype=torch.uint8, device="cuda")
        assert c.read_to_gpu("pytest", "gpu.bin", t3, offset=1 << 20) == 4096
        assert np.array_equal(t3.cpu().numpy(), data[1 << 20:(1 << 20) + 4096])
        # The client's async read into GPU memory, with its callback.
        got = []
        t3.zero_()
        assert c.async_read("pytest", "gpu.bin", t3, offset=77, callback=got.append).wait() == 4096
        assert got == [4096] and np.array_equal(t3.cpu().numpy(), data[77:77 + 4096])
    # The stream-ordered async read (sluice.read_async) of an object.
    t4 = torch.zeros(data.nbytes, dtype=torch.uint8, device="cuda")
    fut = sluice.read_async("s3://pytest/gpu.bin", t4)
    assert fut.wait() == data.nbytes
    torch.cuda.current_stream().synchronize()
    assert np.array_equal(t4.cpu().numpy(), data)


def test_bench_an_object(s3):
    """`sluice bench s3://...`: the object read through the engine, reported as the S3 path; --verify, which
    compares with the kernel's read of a file, is refused for objects rather than passing unchecked."""
    import json
    binary = os.environ.get("SLUICE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "sluice"))
    s3.put_object(Bucket="pytest", Key="bench.bin", Body=os.urandom(3 << 20))
    out = subprocess.run([binary, "bench", "s3://pytest/bench.bin", "--target", "host", "--repeat", "2", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    runs = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert runs and runs[-1]["bytes"] == 3 << 20 and runs[-1]["gb_s"] > 0 and "s3:buffered" in runs[-1]["path"]
    out = subprocess.run([binary, "bench", "s3://pytest/bench.bin", "--verify"], capture_output=True, text=True)
    assert out.returncode != 0 and "s3://pytest/bench.bin" in out.stderr and "--verify" in out.stderr


def test_client_by_bucket_and_key(s3):
    """sluice.Client, the seed's shape: explicit endpoint and keys (the environment's are not used), bucket and
    key apart; a wrong secret is refused by the server's signature check and named."""
    srv = s3.sluice_server
    data = np.random.default_rng(8).integers(0, 256, size=(6 << 20) + 1, dtype=np.uint8)
    with sluice.Client(srv.endpoint, srv.access_key, srv.secret_key, "us-east-1") as c:
        assert c.write_from_gpu("pytest", "client/obj", data) == data.nbytes
        assert c.size("pytest", "client/obj") == data.nbytes
        out = np.zeros(1000, dtype=np.uint8)
        assert c.read_to_gpu("pytest", "client/obj", out, offset=12345) == 1000
        assert np.array_equal(out, data[12345:13345])
        half = np.zeros(data.nbytes, dtype=np.uint8)
        assert c.read_to_gpu("pytest", "client/obj", half, length=100) == 100 and np.array_equal(half[:100], data[:100])
    assert s3.get_object(Bucket="pytest", Key="client/obj")["Body"].read() == data.tobytes()
    with sluice.Client(srv.endpoint, srv.access_key, "not-the-secret") as bad:
        with pytest.raises(sluice.SluiceError) as e:
            bad.size("pytest", "client/obj")
        assert e.value.code == -errno.EACCES and "not-the-secret" not in str(e.value)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Client("localhost:9000")
    assert "localhost:9000" in str(e.value)
    with pytest.raises(sluice.SluiceError):
        sluice.Client(srv.endpoint, srv.access_key)  # a key without its secret
    # The seed's multi-GPU knobs under their names: checked, and an engine of the client's own with them.
    with sluice.Client(srv.endpoint, srv.access_key, srv.secret_key, device_ids=[0], enable_p2p=False) as c:
        out = np.zeros(1000, dtype=np.uint8)
        assert c.read_to_gpu("pytest", "client/obj", out, offset=7) == 1000 and np.array_equal(out, data[7:1007])
    with pytest.raises(sluice.SluiceError, match="device id 0 is listed twice"):
        sluice.Client(srv.endpoint, srv.access_key, srv.secret_key, device_ids=[0, 0])


def _sluice_bin():
    return os.environ.get("SLUICE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "sluice"))


def _tree(root, n=24, seed=3):
    """An ImageFolder tree of n random files in two classes; returns {relative name: bytes}."""
    rng, files = np.random.default_rng(seed), {}
    for i in range(n):
        rel = f"{'ab'[i % 2]}/f{i:03d}.bin"
        data = rng.integers(0, 256, size=int(rng.integers(1000, 90000)), dtype=np.uint8).tobytes()
        os.makedirs(os.path.join(root, rel[0]), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as h:
            h.write(data)
        files[rel] = data
    return files


def _records(ds):
    return sorted((bytes(ds[i]["key"]), bytes(ds[i]["data"]), int(ds[i]["label"])) for i in range(len(ds)))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh SLUICE_CACHE_DIR (the variable is read at each fetch)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(d))
    monkeypatch.delenv("SLUICE_CACHE_LIMIT", raising=False)
    return d


def _pack(src, out, env=None, shard_size="60000"):
    return subprocess.run([_sluice_bin(), "pack", "--from-dir", str(src), "--all-files", "--shard-size", shard_size,
                           "--quiet", out],
                          capture_output=True, text=True, timeout=120, env=env)


def test_dataset_packed_to_s3_reads_like_the_local_one(s3, cache, tmp_path):
    """`sluice pack` into s3://, then inspect, verify, sluice.Dataset and sluice.Loader over it: the same
    records as the same tree packed locally; packing over it again is refused and leaves it whole."""
    _tree(tmp_path / "src")
    assert _pack(tmp_path / "src", str(tmp_path / "local")).returncode == 0
    out = _pack(tmp_path / "src", "s3://pytest/ds1/")
    assert out.returncode == 0, out.stderr
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="pytest", Prefix="ds1/")["Contents"]]
    assert "ds1/index.sli" in keys and sum(k.endswith(".sls") for k in keys) > 3
    assert not [p for p in os.listdir(cache) if p.startswith("staging")]  # the staging directory is gone
    again = _pack(tmp_path / "src", "s3://pytest/ds1")
    assert again.returncode != 0 and "already holds a dataset" in again.stderr
    local, remote = sluice.Dataset(str(tmp_path / "local")), sluice.Dataset("s3://pytest/ds1")
    assert len(remote) == len(local) == 24 and _records(remote) == _records(local)
    for cmd in (["inspect", "--json"], ["verify"]):
        r = subprocess.run([_sluice_bin(), *cmd, "s3://pytest/ds1/"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    import json
    info = json.loads(subprocess.run([_sluice_bin(), "inspect", "--json", "s3://pytest/ds1"], capture_output=True,
                                     text=True, timeout=60).stdout)
    assert info["records"] == 24
    seen = []
    ld = sluice.Loader(remote, batch_size=4, seed=1, drop_last=True, rank=0, world_size=1)
    for b in ld:
        data, offs = b["key"]
        seen += [bytes(data[offs[j]:offs[j + 1]]) for j in range(len(offs) - 1)]
    assert sorted(seen) == sorted(r[0] for r in _records(local))
    # The shards were downloaded once (misses) and found in the cache since (hits): the process's counts.
    st = ld.stats()
    assert st["object_cache_misses"] > 3 and st["object_cache_hits"] > 3


def test_cache_follows_the_etag(s3, cache, tmp_path):
    """A cached shard is used while its ETag and size match; once the object changes it is downloaded again, as
    a copy of its own: the old version's copy is never rewritten under a reader that still has it."""
    _tree(tmp_path / "one", seed=1)
    _tree(tmp_path / "two", seed=2)
    assert _pack(tmp_path / "one", "s3://pytest/ds2", shard_size="1G").returncode == 0
    first = _records(sluice.Dataset("s3://pytest/ds2"))
    copies = sorted(p for p in os.listdir(cache) if p.endswith(".data"))
    assert len(copies) == 2  # index and one shard
    for o in s3.list_objects_v2(Bucket="pytest", Prefix="ds2/")["Contents"]:
        s3.delete_object(Bucket="pytest", Key=o["Key"])
    assert _pack(tmp_path / "two", "s3://pytest/ds2", shard_size="1G").returncode == 0
    second = _records(sluice.Dataset("s3://pytest/ds2"))
    assert second != first and len(second) == 24
    local = tmp_path / "local2"
    assert _pack(tmp_path / "two", str(local), shard_size="1G").returncode == 0
    assert second == _records(sluice.Dataset(str(local)))
    now = sorted(p for p in os.listdir(cache) if p.endswith(".data"))
    assert len(now) == 4 and set(copies) < set(now)  # the new version's copies beside the old ones


def test_ranks_download_each_shard_once(s3, cache, tmp_path):
    """Four processes (the ranks of one machine) read the same s3:// dataset at once through a counting proxy:
    each object is fetched by one of them only; the others wait for it and use the copy."""
    srv = s3.sluice_server
    _tree(tmp_path / "src", n=40)
    assert _pack(tmp_path / "src", "s3://pytest/ds3", shard_size="200000").returncode == 0
    env = dict(os.environ, AWS_ENDPOINT_URL=srv.counting)
    code = ("import sluice\n"
            "ds = sluice.Dataset('s3://pytest/ds3')\n"
            "print(sum(len(ds[i]['data']) for i in range(len(ds))))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({o[0] for o in outs}) == 1
    gets = {path: n for (method, path), n in srv.counter.counts.items() if method == "GET" and "/ds3/" in path}
    shards = [o["Key"] for o in s3.list_objects_v2(Bucket="pytest", Prefix="ds3/")["Contents"]]
    assert len(shards) > 3 and len(gets) == len(shards)
    # Each object is under one part (8 MiB): one GET each, whichever rank made it.
    assert all(n == 1 for n in gets.values()), gets


def test_cache_limit_evicts_least_recently_used(s3, cache, tmp_path, monkeypatch):
    """Under SLUICE_CACHE_LIMIT the copies least recently used go; an object larger than the limit is an error
    that names the variable."""
    _tree(tmp_path / "src", n=40)
    assert _pack(tmp_path / "src", "s3://pytest/ds4", shard_size="150000").returncode == 0
    sizes = [o["Size"] for o in s3.list_objects_v2(Bucket="pytest", Prefix="ds4/")["Contents"]]
    limit = max(sizes) * 3
    monkeypatch.setenv("SLUICE_CACHE_LIMIT", str(limit))
    ds = sluice.Dataset("s3://pytest/ds4")
    total = sum(len(ds[i]["data"]) for i in range(len(ds)))
    assert total > limit
    held = sum(os.path.getsize(cache / p) for p in os.listdir(cache) if p.endswith(".data"))
    assert 0 < held <= limit
    monkeypatch.setenv("SLUICE_CACHE_LIMIT", str(min(sizes) // 2))
    with pytest.raises(sluice.SluiceError) as e:
        sluice.Dataset("s3://pytest/ds4")[0]
    assert "SLUICE_CACHE_LIMIT" in str(e.value)


def _big_tree(root, n, size, seed=4):
    rng = np.random.default_rng(seed)
    for i in range(n):
        os.makedirs(root / "c", exist_ok=True)
        rng.integers(0, 256, size=size, dtype=np.uint8).tofile(root / "c" / f"f{i:03d}.bin")


def test_cache_on_a_full_disk_ends_with_a_clear_error(s3, tmp_path):
    """The cache directory on a 64 MiB file system, a dataset of 24 MiB shards (92 MB): reading it through
    ends (correct records, or an error naming the cache directory) with the bytes fetched within a small
    multiple of the dataset; no shard is fetched again for each record."""
    with small_tmpfs(tmp_path / "small", "64m") as mnt:
        _big_tree(tmp_path / "src", n=23, size=4 << 20)
        r = subprocess.run([_sluice_bin(), "pack", "--from-dir", str(tmp_path / "src"), "--all-files", "--shard-size", "24M",
                            "--quiet", "s3://pytest/full/"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, SLUICE_CACHE_DIR=str(tmp_path / "stage")))
        assert r.returncode == 0, r.stderr
        total = sum(o["Size"] for o in s3.list_objects_v2(Bucket="pytest", Prefix="full/")["Contents"])
        proxy = s3.sluice_server.fault_proxy(faults=())
        env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint, SLUICE_CACHE_DIR=str(mnt / "cache"))
        env.pop("SLUICE_CACHE_LIMIT", None)
        # Every record asked for, as a loader that skips a failed one would: each must be right or fail
        # with an error that names the cache directory.
        code = ("import sluice, sys\n"
                "ds = sluice.Dataset('s3://pytest/full')\n"
                "good = 0\n"
                "for i in range(len(ds)):\n"
                "    try:\n"
                "        good += len(ds[i]['data']) == 4 << 20\n"
                "    except sluice.SluiceError as e:\n"
                "        print('ERROR', e, file=sys.stderr)\n"
                "print(good)\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        errors = r.stderr.splitlines()
        assert int(r.stdout) + len(errors) == 23, r.stdout + r.stderr
        assert all(str(mnt / "cache") in e for e in errors), errors[:3]
        assert proxy.sent <= 3 * total, f"{proxy.sent} bytes fetched for a dataset of {total}"


def test_cache_copy_changed_on_disk_is_fetched_again(s3, cache, tmp_path):
    """A cached shard written into after its download (a byte flipped on disk) is seen on its next use (its
    ctime changed, and it no longer matches the object's checksum) and downloaded again."""
    _tree(tmp_path / "src", seed=7)
    assert _pack(tmp_path / "src", "s3://pytest/ds5", shard_size="1G").returncode == 0
    assert _pack(tmp_path / "src", str(tmp_path / "local")).returncode == 0
    want = _records(sluice.Dataset(str(tmp_path / "local")))
    assert _records(sluice.Dataset("s3://pytest/ds5")) == want
    for p in os.listdir(cache):
        if p.endswith(".data"):
            with open(cache / p, "r+b") as f:  # the header's first byte: "bad magic" without the check
                b = f.read(1)
                f.seek(0)
                f.write(bytes([b[0] ^ 0xFF]))
    assert _records(sluice.Dataset("s3://pytest/ds5")) == want


def test_cache_removes_downloads_of_dead_processes(s3, cache, tmp_path):
    """A .part file left by a process that died is removed by the next download's eviction pass; a live one's
    stays and counts under the limit."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.makedirs(cache, exist_ok=True)
    stale, live = cache / ("0" * 32 + f".part.{dead.pid}"), cache / ("1" * 32 + f".part.{os.getpid()}")
    stale.write_bytes(b"x" * 100000)
    live.write_bytes(b"y" * 100000)
    _tree(tmp_path / "src", seed=8)
    assert _pack(tmp_path / "src", "s3://pytest/ds6", shard_size="1G").returncode == 0
    assert len(sluice.Dataset("s3://pytest/ds6")) == 24
    assert not stale.exists() and live.exists()


def test_copy_both_ways(s3, tmp_path):
    """`sluice cp` and sluice.copy: a file up and down, a tree up and down (-r), all byte for byte; what cannot be
    copied is refused, naming it."""
    files = _tree(tmp_path / "src", n=12)
    big = np.random.default_rng(9).integers(0, 256, size=(19 << 20) + 7, dtype=np.uint8)
    big.tofile(tmp_path / "src" / "big.bin")
    files["big.bin"] = big.tobytes()
    r = subprocess.run([_sluice_bin(), "cp", "-r", "--json", str(tmp_path / "src"), "s3://pytest/tree/"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads(r.stdout)
    assert rep["files"] == len(files) and rep["bytes"] == sum(len(v) for v in files.values())
    for rel, data in files.items():
        assert s3.get_object(Bucket="pytest", Key="tree/" + rel)["Body"].read() == data
    got = sluice.copy("s3://pytest/tree", str(tmp_path / "back"), recursive=True)
    assert got["files"] == len(files)
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    # A trailing '/' on either side names the same tree.
    assert sluice.copy(str(tmp_path / "src") + "/", "s3://pytest/tree2", recursive=True)["files"] == len(files)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="pytest", Prefix="tree2/")["Contents"]}
    assert keys == {"tree2/" + rel for rel in files}
    sluice.copy("s3://pytest/tree/big.bin", str(tmp_path))
    assert (tmp_path / "big.bin").read_bytes() == files["big.bin"]
    sluice.copy(str(tmp_path / "big.bin"), "s3://pytest/one/")
    assert s3.head_object(Bucket="pytest", Key="one/big.bin")["ContentLength"] == big.nbytes
    # Local to local is a copy like any other (the local store's fetch); a directory needs recursive.
    sluice.copy(str(tmp_path / "big.bin"), str(tmp_path / "again.bin"))
    assert (tmp_path / "again.bin").read_bytes() == files["big.bin"]
    with pytest.raises(sluice.SluiceError) as e:
        sluice.copy(str(tmp_path / "src"), str(tmp_path / "elsewhere"))
    assert e.value.code == -errno.EISDIR
    r = subprocess.run([_sluice_bin(), "cp", "s3://pytest/tree", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode != 0 and "--recursive" in r.stderr
    r = subprocess.run([_sluice_bin(), "cp", "s3://pytest/no/such.bin", str(tmp_path / "x")], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "s3://pytest/no/such.bin" in r.stderr and not (tmp_path / "x").exists()


def test_checkpoint_save_load_s3(s3):
    """sluice.save / sluice.load with an s3:// path: one object in the safetensors layout."""
    t = {"w": np.arange(3000, dtype=np.float32).reshape(30, 100), "b": np.arange(7, dtype=np.int64)}
    sluice.save(t, "s3://pytest/ck/model.safetensors", metadata={"step": "5"})
    raw = s3.get_object(Bucket="pytest", Key="ck/model.safetensors")["Body"].read()
    assert int.from_bytes(raw[:8], "little") < len(raw)
    back = sluice.load("s3://pytest/ck/model.safetensors", device="numpy")
    assert set(back) == {"w", "b"} and np.array_equal(back["w"], t["w"]) and np.array_equal(back["b"], t["b"])


def test_sharded_checkpoint_on_s3(s3):
    """A sharded checkpoint saved under an s3:// prefix (its files, then its index) loads from the prefix, some
    tensors by glob, and one rank's rows, in one batched read of the objects."""
    rng = np.random.default_rng(12)
    t = {f"l{i}.w": rng.standard_normal((64, 32)).astype(np.float32) for i in range(6)}
    sluice.save(t, "s3://pytest/sharded", max_shard_size=20000)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="pytest", Prefix="sharded/")["Contents"]}
    assert "sharded/model.safetensors.index.json" in keys and len(keys) == 4  # three shards of two tensors
    back = sluice.load("s3://pytest/sharded/", device="numpy")
    assert set(back) == set(t) and all(np.array_equal(back[k], t[k]) for k in t)
    part = sluice.load("s3://pytest/sharded/model.safetensors.index.json", device="numpy", keys=["l[02].w"],
                       shard=(0, 1, 4))
    assert set(part) == {"l0.w", "l2.w"} and all(np.array_equal(part[k], t[k][16:32]) for k in part)
    with pytest.raises(sluice.SluiceError, match="no .safetensors files and no index"):
        sluice.load("s3://pytest/nothing-here/", device="numpy")
    # Without an index: the prefix's .safetensors objects, listed.
    s3.delete_object(Bucket="pytest", Key="sharded/model.safetensors.index.json")
    names = sluice.listdir("s3://pytest/sharded/")
    assert [n.rsplit("-", 1)[0] for n in names] == [f"s3://pytest/sharded/model-0000{k}-of-00003" for k in (1, 2, 3)]
    back = sluice.load("s3://pytest/sharded/", device="numpy")
    assert set(back) == set(t) and all(np.array_equal(back[k], t[k]) for k in t)


def test_client_async_and_knobs(s3):
    """The client's async_read / async_write return futures at once and call back when done; knobs under the
    engine's names give a client an engine of its own (ranges of max_transfer_size, threads GETs in flight)."""
    import threading
    srv = s3.sluice_server
    data = np.random.default_rng(10).integers(0, 256, size=(9 << 20) + 3, dtype=np.uint8)
    with sluice.Client(srv.endpoint, srv.access_key, srv.secret_key, "us-east-1", max_transfer_size=1 << 20,
                       threads=3, queue_depth=2, buffer_pool_size=8 << 20) as c:
        done, results = threading.Event(), []
        w = c.async_write("pytest", "async/obj", data, callback=lambda r: (results.append(r), done.set()))
        assert w.wait() == data.nbytes and done.wait(10) and results == [data.nbytes]
        outs = [np.zeros(1 << 20, dtype=np.uint8) for _ in range(4)]
        futs = [c.async_read("pytest", "async/obj", o, offset=k * 2_000_001) for k, o in enumerate(outs)]
        assert [f.wait() for f in futs] == [1 << 20] * 4
        for k, o in enumerate(outs):
            assert np.array_equal(o, data[k * 2_000_001:k * 2_000_001 + (1 << 20)])
        failed = []
        f = c.async_read("pytest", "async/missing", outs[0], callback=failed.append)
        with pytest.raises(sluice.SluiceError) as e:
            f.wait()
        assert e.value.code == -errno.ENOENT and "async/missing" in str(e.value) and failed == [-errno.ENOENT]
    with pytest.raises(sluice.SluiceError):
        sluice.Client(srv.endpoint, srv.access_key, srv.secret_key, max_transfer_size=3)


def test_session_token_is_sent_and_signed(s3, tmp_path):
    """AWS_SESSION_TOKEN goes out as x-amz-security-token, inside the signature (SignedHeaders); the server
    refuses a token it did not issue (moto cannot issue one its S3 accepts), and the token is in no message."""
    srv = s3.sluice_server
    s3.put_object(Bucket="pytest", Key="tok/k", Body=b"x" * 100)
    token = "FwoGZXIvYXdzSLUICETESTTOKEN0123456789"
    env = dict(os.environ, AWS_ENDPOINT_URL=srv.counting, AWS_SESSION_TOKEN=token, HOME=str(tmp_path))
    code = ("import numpy as np, sluice\n"
            "try:\n"
            "    sluice.read('s3://pytest/tok/k', np.zeros(100, np.uint8)); print('read')\n"
            "except sluice.SluiceError as e:\n"
            "    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("refused") and "s3://pytest/tok/k" in out.stdout
    assert token not in out.stdout + out.stderr
    sent = [h for m, p, h in srv.counter.headers if p.startswith("/pytest/tok/k")]
    assert sent and all(h.get("x-amz-security-token") == token for h in sent)
    assert all("x-amz-security-token" in h["authorization"].split("SignedHeaders=")[1].split(",")[0] for h in sent)


def test_tune_an_object(s3, tmp_path):
    """sluice tune s3://...: downloads with each part size and parts in flight; the pick lands in the settings file."""
    s3.put_object(Bucket="pytest", Key="tune/obj", Body=os.urandom(24 << 20))
    conf = tmp_path / "sluice.conf"
    conf.write_text("[sluice]\nthreads = 3\n")
    r = subprocess.run([_sluice_bin(), "tune", "--json", "s3://pytest/tune/obj"], capture_output=True, text=True,
                       env=dict(os.environ, SLUICE_CONFIG=str(conf), TMPDIR=str(tmp_path)), timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    d, c, p = out["defaults"], out["candidate"], out["picked"]
    assert out["kind"] == "object" and out["written"] is True
    assert (d["s3_concurrency"], d["s3_part_size"]) == (8, 8 << 20)
    knobs = lambda x: (x["s3_concurrency"], x["s3_part_size"])  # noqa: E731
    tried = {knobs(t) for t in out["trials"]}
    assert knobs(c) in tried and len(tried) >= 9
    assert knobs(p) == (knobs(c) if c["gb_s"] >= d["gb_s"] else knobs(d))
    assert out["gain"] == pytest.approx(p["gb_s"] / d["gb_s"], rel=1e-3)
    text = conf.read_text()
    assert f"s3_concurrency = {p['s3_concurrency']}\n" in text and f"s3_part_size = {p['s3_part_size']}\n" in text
    assert "threads = 3" in text
    assert sorted(os.listdir(tmp_path)) == ["sluice.conf"]  # no download left behind


def test_many_small_objects_as_an_object_folder(s3):
    """sluice.ObjectFolder over an s3:// prefix in ImageFolder's layout: every object once a pass, with its
    class's label (classes sorted), in order or shuffled by epoch; an object larger than max_size read whole;
    objects outside class folders left out; a missing object fails naming it."""
    rng = np.random.default_rng(3)
    want = {}
    for c in ("dog", "cat", "eel"):
        for i in range(23):
            size = int(rng.integers(0, 3000)) if i != 7 else 70_000  # one over max_size below
            body = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            s3.put_object(Bucket="pytest", Key=f"folder/{c}/{i:03d}.jpg", Body=body, ChecksumAlgorithm="CRC32")
            want[f"folder/{c}/{i:03d}.jpg"] = (body, ["cat", "dog", "eel"].index(c))
    s3.put_object(Bucket="pytest", Key="folder/README", Body=b"not a sample")
    ds = sluice.ObjectFolder("s3://pytest/folder", batch_size=10, max_size=4096, in_flight=8)
    assert ds.classes == ["cat", "dog", "eel"] and len(ds) == 7
    seen = []
    for data, labels in ds:
        assert len(data) == len(labels) <= 10
        for (key, label), d, lab in zip(ds.samples[len(seen):], data, labels):
            assert d.tobytes() == want[key][0] and lab == label == want[key][1]
            seen.append(key)
    assert sorted(seen) == sorted(want)
    ds = sluice.ObjectFolder("s3://pytest/folder/", batch_size=16, shuffle=True, seed=1, drop_last=True)
    orders = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = [(d.tobytes(), int(lab)) for data, labels in ds for d, lab in zip(data, labels)]
        assert len(got) == 64 and all(g in want.values() for g in got)
        orders.append(got)
    assert orders[0] != orders[1]
    cl = sluice.Client()
    with pytest.raises(sluice.SluiceError, match="s3://pytest/folder/cat/none"):
        cl.get_many("pytest", ["folder/cat/000.jpg", "folder/cat/none"])
    with pytest.raises(ValueError, match="s3:// prefix"):
        sluice.ObjectFolder("/tmp/x")


DOT_KEYS = ("dots/p/../k", "dots/k", "dots/p/./x", "dots/p/x", "dots/p/..", "dots/a//b")


@pytest.mark.parametrize("recv_min", ["1", "0"])
def test_dot_segment_keys_are_sent_byte_exact(s3, recv_min):
    """S3 keys are names, not paths: "p/../k" is an object of its own, not "k".  Each key is sent as it is
    (no dot-segment removal) and signed as sent, on both receive paths: each read gives its own object's
    bytes (a whole read and a range), and its size."""
    for k in DOT_KEYS:
        s3.put_object(Bucket="pytest", Key=k, Body=(k.encode() + b"|") * 4000)
    code = ("import numpy as np, sys, sluice\n"
            "for url in sys.argv[1:]:\n"
            "    out = np.zeros(sluice.Client().size('pytest', url[len('s3://pytest/'):]), np.uint8)\n"
            "    assert sluice.read(url, out) == out.size\n"
            "    part = np.zeros(100, np.uint8)\n"
            "    sluice.read(url, part, offset=out.size - 100)\n"
            "    sys.stdout.buffer.write(out.tobytes()[:40] + b'#' + part.tobytes()[-20:] + b'\\n')\n")
    env = dict(os.environ, SLUICE_HTTP_RECV_MIN=recv_min)
    r = subprocess.run([sys.executable, "-c", code] + [f"s3://pytest/{k}" for k in DOT_KEYS], env=env,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-800:]
    for k, line in zip(DOT_KEYS, r.stdout.split(b"\n")):
        body = (k.encode() + b"|") * 4000
        assert line == body[:40] + b"#" + body[-20:], (k, line)


@pytest.mark.parametrize("how", ["cli", "python"])
def test_copy_refuses_keys_that_leave_the_destination(s3, tmp_path, how):
    """A key below the prefix whose name would leave the destination directory ("..", an absolute name, an
    empty segment) is refused by name, as the AWS CLI refuses it, before anything is written: nothing lands
    outside the destination, nor inside it."""
    for bad in ("../../escaped.txt", "/abs.txt", "a//b.txt", "x/../../../escaped2.txt", "./dot.txt"):
        prefix = f"esc-{abs(hash(bad)) % 10**8}/"
        s3.put_object(Bucket="pytest", Key=prefix + "fine.txt", Body=b"fine")
        s3.put_object(Bucket="pytest", Key=prefix + bad, Body=b"EVIL")
        dst = tmp_path / how / prefix / "d1" / "d2" / "dst"
        dst.mkdir(parents=True)
        if how == "cli":
            r = subprocess.run([_sluice_bin(), "cp", "-r", f"s3://pytest/{prefix}", str(dst)], capture_output=True,
                               text=True, timeout=60)
            assert r.returncode != 0 and prefix + bad in r.stderr and "outside" in r.stderr, (bad, r.stderr)
        else:
            with pytest.raises(sluice.SluiceError) as e:
                sluice.copy(f"s3://pytest/{prefix}", str(dst), recursive=True)
            assert prefix + bad in str(e.value) and "outside" in str(e.value), (bad, str(e.value))
        written = [p for p in (tmp_path / how).rglob("*") if p.is_file()]
        assert written == [], (bad, written)
    # One object into a directory, under its last name: ".." is refused too.
    s3.put_object(Bucket="pytest", Key="esc-one/p/..", Body=b"EVIL")
    (tmp_path / "one" / "in").mkdir(parents=True)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.copy("s3://pytest/esc-one/p/..", str(tmp_path / "one" / "in"))
    assert "esc-one/p/.." in str(e.value) and not [p for p in (tmp_path / "one").rglob("*") if p.is_file()]
    # A clean tree still copies.
    s3.put_object(Bucket="pytest", Key="esc-ok/a/b.txt", Body=b"b")
    s3.put_object(Bucket="pytest", Key="esc-ok/c..d.txt", Body=b"c")
    sluice.copy("s3://pytest/esc-ok/", str(tmp_path / "ok"), recursive=True)
    assert (tmp_path / "ok" / "a" / "b.txt").read_bytes() == b"b" and (tmp_path / "ok" / "c..d.txt").read_bytes() == b"c"


def test_get_many_bounds_what_the_server_claims(s3):
    """get_many reads an object larger than max_size again at the size the server says, but only up to
    size_limit: past it, an error naming the object, with nothing allocated for the claim."""
    s3.put_object(Bucket="pytest", Key="many/big.bin", Body=b"z" * 50000)
    c = sluice.Client()
    assert c.get_many("pytest", ["many/big.bin"], max_size=4096)[0].tobytes() == b"z" * 50000
    with pytest.raises(sluice.SluiceError) as e:
        c.get_many("pytest", ["many/big.bin"], max_size=4096, size_limit=10000)
    assert e.value.code == -errno.EFBIG and "s3://pytest/many/big.bin" in str(e.value) and "50000" in str(e.value)


def test_cache_too_small_for_a_shard_is_one_line(s3, cache, tmp_path):
    """A cache smaller than each shard: `sluice verify` says so once per shard (naming the cache and
    SLUICE_CACHE_LIMIT), not once per record of it."""
    _tree(tmp_path / "src", n=24, seed=9)
    assert _pack(tmp_path / "src", "s3://pytest/small-cache").returncode == 0
    r = subprocess.run([_sluice_bin(), "verify", "s3://pytest/small-cache"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, SLUICE_CACHE_LIMIT="10K"))
    shards = len([o for o in s3.list_objects_v2(Bucket="pytest", Prefix="small-cache/")["Contents"]
                  if o["Key"].endswith(".sls")])
    bad = [line for line in r.stdout.splitlines() if line.startswith("BAD")]
    assert r.returncode == 1 and 1 < shards < 24 and len(bad) == shards, r.stdout
    assert all(line.startswith("BAD shard") and "SLUICE_CACHE_LIMIT" in line for line in bad), bad


def test_copy_never_writes_through_a_symlinked_directory_in_the_destination(s3, tmp_path):
    """`sluice cp -r` into a directory holding a symbolic link to a directory elsewhere: a key below the link's
    name is refused, naming the key and the link, and nothing is written where the link leads; a symlinked FILE
    at a key's name is replaced by the copy (the file it led to untouched)."""
    dst, outside = tmp_path / "dst", tmp_path / "outside"
    dst.mkdir()
    outside.mkdir()
    (dst / "link").symlink_to(outside)
    for k in ("sym/link/evil", "sym/ok"):
        s3.put_object(Bucket="pytest", Key=k, Body=b"EVIL")
    r = subprocess.run([_sluice_bin(), "cp", "-r", "s3://pytest/sym/", str(dst)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "s3://pytest/sym/link/evil" in r.stderr and str(dst / "link") in r.stderr
    assert "symbolic link" in r.stderr and os.listdir(outside) == []
    dst2, victim = tmp_path / "dst2", tmp_path / "victim"
    dst2.mkdir()
    victim.write_bytes(b"VICTIM")
    (dst2 / "ok").symlink_to(victim)
    assert sluice.copy("s3://pytest/sym/ok", str(dst2 / "ok"))["files"] == 1
    assert (dst2 / "ok").read_bytes() == b"EVIL" and not (dst2 / "ok").is_symlink() and victim.read_bytes() == b"VICTIM"


def test_copy_never_writes_outside_while_a_link_is_swapped_in(s3, tmp_path):
    """A process swapping a directory of the destination for a link elsewhere, over and over, while `sluice cp
    -r` writes into it: each file is written through the directory's descriptor the copy entered, so none lands
    where the link leads (the copy may fail naming the link, or finish)."""
    import threading
    dst, outside = tmp_path / "dst", tmp_path / "outside"
    (dst / "a").mkdir(parents=True)
    outside.mkdir()
    for i in range(60):
        s3.put_object(Bucket="pytest", Key=f"swap/a/f{i:03d}", Body=b"x" * 1000)
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            try:
                os.rename(dst / "a", dst / "real")
                os.symlink(outside, dst / "a")
                os.unlink(dst / "a")
                os.rename(dst / "real", dst / "a")
            except OSError:
                pass
    t = threading.Thread(target=swap)
    t.start()
    try:
        for _ in range(6):
            subprocess.run([_sluice_bin(), "cp", "-r", "s3://pytest/swap/", str(dst)], capture_output=True,
                           timeout=120)
    finally:
        stop.set()
        t.join()
    assert os.listdir(outside) == []
