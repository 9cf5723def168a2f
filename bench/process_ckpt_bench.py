"""GPU process checkpoints (issue #15): a CUDA process holding SIZE of GPU memory, suspended to host memory
and resumed by `sluice checkpoint`, REPS times; medians of each phase, the GB/s the checkpoint and the
restore moved, and the process's own check of its data afterwards.

    python3 bench/process_ckpt_bench.py --sizes 1G,8G,32G --reps 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import parse_size  # noqa: E402
from test_process_checkpoint import CHILD  # noqa: E402  (the test's process: the same data check)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1G,8G")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    results = []
    for s in a.sizes.split(","):
        size = parse_size(s)
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        ready = p.stdout.readline().split()
        runs = []
        for _ in range(a.reps):
            r = subprocess.run([SLUICE, "checkpoint", "--json", str(p.pid)], capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"checkpoint failed: {r.stderr}")
            runs.append(json.loads(r.stdout))
        p.stdin.write("go\n")
        p.stdin.flush()
        after = p.stdout.readline().split()
        p.wait()
        med = {k: statistics.median(r[k] for r in runs) for k in ("lock_s", "checkpoint_s", "restore_s", "unlock_s",
                                                                  "gpu_bytes_moved")}
        row = dict(size=size, reps=a.reps, **med, intact=after == ["after", ready[1], ready[2], "True"],
                   checkpoint_gb_s=med["gpu_bytes_moved"] / med["checkpoint_s"] / 1e9,
                   restore_gb_s=med["gpu_bytes_moved"] / med["restore_s"] / 1e9, runs=runs)
        results.append(row)
        print(f"[ckpt] {s}: lock {med['lock_s'] * 1e3:.1f} ms, checkpoint {med['checkpoint_s']:.3f} s "
              f"({row['checkpoint_gb_s']:.2f} GB/s), restore {med['restore_s']:.3f} s ({row['restore_gb_s']:.2f} GB/s), "
              f"unlock {med['unlock_s'] * 1e3:.1f} ms, moved {med['gpu_bytes_moved'] / 1e9:.2f} GB, "
              f"data intact: {row['intact']}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
