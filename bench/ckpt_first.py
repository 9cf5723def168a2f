"""Where a fresh process's first sluice.load goes (issue #55): the steps of checkpoint.load timed (their wall
time, wrapped), in fresh processes, a first load and then a second, with the engine started before the clock
(and its workers through their start: "engine ready first") or by the load itself.  CUDA is started before the
clock, as bench/ckpt_bench.py's fresh processes start it.

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
import gc
_gc = {}
def _gc_timed(phase, info):  # Python's collections: time spent in them, whichever step they fall in
    if phase == "start":
        _gc["t0"] = time.perf_counter()
    else:
        acc["gc"] = acc.get("gc", 0) + time.perf_counter() - _gc.pop("t0", time.perf_counter())
        _gc["gen"] = max(_gc.get("gen", -1), info["generation"])
gc.callbacks.append(_gc_timed)
if sys.argv[2] != "load starts the engine":
    t0 = time.perf_counter()
    e = _eng()
    out["engine_ms"] = (time.perf_counter() - t0) * 1e3
    if sys.argv[2] == "engine ready first":  # and its workers through their start (get_info waits for them)
        import ctypes
        from sluice._lib import lib
        info = ctypes.create_string_buffer(lib.sluice_sizeof(b"sluice_engine_info"))
        ctypes.c_size_t.from_buffer(info).value = len(info)
        if lib.sluice_engine_get_info(e, info):
            raise SystemExit("sluice_engine_get_info failed")
        out["ready_ms"] = (time.perf_counter() - t0) * 1e3
for k in range(2):
    acc.clear()
    acc["gc"] = 0
    _gc["gen"] = -1
    rep = {}
    prof = None
    if k == 0 and len(sys.argv) > 3:  # --profile: the first load under cProfile, its table to that file
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    got = ck.load(sys.argv[1], device="cuda", report=rep)
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        import io, pstats
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        s2 = io.StringIO()
        pstats.Stats(prof, stream=s2).sort_stats("tottime").print_stats(25)
        with open(sys.argv[3], "w") as f:
            f.write(s.getvalue() + s2.getvalue())
    n = sum(v.numel() * v.element_size() for v in got.values())
    out[f"load{k}"] = {"ms": t * 1e3, "gb_s": n / t / 1e9, "read_ms": rep["seconds"] * 1e3,
                       **{f"{m}_ms": v * 1e3 for m, v in acc.items()}}
    # what no timed step holds (_table runs inside opens; a collection inside whichever step it fell in)
    out[f"load{k}"]["other_ms"] = t * 1e3 - sum(v * 1e3 for m, v in acc.items() if m not in ("_table", "gc"))
    out[f"load{k}"]["gc_oldest_generation"] = _gc["gen"]  # -1: none
    del got
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--procs", type=int, default=3, help="fresh processes of each arm, interleaved")
    ap.add_argument("--out", default="")
    ap.add_argument("--stderr", action="store_true", help="the children's stderr shown (SLUICE_LOG's lines)")
    ap.add_argument("--profile", default="", help="the first process's first load under cProfile: its table to this file")
    ap.add_argument("--arms", default="load starts the engine,engine first",
                    help="comma list of: load starts the engine, engine first, engine ready first")
    a = ap.parse_args()
    arms = tuple(a.arms.split(","))
    runs = {arm: [] for arm in arms}
    for _ in range(a.procs):
        for arm in arms:
            prof = [a.profile] if a.profile and not runs[arm] else []
            r = subprocess.run([sys.executable, "-c", CHILD, a.dir, arm, *prof], stdout=subprocess.PIPE,
                               stderr=None if a.stderr else subprocess.PIPE, text=True)
            if r.returncode:
                raise SystemExit((r.stderr or "")[-2000:])
            runs[arm].append(json.loads(r.stdout.strip().splitlines()[-1]))
    res = {}
    for arm, rs in runs.items():
        med = {}
        for key in ("load0", "load1"):
            med[key] = {m: round(statistics.median(r[key].get(m, 0) for r in rs), 2) for m in rs[0][key]}
        med.update({m: round(statistics.median(r[m] for r in rs), 2) for m in rs[0] if m.endswith("_ms")})
        res[arm] = med
        print(arm, json.dumps(med), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"medians": res, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
