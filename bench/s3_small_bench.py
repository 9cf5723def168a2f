"""Many small objects (issue #25, part 3): a sample an object under an s3:// prefix in ImageFolder's layout,
read whole, every object once a pass, by each client at its best in-flight count of a sweep.

Run it beside its server:
    python3 tests/remote/with_s3_server.py --alocals3 BINARY python3 bench/s3_small_bench.py --sizes 10K,100K,1000K
or with --nginx, against nginx serving the objects as files (anonymous GETs, path-style: BUCKET/KEY under its
root), a server whose own time a request is not the limit (alocals3 takes about 30 ms a GET of a small object).

Contenders, passes interleaved, medians, each given the list of keys: sluice (sluice.ObjectFolder's loop:
batches of 256 read by Client.get_many, the next batch in flight meanwhile; GETs in flight swept); boto3's get_object from a thread pool (threads swept,
one client shared, as boto3's documentation allows); s3torchconnector's S3IterableDataset.from_objects (each
object's reader read whole; its own threads).  With --nginx also MosaicML Streaming and LitData, each reading
the same samples from its own converted format on the same server: MDSWriter shards and litdata.optimize chunks
(their default shard sizes; the conversion timed and reported, not counted in a pass) written under nginx's
root, then every pass a StreamingDataset over s3://bench/... into an empty local cache, in a DataLoader
(workers swept), boto3 underneath with throwaway keys (nginx ignores the signature).  Objects/s and MB/s of the
objects' bytes, and the CPU s/GB of this process and its loader workers.  The objects are written once
(untimed) by boto3 from a thread pool, or as files under nginx's root.
"""
import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results, parse_size, side_by_side, timed  # noqa: E402

_bodies_cache = {}


def bodies_of(size, count):
    """The count distinct random bodies of size bytes that the objects repeat (the same in every process)."""
    if (size, count) not in _bodies_cache:
        import numpy as np
        rng = np.random.default_rng(size)
        _bodies_cache[size, count] = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]
    return _bodies_cache[size, count]


def lit_sample(size, count, i):
    """Sample i for litdata.optimize (module level: its worker processes call it)."""
    return {"i": i, "data": bodies_of(size, count)[i % count]}


def as_rows(batch):
    """A DataLoader's collate: the batch's (index, bytes) pairs (LitData gives a memoryview, which a loader
    worker could not send)."""
    return [(int(r["i"]), bytes(r["data"])) for r in batch]


def allow_http(*_):
    """LitData's chunk GETs go through obstore where it is installed, which refuses http:// unless told (LitData
    has no option for it); in each loader worker too, as they may be spawned."""
    try:
        from litdata.streaming import downloader
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    except (ImportError, AttributeError, TypeError):
        pass


def convert(kind, root, n, size, count):
    """The n samples in the format of kind (streaming: MDS shards; litdata: optimize's chunks) under root."""
    if kind == "streaming":
        from streaming import MDSWriter
        with MDSWriter(out=root, columns={"i": "int", "data": "bytes"}) as w:
            for i in range(n):
                w.write({"i": i, "data": bodies_of(size, count)[i % count]})
    else:
        import litdata
        litdata.optimize(fn=functools.partial(lit_sample, size, count), inputs=list(range(n)), output_dir=root,
                         chunk_bytes="64MB", mode="overwrite")


def converted_pass(kind, remote, cache, workers, ep):
    """Iterates kind's StreamingDataset over remote (s3://) into the empty directory cache: yields each batch's
    (index, bytes) pairs."""
    import torch
    if kind == "streaming":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
        ds = StreamingDataset(remote=remote, local=cache, shuffle=False, batch_size=256)
        dl = torch.utils.data.DataLoader(ds, batch_size=256, num_workers=workers, collate_fn=as_rows)
    else:
        import litdata
        allow_http()
        ds = litdata.StreamingDataset(remote, cache_dir=cache, storage_options={
            "endpoint_url": ep, "aws_access_key_id": "nginx", "aws_secret_access_key": "nginx"})
        dl = litdata.StreamingDataLoader(ds, batch_size=256, num_workers=workers, collate_fn=as_rows,
                                         worker_init_fn=allow_http if workers else None)
    yield from dl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10K,100K,1000K")
    ap.add_argument("--bytes", default="256M", help="bytes of objects a size (their count follows)")
    ap.add_argument("--max-objects", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sweep", default="32,64,128", help="GETs in flight (sluice) and threads (boto3) tried")
    ap.add_argument("--skip", default="", help="comma list of: boto3,s3torch,streaming,litdata")
    ap.add_argument("--workers", default="0,8", help="DataLoader workers tried (Streaming, LitData)")
    ap.add_argument("--nginx", action="store_true", help="the objects as files served by nginx (anonymous)")
    ap.add_argument("--out", default="s3_small.json")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    import boto3
    import botocore
    import botocore.config
    from botocore.parsers import ResponseParserError
    web = None
    if a.nginx:  # objects as files under nginx's root, read anonymously
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "remote"))
        import webserver
        tmp = tempfile.mkdtemp(dir=os.environ.get("SLUICE_BENCH_S3_DIR", "/var/tmp"))
        web = webserver.WebServer(os.path.join(tmp, "www"), os.path.join(tmp, "nginx"), workers=os.cpu_count())
        os.makedirs(os.path.join(tmp, "www", "bench"))
        web.__enter__()
        ep = f"http://127.0.0.1:{web.port}"
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            os.environ.pop(k, None)
        os.environ.update(AWS_ENDPOINT_URL=ep, AWS_REGION="us-east-1", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
                          AWS_CONFIG_FILE="/nonexistent")
        s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1", config=botocore.config.Config(
            max_pool_connections=256, signature_version=botocore.UNSIGNED, s3={"addressing_style": "path"}))
        server = f"nginx ({webserver.NGINX}, {os.cpu_count()} workers), files, anonymous GETs"

        def put(ik):
            path = os.path.join(tmp, "www", "bench", ik[1])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(bodies[ik[0] % len(bodies)])
    else:
        ep, ak, sk = (os.environ[k] for k in ("SLUICE_TEST_S3_ENDPOINT", "SLUICE_TEST_S3_ACCESS_KEY",
                                             "SLUICE_TEST_S3_SECRET_KEY"))
        os.environ.update(AWS_ENDPOINT_URL=ep, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, AWS_REGION="us-east-1",
                          AWS_DEFAULT_REGION="us-east-1")
        s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=ak, aws_secret_access_key=sk,
                          region_name="us-east-1", config=botocore.config.Config(max_pool_connections=256))
        if "bench" not in os.environ.get("SLUICE_TEST_S3_BUCKETS", "").split(","):
            s3.create_bucket(Bucket="bench")
        server = os.environ.get("SLUICE_TEST_S3_SERVER", "moto")

        def put(ik):
            try:
                s3.put_object(Bucket="bench", Key=ik[1], Body=bodies[ik[0] % len(bodies)])
            except ResponseParserError:  # alocals3 answers a PUT with JSON once the object is stored
                pass
    import sluice
    from sluice.s3 import _ahead
    res = Results(a.out, bench="s3_small", server=server, reps=a.reps)
    say = lambda m: print(f"[small] {m}", flush=True)  # noqa: E731
    sweep = [int(x) for x in a.sweep.split(",")]
    for size_s in a.sizes.split(","):
        size = parse_size(size_s)
        n = max(16, min(a.max_objects, parse_size(a.bytes) // size))
        prefix = f"small{size_s}/"
        bodies = bodies_of(size, min(n, 64))
        keys = [f"{prefix}c{i % 10}/{i:07d}.bin" for i in range(n)]
        with ThreadPoolExecutor(64) as pool:  # untimed: the objects, a class folder each tenth
            list(pool.map(put, enumerate(keys)))
        total = n * size
        want = {k: bodies[i % len(bodies)] for i, k in enumerate(keys)}
        say(f"{n} objects of {size_s} ({total / 1e6:.0f} MB)")

        def check(got):
            if len(got) != n:
                raise RuntimeError(f"{len(got)} distinct objects delivered, not {n}")
            if any(want[k] != v for k, v in got.items()):
                raise RuntimeError("the bytes read differ from the objects")

        cl = sluice.Client()

        def batches():  # ObjectFolder's loop over the known keys (a server may not list): batches of 256,
            # the next one's GETs in flight while this one is handed on
            return _ahead(lambda b: cl.get_many("bench", keys[b:b + 256], max(size, 4096), in_flight[0]),
                          range(0, n, 256))

        in_flight = [64]

        def sluice_pass(c, verify=False):
            def one(collect):
                in_flight[0] = c
                got, count = {}, 0
                for data in batches():
                    if collect:
                        got.update((k, d.tobytes()) for k, d in zip(keys[count:count + len(data)], data))
                    count += len(data)
                return got if collect else count
            if verify:
                check(one(True))
            return lambda: timed(lambda: {"objects": one(False)}, total)

        def boto3_pass(threads, verify=False):
            def get(k):
                return k, s3.get_object(Bucket="bench", Key=k)["Body"].read()

            def one():
                with ThreadPoolExecutor(threads) as pool:
                    return dict(pool.map(get, keys))
            if verify:
                check(one())
            return lambda: timed(lambda: {"objects": len(one())}, total)

        def s3torch_pass(verify=False):
            from s3torchconnector import S3IterableDataset, S3ClientConfig

            def one():
                cfg = S3ClientConfig(force_path_style=True, unsigned=web is not None)  # nginx: anonymous
                ds = S3IterableDataset.from_objects([f"s3://bench/{k}" for k in keys], region="us-east-1",
                                                    endpoint=ep, s3client_config=cfg)
                return {r.key: r.read() for r in ds}
            if verify:
                check(one())
            return lambda: timed(lambda: {"objects": len(one())}, total)

        def converted(kind, workers, verify=False):
            remote = f"s3://bench/{kind}{size_s}"

            def one(collect):
                cache = tempfile.mkdtemp(dir=tmp)
                keys_env = {"AWS_ACCESS_KEY_ID": "nginx", "AWS_SECRET_ACCESS_KEY": "nginx", "S3_ENDPOINT_URL": ep}
                os.environ.update(keys_env)  # their boto3 signs (nginx ignores it); sluice's client stays anonymous
                try:
                    got, count = {}, 0
                    for rows in converted_pass(kind, remote, cache, workers, ep):
                        if collect:
                            got.update((keys[i], bytes(d)) for i, d in rows)
                        count += len(rows)
                    return got if collect else count
                finally:
                    for k in keys_env:
                        os.environ.pop(k, None)
                    shutil.rmtree(cache, ignore_errors=True)
            if verify:
                check(one(True))
            return lambda: timed(lambda: {"objects": one(False)}, total, children=True)

        out = {}
        for kind in ("streaming", "litdata") if web else ():  # their formats, written as files under nginx's root
            if kind in skip:
                continue
            t0 = time.perf_counter()
            try:
                convert(kind, os.path.join(tmp, "www", "bench", f"{kind}{size_s}"), n, size, len(bodies))
                out[f"{kind}_conversion_s"] = time.perf_counter() - t0
                say(f"{size_s}: {kind} conversion {out[f'{kind}_conversion_s']:.1f} s")
            except Exception as e:
                out[f"{kind}_error"] = repr(e)
                say(f"{kind} conversion: {e!r}")
        # Each contender's best in-flight count first (one pass each, checked), then the bests side by side.
        tries = {f"sluice x{c}": (lambda c=c: sluice_pass(c, True)) for c in sweep}
        if "boto3" not in skip:
            tries.update({f"boto3 x{c}": (lambda c=c: boto3_pass(c, True)) for c in sweep})
        if "s3torch" not in skip:
            tries["s3torchconnector"] = lambda: s3torch_pass(True)
        for kind in ("streaming", "litdata"):
            if f"{kind}_conversion_s" in out:
                tries.update({f"{kind} w{w}": (lambda k=kind, w=int(w): converted(k, w, True))
                              for w in a.workers.split(",")})
        fns = {}
        for name, make in tries.items():
            try:
                fns[name] = make()
            except Exception as e:
                out[f"{name}_error"] = repr(e)
                say(f"{name}: {e!r}")
        swept = side_by_side(fns, 1)
        out["sweep"] = swept
        best = {}
        for who in ("sluice", "boto3", "streaming", "litdata"):
            cands = [k for k in swept if k.startswith(who) and "gb_s" in swept[k]]
            if cands:
                best[who] = max(cands, key=lambda k: swept[k]["gb_s"])
        if "s3torchconnector" in fns:
            best["s3torchconnector"] = "s3torchconnector"
        got = side_by_side({who: fns[name] for who, name in best.items()}, a.reps)
        for who, r in got.items():
            if "gb_s" in r:
                r["objects_per_s"] = n / r["seconds"]
                r["setting"] = best[who]
                say(f"{size_s}: {who} ({best[who]}) {r['objects_per_s']:.0f} objects/s, {r['gb_s'] * 1e3:.0f} MB/s, "
                    f"{r['cpu_s_per_gb']:.2f} CPU s/GB")
        out["read"] = got
        for who in got:
            if who != "sluice" and "gb_s" in got.get("sluice", {}) and "gb_s" in got[who]:
                out[f"sluice_over_{who}"] = got["sluice"]["gb_s"] / got[who]["gb_s"]
                say(f"{size_s}: sluice / {who} {out[f'sluice_over_{who}']:.1f}x")
        res[size_s] = dict(out, objects=n, size=size)
    if web:
        web.__exit__(None, None, None)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
