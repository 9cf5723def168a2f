"""sluice.profile: where a training loop's time goes, for any iterable of batches (a torch DataLoader with any
number of workers, a Hugging Face dataset, a WebDataset pipeline, a generator, sluice's own Loader).

It times the wait for each batch and the loop's work between batches (with CUDA events on the current stream
where torch has started CUDA), and samples the machine while it runs (sluice_machine_sample: CPU time of the
loop's process and each of its workers, bytes read from storage against bytes read through the page cache,
disks, network, memory; sluice_gpu_sample: GPU utilisation and memory).  Its verdict names the evidence and the
fix the evidence supports; no verdict without a measurement behind it.
"""
import ctypes as C
import math
import os
import statistics
import sys
import threading
import time

from ._lib import MachineSample, lib

# The loop waited for data less than this share of its time: the pipeline keeps up.
WAIT_OK = 0.05
# A loading process counts as CPU-bound from this share of one core busy.
BUSY = 0.7
# CUDA events kept (one a batch, for the GPU's time between batches): each holds a driver event, so a long run
# times its first batches only.
_EVENTS = 4096


def _nbytes(batch, depth=0):
    """Bytes of the arrays in a batch (tensors, numpy arrays, bytes, nested in tuples, lists and dicts), and
    whether every torch tensor among them is in pinned memory (None: no CPU tensor) or on a GPU."""
    if depth > 3:
        return 0, None, False
    if isinstance(batch, (bytes, bytearray, memoryview)):
        return len(batch), None, False
    n = getattr(batch, "nbytes", None)
    if isinstance(n, int):
        is_cuda = bool(getattr(batch, "is_cuda", False))
        pinned = None
        if hasattr(batch, "is_pinned") and not is_cuda:
            try:
                pinned = bool(batch.is_pinned())
            except Exception:  # torch without CUDA cannot say
                pinned = None
        return n, pinned, is_cuda
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    total, pinned, cuda = 0, None, False
    for x in items:
        b, p, c = _nbytes(x, depth + 1)
        total += b
        cuda = cuda or c
        if p is not None:
            pinned = p if pinned is None else pinned and p
    return total, pinned, cuda


def _cuda():
    """torch, when it is imported and has started CUDA in this process (profile never starts it)."""
    torch = sys.modules.get("torch")
    try:
        return torch if torch is not None and torch.cuda.is_initialized() else None
    except Exception:
        return None


class _Sampler(threading.Thread):
    """sluice_machine_sample (and the GPUs') every `interval` seconds while the loop runs; the C call releases
    the GIL, so the loop is not held up."""

    def __init__(self, interval):
        super().__init__(name="sluice-profile", daemon=True)
        self.interval, self.samples, self.stop = interval, [], threading.Event()

    @staticmethod
    def take():
        s = MachineSample()
        if lib.sluice_machine_sample(C.byref(s), 0) < 0:
            return None
        procs = {p.pid: (p.name.decode(errors="replace"), p.cpu_s, p.rss, p.read_bytes, p.rchar, p.ppid)
                 for p in s.proc[:s.nprocs]}
        disks = [(d.name.decode(), d.reads, d.read_bytes, d.read_wait_s, d.busy_s) for d in s.disk[:s.ndisks]]
        return {"t": s.t, "ncpus": s.ncpus, "busy_s": s.all.busy_s, "idle_s": s.all.idle_s,
                "iowait_s": s.all.iowait_s, "cpu": [c.busy_s for c in s.cpu[:s.ncpus]],
                "mem_available": s.mem_available, "page_cache": s.page_cache, "mlocked": s.mlocked,
                "disks": disks, "rx": sum(n.rx_bytes for n in s.nic[:s.nnics]),
                "tx": sum(n.tx_bytes for n in s.nic[:s.nnics]), "procs": procs, "gpu": _gpus()}

    def run(self):
        while not self.stop.wait(self.interval):
            s = self.take()
            if s:
                self.samples.append(s)
                if len(self.samples) > 20000:  # a long run: every other sample dropped, and half the rate
                    del self.samples[1::2]
                    self.interval *= 2


def _gpus():
    from ._lib import GpuSample
    g = (GpuSample * 8)()
    n = lib.sluice_gpu_sample(g, 8)
    return [(x.util_pct, x.mem_used) for x in g[:max(0, min(n, 8))]]


class profile:
    """Where the loop's time goes, and why.

        for batch in sluice.profile(dataloader):     # any iterable: each batch's wait is timed
            step(batch)

        with sluice.profile(loader) as p:            # or around a loop over it (a DataLoader, a sluice.Loader)
            for batch in loader:
                step(batch)
        p.report -> {"verdict", "evidence", "fix", "expected", "wait_share", "batches", ...}

    With no argument inside `with`, the last sluice.Loader created.  A one-line verdict goes to `file` (stderr by
    default; None for silence) at the end.  The verdict is one of compute-bound (the loop's own work is the limit:
    the pipeline keeps up), cpu-bound (loading processes busy decoding or transforming), storage-bound (waiting
    on reads from storage), startup-bound (workers starting at each epoch), ipc-bound (loading neither busy nor
    reading, the batches slow to arrive all the same), transfer-bound (copies of pageable batches to the GPU),
    and for a sluice.Loader its own loader-bound; each with the figures behind it.
    """

    def __init__(self, source=None, file=..., interval=0.2, nvtx=False, sampler=None):
        if not (isinstance(interval, (int, float)) and math.isfinite(interval) and 0.01 <= interval <= 60):
            raise ValueError(f"sluice.profile(interval={interval!r}): seconds between samples, 0.01 to 60")
        self.source, self.file, self.interval, self.report, self.nvtx = source, file, interval, None, nvtx
        self._shared = sampler        # a sampler of someone else's (sluice diagnose's, for every loader)
        self._stats, self._stats_from, self._iter_end = None, None, None
        self._spans = []  # (wait start, batch in hand) of each batch, perf_counter seconds: its wait is their gap
        self._steps, self._firsts, self._thread_cpu = [], [], 0.0
        self._events, self._bytes, self._pinned, self._on_gpu = [], 0, None, False
        self._swapped, self._last, self._sampler, self._t0 = None, None, None, None

    # Timing a batch's wait, wherever the loop takes its batches from.
    def _wrap(self, make):
        """Times make() (the iterable's __iter__: a DataLoader starts its workers there) with the first batch's
        wait, then each batch's."""
        first, t_iter, c_iter = True, time.perf_counter(), time.thread_time()
        it = make()
        try:
            yield from self._timed(it, first, t_iter, c_iter)
        finally:  # the loop is over (its end asked for, or left): the time after it is not the pipeline's
            self._iter_end = time.perf_counter()
            self._snapshot()

    def _snapshot(self):
        """A sluice.Loader's own stats, taken while it is open (a loader closed later has none)."""
        src = self.source if self.source is not None else self._stats_from() if self._stats_from else None
        if src is not None and type(src).__module__.startswith("sluice") and hasattr(src, "stats"):
            try:
                self._stats = src.stats()
            except Exception:  # closed: the last snapshot stays
                pass

    def _timed(self, it, first, t_iter, c_iter):
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            if first:
                t0, c0 = t_iter, c_iter
            if self._last is not None:
                self._steps.append(t0 - self._last)
            torch = _cuda() if self.nvtx else None
            if torch is not None:
                torch.cuda.nvtx.range_push("sluice: waiting for a batch")
            try:
                b = next(it)
            except StopIteration:
                self._last = None
                return
            finally:
                if torch is not None:
                    torch.cuda.nvtx.range_pop()
            t1 = time.perf_counter()
            self._thread_cpu += time.thread_time() - c0
            self._spans.append((t0, t1))
            if first:
                self._firsts.append(len(self._spans) - 1)
                first = False
            if len(self._spans) <= 4 or len(self._spans) % 16 == 0:  # the batch's size, now and then
                n, pinned, cuda = _nbytes(b)
                self._bytes, self._on_gpu = n, self._on_gpu or cuda
                self._pinned = pinned if self._pinned is None else self._pinned if pinned is None else self._pinned and pinned
            torch = _cuda()
            if torch is not None and len(self._events) < _EVENTS:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                self._events.append(e)
            self._last = time.perf_counter()
            yield b

    def __iter__(self):
        if self.source is None:
            raise TypeError("sluice.profile(): iterate over profile(iterable), or use `with profile(loader):`")
        if self.report is not None:
            raise RuntimeError("sluice.profile: this one has reported; make another to profile again")
        started = self._t0 is None
        if started:
            self._start()
        try:
            yield from self._wrap(lambda: iter(self.source))
        finally:
            if started:
                self._finish()

    def __enter__(self):
        if self.source is None:
            from . import loader as _ld
            self.source = _ld._last_loader() if _ld._last_loader else None
            if self.source is None:
                raise RuntimeError("sluice.profile: no Loader to watch (give it the iterable: profile(dataloader))")
        if self._t0 is not None:
            raise RuntimeError("sluice.profile: a profile runs once; make another to profile again")
        cls, me = type(self.source), self

        def items(obj):  # an object iterable through __getitem__ alone (the sequence protocol)
            i = 0
            while True:
                try:
                    yield cls.__getitem__(obj, i)
                except IndexError:
                    return
                i += 1

        # The loop iterates the source itself: its class becomes a subclass whose __iter__ is timed, for the block.
        try:
            class Profiled(cls):
                _sluice_profiled, _sluice_closed = True, False

                def __iter__(self_):
                    return me._wrap(lambda: cls.__iter__(self_) if hasattr(cls, "__iter__") else items(self_))
            Profiled.__name__ = Profiled.__qualname__ = cls.__name__
            self.source.__class__ = Profiled
            self._swapped, self._profiled = cls, Profiled
        except TypeError:
            raise TypeError(f"sluice.profile: cannot watch a {cls.__name__} from outside; iterate through the "
                            "profiler instead: `for batch in sluice.profile(it):`") from None
        self._start()
        return self

    def __exit__(self, *exc):
        if self._swapped is not None:
            # Its own subclass off, and any left by profiles that ended out of order.
            self._profiled._sluice_closed = True
            while getattr(type(self.source), "_sluice_profiled", False) and type(self.source)._sluice_closed:
                self.source.__class__ = type(self.source).__bases__[0]
            self._swapped = None
        self._snapshot()
        self._finish()
        return False

    def _start(self):
        if self._t0 is not None:
            raise RuntimeError("sluice.profile: a profile runs once; make another to profile again")
        self._sampler = self._shared or _Sampler(self.interval)
        self._first_sample = _Sampler.take()
        self._t0, self._m0, self._thread0 = time.perf_counter(), time.monotonic(), time.thread_time()
        if not self._shared:
            self._sampler.start()

    def _finish(self):
        now = time.perf_counter()
        end = min(self._iter_end, now) if self._iter_end else now
        if self._last is not None:  # the last batch's step: to the loop's end
            self._steps.append(max(end - self._last, 0.0))
            self._last = None
        self._loop_thread_cpu = time.thread_time() - self._thread0
        if not self._shared:
            self._sampler.stop.set()
            self._sampler.join()
        last = _Sampler.take()
        # The samples of the loop's time alone (the monotonic clocks of the C sample and of Python agree).
        end_m = self._m0 + (end - self._t0) + self._sampler.interval
        between = [s for s in list(self._sampler.samples) if self._m0 <= s["t"] <= end_m]
        samples = [s for s in [self._first_sample] + between + ([last] if last and last["t"] <= end_m else []) if s]
        self.report = _report(self, end - self._t0, samples)
        self.report["timeline"] = _timeline(self, samples)
        if self.file is not None:
            r = self.report
            print(f"sluice: {r['batches']} batches, the loop waited {100 * r['wait_share']:.1f}% of its time for data: "
                  f"{r['verdict']}. {' '.join(r['evidence'][:2])} {r['fix']}",
                  file=sys.stderr if self.file is ... else self.file)


def _timeline(p, samples):
    """Over the run, for charts and traces: each batch's wait and the loop's work after it (ms, from the start),
    and between samples the cores busy (the machine's, and each process's), disk reads, the page cache and the
    GPUs' utilisation."""
    t0 = p._t0
    starts = set(p._firsts)
    batches = [{"t": a - t0, "wait_ms": 1e3 * (b - a), "step_ms": 1e3 * s, "epoch_start": i in starts}
               for i, ((a, b), s) in enumerate(zip(p._spans, p._steps + [0.0] * (len(p._spans) - len(p._steps))))]
    out = []
    for a, b in zip(samples, samples[1:]):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        total = sum(b[k] - a[k] for k in ("busy_s", "idle_s", "iowait_s"))
        procs = {str(pid): (v[1] - a["procs"][pid][1]) / dt for pid, v in b["procs"].items() if pid in a["procs"]}
        reads = sum(d[2] for d in b["disks"]) - sum(d[2] for d in a["disks"] if any(d[0] == x[0] for x in b["disks"]))
        out.append({"t": b["t"] - samples[0]["t"],
                    "busy_cores": (b["busy_s"] - a["busy_s"]) / total * b["ncpus"] if total > 0 else 0.0,
                    "procs": procs, "disk_read_mb_s": max(reads, 0) / dt / 1e6, "page_cache_gb": b["page_cache"] / 1e9,
                    "gpu_util": [u for u, _ in b["gpu"]]})
    names = {str(pid): v[0] for s in samples for pid, v in s["procs"].items()}
    return {"batches": batches, "samples": out, "process_names": names}


def _median_ms(v):
    return 1e3 * statistics.median(v) if v else 0.0


def _report(p, wall, samples):
    """The figures, the verdict, its evidence and the fix, from a finished profile's timings and samples."""
    waits = [b - a for a, b in p._spans]
    n = len(waits)
    wait, firsts = sum(waits), sum(waits[i] for i in p._firsts)
    r = {"batches": n, "seconds": wall, "wait_s": wait, "wait_share": wait / wall if wall > 0 else 0.0,
         "first_batch_wait_s": firsts, "epochs": len(p._firsts), "wait_ms_p50": _median_ms(waits),
         "wait_ms_p90": 1e3 * sorted(waits)[int(0.9 * (n - 1))] if n else 0.0, "step_ms_p50": _median_ms(p._steps),
         "batch_bytes": p._bytes, "pinned": p._pinned, "on_gpu": p._on_gpu, "wait_thread_cpu_s": p._thread_cpu}
    torch = _cuda()
    if torch is not None and len(p._events) > 1:
        p._events[-1].synchronize()
        r["gpu_step_ms_p50"] = statistics.median(a.elapsed_time(b) for a, b in zip(p._events, p._events[1:]))
    r["loop_thread_cpu_s"] = getattr(p, "_loop_thread_cpu", 0.0)
    r.update(_machine(samples, n, p.interval))
    if p._stats is None:
        p._snapshot()
    if p._stats is not None:
        st = p._stats
        r["loader"] = st
        for k in ("gpu_wait_share", "step_us", "loader_us", "h2d_us"):
            r[k] = st.get(k)
    r.update(_verdict(r))
    return r


def _machine(samples, batches, interval=0.2):
    """What the samples say over the run: each process's CPU, the machine's, storage, memory, network, GPUs."""
    if len(samples) < 2:
        return {"processes": [], "cpu": None, "storage": None}
    a, b = samples[0], samples[-1]
    dt = max(b["t"] - a["t"], 1e-9)
    root = next(iter(a["procs"]), None)
    # Every process seen in any sample (a DataLoader without persistent workers starts new ones each epoch, and
    # they are gone by the last sample): its counters from its first sample (from 0 when it started during the
    # run) to its last, and how long it was seen alive.
    seen = {}
    for i, smp in enumerate(samples):
        for pid, v in smp["procs"].items():
            first = seen.setdefault(pid, {"first": v, "t0": smp["t"], "rss_max": 0})
            first["last"], first["t1"] = v, smp["t"]
            first["rss_max"] = max(first["rss_max"], v[2])
    procs = []
    for pid, x in seen.items():
        v0, v1 = x["first"], x["last"]
        cpu0, rb0, rc0 = (v0[1], v0[3], v0[4]) if x["t0"] == a["t"] else (0.0, 0, 0)
        # Seen once or twice: alive for at least one interval (a short-lived child is not busy 3e7 cores).
        alive = max(x["t1"] - (x["t0"] if x["t0"] > a["t"] else a["t"]), interval)
        procs.append({"pid": pid, "name": v1[0], "role": "main" if pid == root else "worker",
                      "cpu_s": v1[1] - cpu0, "alive_s": alive, "busy_share": (v1[1] - cpu0) / alive,
                      "read_bytes": v1[3] - rb0, "rchar": v1[4] - rc0, "rss_max": x["rss_max"]})
    workers_max = max((sum(1 for pid in smp["procs"] if pid != root) for smp in samples), default=0)
    ncpus = b["ncpus"] or os.cpu_count() or 1
    busy = b["busy_s"] - a["busy_s"]
    total = busy + (b["idle_s"] - a["idle_s"]) + (b["iowait_s"] - a["iowait_s"])
    per_core = [(y - x) / dt for x, y in zip(a["cpu"], b["cpu"])]
    disks = {d[0]: d for d in a["disks"]}
    reads = rbytes = rwait = 0
    busy_disk = 0.0
    for name, rd, rby, rw, bs in b["disks"]:
        if name in disks:
            _, rd0, rby0, rw0, bs0 = disks[name]
            reads, rbytes, rwait = reads + rd - rd0, rbytes + rby - rby0, rwait + rw - rw0
            busy_disk = max(busy_disk, (bs - bs0) / dt)
    tree_read = sum(x["read_bytes"] for x in procs)
    tree_rchar = sum(x["rchar"] for x in procs)
    gpu = None
    if any(s["gpu"] for s in samples):
        utils = [u for s in samples for u, _ in s["gpu"] if u >= 0]
        gpu = {"util_pct_p50": statistics.median(utils) if utils else None,
               "mem_used_max": max((m for s in samples for _, m in s["gpu"]), default=0)}
    return {
        "processes": procs, "workers_max": workers_max,
        "cpu": {"cores": ncpus, "busy_cores": (busy / total * ncpus) if total > 0 else 0.0,
                "iowait_cores": ((b["iowait_s"] - a["iowait_s"]) / total * ncpus) if total > 0 else 0.0,
                "per_core_busy": per_core},
        "storage": {"read_bytes": tree_read, "rchar": tree_rchar,
                    "page_cache_share": (1 - tree_read / tree_rchar) if tree_rchar > tree_read else 0.0,
                    "disk_read_bytes_s": rbytes / dt, "disk_reads_s": reads / dt, "disk_busy_share": min(busy_disk, 1.0),
                    "read_latency_ms": 1e3 * rwait / reads if reads else None, "read_wait_s": rwait,
                    "read_kb_avg": rbytes / reads / 1e3 if reads else None},
        "memory": {"page_cache": b["page_cache"], "available": b["mem_available"], "mlocked": b["mlocked"],
                   "rss_max": sum(x["rss_max"] for x in procs)},
        "network": {"rx_bytes_s": (b["rx"] - a["rx"]) / dt, "tx_bytes_s": (b["tx"] - a["tx"]) / dt},
        "gpu": gpu,
    }


def _verdict(r):
    """The verdict, the evidence (its numbers, as sentences) and the fix the evidence supports."""
    n, ev = r["batches"], []
    if not n:
        return {"verdict": "no batches yet", "evidence": ["no batch was taken inside the block"], "fix": "",
                "expected": None}
    share, step, wait = r["wait_share"], r["step_ms_p50"], r["wait_ms_p50"]
    rate = n / r["seconds"] if r["seconds"] > 0 else 0.0
    ev.append(f"the loop waited {100 * share:.1f}% of {r['seconds']:.1f} s for its {n} batches "
              f"(wait p50 {wait:.1f} ms, its own work p50 {step:.1f} ms a batch, {rate:.1f} batches/s)")
    loader = r.get("loader")
    # sluice.Loader's own verdict, where its figures bear it out: its time a batch (or its copies') above the step's
    # (or no step to speak of: under 0.1 ms).
    step_us = loader.get("step_us", 0) if loader is not None else 0
    own = loader is not None and (
        (loader.get("verdict") == "loader-bound" and (loader.get("loader_us", 0) > step_us or step_us < 100)) or
        (loader.get("verdict") == "transfer-bound" and (loader.get("h2d_us", 0) > step_us or step_us < 100)))
    if own and share >= WAIT_OK:
        ev.append(f"sluice's loader: {loader.get('loader_us', 0) / 1e3:.1f} ms of its own a batch against "
                  f"{loader.get('step_us', 0) / 1e3:.1f} ms of step; copies {loader.get('h2d_us', 0) / 1e3:.1f} ms")
        fix = ("the copies to the GPU are the limit: larger batches, or fewer bytes a batch"
               if loader["verdict"] == "transfer-bound" else
               "the loader's reads or collation are the limit: loader.stats() names the stage")
        return {"verdict": loader["verdict"], "evidence": ev, "fix": fix, "expected": None}
    copy = _copy_share(r)
    if copy is not None and copy["share"] >= 0.25:
        ev.append(f"each batch is {r['batch_bytes'] / 1e6:.1f} MB of pageable memory: a copy to the GPU takes "
                  f"{copy['pageable_ms']:.1f} ms from it against {copy['pinned_ms']:.1f} ms pinned (measured now), "
                  f"{100 * copy['share']:.0f}% of the loop's work a batch")
        return {"verdict": "transfer-bound", "evidence": ev,
                "fix": "pin_memory=True in the DataLoader and .to('cuda', non_blocking=True)",
                "expected": {"step_ms": max(step - copy["pageable_ms"] + copy["pinned_ms"], 0.0)}}
    if share < WAIT_OK:
        gpu = r.get("gpu") or {}
        if gpu.get("util_pct_p50") is not None:
            ev.append(f"GPU busy {gpu['util_pct_p50']:.0f}% (NVML, p50)")
        return {"verdict": "compute-bound", "evidence": ev,
                "fix": "the pipeline keeps up: faster loading will not speed this loop up", "expected": None}
    if r["epochs"] and r["first_batch_wait_s"] >= 0.5 * r["wait_s"] and n > r["epochs"]:
        ev.append(f"the first batch of each of {r['epochs']} epochs waited {r['first_batch_wait_s']:.2f} s of the "
                  f"{r['wait_s']:.2f} s waited in all (workers starting)")
        return {"verdict": "startup-bound", "evidence": ev,
                "fix": "persistent_workers=True (DataLoader) keeps the workers from one epoch to the next",
                "expected": {"seconds": r["seconds"] - r["first_batch_wait_s"] + r["epochs"] * wait / 1e3}}
    procs, cpu, sto = r.get("processes") or [], r.get("cpu") or {}, r.get("storage") or {}
    workers = _workers(r)
    cores = cpu.get("cores") or os.cpu_count() or 1
    idle = max(cores - cpu.get("busy_cores", 0.0), 0.0)
    main = next((x for x in procs if x["role"] == "main"), None)
    # The loop's process's other threads (a prefetching thread, a pin-memory thread): its CPU less the loop's.
    threads = max((main["cpu_s"] if main else 0.0) - r.get("loop_thread_cpu_s", 0.0), 0.0)
    if workers:
        load_cpu = sum(x["cpu_s"] for x in workers)
        busy = load_cpu / sum(x["alive_s"] for x in workers)
        at_once = max(r.get("workers_max") or len(workers), 1)
        who = (f"{at_once} worker processes busy {100 * busy:.0f}% of a core each"
               + (f" ({len(workers)} over the run)" if len(workers) > at_once else ""))
    elif threads >= BUSY * r["seconds"]:
        load_cpu, busy = threads, threads / r["seconds"]
        who = f"other threads of the loop's process busy {busy:.2f} cores (no worker processes)"
    else:
        load_cpu = r["wait_thread_cpu_s"]
        busy = load_cpu / r["wait_s"] if r["wait_s"] > 0 else 0.0
        who = f"the loop's own thread busy {100 * busy:.0f}% of its wait (no workers)"
    per_batch = load_cpu / n
    ev.append(f"{who}; {1e3 * per_batch:.1f} ms of loading CPU a batch; {cpu.get('busy_cores', 0):.1f} of "
              f"{cores} cores busy")
    stored, rchar = sto.get("read_bytes", 0), sto.get("rchar", 0)
    # Busy loading, or busy enough while the machine has no core left idle.
    if (busy >= BUSY or (busy >= BUSY / 2 and idle < 0.5)) and loader is not None and not workers:
        # A sluice.Loader's threads are the busy ones: it has no workers to add; its own stages name the cost.
        return {"verdict": "loader-bound", "evidence": ev,
                "fix": "the loader's reads, decoding or collation are the limit: loader.stats() names the stage",
                "expected": None}
    if busy >= BUSY or (busy >= BUSY / 2 and idle < 0.5):
        have = max(r.get("workers_max") or len(workers), 1)
        more = int(have + idle) if idle >= 1 else have
        expected = None
        pred = predict_rate(r, more) if more > have else None
        if pred:
            expected = {"workers": more, "batches_s": pred, "speedup": pred / rate if rate else None}
            fix = (f"more workers while cores are idle: {more} should give about {pred:.1f} batches/s "
                   f"({pred / rate:.2f}x), or move decoding to the GPU (sluice.Images)")
        else:
            fix = "every core is busy: move decoding and augmentation to the GPU (sluice.Images), or lighter transforms"
        return {"verdict": "cpu-bound", "evidence": ev, "fix": fix, "expected": expected}
    # Storage, where its reads' time could explain the wait: the disks' read time (its share of the wait), the
    # disks busy, or cores in iowait.
    if (stored > 0.5 * max(rchar, 1) and sto.get("read_wait_s", 0) >= 0.3 * r["wait_s"]) or \
            sto.get("disk_busy_share", 0) > 0.5 or cpu.get("iowait_cores", 0) > 0.5:
        lat = sto.get("read_latency_ms")
        ev.append(f"{stored / 1e6:.1f} MB read from storage of {rchar / 1e6:.1f} MB asked for "
                  f"({100 * sto.get('page_cache_share', 0):.0f}% from the page cache); disk busy "
                  f"{100 * sto.get('disk_busy_share', 0):.0f}%, {sto.get('disk_reads_s', 0):.0f} reads/s"
                  + (f" of {sto['read_kb_avg']:.0f} KB, {lat:.2f} ms each" if lat is not None else ""))
        return {"verdict": "storage-bound", "evidence": ev,
                "fix": "pack small files into shards read sequentially (sluice pack), or more workers to keep more "
                       "reads in flight", "expected": None}
    ev.append(f"{stored / 1e6:.1f} MB read from storage of {rchar / 1e6:.1f} MB asked for; disk busy "
              f"{100 * sto.get('disk_busy_share', 0):.0f}%")
    return {"verdict": "ipc-bound", "evidence": ev,
            "fix": "the loading is neither busy nor reading: batches wait in hand-over (larger batches, fewer Python "
                   "objects a batch, persistent_workers, a higher prefetch_factor)", "expected": None}


def _workers(r):
    """The loading processes: the loop's process's descendants that did work (5% of their time busy)."""
    return [x for x in r.get("processes") or [] if x["role"] == "worker" and x["cpu_s"] > 0.05 * x["alive_s"]]


def _loading_cpu(r):
    """CPU seconds the loading took a batch: its worker processes', or without any the loop's thread's in its
    waits."""
    workers = _workers(r)
    load = sum(x["cpu_s"] for x in workers) if workers else r["wait_thread_cpu_s"]
    return load / r["batches"] if r["batches"] else 0.0


def predict_rate(r, workers):
    """Batches a second a CPU-bound loop should reach with `workers` loading processes (0: the loop's own thread),
    from a profile report's figures: the loading CPU a batch spread over the workers (no more of them than the
    cores the loop's own process leaves), no faster than the loop's own work (on the host, and on the GPU: its
    busy share of the run, NVML's, a batch).  None where the figures say nothing."""
    per = _loading_cpu(r)
    if per <= 0 or not r["batches"]:
        return None
    step = r["step_ms_p50"] / 1e3
    gpu = (r.get("gpu") or {}).get("util_pct_p50")
    if gpu:
        step = max(step, gpu / 100 * r["seconds"] / r["batches"])
    if workers == 0:
        return 1 / (per + step)
    cores = (r.get("cpu") or {}).get("cores") or os.cpu_count() or 1
    main = next((x["busy_share"] for x in r.get("processes") or [] if x["role"] == "main"), 1.0)
    w = min(workers, max(cores - main, 1))
    return min(w / per, 1 / step if step > 0 else float("inf"))


def _copy_share(r):
    """For CPU batches headed to a GPU (torch with CUDA started, batches not pinned): a pageable and a pinned
    copy of one batch's size, timed now, and the pageable one's share of the loop's work a batch."""
    torch = _cuda()
    if torch is None or r["on_gpu"] or r["pinned"] is not False or r["batch_bytes"] < (8 << 20):
        return None
    n = r["batch_bytes"]
    host = torch.empty(n, dtype=torch.uint8)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")

    def timed(src):
        dev.copy_(src)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(3):
            dev.copy_(src, non_blocking=src.is_pinned())
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / 3 * 1e3
    pageable_ms, pinned_ms = timed(host), timed(pinned)
    step = r["step_ms_p50"]
    return {"pageable_ms": pageable_ms, "pinned_ms": pinned_ms, "share": pageable_ms / step if step > 0 else 0.0}
