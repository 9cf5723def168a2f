#!/usr/bin/env python3
"""The Data Journey report's chapter 7 loop, with sluice's loader beside torch's ImageFolder DataLoader.

    python3 bench/chapter7_bench.py --sluice build/sluice [--images 10000] [--steps 100]

Data: --images synthetic 224x224 JPEGs (random noise, quality 80) in ImageFolder layout, and the same files
packed by `sluice pack --from-dir` (the JPEG bytes, unchanged). Loop: ResNet-50, batch 64, forward, backward,
SGD step; per step the time spent waiting for data is measured (the report's "DataLoader wait"), after 10
warm-up steps, with the page cache dropped after the warm-up (cold storage, warm CUDA).
  - ImageFolder: PIL decode + resize 224 + normalize in DataLoader workers (num_workers 0 and --workers),
    pin_memory=True, then .to(cuda, non_blocking=True), as the report;
  - sluice: the loader puts each batch's JPEG bytes in host memory (nvJPEG reads from there),
    torchvision.io.decode_jpeg decodes them on the GPU, then the same normalize.
Reports data wait as % of the step and images/s for each; JSON to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np
import torch
import torchvision
from torchvision import transforms

import sluice

B, SIZE = 64, 224
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def make_data(root, n, sluice_bin):
    from PIL import Image
    imgs, ds = f"{root}/imgs", f"{root}/sluice"
    if not os.path.exists(ds):
        os.makedirs(f"{imgs}/class_0", exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(
                f"{imgs}/class_0/img_{i:06d}.jpg", quality=80)
        subprocess.run([sluice_bin, "pack", "--from-dir", imgs, "--quiet", ds], check=True)
    return imgs, ds


def run(batches, model, opt, steps):
    """Runs the loop; returns (mean data wait, mean step) in seconds over the steps after warm-up."""
    crit = torch.nn.CrossEntropyLoss()
    waits, totals = [], []
    it = iter(batches)
    for step in range(steps + 10):
        if step == 10:
            drop_caches()
        t0 = time.perf_counter()
        x, y = next(it)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= 10:
            waits.append(t1 - t0)
            totals.append(time.perf_counter() - t0)
    return statistics.mean(waits), statistics.mean(totals)


def imagefolder_batches(imgs, workers):
    tf = transforms.Compose([transforms.Resize(SIZE), transforms.ToTensor(),
                             transforms.Normalize(MEAN.flatten().tolist(), STD.flatten().tolist())])
    ds = torchvision.datasets.ImageFolder(imgs, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True, num_workers=workers, pin_memory=True,
                                     persistent_workers=workers > 0, drop_last=True)
    while True:
        for x, y in dl:
            yield x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)


def sluice_batches(ds_path):
    # nvJPEG reads the compressed bytes from host memory: the loader delivers them there (its reads and CRC
    # checks stay off this thread), decode_jpeg decodes on the GPU.
    ld = sluice.Loader(sluice.Dataset(ds_path), batch_size=B, device="cpu", fields=["data", "label"],
                       drop_last=True, seed=0)
    mean, std = MEAN.cuda(), STD.cuda()
    epoch = 0
    while True:
        for b in ld:
            data, offs = b["data"]
            t = torch.from_numpy(data)
            jpegs = [t[offs[k]:offs[k + 1]] for k in range(len(offs) - 1)]
            x = torch.stack(torchvision.io.decode_jpeg(jpegs, device="cuda")).float().div_(255)
            yield (x - mean) / std, torch.from_numpy(b["label"].astype(np.int64)).to("cuda", non_blocking=True)
        epoch += 1
        ld.set_epoch(epoch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--dir", default="/var/tmp/sluice-ch7")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/chapter7_bench.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    imgs, ds = make_data(a.dir, a.images, a.sluice)
    torch.backends.cudnn.benchmark = True
    res = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0), "images": a.images, "batch": B}
    for name, batches in (("imagefolder_w0", lambda: imagefolder_batches(imgs, 0)),
                          (f"imagefolder_w{a.workers}", lambda: imagefolder_batches(imgs, a.workers)),
                          ("sluice", lambda: sluice_batches(ds))):
        model = torchvision.models.resnet50().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        wait, total = run(batches(), model, opt, a.steps)
        res[name] = {"data_wait_ms": 1e3 * wait, "step_ms": 1e3 * total, "data_wait_pct": 100 * wait / total,
                     "images_per_s": B / total}
        print(f"{name}: data wait {1e3 * wait:.2f} ms ({100 * wait / total:.1f}%), step {1e3 * total:.1f} ms, "
              f"{B / total:.0f} img/s", flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
