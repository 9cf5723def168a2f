#!/usr/bin/env python3
"""Issue #4: token packing, tokens/s of real (non-padding) tokens delivered to the GPU and slots filled.

    python3 bench/packing_bench.py --sluice build/sluice --ds-bench build/sluice_ds_bench [--dir D]

Documents with an Alpaca-like length distribution (lognormal, mean about 95 tokens, cut to 13..307) are
turned into rows of L = --context tokens three ways, each written as a sluice dataset (input_ids,
position_ids, labels i32 [L], cu_seqlens) by `sluice pack --from-tokens --pack-context L`:
  - best-fit decreasing (the default) and --greedy (arrival order), over --docs documents;
  - naive padding, one document per row: the same command over documents that are each L tokens long, so
    every row holds one document; its real tokens are the documents' true lengths (--naive-docs of them).
Each dataset then runs one shuffled epoch of the loader into GPU memory (`sluice_ds_bench loader DIR gpu
--batch 0 warm`, median of --reps), and real tokens/s = rows/s x real tokens per row. Prints fill %,
rows/s, real tokens/s and CPU s/GB for each; JSON to --out. Without a GPU the rows land in host memory.
"""
import argparse
import json
import os
import subprocess

import numpy as np
from benchlib import Results, side_by_side


def lengths(n, seed):
    rng = np.random.default_rng(seed)
    return np.clip(np.exp(np.log(83) + 0.52 * rng.standard_normal(n)), 13, 307).astype(np.int64)


def pack(sluice, d, name, lens, context, extra):
    out = f"{d}/{name}"
    if not os.path.exists(out):
        toks = np.arange(int(lens.sum()), dtype=np.int64).astype(np.uint16)
        np.save(f"{d}/{name}.tok.npy", toks)
        np.save(f"{d}/{name}.len.npy", lens)
        subprocess.run([sluice, "pack", "--from-tokens", f"{d}/{name}.tok.npy", "--doc-lengths",
                        f"{d}/{name}.len.npy", "--pack-context", str(context), "--quiet", out] + extra, check=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--ds-bench", default="build/sluice_ds_bench")
    ap.add_argument("--dir", default="/var/tmp/sluice-pack")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--docs", type=int, default=200000)
    ap.add_argument("--naive-docs", type=int, default=50000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/packing_bench.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    L = a.context
    lens, nlens = lengths(a.docs, 0), lengths(a.naive_docs, 1)
    res = Results(a.out, context=L, batch=a.batch, mean_doc_tokens=float(lens.mean()), max_doc_tokens=int(lens.max()))
    sets = {"bfd": (pack(a.sluice, a.dir, f"bfd{a.docs}", lens, L, []), float(lens.sum())),
            "greedy": (pack(a.sluice, a.dir, f"greedy{a.docs}", lens, L, ["--greedy"]), float(lens.sum())),
            "naive": (pack(a.sluice, a.dir, f"naive{a.naive_docs}", np.full(a.naive_docs, L), L, []),
                      float(nlens.sum()))}

    def epoch(ds):
        out = subprocess.run([a.ds_bench, "loader", ds, a.target, str(a.batch), "0", "warm"],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    # One epoch of each set in turn, --reps times; medians.
    got = side_by_side({name: (lambda ds=ds: epoch(ds)) for name, (ds, _) in sets.items()}, a.reps,
                       key="samples_per_s")
    for name, (ds, real) in sets.items():
        med = got[name]
        if "error" in med:
            raise SystemExit(f"{name}: {med['error']}")
        # Every row of the dataset is delivered once an epoch (drop_last leaves out under one batch).
        total_rows = json.loads(subprocess.run([a.sluice, "inspect", "--json", ds], capture_output=True,
                                               text=True, check=True).stdout)["records"]
        per_row = real / total_rows
        r = res[name] = {"rows": total_rows, "fill": per_row / L, "rows_per_s": med["samples_per_s"],
                         "real_tokens_per_s": med["samples_per_s"] * per_row, "gb_s": med["gb_s"],
                         "cpu_s_per_gb": med["cpu_s_per_gb"], "rows_delivered": med["records"],
                         "passes_rows_per_s": med["passes"]}
        print(f"{name}: {100 * r['fill']:.2f}% of slots, {r['rows_per_s']:,.0f} rows/s, "
              f"{r['real_tokens_per_s'] / 1e6:,.1f} M real tokens/s, {r['gb_s']:.2f} GB/s, "
              f"CPU {r['cpu_s_per_gb']:.3f} s/GB", flush=True)
    res["bfd_vs_naive_tokens_per_s"] = res["bfd"]["real_tokens_per_s"] / res["naive"]["real_tokens_per_s"]
    print(f"real tokens/s, best-fit decreasing / naive padding: {res['bfd_vs_naive_tokens_per_s']:.1f}x")

if __name__ == "__main__":
    main()
