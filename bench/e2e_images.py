"""Images end to end (issue #38): a ResNet trained on JPEGs, fed by each pipeline side by side in one run.

Data: IMAGES JPEGs of 500x375 (quality 90, textured so they weigh what ImageNet's do, ~90 KB), 100 classes, as an
ImageFolder tree and packed by `sluice pack --from-dir`; made once and reused, and read once through the page
cache before the passes (warm: every contender reads from memory).

Contenders, each a training step (bf16 autocast, channels_last, SGD) on batches of BATCH after WARM batches:
  ceiling      the model on one constant batch already on the GPU (no data at all)
  dl8, dl16    torch DataLoader, ImageFolder + PIL + torchvision.transforms.v2 (RandomResizedCrop(224), flip,
               ToDtype, Normalize), 8 and 16 workers, pinned memory
  tv_gpu       torchvision's batched GPU decode (decode_jpeg(list, device="cuda")), its v2 transforms on the
               GPU per image, stacked
  sluice       sluice.Loader(device="cuda", images=sluice.Images(224, flip, mean/std, bf16, channels_last))
  dali, dali_best  NVIDIA DALI (where it imports; ../shared/tools/carry-dali.sh brings it to the GPU machine):
               fn.readers.file -> fn.decoders.image(device="mixed") -> fn.random_resized_crop(224) ->
               fn.crop_mirror_normalize (fp16, HWC, flip 0.5), at its defaults (4 threads) and at --dali-best
               (THREADS,HW_DECODER_LOAD; default 8,0.99 as MLPerf's H100 configs set it); --dali-sweep first
               runs each of its thread counts and loads once, alone, and keeps the fastest as dali_best
Also, decode alone: torchvision's batched GPU decode of a batch's files against sluice's loader with no model
(decoding and augmenting), images/s.

Figures: images/s (median of REPS interleaved passes), and CPU cores used: the busy share of the machine's CPUs
over the pass (workers included) times its CPU count, and this process's CPU seconds over wall time.

    python3 bench/e2e_images.py --images 20000 --reps 3 --models resnet50,resnet18 --out e2e.json
"""
import argparse
import io
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results, side_by_side, timed, warm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _write_images(args):
    import numpy as np
    from PIL import Image
    d, start, n = args
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        # Smooth colour fields under noise: a photograph's mix of low frequencies and texture.
        base = rng.integers(0, 256, size=(12, 16, 3)).astype(np.float32)
        img = np.asarray(Image.fromarray(base.astype(np.uint8)).resize((500, 375), Image.BICUBIC), np.float32)
        img += rng.normal(0, 22, size=img.shape)
        c = f"{d}/imgs/{i % 100:03d}"
        os.makedirs(c, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(f"{c}/{i:06d}.jpg", quality=90)


def make_data(d, n, sluice_bin):
    if not os.path.exists(f"{d}/ds/index.sli"):
        step = 250
        with ProcessPoolExecutor(os.cpu_count()) as ex:
            list(ex.map(_write_images, [(d, s, min(step, n - s)) for s in range(0, n, step)]))
        subprocess.run([sluice_bin, "pack", "--from-dir", f"{d}/imgs", "--quiet", f"{d}/ds"], check=True)
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(f"{d}/imgs") for f in fs)
    # Both loaders read from the page cache: sluice pack writes its shards with O_DIRECT (none of them cached),
    # while the JPEG files DALI and the DataLoader read are cached as they are written.  Without this sluice
    # alone read at the disk's speed (about 1.6 GB/s, 17k images/s here) and the others from memory.
    warm(f"{d}/ds")
    warm(f"{d}/imgs")
    return f"{d}/ds", files


class Trainer:
    def __init__(self, name, batch):
        import torch
        import torchvision
        self.torch = torch
        self.model = getattr(torchvision.models, name)(num_classes=100).cuda().to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.batch = batch

    def step(self, x, y):
        torch = self.torch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


PIN = False


def run_steps(batches, trainer, warm, steps):
    """WARM batches, then STEPS timed; returns images/s."""
    torch = trainer.torch if trainer else __import__("torch")
    it = batches
    for _ in range(warm):
        x, y = next(it)
        if trainer:
            trainer.step(x, y)
    torch.cuda.synchronize()
    mask = os.sched_getaffinity(0)
    if PIN:  # threads made so far (the pipeline's, autograd's) keep the rest; this one takes CPU 0
        os.sched_setaffinity(0, {0})
    t0, n = time.perf_counter(), 0
    for _ in range(steps):
        x, y = next(it)
        if trainer:
            trainer.step(x, y)
        n += x.shape[0]
    torch.cuda.synchronize()
    r = {"images_s": n / (time.perf_counter() - t0)}
    os.sched_setaffinity(0, mask)
    it.close()  # a pipeline's generator records its figures as it closes
    return r


def measured(fn):
    """images/s of fn() with the CPU it took (cores of the machine busy, and this process's) and, sampled by
    nvidia-smi every 200 ms meanwhile, the GPU's median SM clock (MHz), power (W) and utilisation (%): a step that
    runs slower beside the decoding may be a clock the power limit lowered, not work in its way."""
    import statistics
    import subprocess
    try:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,utilization.gpu",
                                "--format=csv,noheader,nounits", "-lms", "200"], stdout=subprocess.PIPE, text=True)
    except OSError:
        smi = None
    r = timed(fn, children=True)
    r["cores_machine"] = r.get("machine_busy", 0) * os.cpu_count()
    r["cores_process"] = r["cpu_s"] / r["seconds"]
    if smi:
        smi.terminate()
        rows = [line.split(",") for line in smi.communicate()[0].splitlines() if line.count(",") == 2]
        for k, name in enumerate(("sm_mhz", "power_w", "gpu_util")):
            try:
                r[name] = statistics.median(float(x[k]) for x in rows)
            except (ValueError, statistics.StatisticsError):
                pass
    return r


def trace_training(path, torch, tr, batches, warm, steps):
    """STEPS training steps under torch.profiler, the Chrome trace written to PATH; returns what it shows: per CUDA
    stream the GPU time of its kernels and copies; the gaps between the model's kernels, split into those whose
    next kernel was launched only after the previous one ended (the CPU was late) and those where it was queued
    already (the GPU's); and per host thread the CUDA runtime and driver calls it made a step (which thread makes
    them, while the training thread launches: the thread with the most aten ops is the training thread)."""
    import collections
    import json
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warm):
        tr.step(*next(batches))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            tr.step(*next(batches))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    batches.close()
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    out = {"steps": steps, "step_ms": wall / steps * 1e3, "streams": [], "threads": []}
    per = collections.defaultdict(lambda: [0.0, 0, set(), []])
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            k = (e.get("args", {}).get("stream"), e["cat"])
            per[k][0] += e["dur"]
            per[k][1] += 1
            per[k][2].add(e["name"][:40])
            per[k][3].append((e["ts"], e["ts"] + e["dur"]))
    for (stream, cat), (us, n, names, spans) in sorted(per.items(), key=lambda x: -x[1][0]):
        spans.sort()
        gaps = sum(max(0.0, b[0] - a_[1]) for a_, b in zip(spans, spans[1:]))
        out["streams"].append({"stream": stream, "kind": cat, "ops_per_step": n / steps,
                               "busy_ms_per_step": us / 1e3 / steps, "gaps_ms_per_step": gaps / 1e3 / steps,
                               "names": sorted(names)[:4]})
    api = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launch = {e["args"]["correlation"]: e for e in api if "correlation" in e.get("args", {})}
    model = max((k for k in per if k[1] == "kernel"), key=lambda k: per[k][1])
    ks = sorted((e for e in events if e.get("cat") == "kernel" and e.get("args", {}).get("stream") == model[0]),
                key=lambda e: e["ts"])
    late = queued = 0.0
    for a_, b in zip(ks, ks[1:]):
        end, gap = a_["ts"] + a_["dur"], b["ts"] - (a_["ts"] + a_["dur"])
        if gap > 0:
            ln = launch.get(b.get("args", {}).get("correlation"))
            if ln and ln["ts"] + ln["dur"] > end:
                late += gap
            else:
                queued += gap
    out["model_stream"] = {"stream": model[0], "late_ms_per_step": late / 1e3 / steps,
                           "queued_ms_per_step": queued / 1e3 / steps}
    ops = collections.Counter(e.get("tid") for e in events if e.get("cat") == "cpu_op")
    train_tid = ops.most_common(1)[0][0] if ops else None
    by = collections.defaultdict(collections.Counter)
    busy = collections.Counter()
    for e in api:
        by[e.get("tid")][e["name"]] += 1
        busy[e.get("tid")] += e["dur"]
    for tid, c in sorted(by.items(), key=lambda x: -sum(x[1].values())):
        out["threads"].append({"tid": tid, "training": tid == train_tid, "calls_per_step": sum(c.values()) / steps,
                               "ms_in_calls_per_step": busy[tid] / 1e3 / steps,
                               "top": {k: round(v / steps, 1) for k, v in c.most_common(6)}})
    print(f"  {steps} steps, {out['step_ms']:.2f} ms a step; model stream {model[0]}: gaps {late / 1e3 / steps:.2f} "
          f"ms/step launched late (the CPU's), {queued / 1e3 / steps:.2f} ms/step already queued (the GPU's)", flush=True)
    for st in out["streams"][:6]:
        print(f"  stream {st['stream']} {st['kind']}: {st['ops_per_step']:.0f} ops, {st['busy_ms_per_step']:.2f} ms "
              f"busy a step, {st['gaps_ms_per_step']:.2f} ms gaps; {st['names']}", flush=True)
    for th in out["threads"][:8]:
        print(f"  thread {th['tid']}{' (training)' if th['training'] else ''}: {th['calls_per_step']:.0f} CUDA calls "
              f"a step, {th['ms_in_calls_per_step']:.2f} ms in them; {th['top']}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/sluice-e2e")
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice")))
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--alone-steps", type=int, default=0,
                    help="timed batches of each loader alone, no model (default: --steps); a longer pass than the "
                         "model's, since a pass of a fast loader is short and starts with its prefetched batches")
    ap.add_argument("--models", default="resnet50,resnet18")
    ap.add_argument("--only", default="", help="contenders to run (default: all)")
    ap.add_argument("--out", default="")
    ap.add_argument("--side-stream", action="store_true",
                    help="train on a stream of torch's pool, not the legacy default stream (which other libraries' "
                         "blocking streams synchronise with)")
    ap.add_argument("--pin", action="store_true",
                    help="the training thread alone on CPU 0 (every other thread, the loaders' included, kept off it)")
    ap.add_argument("--dali-best", default="8,0.99", help="DALI's best setting here: THREADS,HW_DECODER_LOAD")
    ap.add_argument("--dali-sweep", default="", help="THREADS;LOADS to sweep, e.g. 4,8,12;0.65,0.9,0.99 (alone, once)")
    ap.add_argument("--profile", action="store_true", help="only: the GPU kernels of sluice's batches (torch.profiler)")
    ap.add_argument("--trace", default="", help="only: STEPS training steps of each model fed by each of --trace-with "
                    "under torch.profiler, the Chrome traces written to TRACE.MODEL.CONTENDER.json, what they show "
                    "printed and in --out")
    ap.add_argument("--trace-with", default="sluice", help="the contenders traced (sluice, dali_best, ceiling, ...)")
    a = ap.parse_args()
    # What docs/guides/images.md asks of a user of GPU image loaders, before CUDA starts (a value set is kept).
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

    import torch
    import torchvision
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    import sluice

    torchvision.disable_beta_transforms_warning() if hasattr(torchvision, "disable_beta_transforms_warning") else None
    res = Results(a.out, images=a.images, batch=a.batch, steps=a.steps, alone_steps=a.alone_steps or a.steps, reps=a.reps, cpus=os.cpu_count(),
                  torch=torch.__version__, torchvision=torchvision.__version__,
                  cuda_device_max_connections=os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"))
    t0 = time.perf_counter()
    ds_path, files = make_data(a.dir, a.images, a.sluice)
    res["data"] = {"files": len(files), "mean_kb": sum(os.path.getsize(f) for f in files) / len(files) / 1e3,
                   "made_s": time.perf_counter() - t0}
    a.alone_steps = a.alone_steps or a.steps
    need = (a.warm + max(a.steps, a.alone_steps)) * a.batch
    assert len(files) >= need, f"--images {a.images} is fewer than a pass's {need}"
    ds = sluice.Dataset(ds_path)
    cpu_tf = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    gpu_tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    images = sluice.Images("data", size=224, flip=0.5, mean=MEAN, std=STD, dtype="bf16", channels_last=True)
    only = set(a.only.split(",")) if a.only else None

    def dataloader(workers):
        folder = torchvision.datasets.ImageFolder(f"{a.dir}/imgs", transform=cpu_tf)
        dl = torch.utils.data.DataLoader(folder, batch_size=a.batch, shuffle=True, num_workers=workers,
                                         pin_memory=True, drop_last=True, prefetch_factor=4, persistent_workers=False)
        for x, y in dl:
            yield (x.cuda(non_blocking=True).to(memory_format=torch.channels_last),
                   y.cuda(non_blocking=True))

    def tv_gpu(transform=True):
        order = torch.randperm(len(files)).tolist()
        for s in range(0, len(order) - a.batch + 1, a.batch):
            datas = [torchvision.io.read_file(files[i]) for i in order[s:s + a.batch]]
            imgs = decode_jpeg(datas, device="cuda")
            if transform:
                x = torch.stack([gpu_tf(im) for im in imgs]).to(memory_format=torch.channels_last)
            else:
                x = imgs[0].new_empty((len(imgs), 1))
            yield x, torch.zeros(len(imgs), dtype=torch.long, device="cuda")

    def dali_batches(threads=4, hw_load=None):
        """DALI's pipeline of the same images (ImageFolder tree), channels_last fp16 batches on the GPU."""
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(batch_size=a.batch, num_threads=threads, device_id=torch.cuda.current_device(),
                      seed=int(time.time()))
        def pipe():
            jpegs, labels = fn.readers.file(file_root=f"{a.dir}/imgs", random_shuffle=True, name="Reader")
            kw = {} if hw_load is None else {"hw_decoder_load": hw_load}
            x = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, **kw)
            x = fn.random_resized_crop(x, size=224)
            x = fn.crop_mirror_normalize(x, dtype=types.FLOAT16, output_layout="HWC",
                                         mean=[m * 255 for m in MEAN], std=[v * 255 for v in STD],
                                         mirror=fn.random.coin_flip(probability=0.5))
            return x, labels

        p = pipe()
        p.build()
        it = DALIGenericIterator(p, ["data", "label"], reader_name="Reader", auto_reset=True,
                                 last_batch_policy=LastBatchPolicy.DROP)
        while True:
            for b in it:
                # [B, H, W, 3] in memory: the model's [B, 3, H, W] in channels_last, as sluice's
                yield b[0]["data"].permute(0, 3, 1, 2), b[0]["label"].view(-1).long().cuda(non_blocking=True)

    try:
        import nvidia.dali  # noqa: F401
        have_dali = True
    except ImportError as e:
        have_dali, res["dali"] = False, f"skipped: DALI does not import ({e})"
    dali_best = tuple(float(v) for v in a.dali_best.split(","))
    if have_dali and a.dali_sweep and (not only or {"dali", "dali_best"} & only):
        threads, loads = (v.split(",") for v in a.dali_sweep.split(";"))
        sweep = {f"{t},{h}": measured(lambda t=int(t), h=float(h): run_steps(dali_batches(t, h), None, a.warm,
                                                                           a.steps))["images_s"]
                 for t in threads for h in loads}
        best = max(sweep, key=sweep.get)
        res["dali_sweep"] = {"images_s": sweep, "best": best}
        dali_best = tuple(float(v) for v in best.split(","))
        print("dali sweep (alone)", {k: round(v) for k, v in sweep.items()}, "best", best, flush=True)

    def sluice_batches(key="sluice_stats"):
        ld = sluice.Loader(ds, shuffle=True, batch_size=a.batch, device="cuda", images=images, fields=["data", "label"],
                           drop_last=True, seed=int(time.time()))
        try:
            for b in ld:
                yield b["data"], b["label"].long()
        finally:
            st = ld.stats()
            res[key] = {k: st.get(k) for k in ("gpu_wait_share", "step_us", "loader_us", "verdict", "images_gpu",
                                               "images_cpu", "skipped", "batches", "cuda_calls_producers",
                                               "cuda_calls_consumer", "nvjpeg_calls", "image_batches_gpu",
                                               "image_us", "stages")}
            n = max(1, st.get("batches") or 0)
            res[key]["per_batch"] = {k: round(st.get(k, 0) / n, 1) for k in ("cuda_calls_producers",
                                                                            "cuda_calls_consumer", "nvjpeg_calls")}

    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        it = sluice_batches()
        for _ in range(a.warm):
            next(it)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                next(it)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15), flush=True)
        return

    def model_and_constant(name):
        """The model to train, and a generator of one constant batch already on the GPU (the ceiling's feed)."""
        const = torch.randn(a.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        ys = torch.zeros(a.batch, dtype=torch.long, device="cuda")

        def constant():
            while True:
                yield const, ys
        return Trainer(name, a.batch), constant

    def traces():
        res["trace"] = {}
        for name in a.models.split(","):
            tr, constant = model_and_constant(name)
            feeds = {"ceiling": constant, "sluice": lambda: sluice_batches(f"stats_{name}"),
                     "dali": lambda: dali_batches(), "dali_best": lambda: dali_batches(int(dali_best[0]), dali_best[1])}
            for c in a.trace_with.split(","):
                if c.startswith("dali") and not have_dali:
                    continue
                print(f"trace {name} {c}", flush=True)
                t = trace_training(f"{a.trace}.{name}.{c}.json", torch, tr, feeds[c](), a.warm, a.steps)
                if c == "sluice":
                    st = res[f"stats_{name}"]
                    t["loader"] = st
                    print("  loader:", st, flush=True)
                res["trace"] = dict(res["trace"], **{f"{name}.{c}": t})  # saved as it goes
            del tr

    if a.trace:
        traces()
        return
    if a.side_stream:
        torch.cuda.set_stream(torch.cuda.Stream())
    if a.pin:
        global PIN
        PIN = True
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {0})
    res["pin"] = a.pin
    res["side_stream"] = a.side_stream
    for name in a.models.split(","):
        tr, constant = model_and_constant(name)
        contenders = {
            "ceiling": lambda: measured(lambda: run_steps(constant(), tr, a.warm, a.steps)),
            "dl8": lambda: measured(lambda: run_steps(dataloader(8), tr, a.warm, a.steps)),
            "dl16": lambda: measured(lambda: run_steps(dataloader(16), tr, a.warm, a.steps)),
            "tv_gpu": lambda: measured(lambda: run_steps(tv_gpu(), tr, a.warm, a.steps)),
            "sluice": lambda: measured(lambda: run_steps(sluice_batches(f"sluice_stats_{name}"), tr, a.warm, a.steps)),
        }
        if have_dali:
            contenders["dali"] = lambda: measured(lambda: run_steps(dali_batches(), tr, a.warm, a.steps))
            contenders["dali_best"] = lambda: measured(lambda: run_steps(
                dali_batches(int(dali_best[0]), dali_best[1]), tr, a.warm, a.steps))
        if only:
            contenders = {k: v for k, v in contenders.items() if k in only}
        r = side_by_side(contenders, a.reps, key="images_s")
        ceiling = r.get("ceiling", {}).get("images_s")
        best_dl = max([r[k].get("images_s", 0) for k in ("dl8", "dl16") if k in r] or [0])
        r["ratios"] = {
            "sluice_over_dali_best": (r["sluice"]["images_s"] / r["dali_best"]["images_s"])
            if "images_s" in r.get("sluice", {}) and "images_s" in r.get("dali_best", {}) else None,
            "sluice_over_ceiling": (r["sluice"]["images_s"] / ceiling) if ceiling and "images_s" in r.get("sluice", {}) else None,
            "sluice_over_best_dataloader": (r["sluice"]["images_s"] / best_dl) if best_dl and "images_s" in r.get("sluice", {}) else None,
        }
        res[name] = r
        print(name, {k: (round(v.get("images_s", 0)), round(v.get("cores_machine", 0), 1), v.get("sm_mhz"),
                         v.get("power_w")) for k, v in r.items()
                     if isinstance(v, dict) and "images_s" in v}, r["ratios"], res.get(f"sluice_stats_{name}"), flush=True)
        del tr

    # Decode alone: a batch's files decoded on the GPU by torchvision, against sluice's loader with no model.
    if not only or {"decode", "tv_decode", "sluice_decode", "dali_best_alone"} & only:
        alone = {
            "tv_decode": lambda: measured(lambda: run_steps(tv_gpu(transform=False), None, a.warm, a.alone_steps)),
            "sluice_decode": lambda: measured(lambda: run_steps(sluice_batches(), None, a.warm, a.alone_steps)),
        }
        if have_dali:
            alone["dali_best_alone"] = lambda: measured(lambda: run_steps(
                dali_batches(int(dali_best[0]), dali_best[1]), None, a.warm, a.alone_steps))
        if only and "decode" not in only:
            alone = {k: v for k, v in alone.items() if k in only}
        r = side_by_side(alone, a.reps, key="images_s")
        t, s = r.get("tv_decode", {}).get("images_s"), r.get("sluice_decode", {}).get("images_s")
        d = r.get("dali_best_alone", {}).get("images_s")
        r["ratio"] = s / t if s and t else None
        r["sluice_over_dali_best_alone"] = s / d if s and d else None
        res["decode"] = r
        print("decode", {k: (round(v.get("images_s", 0)), round(v.get("cores_machine", 0), 1))
                         for k, v in r.items() if isinstance(v, dict)}, r["ratio"], r["sluice_over_dali_best_alone"],
              flush=True)


if __name__ == "__main__":
    main()
