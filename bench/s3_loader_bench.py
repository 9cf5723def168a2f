"""The loader over S3 (issue #13): one epoch of the same records from the same S3-compatible server, each
loader's shards downloaded into an empty local cache every pass (cold), batches delivered to the GPU.

    python3 tests/remote/with_s3_server.py python3 bench/s3_loader_bench.py --records 8000 --size 131072

sluice: `sluice pack` into s3://bench/sl, then sluice.Loader(sluice.Dataset("s3://bench/sl"), device="cuda")
with SLUICE_CACHE_DIR new for each pass.  MosaicML Streaming: MDSWriter shards (same shard size) uploaded to
s3://bench/mds, StreamingDataset(remote=..., local=new directory) in a torch DataLoader (workers swept), each
batch moved to the GPU.  LitData: litdata.optimize chunks uploaded to s3://bench/lit, StreamingDataset over it
with a new cache directory, StreamingDataLoader (workers swept).  Records per second, medians of --reps
interleaved passes, each pass an epoch in a process of its own (so no loader keeps state, shared memory or
workers from one pass to the next; the process's start-up is not timed); CPU s/GB counts that process and its
loader workers, not the server.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import GB, Results, side_by_side, timed  # noqa: E402

MiB = 1 << 20


_recs = None


def record(i):
    """Record i: one of 64 distinct random records of S3LB_SIZE bytes (module level, so loader workers and
    litdata's processes make the same ones)."""
    global _recs
    if _recs is None:
        import numpy as np
        rng = np.random.default_rng(1)
        _recs = [rng.integers(0, 256, size=int(os.environ["S3LB_SIZE"]), dtype=np.uint8) for _ in range(64)]
    return _recs[i % 64]


def lit_item(i):
    return {"data": record(i)}


try:  # at module level, so that loader workers started by forkserver or spawn can unpickle it
    import torch
    from streaming import StreamingDataset

    class Rows(StreamingDataset):
        """Streaming's dataset giving each record's bytes as a uint8 tensor."""

        def __getitem__(self, i):
            return torch.frombuffer(bytearray(super().__getitem__(i)["data"]), dtype=torch.uint8)
except ImportError:
    Rows = None


def cpu_all():
    import psutil
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me] + me.children(recursive=True))


def epoch(fn, n, size):
    """One pass of fn (which returns the records it delivered): records/s, GB/s and CPU s/GB."""
    c0 = cpu_all()
    r = timed(fn, n * size)
    got = r.pop("records", n)
    if got != n:
        raise RuntimeError(f"delivered {got} records, not {n}")
    r["cpu_s"] = cpu_all() - c0
    r["cpu_s_per_gb"] = r["cpu_s"] / (n * size / GB)
    r["records_per_s"] = n / r["seconds"]
    return r


def one_pass(kind, workers, n, size, B, root):
    """An epoch of loader kind into an empty cache under root, timed from the dataset's opening."""
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cache = tempfile.mkdtemp(dir=root)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def sluice_run():
        import sluice
        os.environ["SLUICE_CACHE_DIR"] = cache
        ds, got = sluice.Dataset("s3://bench/sl"), 0
        for b in sluice.Loader(ds, shuffle=True, batch_size=B, seed=1, device=dev, fields=["data"], rank=0, world_size=1):
            got += len(b["data"][1]) - 1
        sync()
        return {"records": got}

    def streaming_run():
        ds = Rows(remote="s3://bench/mds", local=cache, shuffle=True, batch_size=B)
        got = 0
        for b in torch.utils.data.DataLoader(ds, batch_size=B, num_workers=workers, pin_memory=dev == "cuda"):
            b.to(dev, non_blocking=True)
            got += len(b)
        sync()
        return {"records": got}

    def litdata_run():
        import litdata
        opts = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"], "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
                "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
        ds = litdata.StreamingDataset("s3://bench/lit", shuffle=True, storage_options=opts, cache_dir=cache)
        got = 0
        for b in litdata.StreamingDataLoader(ds, batch_size=B, num_workers=workers, pin_memory=dev == "cuda"):
            b["data"].to(dev, non_blocking=True)
            got += len(b["data"])
        sync()
        return {"records": got}

    try:
        return epoch({"sluice": sluice_run, "streaming": streaming_run, "litdata": litdata_run}[kind], n, size)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=8192)
    ap.add_argument("--size", type=int, default=131072, help="bytes per record")
    ap.add_argument("--shard", default="64M")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/sluice-s3lb")
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--skip", default="", help="comma list of: streaming,litdata")
    ap.add_argument("--pass", dest="one", help="(internal) run one epoch: KIND:WORKERS, print its JSON")
    ap.add_argument("--out", default="s3_loader_bench.json")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    # Whole batches only: sluice's last batch would otherwise be filled up to the batch size.
    n, size, B = a.records - a.records % a.batch, a.size, a.batch
    ep, ak, sk = (os.environ[k] for k in ("SLUICE_TEST_S3_ENDPOINT", "SLUICE_TEST_S3_ACCESS_KEY",
                                         "SLUICE_TEST_S3_SECRET_KEY"))
    os.environ.update(AWS_ENDPOINT_URL=ep, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, AWS_REGION="us-east-1",
                      AWS_DEFAULT_REGION="us-east-1", S3_ENDPOINT_URL=ep, S3LB_SIZE=str(size))
    if a.one:
        kind, w = a.one.split(":")
        print(json.dumps(one_pass(kind, int(w), n, size, B, a.dir)))
        return
    import boto3
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shard = int(a.shard[:-1]) * MiB if a.shard[-1] in "Mm" else int(a.shard)
    res = Results(a.out, bench="s3_loader", records=n, size=size, batch=B, shard=shard, device=dev,
                  server="moto 5.2.5 (tests/remote/s3server.py)")
    say = lambda m: print(f"[s3-loader] {m}", flush=True)  # noqa: E731
    boto3.client("s3", endpoint_url=ep, region_name="us-east-1").create_bucket(Bucket="bench")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)

    def run_pass(kind, w=0):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--pass", f"{kind}:{w}", "--records", str(n),
                              "--size", str(size), "--batch", str(B), "--dir", a.dir], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"{kind} pass failed: {out.stderr.strip()[-600:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    # The same records in each loader's own format, on the server.
    tree = os.path.join(a.dir, "tree")
    for i in range(n):
        d = os.path.join(tree, str(i % 10))
        os.makedirs(d, exist_ok=True)
        record(i).tofile(os.path.join(d, f"{i:08d}.bin"))
    subprocess.run([a.sluice, "pack", "--from-dir", tree, "--all-files", "--shard-size", str(shard), "--quiet",
                    "s3://bench/sl"],
                   check=True)
    contenders = {"sluice": lambda: run_pass("sluice")}

    def sweep(kind):
        best = None
        for w in map(int, a.workers.split(",")):
            r = run_pass(kind, w)["records_per_s"]
            res[f"{kind}_{w}w_first"] = r
            say(f"{kind} {w} workers: {r:,.0f} records/s")
            if best is None or r > best[1]:
                best = (w, r)
        contenders[f"{kind}_{best[0]}w"] = lambda w=best[0]: run_pass(kind, w)

    if "streaming" not in skip:
        try:
            from streaming import MDSWriter
            with MDSWriter(out=(os.path.join(a.dir, "mds"), "s3://bench/mds"), columns={"data": "bytes"},
                           size_limit=shard) as w:
                for i in range(n):
                    w.write({"data": record(i).tobytes()})
            sweep("streaming")
        except Exception as e:
            res["streaming_error"] = repr(e)
            say(f"Streaming could not run: {e!r}")

    if "litdata" not in skip:
        try:
            import litdata
            out = os.path.join(a.dir, "lit")
            litdata.optimize(fn=lit_item, inputs=list(range(n)), output_dir=out, chunk_bytes=shard, num_workers=4,
                             mode="overwrite")
            subprocess.run([a.sluice, "cp", "-r", out, "s3://bench/lit/"], check=True, capture_output=True)
            sweep("litdata")
        except Exception as e:
            res["litdata_error"] = repr(e)
            say(f"LitData could not run: {e!r}")

    got = side_by_side(contenders, a.reps, key="records_per_s")
    res["epoch"] = got
    for k, v in got.items():
        say(f"{k}: {v.get('records_per_s', 0):,.0f} records/s, {v.get('gb_s', 0):.2f} GB/s, "
            f"{v.get('cpu_s_per_gb', 0):.2f} CPU s/GB {v.get('error', '')}")
    peers = [k for k in got if k != "sluice" and "records_per_s" in got[k]]
    if peers and "records_per_s" in got["sluice"]:
        rat = {f"vs_{k}": got["sluice"]["records_per_s"] / got[k]["records_per_s"] for k in peers}
        rat["vs_best_peer"] = min(rat.values())
        res["ratios"] = rat
        say(f"ratios: { {k: round(v, 3) for k, v in rat.items()} }")


if __name__ == "__main__":
    main()
