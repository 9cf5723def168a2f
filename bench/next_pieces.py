"""Where a Python next() of sluice.Loader(device="cuda") spends its time: python_bench.py's loop (a 2 ms busy
step between batches, the ring full) with the C call, the batch's hold and its views timed one by one (medians).

    python3 bench/next_pieces.py build/sluice
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time

import sluice
from sluice import loader as L
d = tempfile.mkdtemp(dir="/var/tmp")
with open(f"{d}/in.jsonl", "w") as f:
    for i in range(20000):
        f.write(json.dumps({"x": [i] * 64, "n": i}) + "\n")
subprocess.run([sys.argv[1], "pack", "--from-jsonl", f"{d}/in.jsonl", "--fields", "x,n", "--quiet", f"{d}/ds"], check=True)
acc = {}
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter_ns()
        r = fn(*a, **k)
        acc.setdefault(name, []).append(time.perf_counter_ns() - t)
        return r
    return w
L.Loader._array = timed("_array", L.Loader._array)
L.Loader._convert = timed("_convert", L.Loader._convert)
L._Hold.__init__ = timed("_Hold", L._Hold.__init__)
lib_next = L.lib.sluice_loader_next
class LibProxy:
    def __getattr__(self, k):
        return getattr(sluice._lib.lib, k)
    def sluice_loader_next(self, *a):
        t = time.perf_counter_ns(); r = lib_next(*a); acc.setdefault("C next", []).append(time.perf_counter_ns() - t); return r
L.lib = LibProxy()
ld = sluice.Loader(f"{d}/ds", shuffle=True, batch_size=64, device="cuda", prefetch=8)
for rep in range(2):
    acc.clear()
    it = iter(ld); next(it); ts = []
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        t0 = time.perf_counter_ns()
        try:
            next(it)
        except StopIteration:
            break
        ts.append(time.perf_counter_ns() - t0)
    print("next p50 %.1f us" % (statistics.median(ts) / 1e3), {k: round(statistics.median(v) / 1e3, 1) for k, v in acc.items()},
          "_array per batch %.1f" % (sum(acc["_array"]) / len(acc["_convert"]) / 1e3), flush=True)
import gc
gc.disable()
acc.clear()
it = iter(ld); next(it); ts = []
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.002:
        pass
    t0 = time.perf_counter_ns()
    try:
        next(it)
    except StopIteration:
        break
    ts.append(time.perf_counter_ns() - t0)
print("gc off: next p50 %.1f us" % (statistics.median(ts) / 1e3), {k: round(statistics.median(v) / 1e3, 1) for k, v in acc.items()})
