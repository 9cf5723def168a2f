#!/usr/bin/env python3
"""The loader before and after a change, side by side in one run: the same dataset, one shuffled epoch into GPU
memory (`sluice_ds_bench loader DIR gpu BATCH 0 warm|cold`), the two builds' passes interleaved, medians.

    python3 bench/loader_ab.py --a old/build/sluice_ds_bench --b build/sluice_ds_bench --sluice build/sluice

Each build's sluice_ds_bench links its own libsluice (its build directory's rpath).  More contenders with
--arm NAME=PATH (repeated); NAME ending in "+hold" runs PATH with SLUICE_BENCH_HOLD=1 (the hold option as
sluice.Loader runs it), the others as the environment says.  Each is reported against a.  The dataset: --records of
--size bytes of random bytes (default 195,312 of 4 KiB: 800 MB), packed once by --sluice.  Warm: the files read
through the page cache first; cold: the page cache dropped before each pass.  Prints samples/s of each, and
b / a; JSON to --out.
"""
import argparse
import json
import os
import statistics
import subprocess

import numpy as np
from benchlib import drop_caches, warm


def dataset(root, n, size, sluice):
    ds = f"{root}/sluice-{size}x{n}"
    if not os.path.exists(ds):
        files = f"{root}/files-{size}x{n}/c"
        os.makedirs(files, exist_ok=True)
        rng = np.random.default_rng(size)
        for i in range(n):
            with open(f"{files}/{i:08d}.bin", "wb") as f:
                f.write(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())
        subprocess.run([sluice, "pack", "--from-dir", os.path.dirname(files), "--all-files", "--quiet", ds],
                       check=True)
    return ds


def epoch(ds_bench, ds, batch, temp, hold):
    if temp == "cold":
        drop_caches()
    else:
        warm(ds)
    env = dict(os.environ, SLUICE_BENCH_HOLD="1") if hold else os.environ
    out = subprocess.run([ds_bench, "loader", ds, "gpu", str(batch), "0", temp], capture_output=True, text=True,
                         check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="sluice_ds_bench of the build before")
    ap.add_argument("--b", required=True, help="sluice_ds_bench of the build after")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=PATH",
                    help="another sluice_ds_bench; a NAME ending in +hold runs it with the hold option")
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--dir", default="/var/tmp/sluice-ab")
    ap.add_argument("--records", type=int, default=195_312)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--temps", default="warm,cold")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/loader_ab.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    ds = dataset(a.dir, a.records, a.size, a.sluice)
    arms = {"a": a.a, "b": a.b}
    for spec in a.arm:
        name, _, path = spec.partition("=")
        if not name or not path or name in arms:
            ap.error(f"--arm {spec!r}: NAME=PATH, a name not used already")
        arms[name] = path
    res = {}
    for temp in a.temps.split(","):
        runs = {k: [] for k in arms}
        for _ in range(a.reps):
            for k, path in arms.items():
                runs[k].append(epoch(path, ds, a.batch, temp, k.endswith("+hold"))["samples_per_s"])
        med = {k: statistics.median(v) for k, v in runs.items()}
        res[temp] = {"runs": runs, "median": med, "over_a": {k: med[k] / med["a"] for k in arms}}
        for k in arms:
            print(f"{temp}: {k} {med[k]:,.0f} samples/s {[round(x) for x in runs[k]]}: {k}/a {med[k] / med['a']:.3f}",
                  flush=True)
    with open(a.out, "w") as f:
        json.dump({"records": a.records, "size": a.size, "batch": a.batch, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
