#!/usr/bin/env python3
"""A small CNN trained on images streamed by sluice's loader into GPU memory.

    python3 examples/train_images.py [--sluice build/sluice] [--epochs 3]

Writes an ImageFolder tree of 10 classes of 32x32 RGB images (raw bytes; each class a noisy colour pattern,
so it can be learnt), packs it with `sluice pack --from-dir`, and trains a small CNN with SGD on batches that
arrive in GPU memory. Prints loss, accuracy, samples/s and sluice's verdict.
"""
import argparse
import os
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn

import sluice


def make_data(d, sluice_bin, per_class=1000):
    rng = np.random.default_rng(0)
    for c in range(10):
        os.makedirs(f"{d}/imgs/{c}", exist_ok=True)
        base = rng.integers(0, 256, size=(3, 32, 32))
        for i in range(per_class):
            img = np.clip(base + rng.normal(0, 60, size=base.shape), 0, 255).astype(np.uint8)
            img.tofile(f"{d}/imgs/{c}/{i:05d}.raw")
    subprocess.run([sluice_bin, "pack", "--from-dir", f"{d}/imgs", "--all-files", "--quiet", f"{d}/ds"], check=True)
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
        ld = sluice.Loader(ds, batch_size=a.batch, device=a.device, fields=["data", "label"], drop_last=True, seed=2)
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
                    data, _ = b["data"]  # every image is 3 KiB, so the bytes are a dense [B, 3, 32, 32]
                    # as_tensor: in place for the GPU's torch tensors and for host numpy arrays alike
                    x = torch.as_tensor(data).view(-1, 3, 32, 32).float().div_(255)
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
        print(f"{seen / (time.perf_counter() - t0):,.0f} samples/s")


if __name__ == "__main__":
    main()
