"""The peers' formats and loaders beside sluice's, and The Data Journey's training loop that measures them
(the Data Journey report's section 7). `sluice journey` and bench/chapter7_bench.py both use it.

Samples are (bytes, label) pairs kept unchanged in each loader's own format: a file per sample in ImageFolder
layout, a sluice dataset (`sluice pack --from-dir`), MDS shards (streaming.MDSWriter), LitData chunks
(litdata.optimize), WebDataset tars (key.EXT + key.cls). Each peer is a torch DataLoader over its dataset,
shuffled, pin_memory=True, turning a sample's bytes into a tensor with `fn` in its workers; sluice's loader
puts a batch's bytes in host memory and, for JPEGs, a thread decodes them on the GPU (nvJPEG) ahead of the
step. Needs torch (and torchvision for images); a peer whose package is missing raises ImportError.
"""
import glob
import io
import os
import statistics
import tarfile
import time

import numpy as np
import torch

import sluice

B, SIZE = 64, 224
DEV = "cuda" if torch.cuda.is_available() else "cpu"
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
PHASES = ("DATALOADER_WAIT", "H2D_TRANSFER", "FORWARD", "BACKWARD", "OPTIMIZER")


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def make_images(root, n):
    """n synthetic 224x224 JPEGs (random noise, quality 80: the report's) in ImageFolder layout, and the same
    bytes packed as a sluice dataset; made once, then reused. Returns (image folder, sluice dataset)."""
    from PIL import Image
    imgs, ds = f"{root}/imgs-{n}", f"{root}/sluice-{n}"
    if not os.path.exists(f"{ds}/index.sli"):
        rng = np.random.default_rng(0)
        os.makedirs(f"{imgs}/class_0", exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).save(
                f"{imgs}/class_0/img_{i:06d}.jpg", quality=80)
        sluice.pack(ds, dir=imgs)
    return imgs, ds


def sample_list(folder):
    """(path, label) of every file of an ImageFolder layout, labels numbered as ImageFolder numbers them."""
    classes = sorted(os.listdir(folder))
    return [(f"{folder}/{c}/{f}", k) for k, c in enumerate(classes) for f in sorted(os.listdir(f"{folder}/{c}"))]


_tf = None


def decode_image(jpeg):
    """A JPEG's bytes -> the report's light transform (resize, normalize) as a 3x224x224 float tensor."""
    global _tf
    from PIL import Image
    if _tf is None:
        from torchvision import transforms
        _tf = transforms.Compose([transforms.Resize(SIZE), transforms.ToTensor(),
                                  transforms.Normalize(MEAN.flatten().tolist(), STD.flatten().tolist())])
    return _tf(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def nbytes(b):
    """A sample's bytes -> its length: raw I/O with no decoding (the Data Journey report's section 3)."""
    return torch.tensor(len(b))


class Files(torch.utils.data.Dataset):
    """A file per sample (ImageFolder's access pattern: open, read, close), through fn."""

    def __init__(self, folder, fn):
        self.items, self.fn = sample_list(folder), fn

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with open(path, "rb") as f:
            return self.fn(f.read()), label


class _Through:
    """Mixin for a peer's dataset of {"data", "label"} samples: (fn(data), label)."""

    def __getitem__(self, i):
        s = super().__getitem__(i)
        return self.fn(bytes(memoryview(s["data"]))), s["label"]


try:
    import streaming

    class StreamingSamples(_Through, streaming.StreamingDataset):
        def __init__(self, fn, **kw):
            super().__init__(**kw)
            self.fn = fn
except ImportError as e:
    streaming = StreamingSamples = e
try:
    import litdata

    class LitSamples(_Through, litdata.StreamingDataset):
        def __init__(self, fn, *a, **kw):
            super().__init__(*a, **kw)
            self.fn = fn
except ImportError as e:
    litdata = LitSamples = e


def _need(mod):
    if isinstance(mod, ImportError):
        raise mod
    return mod


def torch_loader(ds, workers, shuffle=True):
    return torch.utils.data.DataLoader(ds, batch_size=B, shuffle=shuffle, num_workers=workers,
                                       pin_memory=DEV == "cuda", persistent_workers=workers > 0, drop_last=True)


def forever(dl):
    """A DataLoader's (x, y) batches, in host memory, epoch after epoch."""
    while True:
        for x, y in dl:
            yield x, torch.as_tensor(y)


def write_mds(folder):
    """The folder's samples as MDS shards (64 MiB) beside it; made once."""
    _need(streaming)
    out = f"{folder}.mds"
    if not os.path.exists(f"{out}/index.json"):
        with streaming.MDSWriter(out=out, columns={"data": "bytes", "label": "int"}, size_limit=1 << 26) as w:
            for path, label in sample_list(folder):
                with open(path, "rb") as f:
                    w.write({"data": f.read(), "label": label})
    return out


def write_tars(folder, per_shard=1000):
    """The folder's samples as WebDataset tars beside it (KEY.EXT and KEY.cls members); made once."""
    out = f"{folder}.wds"
    if not os.path.exists(out):
        os.makedirs(f"{out}.tmp", exist_ok=True)
        items = sample_list(folder)
        for k in range(0, len(items), per_shard):
            with tarfile.open(f"{out}.tmp/shard-{k // per_shard:04d}.tar", "w") as t:
                for i, (path, label) in enumerate(items[k:k + per_shard]):
                    key = f"{k + i:08d}"
                    t.add(path, arcname=key + os.path.splitext(path)[1])
                    cls = str(label).encode()
                    info = tarfile.TarInfo(f"{key}.cls")
                    info.size = len(cls)
                    t.addfile(info, io.BytesIO(cls))
        os.rename(f"{out}.tmp", out)
    return out


def _lit_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"data": np.frombuffer(f.read(), np.uint8), "label": label}


def loader(kind, folder, workers, fn=decode_image):
    """One epoch of the folder's samples as (fn(bytes) batch, labels), shuffled, by a peer: "files" (a file
    per sample, ImageFolder's access pattern: "imagefolder"), "streaming", "litdata" or "webdataset". The
    peer's format is written beside the folder the first time."""
    if kind == "imagefolder":
        return torch_loader(Files(folder, fn), workers)
    if kind == "streaming":
        out = write_mds(folder)
        try:  # shared memory a killed earlier run left behind would stop the dataset
            from streaming.base.util import clean_stale_shared_memory
            clean_stale_shared_memory()
        except ImportError:
            pass
        return torch_loader(StreamingSamples(fn, local=out, shuffle=True, batch_size=B), workers, shuffle=False)
    if kind == "litdata":
        _need(litdata)
        out = os.path.abspath(f"{folder}.litdata")
        if not os.path.exists(f"{out}/index.json"):
            litdata.optimize(fn=_lit_item, inputs=sample_list(folder), output_dir=out, chunk_bytes="64MB",
                             num_workers=4)
        return litdata.StreamingDataLoader(LitSamples(fn, out, shuffle=True, drop_last=True), batch_size=B,
                                           num_workers=workers, pin_memory=DEV == "cuda", drop_last=True)
    if kind == "webdataset":
        import webdataset as wds
        urls = sorted(glob.glob(f"{write_tars(folder)}/shard-*.tar"))
        ext = os.path.splitext(sample_list(folder)[0][0])[1][1:]
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
              .shuffle(1000).to_tuple(ext, "cls").map_tuple(fn, int))
        return torch_loader(ds, workers, shuffle=False)
    raise ValueError(f"peers.loader: unknown kind {kind!r}")


def sluice_batches(ds_path):
    """sluice's loader doing the report's light transform itself (sluice.Images: resize to SIZE, normalize): on
    the GPU nvJPEG decodes each batch and one kernel resizes and normalises it, so the batch arrives as a
    [B, 3, SIZE, SIZE] float tensor in GPU memory, with no worker processes and no decoding thread of ours."""
    images = sluice.Images("data", size=SIZE, mode="resize", mean=MEAN.flatten().tolist(),
                           std=STD.flatten().tolist(), dtype="f32")
    ld = sluice.Loader(sluice.Dataset(ds_path), batch_size=B, device=DEV, fields=["data", "label"],
                       drop_last=True, seed=0, images=images)
    epoch = 0
    try:
        while True:
            for b in ld:
                yield torch.as_tensor(b["data"]), torch.as_tensor(b["label"]).long()
            epoch += 1
            ld.set_epoch(epoch)
    finally:
        ld.close()


IMAGE_LOADERS = ("imagefolder", "streaming", "litdata", "webdataset", "sluice")


def image_batches(kind, imgs, ds, workers):
    """(x, y) batches of the images, epoch after epoch: kind one of IMAGE_LOADERS (sluice's reads the dataset
    ds and uses no worker processes; the peers read the folder imgs in their own format)."""
    return sluice_batches(ds) if kind == "sluice" else forever(loader(kind, imgs, workers))


def train(batches, model, steps, warmup=10, at_warm=None, trace=None, trace_steps=5):
    """The report's loop: forward, backward and SGD step of model on each batch, each phase under a
    torch.profiler marker (PHASES) and timed, the device synchronized at each phase's end so that a phase's
    time is its own. at_warm() runs after the warm-up steps (drop the page cache there: storage cold, CUDA
    warm). trace, a path: after the measured steps, trace_steps more run under torch.profiler (CPU and CUDA
    activity) and its trace is written there (Chrome/Perfetto JSON, TensorBoard's too; .gz compresses); the
    figures come from the steps before, which the profiler's own cost does not slow.
    Returns the mean milliseconds of each phase, of the step, the data wait's share, images/s."""
    from torch.profiler import ProfilerActivity, profile, record_function
    crit = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = {p: [] for p in PHASES}
    it = iter(batches)

    def step():
        t = [time.perf_counter()]
        with record_function("DATALOADER_WAIT"):
            x, y = next(it)
            sync()
        t.append(time.perf_counter())
        with record_function("H2D_TRANSFER"):
            x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
            sync()
        t.append(time.perf_counter())
        with record_function("FORWARD"):
            loss = crit(model(x), y)
            sync()
        t.append(time.perf_counter())
        with record_function("BACKWARD"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
            sync()
        t.append(time.perf_counter())
        with record_function("OPTIMIZER"):
            opt.step()
            sync()
        t.append(time.perf_counter())
        return [t[k + 1] - t[k] for k in range(len(PHASES))]

    try:
        for _ in range(warmup):
            step()
        if at_warm:
            at_warm()
        for _ in range(steps):
            for p, v in zip(PHASES, step()):
                times[p].append(v)
        if trace:
            with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])) as prof:
                for _ in range(trace_steps):
                    step()
            prof.export_chrome_trace(trace)
    finally:
        if hasattr(it, "close"):  # the loader's workers (or decode thread) end with it
            it.close()
    ms = {p: 1e3 * statistics.mean(v) for p, v in times.items()}
    step = sum(ms.values())
    return {"data_wait_ms": ms["DATALOADER_WAIT"], "h2d_ms": ms["H2D_TRANSFER"],
            "compute_ms": ms["FORWARD"] + ms["BACKWARD"] + ms["OPTIMIZER"], "step_ms": step,
            "data_wait_pct": 100 * ms["DATALOADER_WAIT"] / step, "images_per_s": 1e3 * B / step, "phases_ms": ms}
