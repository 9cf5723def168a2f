#!/usr/bin/env python3
"""A small CNN trained on JPEGs that sluice's loader decodes and augments on the GPU.

    pip install "sluice[images,torch]"
    python3 examples/train_images.py [--sluice build/sluice] [--epochs 3] [--device cpu]

Writes an ImageFolder tree of 10 classes of 64x48 JPEGs (each class a noisy colour pattern, so it can be learnt),
packs it with `sluice pack --from-dir`, and trains a small CNN with SGD. sluice.Images does what torchvision's
RandomResizedCrop(32) + RandomHorizontalFlip + ToDtype + Normalize would: nvJPEG decodes each batch and one kernel
crops, resizes, flips and normalises it, so the batch arrives as a [B, 3, 32, 32] float tensor on the GPU with no
worker processes (on a machine without one, the CPU's threads do the same). Prints loss, accuracy, images/s, which
decoder did the work and sluice's verdict.
"""
import argparse
import os
import subprocess
import tempfile
import time

import numpy as np

# Before CUDA starts: nvJPEG's streams then get hardware queues of their own, apart from the model's
# (docs/guides/images.md). A value already set in the environment is kept.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from PIL import Image  # noqa: E402

import sluice  # noqa: E402


def make_data(d, sluice_bin, per_class=500):
    rng = np.random.default_rng(0)
    for c in range(10):
        os.makedirs(f"{d}/imgs/{c}", exist_ok=True)
        base = rng.integers(0, 256, size=(48, 64, 3))
        for i in range(per_class):
            img = np.clip(base + rng.normal(0, 40, size=base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(f"{d}/imgs/{c}/{i:05d}.jpg", quality=90)
    subprocess.run([sluice_bin, "pack", "--from-dir", f"{d}/imgs", "--quiet", f"{d}/ds"], check=True)
    return f"{d}/ds"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as d:
        ds = sluice.Dataset(make_data(d, a.sluice))
        images = sluice.Images("data", size=32, scale=(0.5, 1.0), flip=0.5, mean=sluice.IMAGENET_MEAN,
                               std=sluice.IMAGENET_STD, dtype="f32")
        ld = sluice.Loader(ds, shuffle=True, batch_size=a.batch, device=a.device, fields=["data", "label"], drop_last=True, seed=2,
                           images=images)
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(64 * 8 * 8, 10)).to(a.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        seen, t0 = 0, time.perf_counter()
        with sluice.profile(ld):
            for epoch in range(a.epochs):
                ld.set_epoch(epoch)
                correct = total = 0
                for b in ld:
                    x = torch.as_tensor(b["data"])  # [B, 3, 32, 32] float32, decoded, cropped, flipped, normalised
                    y = torch.as_tensor(b["label"]).long()
                    out = model(x)
                    loss = nn.functional.cross_entropy(out, y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    correct += int((out.argmax(1) == y).sum())
                    total += y.numel()
                seen += total
                print(f"epoch {epoch}: loss {loss.item():.3f}, accuracy {correct / total:.3f}", flush=True)
        if a.device != "cpu":
            torch.cuda.synchronize()
        st = ld.stats()
        print(f"{seen / (time.perf_counter() - t0):,.0f} images/s; decoded by nvJPEG {st['images_gpu']}, "
              f"by the CPU {st['images_cpu']}")


if __name__ == "__main__":
    main()
