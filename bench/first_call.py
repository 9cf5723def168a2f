"""A one-shot call's start-up toll (issue #12): the first `sluice.read` of a warm file into a torch tensor in
a fresh process, against the same process's next calls.

Each pass is a new Python process that imports torch and sluice, allocates the tensor, then times
(mode "oneshot") the first read, which opens the engine, as a user's script does, and 5 more; or (mode
"opened") opening the engine by itself, then the reads.  KvikIO's first and next reads (compat mode, its
default thread pool) run the same way beside it when it is installed.  The engine's own breakdown of its
open (SLUICE_LOG=info) is kept.  Passes of the modes and peers are interleaved; medians of --reps.

    python3 bench/first_call.py --size 8G --reps 3 --out first_call.json
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from benchlib import GB, Results, make_file, ratio, side_by_side, warm

NEXT = 5


def child(mode, path, size):
    import torch
    t = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    r = {}
    if mode == "kvikio":
        import kvikio
        def read():
            with kvikio.CuFile(path, "r") as f:
                f.read(t)
    else:
        import sluice
        if mode == "opened":
            t0 = time.perf_counter()
            sluice._eng()
            r["open_ms"] = (time.perf_counter() - t0) * 1e3
        def read():
            sluice.read(path, t)
    times = []
    for _ in range(1 + NEXT):
        t0 = time.perf_counter()
        read()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = statistics.median(times[1:])
    r.update(first_gb_s=size / times[0] / GB, steady_gb_s=size / steady / GB,
             first_vs_steady=steady / times[0], toll_ms=(times[0] - steady) * 1e3)
    print(json.dumps(r))


def one_pass(mode, path, size):
    env = dict(os.environ, SLUICE_LOG="info", PYTHONUNBUFFERED="1")
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--file", path, "--size", str(size)],
                         capture_output=True, text=True, env=env, timeout=300)
    if out.returncode:
        raise RuntimeError(f"{mode}: {out.stderr.strip()[-800:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    m = re.search(r"engine open ([0-9.]+) ms: CUDA ([0-9.]+), (?:backends|stores) ([0-9.]+), pool ([0-9.]+), "
                  r"workers ([0-9.]+)", out.stderr)
    if m:
        r.update(zip(("engine_open_ms", "cuda_ms", "backends_ms", "pool_ms", "workers_ms"), map(float, m.groups())))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/sluice-first-call.bin")
    ap.add_argument("--size", default="8G")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="first_call.json")
    ap.add_argument("--child")
    a = ap.parse_args()
    size = int(a.size[:-1]) << {"K": 10, "M": 20, "G": 30}[a.size[-1]] if a.size[-1] in "KMG" else int(a.size)
    if a.child:
        return child(a.child, a.file, size)
    make_file(a.file, size)
    res = Results(a.out, file=a.file, bytes=size, reps=a.reps)
    modes = ["oneshot", "opened"]
    try:
        import kvikio  # noqa: F401
        modes.append("kvikio")
    except ImportError:
        res["kvikio"] = "not installed"
    res["passes"] = side_by_side({m: (lambda m=m: one_pass(m, a.file, size)) for m in modes}, a.reps,
                                 before=lambda: warm(a.file), key="first_vs_steady")
    for m, r in res["passes"].items():
        if "error" in r:
            print(f"{m:8s} {r['error']}")
            continue
        print(f"{m:8s} first {r['first_gb_s']:6.2f} GB/s, steady {r['steady_gb_s']:6.2f} GB/s, "
              f"first/steady {r['first_vs_steady']:.3f} (passes {', '.join(f'{x:.3f}' for x in r['passes'])}), "
              f"toll {r['toll_ms']:.0f} ms" + (f"; open {r['engine_open_ms']:.1f} ms (CUDA {r['cuda_ms']:.1f}, "
                                               f"backends {r['backends_ms']:.1f}, pool {r['pool_ms']:.1f}, "
                                               f"workers {r['workers_ms']:.1f})" if "engine_open_ms" in r else ""))
    res["oneshot_first_vs_steady"] = res["passes"].get("oneshot", {}).get("first_vs_steady")
    res["sluice_first_vs_kvikio_first"] = ratio(res["passes"].get("oneshot"), res["passes"].get("kvikio"),
                                                "first_gb_s")
    print(f"first call / steady (target >= 0.8): {res['oneshot_first_vs_steady']}; "
          f"sluice's first call / KvikIO's: {res['sluice_first_vs_kvikio_first']}")


if __name__ == "__main__":
    main()
