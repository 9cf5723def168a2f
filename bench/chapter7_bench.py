#!/usr/bin/env python3
"""The Data Journey report's chapter 7 loop, with sluice's loader beside torch's ImageFolder DataLoader and,
where their packages are installed, MosaicML Streaming, LitData and WebDataset.

    python3 bench/chapter7_bench.py --sluice build/sluice [--images 10000] [--steps 100] [--workers 4]

Data: --images synthetic 224x224 JPEGs (random noise, quality 80) in ImageFolder layout, and the same JPEG
bytes, unchanged, in each loader's own format (tools/journey/peers.py says how). Loop (peers.train): ResNet-50,
batch 64, forward, backward, SGD step; per step the time spent waiting for data is measured (the report's
"DataLoader wait"), after 10 warm-up steps, with the page cache dropped after the warm-up (cold storage,
warm CUDA).
  - ImageFolder, Streaming, LitData, WebDataset: PIL decode + resize 224 + normalize in DataLoader workers
    (ImageFolder also with num_workers 0), shuffled, pin_memory=True, then .to(cuda, non_blocking=True), as
    the report;
  - sluice: the loader puts each batch's JPEG bytes in host memory and a thread decodes them on the GPU
    (nvJPEG) up to two batches ahead of the step; a decode not finished in time counts as data wait.
Reports data wait as % of the step and images/s for each; JSON to --out. Without a GPU (a smoke test) all of
it runs on the CPU.
"""
import argparse
import os
import sys

import torch
import torchvision

from benchlib import Results, drop_caches, side_by_side

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "journey"))
import peers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--dir", default="/var/tmp/sluice-ch7")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--only", default="", help="comma list of: imagefolder_w0,imagefolder,streaming,litdata,"
                                                "webdataset,sluice (default: all)")
    ap.add_argument("--reps", type=int, default=1, help="passes of each loader, interleaved; medians")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/chapter7_bench.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    imgs, ds = peers.make_images(a.dir, a.images)
    torch.backends.cudnn.benchmark = True
    res = Results(a.out, images=a.images, batch=peers.B, model=a.model, workers=a.workers)
    w = a.workers
    runs = [("imagefolder_w0", "imagefolder", 0)] + [(f"{k}_w{w}", k, w) for k in peers.IMAGE_LOADERS[:-1]]
    runs.append(("sluice", "sluice", 0))
    only = set(filter(None, a.only.split(",")))

    def loop(name, kind, workers):
        model = getattr(torchvision.models, a.model)().to(peers.DEV)
        r = peers.train(peers.image_batches(kind, imgs, ds, workers), model, a.steps, at_warm=drop_caches)
        print(f"{name}: data wait {r['data_wait_ms']:.2f} ms ({r['data_wait_pct']:.1f}%), step {r['step_ms']:.1f} ms, "
              f"{r['images_per_s']:.0f} img/s", flush=True)
        return r

    # A peer whose package is not installed is reported with its error.
    got = side_by_side({name: (lambda r=r: loop(*r)) for r in runs for name in [r[0]]
                        if not only or name in only or r[1] in only}, a.reps, key="data_wait_pct")
    for name, r in got.items():
        res[name] = r
        if "error" in r:
            print(f"{name}: not run ({r['error']})", flush=True)


if __name__ == "__main__":
    main()
