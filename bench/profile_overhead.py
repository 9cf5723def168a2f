"""What sluice.profile costs a training loop (issue #39: under 2% of step time): the same loop over the same
batches with and without it, passes interleaved, medians.  The loop: ResNet-18's training step (bf16 autocast,
channels_last, batch 256) on batches a DataLoader with 4 workers makes (random tensors), or without a GPU a
20 ms CPU step over a generator.

    python3 bench/profile_overhead.py --reps 5 --steps 60 --out overhead.json
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results  # noqa: E402

import sluice  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    res = Results(a.out, bench="profile_overhead", reps=a.reps, steps=a.steps)
    try:
        import torch
        import torchvision
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        model = torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        class Random(torch.utils.data.Dataset):
            def __len__(self):
                return 1 << 20

            def __getitem__(self, i):
                return torch.zeros(3, 224, 224, dtype=torch.bfloat16), i % 100

        dl = torch.utils.data.DataLoader(Random(), batch_size=256, num_workers=4, pin_memory=True,
                                         persistent_workers=True, prefetch_factor=4)

        def batches():
            return iter(dl)

        def step(b):
            x = b[0].cuda(non_blocking=True).to(memory_format=torch.channels_last)
            y = b[1].cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        def sync():
            torch.cuda.synchronize()
    else:
        def batches():
            return iter(range(1 << 30))

        def step(b):
            t = time.thread_time()
            while time.thread_time() - t < 0.02:
                pass

        def sync():
            pass

    def run(profiled):
        it = batches()
        src = sluice.profile(it, file=None) if profiled else it
        n, t0 = 0, None
        for b in src:
            step(b)
            n += 1
            if n == 5:
                sync()
                t0 = time.perf_counter()
            if n == 5 + a.steps:
                break
        sync()
        ms = (time.perf_counter() - t0) / a.steps * 1e3
        if profiled:
            src.close() if hasattr(src, "close") else None
        return ms

    got = {"plain": [], "profiled": []}
    run(False)  # warm-up: workers, cuDNN's choices
    for _ in range(a.reps):
        for k in got:
            got[k].append(run(k == "profiled"))
    med = {k: statistics.median(v) for k, v in got.items()}
    res.update(gpu=gpu, step_ms=med, passes=got, overhead=med["profiled"] / med["plain"] - 1)
    print(f"step {med['plain']:.2f} ms plain, {med['profiled']:.2f} ms under sluice.profile: overhead "
          f"{100 * res['overhead']:+.2f}% ({'ResNet-18 on the GPU' if gpu else 'a CPU step'}); passes {got}", flush=True)
    res.save()


if __name__ == "__main__":
    main()
