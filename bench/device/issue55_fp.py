"""Issue 55: where a fresh process's sluice.from_pretrained goes on the GPU machine, under cProfile (the model
of bench/model_bench.py, warm), then the same checkpoint's sluice.load in the same process for its read's speed.
argv: the model's directory."""
import cProfile
import io
import pstats
import sys
import time

import torch
import transformers  # noqa: F401
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401  (the model's code, as a script)

import sluice

torch.cuda.set_device(0)
torch.empty(1, device="cuda")
torch.cuda.synchronize()
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
model = sluice.from_pretrained(sys.argv[1], device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
prof.disable()
t = time.perf_counter() - t0
n = sum(p.numel() * p.element_size() for p in model.parameters())
print(f"from_pretrained {t * 1e3:.1f} ms ({n / t / 1e9:.2f} GB/s)")
del model
t0 = time.perf_counter()
got = sluice.load(sys.argv[1], device="cuda")
torch.cuda.synchronize()
t = time.perf_counter() - t0
print(f"then sluice.load {t * 1e3:.1f} ms ({sum(v.numel() * v.element_size() for v in got.values()) / t / 1e9:.2f} GB/s)")
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(35)
print(s.getvalue())
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
print(s.getvalue())
