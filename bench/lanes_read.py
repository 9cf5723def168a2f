"""Child of bench/multi_gpu_bench.py: reads FILE into a tensor on each GPU at once (a Python thread per GPU;
the calls release the GIL) with one engine, whose SLUICE_DEVICE_IDS the parent sets; prints
{"gb_s", "seconds", "ngpus_served"} as JSON, the median of REPS passes, after checking the bytes."""
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import torch

import sluice


def main():
    path, reps = sys.argv[1], int(sys.argv[2])
    size = os.path.getsize(path)
    n = torch.cuda.device_count()
    outs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{d}") for d in range(n)]
    passes = []
    for _ in range(reps + 1):  # the first pass pins the slots: not timed
        ts = [threading.Thread(target=sluice.read, args=(path, o)) for o in outs]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for d in range(n):
            torch.cuda.synchronize(d)
        passes.append(time.perf_counter() - t0)
    step = max(1, size // 4096)
    want = torch.from_numpy(np.array(np.memmap(path, np.uint8, mode="r")[::step]))
    if not all(torch.equal(o[::step].cpu(), want) for o in outs):
        sys.exit("the bytes read differ from the file")
    secs = statistics.median(passes[1:])
    import subprocess
    served = json.loads(subprocess.run([os.environ.get("SLUICE_BIN", "build/sluice"), "info", "--json"],
                                       capture_output=True, text=True).stdout)["ngpus"]
    print(json.dumps({"gb_s": n * size / secs / 1e9, "seconds": secs, "passes": passes[1:], "ngpus_served": served}))


if __name__ == "__main__":
    main()
