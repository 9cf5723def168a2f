"""Where a fresh process's first sluice.load goes (issue #55): the steps of checkpoint.load timed (their wall
time, wrapped), in fresh processes, a first load and then a second, with the engine started before the clock
or by the load itself.  CUDA is started before the clock, as bench/ckpt_bench.py's fresh processes start it.

    python3 bench/ckpt_bench.py --make-only --shape llama8b --layers 20 --dir /var/tmp/sluice-ckpt
    python3 bench/ckpt_first.py /var/tmp/sluice-ckpt/llama8b-20 --procs 3 --out first.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import gc, json, sys, time
import torch
torch.cuda.set_device(0); torch.empty(1, device="cuda"); torch.cuda.synchronize()
t_import = time.perf_counter()
import sluice
import sluice.checkpoint as ck
from sluice.buffers import _eng
acc, out = {}, {"import_ms": (time.perf_counter() - t_import) * 1e3}
def wrap(name):
    f = getattr(ck, name)
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[name] = acc.get(name, 0) + time.perf_counter() - t0
    setattr(ck, name, g)
for n in ("_sources", "_table", "_select", "_slice_of", "_plan", "_place", "_alloc", "_ranges", "_read_ranges",
          "_view", "_check_args"):
    if hasattr(ck, n):
        wrap(n)
_init = ck._Open.__init__
def _timed_open(self, src):  # the library's open: the files opened and their headers read (C, in parallel)
    t0 = time.perf_counter()
    try:
        return _init(self, src)
    finally:
        acc["opens"] = acc.get("opens", 0) + time.perf_counter() - t0
ck._Open.__init__ = _timed_open
if sys.argv[2] == "engine first":
    t0 = time.perf_counter()
    _eng()
    out["engine_ms"] = (time.perf_counter() - t0) * 1e3
for k in range(2):
    acc.clear()
    rep = {}
    t0 = time.perf_counter()
    got = ck.load(sys.argv[1], device="cuda", report=rep)
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    n = sum(v.numel() * v.element_size() for v in got.values())
    out[f"load{k}"] = {"ms": t * 1e3, "gb_s": n / t / 1e9, "read_ms": rep["seconds"] * 1e3,
                       **{f"{m}_ms": v * 1e3 for m, v in acc.items()}}
    # what no timed step holds (_table runs inside opens)
    out[f"load{k}"]["other_ms"] = t * 1e3 - sum(v * 1e3 for m, v in acc.items() if m != "_table")
    del got
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--procs", type=int, default=3, help="fresh processes of each arm, interleaved")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    arms = ("load starts the engine", "engine first")
    runs = {arm: [] for arm in arms}
    for _ in range(a.procs):
        for arm in arms:
            r = subprocess.run([sys.executable, "-c", CHILD, a.dir, arm], capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(r.stderr[-2000:])
            runs[arm].append(json.loads(r.stdout.strip().splitlines()[-1]))
    res = {}
    for arm, rs in runs.items():
        med = {}
        for key in ("load0", "load1"):
            med[key] = {m: round(statistics.median(r[key][m] for r in rs), 2) for m in rs[0][key]}
        med.update({m: round(statistics.median(r[m] for r in rs), 2) for m in rs[0] if m.endswith("_ms")})
        res[arm] = med
        print(arm, json.dumps(med), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"medians": res, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
