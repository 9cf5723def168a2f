"""Fixtures the Python tests share."""
import contextlib
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import s3server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))

# A child that reads N bytes of PATH at OFF into host or GPU memory ("host" or "gpu") with sluice.read and
# writes them to its stdout; on an error, "ERROR CODE MESSAGE" to stderr and exit status 3.  The fault
# suites run each read in one (the engine and its S3 client are made once per process, from the environment).
READ = """
import sys, numpy as np, sluice
off, n = int(sys.argv[1]), int(sys.argv[2])
if sys.argv[4] == "gpu":  # through the bounce slots and their early copies to the GPU
    import torch
    out = torch.zeros(n, dtype=torch.uint8, device="cuda")
else:
    out = np.zeros(n, dtype=np.uint8)
try:
    got = sluice.read(sys.argv[3], out, offset=off)
except sluice.SluiceError as e:
    print("ERROR", e.code, e, file=sys.stderr)
    sys.exit(3)
if sys.argv[4] == "gpu":
    out = out.cpu().numpy()
sys.stdout.buffer.write(out[:got].tobytes())
"""


def run_ranks(code, args, world, nodes=1, env_of=None):
    """Runs world processes of `python -c code args`, the ranks of one torch.distributed job over `nodes`
    simulated nodes as torchrun numbers them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, a free
    MASTER_PORT on 127.0.0.1), with env_of(rank) (or nothing) added to each one's environment; each must exit 0;
    returns the JSON each printed last."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world),
                                   "LOCAL_RANK": str(r % (world // nodes)), "LOCAL_WORLD_SIZE": str(world // nodes),
                                   "GROUP_RANK": str(r // (world // nodes)), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), **(env_of(r) if env_of else {})})
             for r in range(world)]
    out = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, out):
        assert p.returncode == 0, (o[-500:], e[-3000:])
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in out]


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of size (as mount takes it: "4m") mounted at path for the block, unmounted after; the test is
    skipped where it cannot be (not root, or no mount here)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])


@pytest.fixture(scope="session")
def ds_path(tmp_path_factory):
    """A sluice dataset of 500 records (text, n) in shards of 8 KiB, packed by `sluice pack`."""
    d = tmp_path_factory.mktemp("ds")
    with open(d / "in.jsonl", "w") as f:
        for i in range(500):
            f.write(json.dumps({"text": "row %d " % i * (1 + i % 7), "n": i}) + "\n")
    out = d / "ds"
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(d / "in.jsonl"), "--fields", "text,n", "--shard-size", "8K",
                    "--quiet", str(out)], check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """The S3 test server (tests/remote/s3server.py; one a process: moto counts its unauthenticated calls per
    process), a bucket "pytest", and the AWS_* variables the engine's S3 client reads on its first s3:// path.
    A boto3 client, with the server as .sluice_server."""
    if s3server.ThreadedMotoServer is None:
        pytest.skip(s3server.MOTO_MISSING)
    boto3 = pytest.importorskip("boto3")
    with s3server.S3Server() as srv:
        saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                 "AWS_REGION", "HOME")}
        os.environ.update(AWS_ENDPOINT_URL=srv.endpoint, AWS_ACCESS_KEY_ID=srv.access_key,
                          AWS_SECRET_ACCESS_KEY=srv.secret_key, AWS_REGION="us-east-1",
                          HOME=str(tmp_path_factory.mktemp("home")))
        client = boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=srv.access_key,
                              aws_secret_access_key=srv.secret_key, region_name="us-east-1")
        client.create_bucket(Bucket="pytest")
        client.sluice_server = srv
        try:
            yield client
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
