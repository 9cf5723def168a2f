"""GPU against CPU decoding of zstd shards (issue #15, part 2), and the loader over compressed shards against
uncompressed ones.

Data: TOKENS Zipf-distributed uint32 tokens (a vocabulary of 50,257; documents of 512-4096 tokens) packed
twice by `sluice pack --from-tokens`: plain, and in zstd blocks (level 3, --block, default 4 MiB), shards of
256 MiB.

1. Every shard of the zstd pack whole into one GPU buffer with Dataset.read_shard: nvCOMP on the GPU
   against the CPU decoder (the engine's threads), warm (page cache) and cold, medians of REPS interleaved
   passes: delivered uncompressed GB/s and this process's CPU s per delivered GB.  The plain pack read the
   same way is the reference ("none").
2. The loader (GPU batches) over each pack, cold: records/s, the zstd pack's blocks decoded by nvCOMP and by the
   CPU; one loader, two epochs, each after the page cache is dropped: the first with the loader's opening, the
   second as later epochs run.  Targets: compressed not slower than plain (issue #15); >= 1.3x plain with nvCOMP (issue #38).

    python3 bench/decode_bench.py --tokens 1G --reps 3 --dir /tmp/dec
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results, cpu_now, drop_caches, pack_tokens, parse_size, ratio, side_by_side, timed, warm  # noqa: E402

import sluice  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1G", help="bytes of tokens (uint32)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/sluice-decode")
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--block", default="4M", help="zstd block size of the compressed pack (sluice pack --block-size)")
    a = ap.parse_args()
    import torch
    pack_tokens(SLUICE, a.dir, parse_size(a.tokens), {"plain": [], "zstd": ["--zstd", "3", "--block-size", a.block]})
    res = Results(a.out, bench="decode", tokens=a.tokens, block=a.block)
    z, p = sluice.Dataset(os.path.join(a.dir, "zstd")), sluice.Dataset(os.path.join(a.dir, "plain"))
    nshards = sluice.lib.sluice_dataset_shards(z._h)
    logical = sum(z.shard_bytes(s)[1] for s in range(nshards))
    cap = max(z.shard_bytes(s)[1] for s in range(nshards))
    buf = torch.empty(cap, dtype=torch.uint8, device="cuda")
    res["logical_bytes"], res["shards"] = logical, nshards
    stored = 0

    def read_all(ds, decoder):
        nonlocal stored
        def one():
            st = rd = de = 0
            for s in range(sluice.lib.sluice_dataset_shards(ds._h)):
                r = ds.read_shard(s, buf, decoder=decoder)
                if decoder != "cpu" and ds is z and r["decoder"] != "gpu":
                    raise RuntimeError("nvCOMP unusable: " + r["why_not_gpu"])
                st, rd, de = st + r["stored"], rd + r["read_s"], de + r["decode_s"]
            torch.cuda.synchronize()
            return {"stored": st, "read_s": rd, "decode_s": de}
        r = timed(one, logical)
        stored = r["stored"] if ds is z else stored
        return r

    # Both decoders give the same bytes (shard 0), before any timing.
    ref = torch.empty_like(buf)
    z.read_shard(0, ref, decoder="cpu")
    z.read_shard(0, buf, decoder="gpu")
    n0 = z.shard_bytes(0)[1]
    res["same_bytes"] = bool(torch.equal(ref[:n0], buf[:n0]))
    contenders = {"gpu": lambda: read_all(z, "gpu"), "cpu": lambda: read_all(z, "cpu"), "none": lambda: read_all(p, "auto")}
    for temp, before in (("warm", lambda: (warm(os.path.join(a.dir, "zstd")), warm(os.path.join(a.dir, "plain")))),
                         ("cold", drop_caches)):
        r = side_by_side(contenders, a.reps, before=before)
        res[temp] = r
        res[f"{temp}_gpu_over_cpu"] = ratio(r.get("gpu"), r.get("cpu"))
        for k, v in r.items():
            print(f"[decode] {temp} {k}: {v.get('gb_s', 0):.2f} GB/s delivered, {v.get('cpu_s_per_gb', 0):.3f} CPU s/GB"
                  f"{' (' + v['error'] + ')' if 'error' in v else ''}", flush=True)
    res["stored_bytes"] = stored
    res["compression_ratio"] = logical / stored if stored else None

    # The loader over each pack, cold: GPU batches of token sequences; the zstd pack's blocks decoded by nvCOMP
    # (SLUICE_DECODE=auto) and by the CPU (cpu).  One loader runs two epochs, the page cache dropped before each:
    # the first with the loader's opening (what a one-epoch job sees), the second as every later epoch runs.
    def loader(ds, decode="auto"):
        os.environ["SLUICE_DECODE"] = decode
        try:
            t0 = time.perf_counter()
            ld = sluice.Loader(ds, batch_size=a.batch, device="cuda", shuffle=True, seed=1)
        finally:
            os.environ.pop("SLUICE_DECODE")
        out = {}
        for e in range(2):
            drop_caches()
            if e:
                ld.set_epoch(e)
                t0 = time.perf_counter()
            c0, n = cpu_now(), 0
            for _ in ld:
                n += a.batch
            torch.cuda.synchronize()
            out[f"epoch{e + 1}_records_s"] = n / (time.perf_counter() - t0)
            out[f"epoch{e + 1}_cpu_s"] = cpu_now() - c0
        st = ld.stats()
        out.update({"records_s": out["epoch2_records_s"], "zstd_blocks_gpu": st["zstd_blocks_gpu"],
                    "zstd_blocks_cpu": st["zstd_blocks_cpu"], "window_read_p50_us": st["stages"]["read"]["p50_us"],
                    "windows": st["stages"]["read"]["count"], "verdict": st["verdict"],
                    "consumer_wait_p50_us": st["stages"]["consumer_wait"]["p50_us"],
                    "zstd_window_read_p50_us": st["stages"]["zstd_window_read"]["p50_us"],
                    "zstd_window_decode_p50_us": st["stages"]["zstd_window_decode"]["p50_us"]})
        ld.close()
        return out
    r = side_by_side({"zstd": lambda: loader(z), "zstd_cpu": lambda: loader(z, "cpu"), "plain": lambda: loader(p)},
                     a.reps, key="records_s")
    res["loader_cold"] = r
    for e in (1, 2):
        res[f"loader_zstd_over_plain_epoch{e}"] = ratio(r.get("zstd"), r.get("plain"), key=f"epoch{e}_records_s")
        res[f"loader_zstd_cpu_over_plain_epoch{e}"] = ratio(r.get("zstd_cpu"), r.get("plain"), key=f"epoch{e}_records_s")
    for k, v in r.items():
        print(f"[decode] loader cold {k}: {v.get('epoch1_records_s', 0):.0f} records/s in the first epoch (opening "
              f"included), {v.get('epoch2_records_s', 0):.0f} in the second; CPU s {v.get('epoch1_cpu_s', 0):.1f} / "
              f"{v.get('epoch2_cpu_s', 0):.1f}; blocks gpu/cpu {v.get('zstd_blocks_gpu')}/{v.get('zstd_blocks_cpu')}, "
              f"{v.get('windows')} windows read in {v.get('window_read_p50_us', 0) / 1e3:.1f} ms (p50; its blocks read "
              f"{v.get('zstd_window_read_p50_us', 0) / 1e3:.1f}, decoded {v.get('zstd_window_decode_p50_us', 0) / 1e3:.1f}), "
              f"consumer wait p50 {v.get('consumer_wait_p50_us', 0) / 1e3:.2f} ms, {v.get('verdict')} {v.get('error', '')}",
              flush=True)
    print(f"[decode] GPU / CPU decoding: warm {res['warm_gpu_over_cpu']}, cold {res['cold_gpu_over_cpu']}; loader zstd / "
          f"plain (cold), first epoch {res['loader_zstd_over_plain_epoch1']} (CPU decoding "
          f"{res['loader_zstd_cpu_over_plain_epoch1']}), second {res['loader_zstd_over_plain_epoch2']} (CPU decoding "
          f"{res['loader_zstd_cpu_over_plain_epoch2']}); ratio {res['compression_ratio']:.2f}", flush=True)
    res.save()


if __name__ == "__main__":
    main()
