"""Issue 55: a fresh process's first and second sluice.load(dir, device="cuda"), nothing of sluice's wrapped;
argv: DIR, then "set_device" to call torch.cuda.set_device(0) first (as bench/ckpt_bench.py's children do)."""
import json
import sys
import time

import torch

if "set_device" in sys.argv[2:]:
    torch.cuda.set_device(0)
torch.empty(1, device="cuda")
torch.cuda.synchronize()
import sluice  # noqa: E402

out = {}
for k in range(2):
    t0 = time.perf_counter()
    got = sluice.load(sys.argv[1], device="cuda")
    torch.cuda.synchronize()
    out[f"load{k}_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    del got
print(json.dumps(out))
