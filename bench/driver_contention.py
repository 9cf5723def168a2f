"""Why a model's step runs slower beside GPU image decoding (issue #38): ResNet-18 (bf16 autocast, channels_last,
SGD, batch 256) trains on one constant batch, alone and beside one other thing at a time:
  sluice       an image loader (sluice.Images on the GPU) whose batches are taken each step and not used, so
               the model's work is the same and only the loader's runs beside it
  cpu, memcpy  N threads spinning on the CPU, or copying 64 MiB again and again (memory bandwidth)
  cuda         N threads making cheap CUDA calls (a 4 KiB device copy, an event recorded and queried) in the
               model's context, or in a context of their own (cuda_own_context)
Each figure is the model's median time a step over REPS passes of STEPS steps.  Data: bench/e2e_images.py's
(made there first).

    python3 bench/driver_contention.py --data /var/tmp/sluice-e2e/ds --out contention.json
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LOADS = {"cpu": 0, "memcpy": 1, "cuda": 2, "cuda_own_context": 3}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/var/tmp/sluice-e2e/ds", help="a packed image dataset (bench/e2e_images.py)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    import torch
    import torchvision

    import sluice
    so = os.path.join(tempfile.mkdtemp(), "driver_contention.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(HERE, "driver_contention.c"), "-ldl",
                    "-lpthread"], check=True)
    load = ctypes.CDLL(so)
    load.contention_stop.restype = ctypes.c_long
    res = Results(a.out, bench="driver_contention", steps=a.steps, reps=a.reps, torch=torch.__version__)
    model = torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.zeros(256, dtype=torch.long, device="cuda")
    images = sluice.Images("data", size=224, flip=0.5, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                           dtype="bf16", channels_last=True)

    def step_ms(batches=None):
        """The model's ms a step; each step takes a batch of batches first (not used) where given."""
        def one():
            if batches is not None:
                next(batches)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for _ in range(3):
            one()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            one()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / a.steps * 1e3

    def loader_batches():
        ds = sluice.Dataset(a.data)
        ld = sluice.Loader(ds, shuffle=True, batch_size=256, device="cuda", images=images, fields=["data", "label"], drop_last=True)
        for e in range(1 << 30):
            ld.set_epoch(e)
            yield from ld

    def beside(kind, n):
        if load.contention_start(LOADS[kind], n):
            raise RuntimeError(f"{kind}: CUDA or a context of its own failed")
        t0 = time.perf_counter()
        try:
            ms = step_ms()
        finally:
            ops = load.contention_stop()
        return ms, ops / (time.perf_counter() - t0)

    got = {}
    for _ in range(a.reps):
        got.setdefault("alone", []).append(step_ms())
        batches = loader_batches()
        got.setdefault("sluice", []).append(step_ms(batches))
        batches.close()
        for kind in LOADS:
            for n in map(int, a.threads.split(",")):
                ms, rate = beside(kind, n)
                got.setdefault(f"{kind}x{n}", []).append(ms)
                res[f"{kind}x{n}_ops_s"] = rate
    for k, v in got.items():
        res[k] = {"step_ms": statistics.median(v), "passes": v}
        print(f"{k}: {statistics.median(v):.1f} ms a step {[round(p, 1) for p in v]}", flush=True)
    res.save()


if __name__ == "__main__":
    main()
