"""torch.distributed.checkpoint storage side by side (issue #24): DCP's FileSystemWriter/Reader (its defaults, and
8 threads with its staging kept between saves), s3torchconnector's S3StorageWriter/Reader and sluice.dcp save and load the same GPU state dict (a
Llama-8B-shaped model of --layers layers, bf16), passes interleaved in one process, as a training job saves
again and again: dcp.save (durable: fsync, as each writer does by default), dcp.async_save (the seconds the
training loop waits, and the seconds until the save is done), dcp.load cold (page cache dropped) and warm into
the model's GPU tensors, each load checked equal to the model.

    python3 bench/dcp_bench.py --layers 4 --reps 3 --out dcp.json
    python3 tests/remote/with_s3_server.py python3 bench/dcp_bench.py --s3 --layers 0 --reps 3 --out dcp-s3.json

--s3: the S3 test server (with_s3_server.py) instead of a local directory: s3torchconnector and sluice only.
"""
import argparse
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import GB, Results, drop_caches, side_by_side, warm  # noqa: E402
from ckpt_bench import shapes  # noqa: E402


def s3_env():
    """The engine's and boto3's AWS_* from the test server's variables; the bucket made."""
    env = {k[len("SLUICE_TEST_S3_"):]: v for k, v in os.environ.items() if k.startswith("SLUICE_TEST_S3_")}
    os.environ.update(AWS_ENDPOINT_URL=env["ENDPOINT"], AWS_ACCESS_KEY_ID=env["ACCESS_KEY"],
                      AWS_SECRET_ACCESS_KEY=env["SECRET_KEY"], AWS_REGION=env.get("REGION", "us-east-1"))
    import boto3
    boto3.client("s3", endpoint_url=env["ENDPOINT"], aws_access_key_id=env["ACCESS_KEY"],
                 aws_secret_access_key=env["SECRET_KEY"], region_name="us-east-1").create_bucket(Bucket="dcpbench")
    return env["ENDPOINT"]


def storages(a, base):
    """{name: (writer factory, reader factory)} of the contenders."""
    import torch.distributed.checkpoint as dcp
    import sluice.dcp as sd
    if not a.s3:
        return {"torch FileSystem": (lambda p: dcp.FileSystemWriter(p), dcp.FileSystemReader),
                "torch FileSystem 8 threads": (lambda p: dcp.FileSystemWriter(p, thread_count=8, cache_staged_state_dict=True),
                                               dcp.FileSystemReader),
                "sluice": (sd.StorageWriter, sd.StorageReader)}
    ep = s3_env()
    out = {"sluice": (sd.StorageWriter, sd.StorageReader)}
    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter

        def fs():  # the test server's endpoint: the connector's own constructors take none
            return S3FileSystem("us-east-1", s3_client=S3Client("us-east-1", endpoint=ep, s3client_config=S3ClientConfig(
                force_path_style=True)))

        def writer(p, threads=1):
            w = S3StorageWriter("us-east-1", p, thread_count=threads)
            w.fs = fs()
            w.path = w.fs.init_path(p)
            return w

        def reader(p):
            r = S3StorageReader("us-east-1", p)
            r.fs = fs()
            r.path = r.fs.init_path(p)
            return r
        out["s3torchconnector"] = (writer, reader)
        out["s3torchconnector 8 threads"] = (lambda p: writer(p, 8), reader)
    except ImportError as e:
        print(f"[dcp] s3torchconnector: {e}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/sluice-dcp")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--s3", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-vocab", action="store_true", help="without the 1 GB embedding and head: a smaller model")
    ap.add_argument("--device", default="cuda", help="where the state dict lives (cpu: a trial run without a GPU)")
    ap.add_argument("--out", default="dcp_bench.json")
    a = ap.parse_args()
    import torch
    import torch.distributed.checkpoint as dcp
    g = torch.Generator(device=a.device).manual_seed(0)
    model = {n: torch.randn(s, generator=g, device=a.device).to(torch.bfloat16) for n, s in shapes("llama8b", a.layers)
             if not (a.no_vocab and n in ("model.embed_tokens.weight", "lm_head.weight"))}
    model["step"] = torch.tensor(100)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    size = sum(t.numel() * t.element_size() for t in model.values())
    base = "s3://dcpbench" if a.s3 else a.dir
    if not a.s3:
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
    st = {k: v for k, v in storages(a, base).items() if not a.only or k in a.only.split(",")}
    path = {k: f"{base}/{k.replace(' ', '-')}" for k in st}
    res = Results(a.out, layers=a.layers, bytes=size, reps=a.reps, s3=a.s3)
    say = lambda *x: print("[dcp]", *x, flush=True)  # noqa: E731
    say(f"{size / GB:.2f} GB, {len(model)} tensors, {list(st)}")

    writers = {k: st[k][0](path[k]) for k in st}  # one a job, as a training loop keeps it (and its staging)

    def save(k):
        t0 = time.perf_counter()
        dcp.save(model, storage_writer=writers[k], checkpoint_id=path[k])
        s = time.perf_counter() - t0
        return {"gb_s": size / s / GB, "seconds": s}

    def async_save(k):
        t0 = time.perf_counter()
        fut = dcp.async_save(model, storage_writer=writers[k], checkpoint_id=path[k])
        stall = time.perf_counter() - t0
        fut.result()
        s = time.perf_counter() - t0
        return {"stall_s": stall, "seconds": s, "gb_s": size / s / GB}

    into = {n: torch.empty_like(t) for n, t in model.items()}

    def load(k):
        for t in into.values():
            t.zero_()
        sync()
        t0 = time.perf_counter()
        dcp.load(into, storage_reader=st[k][1](path[k]))
        sync()
        s = time.perf_counter() - t0
        bad = [n for n in model if not torch.equal(into[n], model[n])]
        if bad:
            raise RuntimeError(f"{k}: wrong tensors after load: {bad[:3]}")
        return {"gb_s": size / s / GB, "seconds": s}

    modes = [("save", save, None), ("async_save", async_save, None),
             ("load cold", load, None if a.s3 else drop_caches),
             ("load warm", load, None if a.s3 else (lambda: [warm(p) for p in path.values()]))]
    for mode, fn, before in modes:
        got = side_by_side({k: (lambda k=k: fn(k)) for k in st}, a.reps, before=before)
        res[mode] = got
        for k, r in got.items():
            extra = f", loop waits {r['stall_s']:.2f} s" if "stall_s" in r else ""
            say(f"{mode:10s} {k:28s} " + (f"{r['gb_s']:6.2f} GB/s {r['seconds']:.2f} s{extra} "
                                           f"({min(r['passes']):.2f}-{max(r['passes']):.2f})"
                                           if "error" not in r else f"error: {r['error'][:200]}"))
    if not a.s3:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
