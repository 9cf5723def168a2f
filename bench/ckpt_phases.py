"""Where a warm whole-checkpoint load's time goes (issue #40: sluice.load at 27-33 GB/s warm against a plain read
of one file at 37-50 and the link at 55). On the checkpoint bench/ckpt_bench.py makes, warm (its files read once
before), in one process, passes interleaved, medians of REPS:
  load     sluice.load(DIR, device): its wall time, and of it the engine's read (the report's seconds); the rest
           is the headers, the plan, the allocation and the views
  headers  the files opened and their headers parsed, alone
  alloc    the device buffer of the checkpoint's size, alone
  files    sluice.read of each file whole into one device buffer (the engine's plain warm read of the same
           bytes, no tensors)
  link     the same bytes from pinned host memory to the device (no loader beats it warm)

    python3 bench/ckpt_phases.py --dir /var/tmp/sluice-ckpt --reps 5 --out phases.json
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import GB, Results, warm  # noqa: E402

import sluice  # noqa: E402
from sluice import checkpoint as ck  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/sluice-ckpt")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    cuda = a.device.startswith("cuda")
    files = sorted(os.path.join(a.dir, n) for n in os.listdir(a.dir) if n.endswith(".safetensors"))
    sizes = [os.path.getsize(f) for f in files]
    total = sum(sizes)
    res = Results(a.out, bench="ckpt_phases", dir=a.dir, files=len(files), bytes=total, device=a.device)
    warm(a.dir)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def load():
        rep = {}
        sync()
        t = time.perf_counter()
        out = sluice.load(a.dir, device=a.device, report=rep)
        sync()
        wall = time.perf_counter() - t
        n = sum(v.numel() * v.element_size() for v in out.values())
        del out
        return {"wall_s": wall, "read_s": rep["seconds"], "rest_s": wall - rep["seconds"], "gb_s": n / wall / GB,
                "read_gb_s": rep["bytes"] / rep["seconds"] / GB, "ios": rep["ios"], "tensors": rep["tensors"]}

    def headers():
        t = time.perf_counter()
        with ck._Open(ck._sources(a.dir)) as ckp:  # the library's open: files opened, headers read
            n = len(ckp.table)
        return {"wall_s": time.perf_counter() - t, "tensors": n}

    def alloc():
        sync()
        t = time.perf_counter()
        buf = torch.empty(total, dtype=torch.uint8, device=a.device)
        sync()
        s = time.perf_counter() - t
        del buf
        return {"wall_s": s}

    dest = torch.empty(total, dtype=torch.uint8, device=a.device)

    def plain():
        sync()
        t, at = time.perf_counter(), 0
        for f, n in zip(files, sizes):
            sluice.read(f, dest[at:at + n])
            at += n
        sync()
        s = time.perf_counter() - t
        return {"wall_s": s, "gb_s": total / s / GB}

    runs = {"load": load, "headers": headers, "alloc": alloc, "files": plain}
    if cuda:
        pinned = torch.empty(total, dtype=torch.uint8).pin_memory()

        def link():
            sync()
            t = time.perf_counter()
            dest.copy_(pinned, non_blocking=True)
            sync()
            s = time.perf_counter() - t
            return {"wall_s": s, "gb_s": total / s / GB}
        runs["link"] = link
    got = {k: [] for k in runs}
    for k, fn in runs.items():  # a first pass each, untimed: CUDA, the allocator and the engine started
        fn()
    for _ in range(a.reps):
        for k, fn in runs.items():
            got[k].append(fn())
    for k, passes in got.items():
        med = {f: statistics.median(p[f] for p in passes) for f in passes[0]}
        res[k] = {"median": med, "passes": passes}
        print(f"[phases] {k}: " + ", ".join(f"{f} {v:.4g}" for f, v in med.items()), flush=True)
    ld = res["load"]["median"]
    print(f"[phases] load {ld['gb_s']:.1f} GB/s = read {ld['read_s']:.3f} s + the rest {ld['rest_s']:.3f} s "
          f"(headers {res['headers']['median']['wall_s']:.3f}, alloc {res['alloc']['median']['wall_s']:.3f}); "
          f"the files read plainly {res['files']['median']['gb_s']:.1f} GB/s"
          + (f"; the link {res['link']['median']['gb_s']:.1f} GB/s" if "link" in res else ""), flush=True)


if __name__ == "__main__":
    main()
