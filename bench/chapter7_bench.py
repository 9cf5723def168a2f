#!/usr/bin/env python3
"""The Data Journey report's chapter 7 loop, with sluice's loader beside torch's ImageFolder DataLoader and,
where their packages are installed, MosaicML Streaming, LitData and WebDataset.

    python3 bench/chapter7_bench.py --sluice build/sluice [--images 10000] [--steps 100] [--workers 4]

Data: --images synthetic 224x224 JPEGs (random noise, quality 80) in ImageFolder layout, and the same JPEG
bytes, unchanged, in each loader's own format: a sluice dataset (`sluice pack --from-dir`), MDS shards
(streaming.MDSWriter), LitData chunks (litdata.optimize), WebDataset tars (key.jpg + key.cls). Loop:
ResNet-50, batch 64, forward, backward, SGD step; per step the time spent waiting for data is measured (the
report's "DataLoader wait"), after 10 warm-up steps, with the page cache dropped after the warm-up (cold
storage, warm CUDA).
  - ImageFolder, Streaming, LitData, WebDataset: PIL decode + resize 224 + normalize in DataLoader workers
    (ImageFolder also with num_workers 0), shuffled, pin_memory=True, then .to(cuda, non_blocking=True), as
    the report;
  - sluice: the loader puts each batch's JPEG bytes in host memory (nvJPEG reads from there), and a thread
    decodes them on the GPU (torchvision.io.decode_jpeg, then the same normalize) on its own CUDA stream,
    up to two batches ahead of the step (as DALI's pipeline does); the step waits on the batch's event. A
    decode not finished when the step asks for its batch counts as data wait.
Reports data wait as % of the step and images/s for each; JSON to --out. Without a GPU (a smoke test) all of
it runs on the CPU.
"""
import argparse
import glob
import io
import os
import statistics
import subprocess
import tarfile
import time

import numpy as np
import torch
import torchvision
from torchvision import transforms

import sluice
from benchlib import Results, drop_caches, side_by_side

B, SIZE = 64, 224
DEV = "cuda" if torch.cuda.is_available() else "cpu"
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def make_data(root, n, sluice_bin):
    from PIL import Image
    imgs, ds = f"{root}/imgs-{n}", f"{root}/sluice-{n}"
    if not os.path.exists(ds):
        os.makedirs(f"{imgs}/class_0", exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(
                f"{imgs}/class_0/img_{i:06d}.jpg", quality=80)
        subprocess.run([sluice_bin, "pack", "--from-dir", imgs, "--quiet", ds], check=True)
    return imgs, ds


def image_list(imgs):
    """(path, label) of every image, labels numbered as ImageFolder numbers its classes."""
    classes = sorted(os.listdir(imgs))
    return [(f"{imgs}/{c}/{f}", k) for k, c in enumerate(classes) for f in sorted(os.listdir(f"{imgs}/{c}"))]


def cpu_transform():
    return transforms.Compose([transforms.Resize(SIZE), transforms.ToTensor(),
                               transforms.Normalize(MEAN.flatten().tolist(), STD.flatten().tolist())])


def decode(jpeg, tf):
    from PIL import Image
    return tf(Image.open(io.BytesIO(jpeg)).convert("RGB"))


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
        sync()
        t1 = time.perf_counter()
        loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        if step >= 10:
            waits.append(t1 - t0)
            totals.append(time.perf_counter() - t0)
    return statistics.mean(waits), statistics.mean(totals)


def forever(dl):
    """Batches of a DataLoader moved to the device, epoch after epoch."""
    while True:
        for x, y in dl:
            yield x.to(DEV, non_blocking=True), torch.as_tensor(y).to(DEV, non_blocking=True)


def torch_loader(ds, workers, shuffle=True):
    return torch.utils.data.DataLoader(ds, batch_size=B, shuffle=shuffle, num_workers=workers,
                                       pin_memory=DEV == "cuda", persistent_workers=workers > 0, drop_last=True)


def imagefolder_batches(root, imgs, workers):
    return forever(torch_loader(torchvision.datasets.ImageFolder(imgs, transform=cpu_transform()), workers))


# The peers' datasets decode in DataLoader workers, which may be spawned: their classes live at module level.
class Decoded:
    """Mixin for a peer's dataset of {"jpeg", "label"} samples: (decoded image tensor, label)."""
    tf = None

    def __getitem__(self, i):
        s = super().__getitem__(i)
        self.tf = self.tf or cpu_transform()
        return decode(bytes(memoryview(s["jpeg"])), self.tf), s["label"]


try:
    import streaming

    class StreamingImages(Decoded, streaming.StreamingDataset):
        pass
except ImportError as e:
    streaming = StreamingImages = e
try:
    import litdata

    class LitImages(Decoded, litdata.StreamingDataset):
        pass
except ImportError as e:
    litdata = LitImages = e


def need(mod):
    if isinstance(mod, ImportError):
        raise mod
    return mod


def streaming_batches(root, imgs, workers):
    need(streaming)
    try:  # shared memory a killed earlier run left behind would stop the dataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
    except ImportError:
        pass
    out = f"{imgs}.mds"
    if not os.path.exists(f"{out}/index.json"):
        with streaming.MDSWriter(out=out, columns={"jpeg": "bytes", "label": "int"}, size_limit=1 << 26) as w:
            for path, label in image_list(imgs):
                with open(path, "rb") as f:
                    w.write({"jpeg": f.read(), "label": label})
    return forever(torch_loader(StreamingImages(local=out, shuffle=True, batch_size=B), workers, shuffle=False))


def _lit_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpeg": np.frombuffer(f.read(), np.uint8), "label": label}


def litdata_batches(root, imgs, workers):
    need(litdata)
    out = os.path.abspath(f"{imgs}.litdata")
    if not os.path.exists(f"{out}/index.json"):
        litdata.optimize(fn=_lit_item, inputs=image_list(imgs), output_dir=out, chunk_bytes="64MB", num_workers=4)
    ds = LitImages(out, shuffle=True, drop_last=True)
    return forever(litdata.StreamingDataLoader(ds, batch_size=B, num_workers=workers, pin_memory=DEV == "cuda",
                                               drop_last=True))


def webdataset_batches(root, imgs, workers):
    import webdataset as wds
    out = f"{imgs}.wds"
    if not os.path.exists(out):
        os.makedirs(f"{out}.tmp", exist_ok=True)
        items = image_list(imgs)
        for k in range(0, len(items), 1000):
            with tarfile.open(f"{out}.tmp/shard-{k // 1000:04d}.tar", "w") as t:
                for i, (path, label) in enumerate(items[k:k + 1000]):
                    t.add(path, arcname=f"{k + i:08d}.jpg")
                    cls = str(label).encode()
                    info = tarfile.TarInfo(f"{k + i:08d}.cls")
                    info.size = len(cls)
                    t.addfile(info, io.BytesIO(cls))
        os.rename(f"{out}.tmp", out)
    urls = sorted(glob.glob(f"{out}/shard-*.tar"))
    tf = cpu_transform()
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
          .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(tf, int))
    return forever(torch_loader(ds, workers, shuffle=False))


def sluice_batches(root, ds_path, workers):
    # nvJPEG reads the compressed bytes from host memory: the loader delivers them there (its reads and CRC
    # checks stay off this thread). A thread decodes each batch on the GPU (decode_jpeg) on a stream of its
    # own, a batch or two ahead of the step, as DALI's pipeline does; the step's stream waits on an event.
    import queue
    import threading
    ld = sluice.Loader(sluice.Dataset(ds_path), batch_size=B, device="cpu", fields=["data", "label"],
                       drop_last=True, seed=0)
    mean, std = MEAN.to(DEV), STD.to(DEV)
    ready, stop = queue.Queue(maxsize=2), threading.Event()

    def decode_ahead():
        side = torch.cuda.Stream() if DEV == "cuda" else None
        epoch = 0
        try:
            while not stop.is_set():
                for b in ld:
                    data, offs = b["data"]
                    t = torch.from_numpy(data)
                    jpegs = [t[offs[k]:offs[k + 1]] for k in range(len(offs) - 1)]
                    y = torch.from_numpy(b["label"].astype(np.int64))
                    with torch.cuda.stream(side) if side else torch.autograd.no_grad():
                        x = torch.stack(torchvision.io.decode_jpeg(jpegs, device=DEV)).float().div_(255)
                        x = (x - mean) / std
                        y = y.to(DEV)
                        ev = None
                        if side:
                            ev = torch.cuda.Event()
                            ev.record(side)
                    ready.put((x, y, ev))
                    if stop.is_set():
                        return
                epoch += 1
                ld.set_epoch(epoch)
        except BaseException as e:  # the step's thread raises it
            ready.put(e)

    th = threading.Thread(target=decode_ahead, daemon=True)
    th.start()
    try:
        while True:
            item = ready.get()
            if isinstance(item, BaseException):
                raise item
            x, y, ev = item
            if ev is not None:
                cur = torch.cuda.current_stream()
                cur.wait_event(ev)
                x.record_stream(cur)
                y.record_stream(cur)
            yield x, y
    finally:
        stop.set()


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
    imgs, ds = make_data(a.dir, a.images, a.sluice)
    torch.backends.cudnn.benchmark = True
    res = Results(a.out, images=a.images, batch=B, model=a.model, workers=a.workers)
    w = a.workers
    runs = (("imagefolder_w0", lambda: imagefolder_batches(a.dir, imgs, 0)),
            (f"imagefolder_w{w}", lambda: imagefolder_batches(a.dir, imgs, w)),
            (f"streaming_w{w}", lambda: streaming_batches(a.dir, imgs, w)),
            (f"litdata_w{w}", lambda: litdata_batches(a.dir, imgs, w)),
            (f"webdataset_w{w}", lambda: webdataset_batches(a.dir, imgs, w)),
            ("sluice", lambda: sluice_batches(a.dir, ds, w)))
    only = set(filter(None, a.only.split(",")))

    def loop(name, batches):
        model = getattr(torchvision.models, a.model)().to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        wait, total = run(batches(), model, opt, a.steps)
        r = {"data_wait_ms": 1e3 * wait, "step_ms": 1e3 * total, "data_wait_pct": 100 * wait / total,
             "images_per_s": B / total}
        print(f"{name}: data wait {1e3 * wait:.2f} ms ({100 * wait / total:.1f}%), step {1e3 * total:.1f} ms, "
              f"{B / total:.0f} img/s", flush=True)
        return r

    # A peer whose package is not installed is reported with its error.
    got = side_by_side({name: (lambda name=name, b=b: loop(name, b)) for name, b in runs
                        if not only or name in only or name.rsplit("_w", 1)[0] in only}, a.reps,
                       key="data_wait_pct")
    for name, r in got.items():
        res[name] = r
        if "error" in r:
            print(f"{name}: not run ({r['error']})", flush=True)

if __name__ == "__main__":
    main()
