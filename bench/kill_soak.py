"""kill -9 soak: writers killed at random moments, then what they were writing is checked.

    python3 bench/kill_soak.py --trials 100 [--s3]        (run under tests/remote/with_s3_server.py for --s3)

Three writers, each killed (SIGKILL) after a random delay while it writes, `--trials` times:
  checkpoint  sluice.write of 32 MiB over an older file: after the kill the file is wholly old or wholly new;
  pack        `sluice pack --from-dir` of a 40 MB tree: the output opens as a whole, verified dataset or not at
              all (no index.sli), and a pack run again into the same directory then succeeds;
  upload      `sluice cp` of 24 MiB to s3:// (a multipart upload) over an older object: the object is wholly
              old or wholly new.
It prints, per writer, the trials and how each ended (old, new, incomplete) and the failures: any torn
file, unreadable dataset or mixed object.  tests/python/test_soak.py runs a few trials of each in `make test`.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))
WRITE = """
import sys, numpy as np, sluice
data = np.frombuffer(open(sys.argv[2], "rb").read(), np.uint8)
while True:
    sluice.write(sys.argv[1], data)
"""


def _kill_after(cmd, delay, env=None):
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return p.returncode


def soak_checkpoint(work, trials, rng):
    old, new = os.urandom(32 << 20), os.urandom(32 << 20)
    target, src = os.path.join(work, "ckpt.bin"), os.path.join(work, "new.bin")
    with open(src, "wb") as f:
        f.write(new)
    seen = {"old": 0, "new": 0}
    for _ in range(trials):
        with open(target, "wb") as f:
            f.write(old)
        _kill_after([sys.executable, "-c", WRITE, target, src], rng.uniform(0.05, 0.6))
        got = open(target, "rb").read()
        if got not in (old, new):
            return seen, f"checkpoint torn: {len(got)} bytes, neither old nor new"
        seen["old" if got == old else "new"] += 1
    return seen, None


def soak_pack(work, trials, rng):
    tree = os.path.join(work, "tree")
    for c in range(4):
        os.makedirs(os.path.join(tree, f"c{c}"), exist_ok=True)
        for i in range(40):
            with open(os.path.join(tree, f"c{c}", f"{i:03d}.jpg"), "wb") as f:
                f.write(os.urandom(250_000))
    seen = {"complete": 0, "incomplete": 0}
    for t in range(trials):
        out = os.path.join(work, f"ds{t}")
        _kill_after([SLUICE, "pack", "--from-dir", tree, "--shard-size", "4M", "--quiet", out], rng.uniform(0.01, 0.4))
        if os.path.exists(os.path.join(out, "index.sli")):
            r = subprocess.run([SLUICE, "verify", out], capture_output=True, text=True)
            if r.returncode:
                return seen, f"pack killed left an index whose dataset does not verify: {r.stdout[-300:]}"
            seen["complete"] += 1
        else:
            r = subprocess.run([SLUICE, "inspect", out], capture_output=True, text=True)
            if r.returncode == 0:
                return seen, "a dataset without index.sli opened"
            seen["incomplete"] += 1
            # Nothing stored is in the way of doing it again.
            r = subprocess.run([SLUICE, "pack", "--from-dir", tree, "--shard-size", "4M", "--quiet", out],
                               capture_output=True, text=True)
            if r.returncode or subprocess.run([SLUICE, "verify", out], capture_output=True).returncode:
                return seen, f"pack into a killed pack's directory failed: {r.stderr[-300:]}"
        shutil.rmtree(out)
    return seen, None


def soak_upload(work, trials, rng):
    import boto3
    ep = os.environ["SLUICE_TEST_S3_ENDPOINT"]
    ak, sk = os.environ["SLUICE_TEST_S3_ACCESS_KEY"], os.environ["SLUICE_TEST_S3_SECRET_KEY"]
    s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1")
    try:
        s3.create_bucket(Bucket="soak")
    except Exception:
        pass
    old, new = os.urandom(1 << 20), os.urandom(24 << 20)
    src = os.path.join(work, "up.bin")
    with open(src, "wb") as f:
        f.write(new)
    env = dict(os.environ, AWS_ENDPOINT_URL=ep, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk,
               AWS_REGION="us-east-1", SLUICE_S3_PART_SIZE="5M", SLUICE_S3_CONCURRENCY="2")
    seen = {"old": 0, "new": 0}
    for _ in range(trials):
        s3.put_object(Bucket="soak", Key="obj", Body=old)
        _kill_after([SLUICE, "cp", src, "s3://soak/obj"], rng.uniform(0.05, 1.5), env=env)
        got = s3.get_object(Bucket="soak", Key="obj")["Body"].read()
        if got not in (old, new):
            return seen, f"object torn: {len(got)} bytes, neither old nor new"
        seen["old" if got == old else "new"] += 1
    return seen, None


def run(trials, s3=False, seed=None, work=None):
    rng = random.Random(seed)
    out = {}
    with tempfile.TemporaryDirectory(dir=work) as d:
        soaks = [("checkpoint", soak_checkpoint), ("pack", soak_pack)] + ([("upload", soak_upload)] if s3 else [])
        for name, fn in soaks:
            w = os.path.join(d, name)
            os.makedirs(w)
            seen, failure = fn(w, trials, rng)
            out[name] = {"trials": trials, "ended": seen, "failure": failure}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--s3", action="store_true", help="the upload soak too (needs the S3 test server's variables)")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    res = run(a.trials, a.s3, a.seed)
    print(json.dumps(res, indent=1))
    return 1 if any(v["failure"] for v in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
