"""Where a warm sluice.load of a checkpoint spends its time (issue #24): the engine's start, the read the
engine reports, and the rest (headers, plan, GPU buffer), in a fresh process; the files read through the page
cache first.  python3 bench/warm_probe.py DIR [all]  (all: also a sweep of threads and transfer sizes)"""
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
torch.empty(1, device="cuda:0"); torch.cuda.synchronize()
ti = time.perf_counter()
import sluice
from sluice import checkpoint
t0 = time.perf_counter(); checkpoint._eng(); t1 = time.perf_counter()
rep = {}
out = sluice.load(sys.argv[1], device="cuda:0", report=rep); torch.cuda.synchronize(); t2 = time.perf_counter()
n = sum(t.numel() * t.element_size() for t in out.values())
print(json.dumps({"import_s": t0 - ti, "engine_s": t1 - t0, "load_s": t2 - t1, "read_s": rep.get("seconds"), "bytes": n,
                  "gb_s_load": n / (t2 - t1) / 1e9, "gb_s_read": n / rep["seconds"] / 1e9, "path": rep.get("path")}))
"""


def main():
    d = sys.argv[1]
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                while fh.read(64 << 20):
                    pass
    sweep = ({}, {"SLUICE_THREADS": "16"}, {"SLUICE_MAX_TRANSFER_SIZE": "8M"}, {"SLUICE_MAX_TRANSFER_SIZE": "16M"},
             {"SLUICE_THREADS": "8", "SLUICE_MAX_TRANSFER_SIZE": "16M"})
    for env in sweep if sys.argv[2:] == ["all"] else sweep[:1]:
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", CHILD, d], capture_output=True, text=True,
                                 env=dict(os.environ, **env))
            print(json.dumps(env), out.stdout.strip() or out.stderr.strip()[-400:])


if __name__ == "__main__":
    main()
