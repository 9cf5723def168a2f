"""A model ready on the GPU straight from its checkpoint (issue #40, item 2): transformers' own
from_pretrained(device_map="cuda") and sluice.from_pretrained side by side, on a Llama model the benchmark
makes (transformers' LlamaForCausalLM with Llama-3-8B's widths, --layers of its 32, random weights, saved by
save_pretrained in 5 GB shards).  Each pass is a fresh process that imports torch, transformers and the loader
(the model's module too) and starts CUDA first, then times the call until the model's weights are on the GPU (torch.cuda.synchronize():
"ready"), and then its first forward on 16 tokens.  Every pass's logits are hashed: a loader whose model gives
other logits than transformers' is reported as such.  Passes interleaved, cold (page cache dropped) and warm.

    python3 bench/model_bench.py --layers 8 --modes cold,warm --reps 3
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import GB, Results, child_json, drop_caches, side_by_side, warm  # noqa: E402

LOADERS = {
    "transformers": """
model = transformers.AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.bfloat16, device_map="cuda")
""",
    "sluice": """
model = sluice.from_pretrained(DIR, device="cuda", dtype=torch.bfloat16)
""",
}

CHILD = """
import hashlib, json, sys, time
import torch, transformers
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # the model's code imported, as a script does first
import sluice
DIR = sys.argv[1]
torch.cuda.set_device(0)
torch.empty(1, device="cuda")
ids = (torch.arange(16, device="cuda") * 7919 %% 1000).reshape(1, 16)
torch.cuda.synchronize()
t0 = time.perf_counter()
%s
torch.cuda.synchronize()
ready = time.perf_counter() - t0
with torch.no_grad():
    logits = model(ids).logits
torch.cuda.synchronize()
first = time.perf_counter() - t0
n = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"seconds": ready, "first_forward_s": first, "bytes": n,
                  "on_gpu": all(p.is_cuda for p in model.parameters()),
                  "logits": hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()}))
"""

MAKE = """
import sys, torch, transformers
cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=int(sys.argv[2]),
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                               tie_word_embeddings=False, dtype="bfloat16")
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(cfg)
model.save_pretrained(sys.argv[1], max_shard_size="5GB")
"""


def one_pass(d, loader):
    got = child_json(CHILD % LOADERS[loader], d)
    if not got["on_gpu"]:
        raise RuntimeError("parameters not on the GPU")
    got["gb_s"] = got["bytes"] / got["seconds"] / GB
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/sluice-model")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="model_bench.json")
    a = ap.parse_args()
    d = os.path.join(a.dir, f"llama8b-{a.layers}")
    if not os.path.exists(os.path.join(d, "config.json")):
        subprocess.run([sys.executable, "-c", MAKE, d, str(a.layers)], check=True)
    size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".safetensors"))
    res = Results(a.out, layers=a.layers, bytes=size, reps=a.reps)
    for mode in a.modes.split(","):
        got = side_by_side({n: (lambda n=n: one_pass(d, n)) for n in LOADERS}, a.reps, key="seconds",
                           before=drop_caches if mode == "cold" else (lambda: warm(d)))
        hashes = {n: r.get("logits") for n, r in got.items() if "error" not in r}
        same = len(set(hashes.values())) <= 1
        res[mode] = dict(got, same_logits=same)
        base = got.get("transformers", {}).get("seconds")
        for name, r in got.items():
            if "error" in r:
                print(f"[model] {mode:4s} {name:14s} error: {r['error'][:160]}", flush=True)
                continue
            print(f"[model] {mode:4s} {name:14s} ready {r['seconds']:6.3f} s ({min(r['passes']):.3f}-"
                  f"{max(r['passes']):.3f}; {r['gb_s']:5.2f} GB/s), first forward done {r['first_forward_s']:6.3f} s"
                  + (f"; {r['seconds'] / base:.2f}x transformers' time" if base else ""), flush=True)
        print(f"[model] {mode:4s} logits {'the same' if same else 'DIFFER'}: {hashes}", flush=True)


if __name__ == "__main__":
    main()
