"""Object storage <-> GPU (issue #13): one S3-compatible server, the same objects for every client.

Run it beside its server:
    python3 tests/remote/with_s3_server.py python3 bench/s3_bench.py --size 1G --reps 3 --out s3.json
or beside alocals3-server, a Rust server fast enough not to be every client's limit (reads only: it takes no
multipart uploads):
    python3 tests/remote/with_s3_server.py --alocals3 BINARY python3 bench/s3_bench.py --skip write ...

The server is tests/remote/s3server.py (moto, signatures checked, ranges served without reading the whole
object) in the parent process; the clients run here.  Measured, medians of --reps interleaved passes:
  ceiling  the server's own: the object fetched by P curl processes at once, each a run of ranged GETs on one
           kept-alive connection to /dev/null (P and the range size swept, the best kept);
  read     the whole object into GPU memory (host memory without a GPU): sluice.Client.read_to_gpu at its best
           max_transfer_size x threads of a sweep; KvikIO's RemoteFile.open_s3 read into the GPU buffer at its
           best task_size x num_threads of the same sweep; boto3's download_fileobj at its best TransferConfig
           (swept), then one copy to the GPU; s3torchconnector's S3Client.get_object read whole, then the copy;
  write    a GPU buffer as one object: sluice.write; boto3's upload_fileobj (multipart) at its best
           TransferConfig, from the buffer copied to the host; s3torchconnector's put_object.
CPU s/GB is this process's CPU time (the server's is not counted) over the bytes moved.
"""
import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import GB, Results, parse_size, ratio, side_by_side, timed  # noqa: E402

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write-size", default="256M", help="bytes of each write (the test server takes writes slowly)")
    ap.add_argument("--part", default="16M", help="range / part size every client is set to (sluice, boto3 "
                    "sweep around it, s3torchconnector, KvikIO task size)")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight for every client")
    ap.add_argument("--skip", default="", help="comma list of: ceiling,boto3,s3torch,kvikio,write,sweep")
    ap.add_argument("--sweep-parts", default="32M,64M,128M", help="sluice and KvikIO: range sizes tried")
    ap.add_argument("--sweep-conc", default="16,32", help="sluice and KvikIO: requests in flight tried")
    ap.add_argument("--out", default="s3_bench.json")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    size, part, conc = parse_size(a.size), parse_size(a.part), a.concurrency
    wsize = min(size, parse_size(a.write_size))
    ep, ak, sk = (os.environ[k] for k in ("SLUICE_TEST_S3_ENDPOINT", "SLUICE_TEST_S3_ACCESS_KEY",
                                         "SLUICE_TEST_S3_SECRET_KEY"))
    # Every client takes its settings the AWS way; sluice's engine and client are set to the same part size
    # and requests in flight as the peers.
    os.environ.update(AWS_ENDPOINT_URL=ep, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, AWS_REGION="us-east-1",
                      AWS_DEFAULT_REGION="us-east-1", SLUICE_MAX_TRANSFER_SIZE=str(part),
                      SLUICE_S3_PART_SIZE=str(max(part, 5 * MiB)), SLUICE_S3_CONCURRENCY=str(conc),
                      SLUICE_THREADS=str(conc))
    import boto3
    import numpy as np
    from boto3.s3.transfer import TransferConfig
    import sluice
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        torch, gpu = None, False
    res = Results(a.out, bench="s3", size=size, write_size=wsize, part=part, concurrency=conc, server=os.environ.get("SLUICE_TEST_S3_SERVER", "moto 5.2.5 (tests/remote/s3server.py)"),
                  target="gpu" if gpu else "host")
    say = lambda m: print(f"[s3] {m}", flush=True)  # noqa: E731
    s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1")
    if "bench" not in os.environ.get("SLUICE_TEST_S3_BUCKETS", "").split(","):  # made by the server's harness
        s3.create_bucket(Bucket="bench")
    data = np.frombuffer(os.urandom(size), np.uint8)
    # One PUT (up to S3's 5 GiB): every server takes it, multipart uploads or not.
    from botocore.parsers import ResponseParserError
    try:
        s3.upload_fileobj(io.BytesIO(data), "bench", "obj", Config=TransferConfig(multipart_threshold=5 << 30))
    except ResponseParserError:  # alocals3 answers a PUT with JSON once the object is stored: HEAD checks it
        pass
    if s3.head_object(Bucket="bench", Key="obj")["ContentLength"] != size:
        raise RuntimeError("s3://bench/obj was not stored whole")
    say(f"object s3://bench/obj: {size / GB:.2f} GB; target {'GPU' if gpu else 'host'}")
    dst = torch.empty(size, dtype=torch.uint8, device="cuda") if gpu else np.empty(size, np.uint8)

    def check(buf):
        got = buf[:: max(1, size // 4096)].cpu().numpy() if gpu else buf[:: max(1, size // 4096)]
        if not np.array_equal(got, data[:: max(1, size // 4096)]):
            raise RuntimeError("the bytes read differ from the object")

    def to_target(host_bytes):
        """What a user of a host-side client does next: the bytes into the (GPU) buffer."""
        if gpu:
            dst.copy_(torch.frombuffer(host_bytes, dtype=torch.uint8))
            torch.cuda.synchronize()
        else:
            np.copyto(dst, np.frombuffer(host_bytes, np.uint8))

    # ---- The server's ceiling: curl processes, each a run of ranged GETs on one connection, to /dev/null.
    # The machine's own curl with its own libcurl (not the one carried for building sluice).
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if "ceiling" not in skip and not shutil.which("curl"):
        res["ceiling_error"] = "no curl command on this machine"
    elif "ceiling" not in skip:
        def curl_pass(procs, rng, keep=False):
            """procs curls, each a run of rng-byte ranged GETs on one connection, to /dev/null; keep: each
            range to a file of its own in /dev/shm (memory), so the bytes are kept, as every client keeps
            them (the files are made, empty, before the pass)."""
            ranges = [(o, min(o + rng, size) - 1) for o in range(0, size, rng)]
            cfgs = []
            tmp = tempfile.mkdtemp(dir="/dev/shm" if keep else None)
            for p in range(procs):
                mine = ranges[p::procs]
                if not mine:
                    continue
                path = os.path.join(tmp, f"c{p}")
                with open(path, "w") as f:
                    for i, (b, e) in enumerate(mine):
                        if i:
                            f.write("next\n")
                        out = os.path.join(tmp, f"r{b}") if keep else "/dev/null"
                        if keep:
                            open(out, "wb").close()
                        f.write(f'url = "{ep}/bench/obj"\noutput = "{out}"\nrange = "{b}-{e}"\n'
                                f'aws-sigv4 = "aws:amz:us-east-1:s3"\nuser = "{ak}:{sk}"\nfail\nsilent\n'
                                f'header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"\n')
                cfgs.append(path)

            def run():
                ps = [subprocess.Popen(["curl", "-K", c], env=env) for c in cfgs]
                if any(p.wait() for p in ps):
                    raise RuntimeError("a curl of the ceiling failed")
            r = timed(run, size, children=True)
            shutil.rmtree(tmp)
            return r
        sweep = {}
        for procs in (8, 16, 32):
            for rng in (8 * MiB, 16 * MiB, 64 * MiB):
                sweep[f"{procs}x{rng // MiB}M"] = side_by_side({"c": lambda p=procs, r=rng: curl_pass(p, r)},
                                                              a.reps)["c"]
                say(f"ceiling {procs} curls, {rng // MiB} MiB ranges: {sweep[f'{procs}x{rng // MiB}M']}")
        res["ceiling_sweep"] = sweep
        best = max(sweep, key=lambda k: sweep[k].get("gb_s", 0))
        res["ceiling"] = dict(sweep[best], setting=best)
        # The same curls keeping the bytes, at that setting: the kernel's copy into memory, then curl's own
        # copy into the files; a client that keeps the bytes and makes one copy lies between the two.
        procs, rng = best.split("x")
        res["ceiling_kept"] = side_by_side({"c": lambda: curl_pass(int(procs), int(rng[:-1]) * MiB, keep=True)},
                                           a.reps)["c"]
        say(f"ceiling, bytes kept in /dev/shm, {best}: {res['ceiling_kept']}")
        res["curl"] = subprocess.run(["curl", "--version"], capture_output=True, text=True, env=env).stdout.split("\n")[0]

    # ---- Reads into GPU memory.
    def sluice_read():
        r = timed(lambda: sluice.read("s3://bench/obj", dst), size)
        if gpu:
            torch.cuda.synchronize()
        return r

    def boto3_read(cfg):
        def one():
            buf = io.BytesIO()
            s3.download_fileobj("bench", "obj", buf, Config=cfg)
            to_target(buf.getbuffer())
        return timed(one, size)

    best_cfg = TransferConfig(multipart_chunksize=part, max_concurrency=conc)
    if "boto3" not in skip:
        sweep = {}
        for chunk in sorted({8 * MiB, part, 64 * MiB}):
            for c in sorted({10, conc, 2 * conc}):
                cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=chunk, max_concurrency=c)
                sweep[f"{chunk // MiB}M x{c}"] = side_by_side({"b": lambda cfg=cfg: boto3_read(cfg)}, 1)["b"]
                say(f"boto3 read, chunk {chunk // MiB} MiB, {c} threads: {sweep[f'{chunk // MiB}M x{c}'].get('gb_s', 0):.2f} GB/s")
        res["boto3_read_sweep"] = sweep
        best = max(sweep, key=lambda k: sweep[k].get("gb_s", 0))
        chunk, c = best.split(" x")
        best_cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=int(chunk[:-1]) * MiB,
                                  max_concurrency=int(c))
        res["boto3_best_config"] = best

    # sluice and KvikIO at their best settings too, as boto3: range size x requests in flight, two passes
    # each; sluice's through the client's knobs (sluice.Client(max_transfer_size=, threads=), an engine of its
    # own), KvikIO's through kvikio.defaults.
    kv = None
    if "kvikio" not in skip and gpu:
        try:
            import kvikio
            import kvikio.defaults
            kv = kvikio
            res["kvikio_version"] = kvikio.__version__
        except Exception as e:
            res["kvikio_error"] = repr(e)

    def kvikio_read(p, c):
        def one():
            kv.defaults.set({"num_threads": c, "task_size": p})
            with kv.RemoteFile.open_s3("bench", "obj") as f:
                f.read(dst)
        return timed(one, size)

    def client_read(cl):
        r = timed(lambda: cl.read_to_gpu("bench", "obj", dst), size)
        if gpu:
            torch.cuda.synchronize()
        return r

    sluice_best, kvikio_best = None, (part, conc)
    if "sweep" not in skip:
        grid = [(parse_size(p), int(c)) for p in a.sweep_parts.split(",") for c in a.sweep_conc.split(",")]
        sweep = {}
        for p, c in grid:
            name = f"{p // MiB}M x{c}"
            with sluice.Client(ep, ak, sk, "us-east-1", max_transfer_size=p, threads=c, queue_depth=2) as cl:
                client_read(cl)  # its engine's first use: slots pinned
                sweep[f"sluice {name}"] = side_by_side({"s": lambda cl=cl: client_read(cl)}, 2)["s"]
            if kv:
                sweep[f"kvikio {name}"] = side_by_side({"k": lambda p=p, c=c: kvikio_read(p, c)}, 2)["k"]
            say(f"sweep {name}: sluice {sweep[f'sluice {name}'].get('gb_s', 0):.2f} GB/s" +
                (f", kvikio {sweep[f'kvikio {name}'].get('gb_s', 0):.2f} GB/s" if kv else ""))
        res["read_sweep"] = sweep
        pick = lambda who: max(grid, key=lambda g: sweep.get(f"{who} {g[0] // MiB}M x{g[1]}", {}).get("gb_s", 0))  # noqa: E731
        sluice_best = pick("sluice")
        if kv:
            kvikio_best = pick("kvikio")
        res["sluice_best_config"] = f"{sluice_best[0] // MiB}M x{sluice_best[1]}"
        res["kvikio_best_config"] = f"{kvikio_best[0] // MiB}M x{kvikio_best[1]}"
    best_client = sluice.Client(ep, ak, sk, "us-east-1", max_transfer_size=sluice_best[0], threads=sluice_best[1],
                                queue_depth=2) if sluice_best else None
    readers = {"sluice": (lambda: client_read(best_client)) if best_client else sluice_read}
    if "boto3" not in skip:
        readers["boto3"] = lambda: boto3_read(best_cfg)
    if "s3torch" not in skip:
        try:
            from s3torchconnector._s3client import S3Client, S3ClientConfig
            s3t = S3Client("us-east-1", endpoint=ep, s3client_config=S3ClientConfig(
                part_size=part, force_path_style=True, throughput_target_gbps=100.0))

            def s3torch_read():
                return timed(lambda: to_target(memoryview(s3t.get_object("bench", "obj").read())), size)
            readers["s3torchconnector"] = s3torch_read
        except Exception as e:  # reported, not fatal
            res["s3torchconnector_error"] = repr(e)
    if kv:
        readers["kvikio"] = lambda: kvikio_read(*kvikio_best)
    for name, fn in readers.items():  # each once, checked, before the timed passes
        try:
            dst.zero_() if gpu else dst.fill(0)
            fn()
            check(dst)
        except Exception as e:
            res[f"{name}_read_error"] = repr(e)
            say(f"{name} read failed: {e!r}")
    readers = {k: v for k, v in readers.items() if f"{k}_read_error" not in res}
    res["read"] = side_by_side(readers, a.reps)
    for k, v in res["read"].items():
        say(f"read {k}: {v.get('gb_s', 0):.2f} GB/s, {v.get('cpu_s_per_gb', 0):.2f} CPU s/GB, "
            f"machine {100 * v.get('machine_busy', 0):.0f}% busy")

    # ---- Writes from GPU memory.
    if "write" not in skip:
        dst.copy_(torch.from_numpy(data)) if gpu else np.copyto(dst, data)
        src = dst[:wsize]
        if gpu:
            torch.cuda.synchronize()

        def host_copy():
            return src.cpu().numpy() if gpu else src

        # sluice writes through the same client (its engine is open already), else the process's engine.
        put = (lambda: best_client.write_from_gpu("bench", "w-sluice", src)) if best_client else \
            (lambda: sluice.write("s3://bench/w-sluice", src))
        writers = {"sluice": lambda: timed(put, wsize)}
        if "boto3" not in skip:
            cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=best_cfg.multipart_chunksize,
                                 max_concurrency=best_cfg.max_concurrency)
            writers["boto3"] = lambda: timed(lambda: s3.upload_fileobj(io.BytesIO(memoryview(host_copy())), "bench",
                                                                       "w-boto3", Config=cfg), wsize)
        if "s3torchconnector" in readers:
            def s3torch_write():
                def one():
                    with s3t.put_object("bench", "w-s3torch") as w:
                        w.write(memoryview(host_copy()))
                return timed(one, wsize)
            writers["s3torchconnector"] = s3torch_write
        res["write"] = side_by_side(writers, a.reps)
        for k, v in res["write"].items():
            say(f"write {k}: {v.get('gb_s', 0):.2f} GB/s, {v.get('cpu_s_per_gb', 0):.2f} CPU s/GB")
        for name in writers:  # the objects written are whole and right
            got = s3.get_object(Bucket="bench", Key=f"w-{name.replace('connector', '')}")["Body"].read()
            res[f"write_{name}_checked"] = got == data[:wsize].tobytes()

    # ---- Ratios.
    rd = res["read"]
    peers = [k for k in rd if k != "sluice" and "gb_s" in rd[k]]
    rat = {f"read_vs_{k}": ratio(rd["sluice"], rd[k]) for k in peers}
    if peers:
        best_peer = max(peers, key=lambda k: rd[k]["gb_s"])
        rat["read_vs_best_peer"] = ratio(rd["sluice"], rd[best_peer])
        rat["read_best_peer"] = best_peer
    if "ceiling" in res:
        rat["read_vs_ceiling"] = ratio(rd["sluice"], res["ceiling"])
    if "gb_s" in res.get("ceiling_kept", {}):
        rat["read_vs_ceiling_kept"] = ratio(rd["sluice"], res["ceiling_kept"])
    if "write" in res:
        wr = res["write"]
        wpeers = [k for k in wr if k != "sluice" and "gb_s" in wr[k]]
        rat.update({f"write_vs_{k}": ratio(wr["sluice"], wr[k]) for k in wpeers})
        if wpeers:
            rat["write_vs_best_peer"] = min(ratio(wr["sluice"], wr[k]) for k in wpeers)
    res["ratios"] = rat
    if best_client:
        best_client.close()
    say(f"ratios: { {k: (round(v, 3) if isinstance(v, float) else v) for k, v in rat.items()} }")


if __name__ == "__main__":
    main()
