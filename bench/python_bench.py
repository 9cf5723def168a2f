#!/usr/bin/env python3
"""Issue #5 benchmarks on the GPU machine (one command, results as JSON in --out):

    python3 bench/python_bench.py --sluice build/sluice [--gb 10]

1. Python overhead per batch: the time one `next()` of sluice.Loader(device="cuda") takes when the batch is
   already prepared (the consumer spins 2 ms between batches so the ring is full), against the same measured
   in C (`sluice_loader_next` alone, from the loader's consumer-wait histogram). Target < 20 us.
2. Checkpoint load: a state dict of --gb GB (bf16/f32 tensors of 16-256 MiB) saved once with safetensors;
   then, cold (page cache dropped) and warm (the file read through the page cache first), median of --reps: sluice.load(device="cuda"),
   safetensors.torch.load_file(device="cuda"), torch.load(map_location="cuda") of the same tensors saved by
   torch.save. Target: sluice >= 3x safetensors. Save: sluice.save against torch.save and save_file.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch

import sluice
from benchlib import Results, drop_caches, side_by_side, warm

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test of this script


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def overhead(sluice_bin, d):
    with open(f"{d}/in.jsonl", "w") as f:
        for i in range(20000):
            f.write(json.dumps({"x": [i] * 64, "n": i}) + "\n")
    subprocess.run([sluice_bin, "pack", "--from-jsonl", f"{d}/in.jsonl", "--fields", "x,n", "--quiet", f"{d}/ds"],
                   check=True)
    ld = sluice.Loader(sluice.Dataset(f"{d}/ds"), shuffle=True, batch_size=64, device=DEV, rank=0, world_size=1, prefetch=8)
    times = []
    it = iter(ld)
    next(it)
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass  # the step: busy, as a training loop's thread launching kernels; the loader refills its ring
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t0)
    st = ld.stats()
    c_us = st["stages"]["consumer_wait"]["p50_us"]
    py_us = statistics.median(times) * 1e6
    # The same with the bare ctypes call (no batch dict): splits the overhead into the call and the rest.
    from sluice._lib import Batch
    if sluice.lib.sluice_loader_set_epoch(ld._h, 2):  # the C loader's own epoch: the Loader's starts at a pass
        raise RuntimeError("sluice_loader_set_epoch failed")
    b, stream, held = Batch(), None, 0
    b.struct_size = ctypes.sizeof(b)
    if DEV == "cuda":
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    bare = []
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        t0 = time.perf_counter()
        r = sluice.lib.sluice_loader_next(ld._h, ctypes.byref(b), stream)
        bare.append(time.perf_counter() - t0)
        if held:  # as the Loader's batches are let go of: the one before, once the next has come
            sluice.lib.sluice_loader_release(ld._h, held)
        if r != 1:
            break
        held = getattr(b, "hold", 0)  # (a build before the hold option has none)
    ctypes_us = statistics.median(bare[1:-1]) * 1e6
    # Where a next() spends its time in Python, one more epoch under cProfile (not timed above).
    import cProfile
    import io
    import pstats
    ld.set_epoch(1)
    pr = cProfile.Profile()
    pr.enable()
    for _ in ld:
        pass
    pr.disable()
    prof = io.StringIO()
    pstats.Stats(pr, stream=prof).sort_stats("tottime").print_stats(6)
    return {"python_next_p50_us": py_us, "c_next_p50_us": c_us, "python_overhead_us": py_us - c_us,
            "ctypes_next_p50_us": ctypes_us, "batches": len(times), "profile": prof.getvalue()}


def load_pass(fn, path, total, cold):
    """One timed load of total bytes from path, cold (page cache dropped) or warm (path read first)."""
    if cold:
        drop_caches()
    else:
        warm(path)
    sync()
    t0 = time.perf_counter()
    r = fn()
    sync()
    dt = time.perf_counter() - t0
    del r
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return total / dt / 1e9


def checkpoints(d, gb, reps):
    from safetensors.torch import load_file, save_file

    sd, total, i = {}, 0, 0
    while total < gb * 1e9:
        n = (16 << 20) * (1 + i % 16) // 4
        sd[f"layer{i}.weight"] = torch.randn(n, device=DEV, dtype=torch.float32 if i % 2 else torch.bfloat16)
        total += sd[f"layer{i}.weight"].numel() * sd[f"layer{i}.weight"].element_size()
        i += 1
    res = {"bytes": total, "tensors": len(sd)}
    paths = {k: f"{d}/ck.{k}" for k in ("sluice", "safetensors", "torch")}
    for name, fn in (("sluice", lambda: sluice.save(sd, paths["sluice"])),
                     ("safetensors", lambda: save_file(sd, paths["safetensors"])),
                     ("torch", lambda: torch.save(sd, paths["torch"]))):
        t0 = time.perf_counter()
        fn()
        os.sync()
        res[f"save_{name}_gb_s"] = total / (time.perf_counter() - t0) / 1e9
    sd.clear()  # frees the tensors before the loads
    if DEV == "cuda":
        torch.cuda.empty_cache()
    loads = {"sluice": (lambda: sluice.load(paths["safetensors"], device=DEV), paths["safetensors"]),
             "safetensors": (lambda: load_file(paths["safetensors"], device=DEV), paths["safetensors"]),
             "torch": (lambda: torch.load(paths["torch"], map_location=DEV), paths["torch"])}
    for temp in ("cold", "warm"):
        # The three loaders in turn, --reps times (interleaved); medians.
        got = side_by_side({name: (lambda fn=fn, path=path: load_pass(fn, path, total, temp == "cold"))
                            for name, (fn, path) in loads.items()}, reps)
        for name, r in got.items():
            if "error" in r:
                raise RuntimeError(f"load {name} {temp}: {r['error']}")
            res[f"load_{name}_{temp}_gb_s"] = r["gb_s"]
            res[f"load_{name}_{temp}_passes"] = r["passes"]
            print(f"load {name} {temp}: {r['gb_s']:.2f} GB/s", flush=True)
        res[f"load_ratio_vs_safetensors_{temp}"] = res[f"load_sluice_{temp}_gb_s"] / res[f"load_safetensors_{temp}_gb_s"]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--gb", type=float, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/sluice-py")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/python_bench.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    res = Results(a.out)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        res["overhead"] = o = overhead(a.sluice, d)
        print(f"python overhead per batch: {o['python_overhead_us']:.1f} us (next {o['python_next_p50_us']:.1f} us, "
              f"bare ctypes call {o['ctypes_next_p50_us']:.1f} us, C {o['c_next_p50_us']:.1f} us)\n{o['profile']}", flush=True)
        if a.gb > 0:
            res["checkpoint"] = checkpoints(d, a.gb, a.reps)
    print(json.dumps(res.get("checkpoint"), indent=1))

if __name__ == "__main__":
    main()
