"""sluice journey: the experiments of "The Data Journey", a benchmarking report, on this machine, as a self-contained HTML
report with a chart per experiment (inline SVG: no network needed to view it) and the same figures as JSON.

    sluice journey [--dir PATH] [--quick] [--only N[,N...]] [--html FILE] [--json FILE]

Each experiment reports its figures, a one-line verdict and the Data Journey report's figure beside this machine's.
Experiments that need what the machine lacks (a GPU, root to drop the page cache) say so instead of a figure.
"""
import argparse
import html
import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time


def _parser():
    ap = argparse.ArgumentParser(prog="sluice journey", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "sluice-journey"),
                    help="where the generated data goes (kept for the next run)")
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes: about 2 minutes on an H100 machine (the full run about 4), data made included")
    ap.add_argument("--html", default="sluice-journey.html", help="the report (default ./sluice-journey.html)")
    ap.add_argument("--json", help="the figures as JSON too")
    ap.add_argument("--only", metavar="N[,N...]", help="only these sections of the Data Journey report (2-7)")
    return ap


# Run as a program (sluice journey does), the arguments are read before numpy and the library are imported:
# --help and a bad option need neither.
_ARGS = _parser().parse_args() if __name__ == "__main__" else None
if _ARGS:  # section 7 decodes JPEGs on the GPU beside a training loop: docs/guides/images.md asks for 32 queues
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import numpy as np  # noqa: E402

import sluice  # noqa: E402

SLUICE = os.environ.get("SLUICE_BIN", "sluice")
PASSES = 3  # cold passes of each figure in section 2; the median is reported


def _say(msg):
    print(f"[journey] {msg}", file=sys.stderr, flush=True)


def _state(cold):
    """How an experiment's storage was: cold, or warm where its files stayed in the page cache (_drop_caches says
    which and why)."""
    return "cold" if cold else "warm (its files stayed in the page cache)"


def _drop_caches(*paths):
    """Cold: the files the experiments read out of the page cache, and no other file of the machine's: those
    named (a file, or every file below a directory; none named: below the report's --dir), each one's dirty pages
    written back, then dropped (sluice_page_cache_evict: fdatasync, POSIX_FADV_DONTNEED; no root needed), then
    what stayed counted. True when nothing stayed; False, saying once which file and why, where some did (tmpfs
    keeps its files in memory alone; pages another process maps stay)."""
    import ctypes
    from sluice._lib import lib
    evict = lib.sluice_page_cache_evict
    evict.restype, evict.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64),
                                                   ctypes.c_char_p, ctypes.c_size_t]
    cold, why = True, ctypes.create_string_buffer(256)
    files = []
    for d in paths or ((_ARGS or _parser().parse_args([])).dir,):
        files += [d] if os.path.isfile(d) else [os.path.join(r, n) for r, _, names in os.walk(d) for n in names]
    for p in files:
        left = ctypes.c_uint64()
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        rc = evict(os.fsencode(p), ctypes.byref(left), why, len(why))
        if rc == 0 and not why.value:
            continue
        if cold and p not in _drop_caches.said:
            said = why.value.decode(errors="replace") if rc == 0 else os.strerror(-rc)
            _say(f"{p}: {left.value / 1e6:.1f} MB stayed in the page cache: {said}")
            _drop_caches.said.add(p)
        cold = False
    return cold


_drop_caches.said = set()


def _bench(args):
    r = subprocess.run([SLUICE, "bench", "--json"] + args, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"sluice bench {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def _make_file(path, size):
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(size >> 20):
            f.write(i.to_bytes(8, "little") + block[8:])
        f.flush()
        os.fsync(f.fileno())


def _lacks(title, section, seed, modules=("torch",), gpu=None):
    """The record of an experiment this machine cannot run (a module missing; no GPU, gpu saying why it needs
    one), or None when it can."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            why = f"{'PyTorch' if m == 'torch' else m} is not installed"
            return {"title": title, "section": section, "skipped": why, "seed": seed}
    if gpu is not None and sluice.gpu_count() == 0:
        return {"title": title, "section": section, "skipped": "no GPU on this machine" + gpu, "seed": seed}
    return None


def _readahead_kb(path):
    """The read-ahead of the block device that holds path, in KiB ("?" where it cannot be read)."""
    try:
        st = os.stat(path)
        dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        for q in (f"{dev}/queue/read_ahead_kb", f"{dev}/../queue/read_ahead_kb"):
            if os.path.exists(q):
                with open(q) as f:
                    return f.read().strip()
    except OSError:
        pass
    return "?"


def random_vs_sequential(d, quick):
    """Section 2: 16 KB samples read one by one in random order against in file order, cold."""
    size, sample = (64 << 20) if quick else (512 << 20), 16 << 10
    path = os.path.join(d, "samples.bin")
    _make_file(path, size)
    n = size // sample
    order = list(range(n))
    random.Random(0).shuffle(order)
    cold = _drop_caches()

    def py_read(idx):
        if cold:
            _drop_caches()
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            for i in idx:
                f.seek(i * sample)
                f.read(sample)
        return size / (time.perf_counter() - t0) / 1e6

    how = {}  # each sluice arm's settings, as sluice bench reports them

    def sl_read(args, direct=True):  # MB/s of sluice bench, cold (direct: O_DIRECT; else the page cache dropped)
        if not direct and cold:
            _drop_caches()
        r = _bench(args + ["--target", "host", "--repeat", "1"] + (["--cold"] if cold and direct else []) + [path])
        how[" ".join(args)] = (f"sluice bench {' '.join(args)}: {r['path']}, {r['io_size'] >> 10} KiB I/Os, "
                               f"{r['threads']} threads x {r['queue_depth']} in flight")
        return r["gb_s"] * 1e3

    # Each figure the median of PASSES cold passes (one pass of a small file is a few tens of ms, and varies).
    # sluice reads a file in order as it always does (4 MiB I/Os): 16 KiB direct reads would have no readahead,
    # which Python's buffered 16 KB reads ride (the kernel reads ahead read_ahead_kb at a time).
    arms = {"Python, sequential 16 KB reads": (lambda: py_read(range(n)), "open(buffering=0), read(16 KB) in order"),
            "Python, random 16 KB reads": (lambda: py_read(order), "seek + read(16 KB), shuffled order, one at a time"),
            "sluice, sequential (io_uring, 4 MiB reads)": (lambda: sl_read(["--rw", "read"]), "--rw read"),
            "sluice, random 16 KB (io_uring, queue depth)": (lambda: sl_read(["--rw", "randread", "--io-size", "16K"]),
                                                             "--rw randread --io-size 16K")}
    if cold:  # sluice reads a file not in the page cache with O_DIRECT; the same read through the cache, cold
        arms["sluice, sequential through the page cache"] = (
            lambda: sl_read(["--rw", "read", "--path", "pagecache"], direct=False), "--rw read --path pagecache")
    runs = {k: fn for k, (fn, _) in arms.items()}
    got = {k: [] for k in runs}
    for _ in range(PASSES):
        for k, fn in runs.items():
            got[k].append(fn())
    v = {k: statistics.median(x) for k, x in got.items()}
    series = [[k, v[k]] for k in runs]
    seq, rnd = v["Python, sequential 16 KB reads"], v["Python, random 16 KB reads"]
    s_seq, s_rnd = v["sluice, sequential (io_uring, 4 MiB reads)"], v["sluice, random 16 KB (io_uring, queue depth)"]
    pc = v.get("sluice, sequential through the page cache", 0)
    spread = max(max(x) / min(x) for x in got.values())
    why = f". Passes varied up to {spread:.1f}x (max over min), so read these as rough" if spread > 1.5 else ""
    if pc > 1.2 * s_seq:
        why += (f". This disk serves reads through the page cache faster than direct ones ({pc:,.0f} against "
               f"{s_seq:,.0f} MB/s): a virtual disk whose host caches it can; sluice reads a file that is not "
               f"cached with O_DIRECT unless SLUICE_DIRECT=never")
    settings = [how.get(h, h) for _, h in arms.values()]
    return {
        "title": f"Random against sequential reads, {_state(cold)}",
        "section": 2,
        "unit": f"MB/s, medians of {PASSES} passes",
        "series": series,
        "tables": [{"title": f"Each arm reads the same {size >> 20} MiB file ({sample >> 10} KiB samples)",
                    "columns": ["", "MB/s", "how"],
                    "rows": [[k, v[k], h] for k, h in zip(runs, settings)]}],
        "ratios": {"python_sequential_over_random": seq / rnd, "sluice_random_over_python_random": s_rnd / rnd},
        "passes": PASSES, "passes_mb_s": got,
        "cold": cold,
        "verdict": (f"sequential reads are {seq / rnd:.1f}x faster than random ones here"
                    f"{'' if cold else ' (warm: its files stayed in the page cache)'}: in order, the kernel reads ahead "
                    f"of Python's 16 KB reads ({_readahead_kb(path)} KiB at a time here), so the disk sees large "
                    f"reads; sluice's random reads, many in flight, run {s_rnd / rnd:.1f}x the "
                    f"one-at-a-time Python reader{why}"),
        "seed": "Data Journey report: 20.2x (70 MB/s random against 1,422 MB/s sequential, NVMe, 16 KB samples)",
    }


def padding_tax(d, quick):
    """Section 5: instruction samples padded to a 4,096-token context against packed into it (sluice.Packer)."""
    rng = np.random.default_rng(0)
    n, ctx = 2000, 4096
    # Alpaca-like lengths (the report's: 13-307 tokens, mean 95, median 83).
    lens = np.clip(np.round(rng.lognormal(np.log(83), 0.5, n)), 13, 307).astype(int)
    naive = lens.mean() / ctx
    p = sluice.Packer(ctx)
    for k in lens:
        p.add(rng.integers(1, 50000, k))
    for _ in p.rows(flush=True):
        pass
    packed = p.fill()
    return {
        "title": "The padding tax: padded against packed sequences",
        "section": 5,
        "unit": "% of token positions holding data",
        "series": [["padded to the context (4,096)", 100 * naive], ["packed (sluice.Packer, best fit)", 100 * packed]],
        "ratios": {"packed_over_padded": packed / naive},
        "lengths": {"mean": float(lens.mean()), "median": float(np.median(lens)), "min": int(lens.min()),
                    "max": int(lens.max())},
        "verdict": f"packing fills {100 * packed:.1f}% of the context against {100 * naive:.1f}% padded: "
                   f"{packed / naive:.1f}x the useful tokens a step",
        "seed": "Data Journey report: 2.3% padded, 98.5% packed (42.4x), Alpaca with GPT-2's tokenizer",
    }


def _median_s(*fns, iters, warmup=2):
    """Median seconds of each fn() between two device synchronizations (the whole wall-clock cost, staging
    copies on the CPU included, as the seed measures), the fns taking turns so that drift reaches all alike.
    One fn: its median; several: a list."""
    import torch
    for fn in fns * warmup:
        fn()
    out = [[] for _ in fns]
    for _ in range(iters):
        for k, fn in enumerate(fns):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out[k].append(time.perf_counter() - t0)
    med = [float(np.median(v)) for v in out]
    return med[0] if len(fns) == 1 else med


def pinned_vs_pageable(d, quick):
    """Section 6: torch copies host->GPU (H2D) and GPU->host (D2H) from and to pinned (page-locked) against
    pageable memory at 1 MB to 1 GB; the overlap experiment (a copy started, ~5 ms of CPU work, then a wait:
    does the CPU work hide the copy?) for the four (pinned, non_blocking) combinations; and sluice's own path,
    the page cache into the GPU through its pinned slots against through a pageable buffer."""
    title = "Crossing the PCIe bridge: pinned against pageable memory"
    seed = ("Data Journey report (L40S, PCIe 4): H2D pinned 1.02x pageable at 1 GB; D2H 7.44x (13.21 against 1.77 GB/s); "
            "the CPU's work overlaps a copy only when pinned and non_blocking (77% at 16 MB)")
    skip = _lacks(title, 6, seed, gpu="")
    if skip:
        return skip
    import torch
    iters = 5 if quick else 20
    bw_rows, gbs = [], {}
    for size in (1 << 20, 16 << 20, 256 << 20, 1 << 30):
        n = size // 4
        pageable, dev = torch.randn(n), torch.empty(n, device="cuda")
        pinned = pageable.pin_memory()
        row = [f"{size >> 20} MB"]
        for way, copy in (("H2D", lambda h: dev.copy_(h)), ("D2H", lambda h: h.copy_(dev))):
            for kind, h in (("pageable", pageable), ("pinned", pinned)):
                gbs[way, kind, size] = size / _median_s(lambda: copy(h), iters=iters) / 1e9
            row += [gbs[way, "pageable", size], gbs[way, "pinned", size],
                    gbs[way, "pinned", size] / gbs[way, "pageable", size]]
        bw_rows.append(row)

    # The overlap experiment: CPU work calibrated to about 5 ms of matrix multiplies.
    w = torch.randn(192, 192)
    reps = 1
    while _median_s(lambda: [w @ w for _ in range(reps)], iters=3, warmup=1) < 0.005:
        reps *= 2

    def cpu_work():
        for _ in range(reps):
            w @ w
    ov_rows, overlap = [], {}
    for size in (16 << 20, 256 << 20):
        n = size // 4
        pageable, dev = torch.randn(n), torch.empty(n, device="cuda")
        pinned = pageable.pin_memory()
        for kind, h in (("pageable", pageable), ("pinned", pinned)):
            for nb in (False, True):
                alone, both, cpu_s = _median_s(lambda: dev.copy_(h, non_blocking=nb),
                                               lambda: (dev.copy_(h, non_blocking=nb), cpu_work()), cpu_work,
                                               iters=3 * iters)
                seq, par = alone + cpu_s, max(alone, cpu_s)
                score = min(1.0, max(0.0, (seq - both) / (seq - par))) if seq > par else 0.0
                overlap[kind, nb, size] = score
                ov_rows.append([f"{size >> 20} MB, {kind} + {'non_blocking' if nb else 'blocking'}", 1e3 * alone,
                                1e3 * cpu_s, 1e3 * both, 100 * score])

    size = (2 << 30) if quick else (8 << 30)
    path = os.path.join(d, "copy.bin")
    _make_file(path, size)
    sl_pinned = _bench(["--repeat", "5", path])["gb_s"]  # warm: the page cache -> pinned slots -> GPU
    sl_pageable = _bench(["--repeat", "5", "--path", "pageable", path])["gb_s"]
    big = 256 << 20
    series = [["H2D 256 MB, pageable", gbs["H2D", "pageable", big]], ["H2D 256 MB, pinned", gbs["H2D", "pinned", big]],
              ["D2H 256 MB, pageable", gbs["D2H", "pageable", big]], ["D2H 256 MB, pinned", gbs["D2H", "pinned", big]],
              ["sluice, page cache -> GPU, pageable buffer", sl_pageable],
              ["sluice, page cache -> GPU, pinned slots", sl_pinned]]
    d2h = gbs["D2H", "pinned", big] / gbs["D2H", "pageable", big]
    h2d = gbs["H2D", "pinned", big] / gbs["H2D", "pageable", big]
    return {
        "title": title,
        "section": 6,
        "unit": "GB/s",
        "series": series,
        "tables": [{"title": "Bandwidth, GB/s (median of the copies)",
                    "columns": ["size", "H2D pageable", "H2D pinned", "H2D speedup", "D2H pageable", "D2H pinned",
                                "D2H speedup"], "rows": bw_rows},
                   {"title": "Overlap: a copy, then ~5 ms of CPU work, then a wait (100% = the work hid the copy)",
                    "columns": ["copy", "copy alone, ms", "CPU work, ms", "both, ms", "overlap, %"],
                    "rows": ov_rows}],
        "ratios": {"h2d_pinned_over_pageable_256mb": h2d, "d2h_pinned_over_pageable_256mb": d2h,
                   "sluice_pinned_over_pageable": sl_pinned / sl_pageable},
        "overlap_pct": {f"{k}{'_nb' if nb else ''}_{sz >> 20}mb": 100 * v for (k, nb, sz), v in overlap.items()},
        "verdict": f"at 256 MB pinned memory copies {h2d:.2f}x pageable's speed into the GPU and {d2h:.2f}x out of "
                   f"it; the CPU's work hid a 16 MB copy {100 * overlap['pinned', True, 16 << 20]:.0f}% when pinned "
                   f"and non_blocking, {100 * overlap['pageable', True, 16 << 20]:.0f}% when pageable; sluice's "
                   f"pinned slots move {sl_pinned / sl_pageable:.2f}x its pageable path's bytes",
        "seed": seed,
    }



def dataloader_masking(d, quick):
    """Section 3: PyTorch's DataLoader over one small file per sample (shuffled) against one big file read in
    order, with 0 and 4 workers, cold; the same samples in MosaicML Streaming's and WebDataset's shards (where
    installed) and in sluice's, shuffled."""
    seed = "Data Journey report: 19.5x with no workers, 4.8x with 4 (50,000 x 4 KB, cold)"
    skip = _lacks("What the DataLoader hides", 3, seed)
    if skip:
        return skip
    from torch.utils.data import Dataset
    import peers

    n, size = (20000 if quick else 50000), 4096  # quick: enough that starting 4 workers is not all it measures
    folder = os.path.join(d, f"small{n}")
    small = os.path.join(folder, "c0")
    big = os.path.join(d, f"giant{n}.bin")
    if not os.path.exists(big):
        os.makedirs(small, exist_ok=True)
        rng = np.random.default_rng(1)
        with open(big + ".tmp", "wb") as g:
            for i in range(n):
                b = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                with open(os.path.join(small, f"{i:06d}.bin"), "wb") as f:
                    f.write(b)
                g.write(b)
        os.rename(big + ".tmp", big)
    packed = os.path.join(d, f"packed{n}")
    if not os.path.exists(os.path.join(packed, "index.sli")):
        sluice.pack(packed, dir=folder, all_files=True)

    class GiantFile(Dataset):
        def __init__(self):
            self.f = None

        def __len__(self):
            return n

        def __getitem__(self, i):
            if self.f is None:
                self.f = open(big, "rb")
            self.f.seek(i * size)
            return peers.nbytes(self.f.read(size)), 0

    def run(make, cold=True):
        if cold:
            _drop_caches()
        t0 = time.perf_counter()
        got = make()
        return got / (time.perf_counter() - t0) / 1e6

    def torch_pass(dl):  # the bytes a pass of the DataLoader delivered
        return lambda: int(sum(x.sum() for x, _ in dl))

    cold = _drop_caches()
    sl_ds = sluice.Dataset(packed)  # opened, and the engine started, before the clock (as the peers' datasets)
    sluice._eng()

    def sluice_pass():
        return sum(len(b["data"][0]) for b in sluice.Loader(sl_ds, batch_size=64, shuffle=True))

    series, missing = [], []
    for w in (0, 4):
        series.append([f"DataLoader, small files, shuffled, {w} workers",
                       run(torch_pass(peers.loader("imagefolder", folder, w, peers.nbytes)))])
        series.append([f"DataLoader, one big file, in order, {w} workers",
                       run(torch_pass(peers.torch_loader(GiantFile(), w, shuffle=False)))])
    # The same 4-worker pass from the page cache: no reads to spread, so what is left is the workers' own cost
    # (starting them, and each batch handed to the main process through shared memory).
    handoff = run(torch_pass(peers.torch_loader(GiantFile(), 4, shuffle=False)), cold=False)
    for kind, label in (("streaming", "MosaicML Streaming (MDS shards)"), ("webdataset", "WebDataset (tar shards)")):
        try:
            dl = peers.loader(kind, folder, 4, peers.nbytes)  # the peer's shards written before the clock
        except ImportError:
            missing.append(kind)
            continue
        series.append([f"{label}, shuffled, 4 workers", run(torch_pass(dl))])
    series.append(["sluice.Loader, shards, shuffled", run(sluice_pass)])
    v = dict(series)
    r0 = series[1][1] / series[0][1]
    r4 = series[3][1] / series[2][1]
    best = max([series[2]] + series[4:-1], key=lambda s: s[1])  # the best 4-worker loader of shuffled samples
    sl = v["sluice.Loader, shards, shuffled"]
    return {
        "title": "What the DataLoader hides",
        "section": 3,
        "unit": f"MB/s, {_state(cold)}",
        "cold": cold,
        "series": series,
        "ratios": {"big_over_small_0_workers": r0, "big_over_small_4_workers": r4,
                   "big_4_workers_warm_mb_s": handoff,
                   "sluice_over_small_files_4_workers": sl / series[2][1],
                   "sluice_over_best_shuffled_peer": sl / best[1]},
        "not_installed": missing,
        "verdict": f"one big file in order beats a file per sample {r0:.1f}x with no workers and still {r4:.1f}x with "
                   f"4. With 4 workers the big file runs {series[1][1] / series[3][1]:.1f}x slower than with none, and "
                   f"{handoff:.0f} MB/s even from the page cache: for {size // 1024} KB samples, starting the workers "
                   f"and handing each batch back through shared memory cost more than the reads they spread; "
                   f"sluice's shuffled loader, with no worker processes, runs {sl / series[2][1]:.1f}x the "
                   f"4-worker small-file loader and {sl / best[1]:.1f}x the best shuffled peer ({best[0]})",
        "seed": seed,
    }


def cpu_starvation(d, quick):
    """Section 4: a training step of 50 ms fed by a DataLoader whose samples cost 5 ms of CPU each (the report's
    simulation, sleeps standing in for tokenisation and the GPU), with 0 and 4 workers: the share of each step
    spent waiting for data."""
    seed = "Data Journey report: 76% of every step idle with no workers (160.6 ms wait, 50.1 ms compute)"
    skip = _lacks("CPU starvation", 4, seed)
    if skip:
        return skip
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Heavy(Dataset):
        def __len__(self):
            return 10000

        def __getitem__(self, i):
            time.sleep(0.005)
            return torch.zeros(16)

    steps = 8 if quick else 20
    series, waits = [], {}
    for w in (0, 4):
        it = iter(DataLoader(Heavy(), batch_size=32, num_workers=w))
        next(it)  # workers started
        wait = comp = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            next(it)
            t1 = time.perf_counter()
            time.sleep(0.05)  # the step
            wait, comp = wait + t1 - t0, comp + time.perf_counter() - t1
        waits[w] = 1000 * wait / steps
        series.append([f"{w} workers: GPU idle, % of the step", 100 * wait / (wait + comp)])
    return {
        "title": "CPU starvation",
        "section": 4,
        "unit": "% of each step waiting for data",
        "series": series,
        "ratios": {"idle_0_over_4_workers": series[0][1] / max(series[1][1], 1e-9)},
        "wait_ms": waits,
        "verdict": f"with no workers the GPU waits {series[0][1]:.0f}% of every step ({waits[0]:.0f} ms a step); with "
                   f"4 workers, {series[1][1]:.0f}%",
        "seed": seed,
    }


def full_picture(d, quick):
    """Section 7: a ResNet-50 training step (batch 64) fed with synthetic 224x224 JPEGs by a file per image
    (ImageFolder) and MosaicML Streaming's shards with 0 and 4 workers, WebDataset's with 4 and sluice's loader
    (no worker processes; nvJPEG decodes on the GPU), cold, each phase timed under the report's profiler markers:
    the share of each step spent waiting for data. A few more steps of each run under torch.profiler for a
    trace (--dir/traces)."""
    title = "The full picture: a ResNet-50 step fed by each loader"
    seed = ("Data Journey report (L40S, 100,000 JPEGs, NVMe): with no workers 57% of each step waiting for data with "
            "ImageFolder, 49% with Streaming (1.42x less wait); with 4 workers 0.4% for both, 2.33x the images/s")
    skip = _lacks(title, 7, seed, ("torch", "torchvision"), gpu=" (the step trains ResNet-50)")
    if skip:
        return skip
    cold = _drop_caches()  # whether train()'s drops will make it cold (not tried when it cannot run)
    title += f", {_state(cold)}"
    import torch
    import torchvision
    import peers

    n, steps = (3200, 30) if quick else (20000, 100)
    imgs, ds = peers.make_images(d, n)
    traces = os.path.join(d, "traces")
    os.makedirs(traces, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    names = {"imagefolder": "ImageFolder", "streaming": "MosaicML Streaming", "webdataset": "WebDataset"}
    got, missing = {}, []
    for kind, w in (("imagefolder", 0), ("streaming", 0), ("imagefolder", 4), ("streaming", 4), ("webdataset", 4),
                    ("sluice", 0)):
        name = "sluice.Loader + nvJPEG" if kind == "sluice" else f"{names[kind]}, {w} workers"
        try:
            batches = peers.image_batches(kind, imgs, ds, w)
            model = torchvision.models.resnet50().to("cuda")
            got[name] = peers.train(batches, model, steps, at_warm=_drop_caches,
                                    trace=os.path.join(traces, f"{kind}_w{w}.json.gz"))
        except ImportError:
            missing.append(kind)
            continue
        finally:
            model = None
            torch.cuda.empty_cache()
        r = got[name]
        _say(f"  {name}: data wait {r['data_wait_ms']:.1f} ms of {r['step_ms']:.1f} ({r['data_wait_pct']:.1f}%), "
             f"{r['images_per_s']:.0f} img/s")
    missing = sorted(set(missing))
    f0, f4 = got["ImageFolder, 0 workers"], got["ImageFolder, 4 workers"]
    sl = got["sluice.Loader + nvJPEG"]
    best = max((k for k in got if k != "sluice.Loader + nvJPEG"), key=lambda k: got[k]["images_per_s"])
    ratios = {"imagefolder_4_over_0_workers": f4["images_per_s"] / f0["images_per_s"],
              "sluice_over_best_peer": sl["images_per_s"] / got[best]["images_per_s"]}
    verdict = f"with no workers the GPU waits {f0['data_wait_pct']:.0f}% of each step for a file per image"
    if "MosaicML Streaming, 0 workers" in got:
        s0 = got["MosaicML Streaming, 0 workers"]
        r = ratios["imagefolder_over_streaming_wait_0_workers"] = f0["data_wait_ms"] / s0["data_wait_ms"]
        verdict += (f", {s0['data_wait_pct']:.0f}% for Streaming's shards (" +
                    (f"{r:.2f}x less wait" if r >= 1 else f"{1 / r:.2f}x the wait") + ")")
    verdict += (f"; 4 workers bring it to {f4['data_wait_pct']:.1f}% ({ratios['imagefolder_4_over_0_workers']:.2f}x "
                f"the images/s); sluice, with no worker processes, waits {sl['data_wait_pct']:.1f}% and trains "
                f"{ratios['sluice_over_best_peer']:.2f}x the best peer's images/s ({best})")
    return {
        "title": title,
        "section": 7,
        "unit": "images/s trained",
        "series": [[k, r["images_per_s"]] for k, r in got.items()],
        "tables": [{"columns": ["loader", "data wait, ms", "H2D, ms", "compute, ms", "step, ms", "data wait, %",
                              "images/s"],
                  "rows": [[k, r["data_wait_ms"], r["h2d_ms"], r["compute_ms"], r["step_ms"], r["data_wait_pct"],
                            r["images_per_s"]] for k, r in got.items()]}],
        "figures": got,
        "ratios": ratios,
        "not_installed": missing,
        "images": n, "steps": steps, "traces": traces, "cold": cold,
        "verdict": verdict,
        "seed": seed,
    }


# The Data Journey report's sections, each an experiment.
EXPERIMENTS = {2: random_vs_sequential, 3: dataloader_masking, 4: cpu_starvation, 5: padding_tax,
               6: pinned_vs_pageable, 7: full_picture}


def machine():
    facts = {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
             "python": platform.python_version(), "sluice": sluice.lib.sluice_version().decode()}
    try:
        facts["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                      text=True, timeout=20).stdout.strip() or "none"
    except (OSError, subprocess.TimeoutExpired):
        facts["gpu"] = "none"
    return facts


def _svg(exp):
    """A horizontal bar chart of the experiment's series, as inline SVG."""
    from sluice.diagnose import bars_svg
    return bars_svg(exp["title"], exp["series"], exp["unit"], w=720, bar=26, gap=12, left=330)


def report_html(rep):
    facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rep["machine"].items())
    parts = [f"""<!doctype html><html><head><meta charset="utf-8"><title>sluice journey</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}} th{{text-align:left;padding-right:1em}}
.verdict{{font-weight:bold}} .seed{{color:#555}} section{{margin:2em 0;border-top:1px solid #ccc}}</style></head><body>
<h1>The data journey on {html.escape(rep["machine"]["host"])}</h1>
<p>sluice journey, {html.escape(rep["date"])}{", quick" if rep["quick"] else ""}: the experiments of "The Data Journey"
on this machine.</p><table>{facts}</table>"""]
    for e in rep["experiments"]:
        parts.append(f'<section><h2>{e["section"]}. {html.escape(e["title"])}</h2>')
        if "skipped" in e:
            parts.append(f'<p class="verdict">Not run: {html.escape(e["skipped"])}</p>')
        else:
            parts.append(_svg(e))
            for t in e.get("tables") or [{"columns": ["", e["unit"]], "rows": e["series"]}]:
                head = "".join(f"<th>{html.escape(c)}</th>" for c in t["columns"])
                rows = "".join("<tr>" + "".join(f"<td>{html.escape(c) if isinstance(c, str) else f'{c:,.3f}'}</td>"
                                                for c in row) + "</tr>" for row in t["rows"])
                caption = f"<caption>{html.escape(t['title'])}</caption>" if t.get("title") else ""
                parts.append(f"<table>{caption}<tr>{head}</tr>{rows}</table>")
            if e.get("traces"):
                parts.append(f"<p>torch.profiler traces of each loader's steps (Perfetto, TensorBoard): "
                             f"<code>{html.escape(e['traces'])}</code></p>")
            if e.get("not_installed"):
                parts.append(f"<p>Not installed, so not run: {html.escape(', '.join(e['not_installed']))}</p>")
            parts.append(f"<p class=\"verdict\">{html.escape(e['verdict'])}</p>")
        parts.append(f'<p class="seed">{html.escape(e["seed"])}</p></section>')
    parts.append("</body></html>")
    return "\n".join(parts)


def main(argv=None):
    ap = _parser()
    a = _ARGS if argv is None and _ARGS is not None else ap.parse_args(argv)
    only = sorted(EXPERIMENTS)
    if a.only:
        try:
            only = sorted({int(x) for x in a.only.split(",")})
        except ValueError:
            only = [a.only]
        bad = [x for x in only if x not in EXPERIMENTS]
        if bad:
            ap.error(f"--only: '{bad[0]}' is not a section of the report (2-7)")
    os.makedirs(a.dir, exist_ok=True)
    rep = {"date": time.strftime("%Y-%m-%d %H:%M"), "quick": a.quick, "machine": machine(), "experiments": []}
    t0 = time.time()
    for fn in (EXPERIMENTS[k] for k in only):
        _say(f"{fn.__name__} ...")
        t = time.time()
        e = fn(a.dir, a.quick)
        e["name"], e["seconds"] = fn.__name__, round(time.time() - t, 2)
        rep["experiments"].append(e)
        _say(f"{fn.__name__}: {e.get('verdict', e.get('skipped'))} ({e['seconds']} s)")
    rep["seconds"] = round(time.time() - t0, 2)
    with open(a.html, "w") as f:
        f.write(report_html(rep))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)
    _say(f"report: {a.html} ({rep['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
