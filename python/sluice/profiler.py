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
        procs = {p.pid: (p.name.decode(errors="replace"), p.cpu_s, p.rss, p.read_bytes, p.rchar, p.ppid,
                         _runqs.total(p.pid))
                 for p in s.proc[:s.nprocs]}
        disks = [(d.name.decode(), d.reads, d.read_bytes, d.read_wait_s, d.busy_s) for d in s.disk[:s.ndisks]]
        return {"t": s.t, "ncpus": s.ncpus, "busy_s": s.all.busy_s, "idle_s": s.all.idle_s,
                "iowait_s": s.all.iowait_s, "cpu": [c.busy_s for c in s.cpu[:s.ncpus]],
                "mem_available": s.mem_available, "page_cache": s.page_cache, "mlocked": s.mlocked,
                "disks": disks, "rx": sum(n.rx_bytes for n in s.nic[:s.nnics]),
                "tx": sum(n.tx_bytes for n in s.nic[:s.nnics]), "procs": procs, "gpu": _gpus()}

    def run(self):
        try:  # its own CPU and wait for a core, counted apart from the loop's process's other threads
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = None
        try:
            while not self.stop.wait(self.interval):
                s = self.take()
                if s:
                    s["sampler_cpu"], s["sampler_runq"] = time.thread_time(), _runq_s(None, fd) if fd else None
                    self.samples.append(s)
                    if len(self.samples) > 20000:  # a long run: every other sample dropped, and half the rate
                        del self.samples[1::2]
                        self.interval *= 2
        finally:
            if fd:
                os.close(fd)


def _runq_s(path, fd=None):
    """Seconds a task has waited on a run queue for a CPU (/proc/.../schedstat's second field; None where the
    kernel keeps no such count).  A busy process on a machine whose cores other work takes waits here."""
    try:
        if fd is not None:
            line = os.pread(fd, 96, 0)
        else:
            with open(path, "rb") as f:
                line = f.read(96)
        return int(line.split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class _RunQueues:
    """Each process's run-queue wait, in seconds, that only grows: its living threads' counts (a DataLoader
    worker's, or the loop's process's prefetching and pinning threads beside the loop's own), plus those of its
    threads that ended (a sum over the living alone would lose them).  None where the kernel keeps no count."""

    def __init__(self):
        self.lock, self.last, self.ended = threading.Lock(), {}, {}

    def total(self, pid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
        now = {}
        for t in tids:
            q = _runq_s(f"/proc/{pid}/task/{t}/schedstat")
            if q is not None:
                now[t] = q
            elif os.path.exists(f"/proc/{pid}/task/{t}"):
                return None  # no count kept
        with self.lock:
            gone = sum(q for t, q in self.last.get(pid, {}).items() if t not in now)
            self.ended[pid] = self.ended.get(pid, 0.0) + gone
            self.last[pid] = now
            return self.ended[pid] + sum(now.values())


_runqs = _RunQueues()


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
    the pipeline keeps up), cpu-bound (the loading busy decoding or transforming, or waiting for a core),
    storage-bound (waiting on the loading's own reads from storage), latency-bound (the loading neither busy nor
    reading: each worker, or the loop's thread, waits on a fetch a sample), startup-bound (workers starting again
    at each epoch, where keeping them can help), ipc-bound (the loop's thread busy taking batches over from the
    workers), transfer-bound (copies of pageable batches to the GPU), and for a sluice.Loader its own
    loader-bound; each with the figures behind it.  It is decided on the steady state: each epoch's first batch
    (and a DataLoader's prefetch burst after it) is start-up, reported as evidence.  The workers are those the
    iterable names (a DataLoader's, a multiprocessing Pool's), busy or not; another child of the script is not.
    """

    def __init__(self, source=None, file=..., interval=0.2, nvtx=False, sampler=None):
        if not (isinstance(interval, (int, float)) and math.isfinite(interval) and 0.01 <= interval <= 60):
            raise ValueError(f"sluice.profile(interval={interval!r}): seconds between samples, 0.01 to 60")
        self.source, self.file, self.interval, self.report, self.nvtx = source, file, interval, None, nvtx
        self._shared = sampler        # a sampler of someone else's (sluice diagnose's, for every loader)
        self._stats, self._stats_from, self._iter_end = None, None, None
        self._spans = []  # (wait start, batch in hand) of each batch, perf_counter seconds: its wait is their gap
        self._steps, self._firsts, self._thread_cpu = [], [], 0.0
        # Each batch's, in the loop's thread: its CPU and run-queue time in the wait, its CPU clock at the wait's start.
        self._wait_cpu, self._wait_runq, self._wait_c0, self._wait_q0, self._runq_fd = [], [], [], [], None
        self._q_start = self._q_end = None
        self._worker_pids, self._dataloader = set(), None  # the loading processes the iterable names
        self._events, self._bytes, self._pinned, self._on_gpu = [], 0, None, False
        self._swapped, self._last, self._sampler, self._t0 = None, None, None, None

    # Timing a batch's wait, wherever the loop takes its batches from.
    def _wrap(self, make):
        """Times make() (the iterable's __iter__: a DataLoader starts its workers there) with the first batch's
        wait, then each batch's."""
        first, t_iter, c_iter = True, time.perf_counter(), time.thread_time()
        it = make()
        self._note_workers(it)
        try:
            yield from self._timed(it, first, t_iter, c_iter)
        finally:  # the loop is over (its end asked for, or left): the time after it is not the pipeline's
            self._iter_end = time.perf_counter()
            self._snapshot()

    def _note_workers(self, it):
        """The loading processes an iterator names, by pid: a torch DataLoader's workers (with its worker count,
        prefetch_factor and persistent_workers), a multiprocessing Pool's.  Only they count as the loading's: any
        other child of the script (a logger, an evaluator) is not a worker however busy."""
        try:
            ws = getattr(it, "_workers", None)
            if ws is None:
                ws = getattr(getattr(it, "_pool", None), "_pool", None)
            if isinstance(ws, list):
                self._worker_pids |= {w.pid for w in ws if type(getattr(w, "pid", None)) is int}
            nw = getattr(it, "_num_workers", None)
            if type(nw) is int and hasattr(it, "_persistent_workers"):
                pf = getattr(it, "_prefetch_factor", None)
                self._dataloader = {"num_workers": nw, "prefetch_factor": pf if type(pf) is int else 2,
                                    "persistent_workers": bool(it._persistent_workers)}
        except Exception:  # an iterator of any kind: what it will not say is not known
            pass

    def _snapshot(self):
        """A sluice.Loader's own stats, taken while it is open (a loader closed later has none)."""
        src = self.source if self.source is not None else self._stats_from() if self._stats_from else None
        if src is not None and type(src).__module__.startswith("sluice") and hasattr(src, "stats"):
            try:
                self._stats = src.stats()
            except Exception:  # closed: the last snapshot stays
                pass

    def _timed(self, it, first, t_iter, c_iter):
        if self._runq_fd is None:  # this thread's (the loop's) own count, read twice a batch
            try:
                self._runq_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._runq_fd = -1
        fd = self._runq_fd if self._runq_fd >= 0 else None
        if self._q_start is None and fd is not None:
            self._q_start = _runq_s(None, fd)
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            q0 = _runq_s(None, fd) if fd is not None else None
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
            c1 = time.thread_time() - c0
            q1 = _runq_s(None, fd) if q0 is not None else None
            self._thread_cpu += c1
            self._wait_cpu.append(c1)
            self._wait_c0.append(c0)
            self._wait_q0.append(q0)
            self._wait_runq.append(q1 - q0 if q1 is not None else None)
            self._spans.append((t0, t1))
            if first:
                self._firsts.append(len(self._spans) - 1)
                first = False
            if len(self._spans) <= 4 or len(self._spans) % 16 == 0:  # the batch's size, now and then
                try:
                    n, pinned, cuda = _nbytes(b)
                except Exception:  # a batch whose nbytes (or items) raise: its size is not known, the loop goes on
                    n, pinned, cuda = self._bytes, None, False
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
        self._thread_end = time.thread_time()
        self._loop_thread_cpu = self._thread_end - self._thread0
        if self._runq_fd is not None and self._runq_fd >= 0:
            self._q_end = _runq_s(None, self._runq_fd)
            os.close(self._runq_fd)
        self._runq_fd = -1
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


def _steady(p, samples):
    """The steady state of the run, apart from its start-up: each epoch's first batch (workers starting) and, for
    a DataLoader with workers, the burst that follows it (each worker's prefetch_factor batches, made while the
    first waited) are left out.  Its batches, seconds (their waits and the loop's work after each), waits, the
    loop's thread's CPU and run-queue time in them, and the samples from its first batch on."""
    waits = [b - a for a, b in p._spans]
    steps = p._steps + [0.0] * (len(waits) - len(p._steps))
    dl = p._dataloader
    burst = dl["num_workers"] * max(dl["prefetch_factor"], 1) if dl and dl["num_workers"] > 0 else 0
    starts = sorted(set(p._firsts)) or [0]
    epoch = [0] * len(waits)
    for k, a in enumerate(starts):
        for i in range(a, starts[k + 1] if k + 1 < len(starts) else len(waits)):
            epoch[i] = k
    kept = []
    for skip in (1 + burst, 1, 0):  # a short epoch: fewer left out, never all
        kept = [i for i in range(len(waits)) if i - starts[epoch[i]] >= skip]
        if kept:
            break
    kept_set = set(kept)
    out = {"batches": len(kept), "from_batch": kept[0] if kept else 0, "left_out": len(waits) - len(kept),
           "wait_s": sum(waits[i] for i in kept), "seconds": sum(waits[i] + steps[i] for i in kept),
           "startup_wait_s": sum(w for i, w in enumerate(waits) if i not in kept_set and epoch[i] == 0),
           "restart_wait_s": sum(w for i, w in enumerate(waits) if i not in kept_set and epoch[i] > 0),
           "wait_thread_cpu_s": sum(p._wait_cpu[i] for i in kept if i < len(p._wait_cpu))}
    rq = [p._wait_runq[i] for i in kept if i < len(p._wait_runq)]
    out["wait_runq_s"] = sum(rq) if rq and all(x is not None for x in rq) else None
    out["wait_share"] = out["wait_s"] / out["seconds"] if out["seconds"] > 0 else 0.0
    # The samples from the steady state's first batch (the one just before it as the base), where they are enough.
    window = samples
    if kept and out["left_out"]:
        since = p._m0 + (p._spans[kept[0]][0] - p._t0)
        before = [s for s in samples if s["t"] <= since]
        after = [s for s in samples if s["t"] > since]
        if len(after) >= 2:
            window = before[-1:] + after
    steady = window is not samples and kept[0] < len(p._wait_c0)
    c0 = p._wait_c0[kept[0]] if steady else p._thread0
    out["loop_thread_cpu_s"] = max(getattr(p, "_thread_end", c0) - c0, 0.0)
    q0 = p._wait_q0[kept[0]] if steady else p._q_start
    out["loop_thread_runq_s"] = p._q_end - q0 if p._q_end is not None and q0 is not None else None
    return out, window


def _report(p, wall, samples):
    """The figures, the verdict, its evidence and the fix, from a finished profile's timings and samples."""
    waits = [b - a for a, b in p._spans]
    n = len(waits)
    wait, firsts = sum(waits), sum(waits[i] for i in p._firsts)
    r = {"batches": n, "seconds": wall, "wait_s": wait, "wait_share": wait / wall if wall > 0 else 0.0,
         "first_batch_wait_s": firsts, "epochs": len(p._firsts), "wait_ms_p50": _median_ms(waits),
         "wait_ms_p90": 1e3 * sorted(waits)[int(0.9 * (n - 1))] if n else 0.0, "step_ms_p50": _median_ms(p._steps),
         "batch_bytes": p._bytes, "pinned": p._pinned, "on_gpu": p._on_gpu, "wait_thread_cpu_s": p._thread_cpu,
         "dataloader": p._dataloader, "workers_known": bool(p._worker_pids), "worker_pids": sorted(p._worker_pids)}
    torch = _cuda()
    if torch is not None and len(p._events) > 1:
        p._events[-1].synchronize()
        r["gpu_step_ms_p50"] = statistics.median(a.elapsed_time(b) for a, b in zip(p._events, p._events[1:]))
    r["loop_thread_cpu_s"] = getattr(p, "_loop_thread_cpu", 0.0)
    r["steady"], window = _steady(p, samples)
    # The machine's figures are the steady state's: a worker's start-up (spawn imports torch) is not its load.
    r.update(_machine(window, n, p.interval, p._worker_pids))
    if p._stats is None:
        p._snapshot()
    if p._stats is not None:
        st = p._stats
        r["loader"] = st
        for k in ("gpu_wait_share", "step_us", "loader_us", "h2d_us"):
            r[k] = st.get(k)
    r.update(_verdict(r))
    return r


def _machine(samples, batches, interval=0.2, worker_pids=()):
    """What the samples say over the run: each process's CPU (and its wait for a core), the machine's, storage,
    memory, network, GPUs.  Where the iterable named its workers (worker_pids), only they have the role
    "worker"; the script's other children are "other".  Without, every child is taken for a worker."""
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
        born = x["t0"] != a["t"]
        cpu0, rb0, rc0 = (0.0, 0, 0) if born else (v0[1], v0[3], v0[4])

        # Seen once or twice: alive for at least one interval (a short-lived child is not busy 3e7 cores).
        alive = max(x["t1"] - (x["t0"] if born else a["t"]), interval)
        role = "main" if pid == root else "worker" if not worker_pids or pid in worker_pids else "other"
        rq0, rq1 = (0.0 if born else v0[6] if len(v0) > 6 else None), v1[6] if len(v1) > 6 else None
        runq = rq1 - rq0 if rq0 is not None and rq1 is not None else None
        procs.append({"pid": pid, "name": v1[0], "role": role, "cpu_s": v1[1] - cpu0, "alive_s": alive,
                      "busy_share": (v1[1] - cpu0) / alive, "runq_s": runq,
                      "read_bytes": v1[3] - rb0, "rchar": v1[4] - rc0, "rss_max": x["rss_max"]})
    workers_max = max((sum(1 for pid in smp["procs"] if pid != root and (not worker_pids or pid in worker_pids))
                       for smp in samples), default=0)
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
    own = [smp for smp in samples if "sampler_cpu" in smp]
    sampler = {"cpu_s": own[-1]["sampler_cpu"] - own[0]["sampler_cpu"] if len(own) > 1 else 0.0,
               "runq_s": own[-1]["sampler_runq"] - own[0]["sampler_runq"]
               if len(own) > 1 and own[0]["sampler_runq"] is not None and own[-1]["sampler_runq"] is not None else 0.0}
    return {
        "processes": procs, "workers_max": workers_max, "window_s": dt, "sampler": sampler,
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


def _steady_of(r):
    """The steady state's batches, seconds, waits and share (the whole run's where a report has none)."""
    st = r.get("steady") or {}
    n = st.get("batches") or r["batches"]
    if not st.get("batches"):
        return {"batches": n, "seconds": r["seconds"], "wait_s": r["wait_s"], "wait_share": r["wait_share"],
                "wait_thread_cpu_s": r["wait_thread_cpu_s"], "wait_runq_s": None, "left_out": 0,
                "startup_wait_s": 0.0, "restart_wait_s": 0.0}
    return st


def _loading(r):
    """Who loads the batches in the steady state, and how hard: kind ("workers", "threads", "loop"), a sentence,
    its CPU seconds, its busy share, its share busy or waiting for a core (demand), the share waiting alone, and
    the worker processes.  The workers the iterable named, else the children that did work; without any, the
    loop's process's other threads where they did more than the loop's own thread in its waits, else that thread."""
    st, procs = _steady_of(r), r.get("processes") or []
    workers = _workers(r)
    if workers:
        load = sum(x["cpu_s"] for x in workers)
        alive = sum(x["alive_s"] for x in workers) or 1e-9
        rq = [x.get("runq_s") for x in workers]
        known = all(q is not None for q in rq)
        runq = sum(rq) if known else 0.0
        at_once = max(r.get("workers_max") or len(workers), 1)
        busy = load / alive
        who = (f"{at_once} worker process{'es' * (at_once != 1)} busy {100 * busy:.0f}% of a core each"
               + (f" ({len(workers)} over the run)" if len(workers) > at_once else ""))
        return {"kind": "workers", "who": who, "cpu_s": load, "busy": busy, "demand": (load + runq) / alive,
                "queued": runq / alive, "workers": workers, "runq_unknown": not known}
    # The loop's process's other threads (a prefetching thread, a pin-memory thread): its CPU less the loop's
    # thread's, over the samples' window, and the same of their wait for a core.
    main = next((x for x in procs if x["role"] == "main"), None)
    secs = r.get("window_s") or r["seconds"]
    own = r.get("sampler") or {}  # the profile's own sampling thread is not the loading
    threads = max((main["cpu_s"] if main else 0.0) - st.get("loop_thread_cpu_s", r.get("loop_thread_cpu_s", 0.0))
                  - own.get("cpu_s", 0.0), 0.0)
    loop_q = st.get("loop_thread_runq_s")
    threads_q = max(main["runq_s"] - loop_q - own.get("runq_s", 0.0), 0.0) \
        if main and main.get("runq_s") is not None and loop_q is not None else 0.0
    load, w = st["wait_thread_cpu_s"], st["wait_s"]
    # They are the loading where they did more than the loop's thread in its waits, a millisecond a batch or more.
    if threads > load and threads >= 1e-3 * st["batches"]:
        busy = threads / secs
        return {"kind": "threads", "who": f"other threads of the loop's process busy {busy:.2f} cores (no worker "
                "processes)", "cpu_s": threads, "busy": busy, "demand": (threads + threads_q) / secs,
                "queued": threads_q / secs, "workers": [], "runq_unknown": False}
    busy = load / w if w > 0 else 0.0
    runq = st.get("wait_runq_s")
    q = (runq or 0.0) / w if w > 0 else 0.0
    return {"kind": "loop", "who": f"the loop's own thread busy {100 * busy:.0f}% of its wait (no workers)",
            "cpu_s": load, "busy": busy, "demand": busy + q, "queued": q, "workers": [],
            "runq_unknown": runq is None}


def _verdict(r):
    """The verdict, the evidence (its numbers, as sentences) and the fix the evidence supports.  It is decided on
    the steady state (_steady); the start-up is evidence, and startup-bound only where what it advises can help
    the run measured (several epochs, workers that start again each)."""
    n, ev = r["batches"], []
    if not n:
        return {"verdict": "no batches yet", "evidence": ["no batch was taken inside the block"], "fix": "",
                "expected": None}
    share, step, wait = r["wait_share"], r["step_ms_p50"], r["wait_ms_p50"]
    rate = n / r["seconds"] if r["seconds"] > 0 else 0.0
    st = _steady_of(r)
    s_share = st["wait_share"]
    s_rate = st["batches"] / st["seconds"] if st["seconds"] > 0 else rate
    # The loop's thread waiting for a core inside its waits (a busy machine preempted it) is not a wait for data:
    # a thread that waits for data sleeps, it does not queue for a core.
    own_q = min(st.get("wait_runq_s") or 0.0, st["wait_s"])
    data_share = (st["wait_s"] - own_q) / st["seconds"] if st["seconds"] > 0 else s_share
    ev.append(f"the loop waited {100 * share:.1f}% of {r['seconds']:.1f} s for its {n} batches "
              f"(wait p50 {wait:.1f} ms, its own work p50 {step:.1f} ms a batch, {rate:.1f} batches/s)")
    startup = st["startup_wait_s"] + st["restart_wait_s"]
    if st["left_out"] and startup >= 0.05 * max(r["wait_s"], 1e-9):
        own = f", {s_rate * step / 1e3:.2f}x the {1e3 / step:.1f} batches/s its own work allows" if step >= 0.1 else ""
        ev_start = (f"start-up: the first {'batches' if st['left_out'] > r['epochs'] else 'batch'} of "
                    f"{'each of its ' + str(r['epochs']) + ' epochs' if r['epochs'] > 1 else 'its one epoch'} "
                    f"waited {startup:.2f} s of the {r['wait_s']:.2f} s waited (workers starting, the pipeline "
                    f"filling); the steady state after: {st['batches']} batches, waited {100 * s_share:.1f}% of "
                    f"{st['seconds']:.1f} s, {s_rate:.1f} batches/s{own}")
    else:
        ev_start = None
    loader = r.get("loader")
    dl = r.get("dataloader")
    # sluice.Loader's own verdict, where its figures bear it out: its time a batch (or its copies') above the step's
    # (or no step to speak of: under 0.1 ms).
    step_us = loader.get("step_us", 0) if loader is not None else 0
    own = loader is not None and (
        (loader.get("verdict") == "loader-bound" and (loader.get("loader_us", 0) > step_us or step_us < 100)) or
        (loader.get("verdict") == "transfer-bound" and (loader.get("h2d_us", 0) > step_us or step_us < 100)))
    if own and data_share >= WAIT_OK:
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
    # Workers that start again each epoch, where keeping them can help: a DataLoader with workers that are not
    # persistent, or an iterable that does not say (a sluice.Loader has no workers to keep).
    restarts = st["restart_wait_s"] if st["left_out"] else 0.0
    keepable = loader is None and (dl is None or (dl["num_workers"] > 0 and not dl["persistent_workers"]))
    if r["epochs"] > 1 and keepable and restarts >= 0.5 * r["wait_s"]:
        ev.append(f"the first batch of each of {r['epochs']} epochs waited {r['first_batch_wait_s']:.2f} s of the "
                  f"{r['wait_s']:.2f} s waited in all (workers starting), {restarts:.2f} s of it after the first "
                  "epoch")
        fix = ("persistent_workers=True (DataLoader) keeps the workers from one epoch to the next" if dl else
               "each epoch's iteration starts over slowly: keep its workers from one epoch to the next "
               "(persistent_workers=True for a torch DataLoader)")
        return {"verdict": "startup-bound", "evidence": ev, "fix": fix,
                "expected": {"seconds": r["seconds"] - restarts + (r["epochs"] - 1) * wait / 1e3}}
    if data_share < WAIT_OK:
        gpu = r.get("gpu") or {}
        if gpu.get("util_pct_p50") is not None:
            ev.append(f"GPU busy {gpu['util_pct_p50']:.0f}% (NVML, p50)")
        if own_q >= 0.2 * st["wait_s"] > 0:
            ev.append(f"{100 * own_q / st['wait_s']:.0f}% of the steady state's waits was the loop's own thread "
                      f"waiting for a free core (other work on this machine), not for data: "
                      f"{100 * data_share:.1f}% of its time waited for data")
        if ev_start:
            ev.append(ev_start)
        return {"verdict": "compute-bound", "evidence": ev,
                "fix": "the pipeline keeps up: faster loading will not speed this loop up", "expected": None}
    procs, cpu, sto = r.get("processes") or [], r.get("cpu") or {}, r.get("storage") or {}
    cores = cpu.get("cores") or os.cpu_count() or 1
    idle = max(cores - cpu.get("busy_cores", 0.0), 0.0)
    ld = _loading(r)
    busy, demand, queued, workers = ld["busy"], ld["demand"], ld["queued"], ld["workers"]
    per_batch = ld["cpu_s"] / st["batches"]
    ev.append(ld["who"] + (f", and {100 * queued:.0f}% more waiting for a free core" if queued >= 0.1 else "")
              + f"; {1e3 * per_batch:.1f} ms of loading CPU a batch; {cpu.get('busy_cores', 0):.1f} of {cores} cores "
              "busy")
    for x in procs:  # children of the script's that are not its loading workers, busy all the same
        if x["role"] == "other" and x["busy_share"] >= BUSY / 2:
            ev.append(f"process {x['pid']} ({x['name']}) busy {x['busy_share']:.2f} cores: a child of the script's, "
                      "not one of the loading workers")
    if ev_start:
        ev.append(ev_start)
    stored, rchar = sto.get("read_bytes", 0), sto.get("rchar", 0)
    thread_busy = st["wait_thread_cpu_s"] / st["wait_s"] if st["wait_s"] > 0 else 0.0
    # Busy loading: it ran, or wanted to run (its wait for a core, where other work takes the cores), most of its
    # time; a loading that waits on fetches sleeps (and on a crowded machine queues for a core at each wake-up).
    # Where no wait for a core is counted, half busy with no core left idle.  Threads of the loop's process also
    # wait for the GIL, which no count shows (a busy machine preempts its holder): a sixth, with no core idle.
    starved = (ld["kind"] == "threads" and demand >= BUSY / 4) or (ld["runq_unknown"] and busy >= BUSY / 2)
    if demand >= BUSY or busy >= BUSY or (starved and idle < 0.5):
        if loader is not None and ld["kind"] != "workers":
            # A sluice.Loader's threads are the busy ones: it has no workers to add; its own stages name the cost.
            return {"verdict": "loader-bound", "evidence": ev,
                    "fix": "the loader's reads, decoding or collation are the limit: loader.stats() names the stage",
                    "expected": None}
        have = max(r.get("workers_max") or len(workers), 1)
        more = int(have + idle) if idle >= 1 else have
        expected = None
        pred = predict_rate(r, more) if more > have else None
        if pred:
            expected = {"workers": more, "batches_s": pred, "speedup": pred / s_rate if s_rate else None}
            fix = (f"more workers while cores are idle: {more} should give about {pred:.1f} batches/s "
                   f"({pred / s_rate:.2f}x), or move decoding to the GPU (sluice.Images)")
        elif queued >= 0.1 and busy < BUSY:
            fix = ("the loading waits for a free core as much as it runs: other work on this machine takes the "
                   "cores; with them back, or with decoding on the GPU (sluice.Images), it goes faster")
        else:
            fix = "every core is busy: move decoding and augmentation to the GPU (sluice.Images), or lighter transforms"
        return {"verdict": "cpu-bound", "evidence": ev, "fix": fix, "expected": expected}
    # Storage, where the loading read from it (not the page cache) and its reads' time could explain the wait: its
    # share of the disks' read time (a share of the wait), or the disks busy or cores in iowait with its reads half
    # of what the disks read.  The disks' figures are the machine's: another job's reads never make this loop
    # storage-bound, nor do a few pages of its own read on a crowded machine.
    disk_bytes = sto.get("disk_read_bytes_s", 0) * (r.get("window_s") or st["seconds"])
    mine = min(stored / disk_bytes, 1.0) if disk_bytes > 0 else float(stored > 0)
    if stored > 0.5 * max(rchar, 1) and (mine * sto.get("read_wait_s", 0) >= 0.3 * st["wait_s"] or (mine >= 0.5 and (
            sto.get("disk_busy_share", 0) > 0.5 or cpu.get("iowait_cores", 0) > 0.5))):
        lat = sto.get("read_latency_ms")
        ev.append(f"{stored / 1e6:.1f} MB read from storage of {rchar / 1e6:.1f} MB asked for "
                  f"({100 * sto.get('page_cache_share', 0):.0f}% from the page cache); disk busy "
                  f"{100 * sto.get('disk_busy_share', 0):.0f}%, {sto.get('disk_reads_s', 0):.0f} reads/s"
                  + (f" of {sto['read_kb_avg']:.0f} KB, {lat:.2f} ms each" if lat is not None else ""))
        return {"verdict": "storage-bound", "evidence": ev,
                "fix": "pack small files into shards read sequentially (sluice pack), or more workers to keep more "
                       "reads in flight", "expected": None}
    rx = (r.get("network") or {}).get("rx_bytes_s") or 0.0
    ev.append(f"{stored / 1e6:.1f} MB read from storage of {rchar / 1e6:.1f} MB asked for; disk busy "
              f"{100 * sto.get('disk_busy_share', 0):.0f}%; network {rx / 1e6:.1f} MB/s in")
    if ld["kind"] == "workers" and thread_busy >= BUSY / 2:
        ev.append(f"the loop's own thread was busy {100 * thread_busy:.0f}% of its waits, taking the batches over")
        return {"verdict": "ipc-bound", "evidence": ev,
                "fix": "the hand-over of each batch to the loop is the limit (unpickling, copying): larger batches, "
                       "tensors rather than many Python objects a batch, a higher prefetch_factor", "expected": None}
    if loader is not None and ld["kind"] != "workers":
        return {"verdict": "loader-bound", "evidence": ev,
                "fix": "the loader waits on its reads with little CPU or storage busy behind them (a remote store's "
                       "latency): loader.stats() names the stage", "expected": None}
    # Latency: the loading neither busy nor reading, the batches slow to arrive all the same: each worker (or the
    # loop's thread) waits per sample on something else (a fetch over the network, a remote read, a sleep, a lock).
    # More of them keep more waits in flight.
    r_lat = dict(r, verdict="latency-bound")
    have = len(workers)
    more = _latency_workers(r_lat)
    pred = predict_rate(r_lat, more) if more else None
    who = {"workers": f"the {have} workers wait", "threads": "the loading threads wait"}.get(ld["kind"],
                                                                                          "the loop's own thread waits")
    fix = (f"{who} on each batch with little CPU or storage behind it (a fetch, a remote read, a sleep): more "
           f"{'workers' if workers else 'loading workers (num_workers in a DataLoader)'} keep more of those waits "
           "in flight")
    expected = None
    if pred and s_rate:
        expected = {"workers": more, "batches_s": pred, "speedup": pred / s_rate}
        fix += f": {more} should give about {pred:.1f} batches/s ({pred / s_rate:.2f}x)"
    return {"verdict": "latency-bound", "evidence": ev, "fix": fix, "expected": expected}


def _workers(r):
    """The loading processes: those the iterable named (a DataLoader's workers, busy or waiting), else the loop's
    process's children that did work (5% of their time busy)."""
    procs = r.get("processes") or []
    if r.get("workers_known"):
        return [x for x in procs if x["role"] == "worker"]
    return [x for x in procs if x["role"] == "worker" and x["cpu_s"] > 0.05 * x["alive_s"]]


def _loading_cpu(r):
    """CPU seconds the loading took a batch in the steady state (its worker processes', its threads' or the loop's
    thread's in its waits: _loading)."""
    st = _steady_of(r)
    return _loading(r)["cpu_s"] / st["batches"] if st["batches"] else 0.0


def _step_s(r):
    """The loop's own work a batch, in seconds: on the host, and on the GPU (its busy share of the run, NVML's)."""
    step = r["step_ms_p50"] / 1e3
    gpu = (r.get("gpu") or {}).get("util_pct_p50")
    if gpu:
        step = max(step, gpu / 100 * r["seconds"] / r["batches"])
    return step


def _latency_workers(r):
    """The worker count a latency-bound loop should try: enough that the loop's own work becomes the limit, at
    least one more than now, at most four times as many (the prediction is a straight line)."""
    st = _steady_of(r)
    have = len(_workers(r))
    rate = st["batches"] / st["seconds"] if st["seconds"] > 0 else 0.0
    per = have / rate if have and rate else st["wait_s"] / st["batches"]  # a worker's seconds a batch
    step = _step_s(r)
    want = math.ceil(per / step) if step > 0 else 4 * max(have, 1)
    return int(min(max(want, have + 1), 4 * max(have, 2)))


def predict_rate(r, workers):
    """Batches a second the loop should reach with `workers` loading processes (0: the loop's own thread), from a
    profile report's figures, no faster than the loop's own work (on the host, and on the GPU: its busy share of
    the run, NVML's, a batch).  CPU-bound: the loading CPU a batch spread over the workers (no more of them than
    the cores the loop's own process leaves).  Latency-bound: each worker's time a batch, mostly waiting,
    overlapped by more of them, as far as the idle cores carry their CPU.  None where the figures say nothing."""
    per = _loading_cpu(r)
    step = _step_s(r)
    cores = (r.get("cpu") or {}).get("cores") or os.cpu_count() or 1
    main = next((x.get("busy_share", 1.0) for x in r.get("processes") or [] if x["role"] == "main"), 1.0)
    if r.get("verdict") == "latency-bound":
        st = _steady_of(r)
        have = len(_workers(r))
        rate = st["batches"] / st["seconds"] if st["seconds"] > 0 else 0.0
        t = have / rate if have and rate else st["wait_s"] / st["batches"] if st["batches"] else 0.0
        if t <= 0:
            return None
        if workers == 0:
            return 1 / (t + step)
        cap = max(cores - main, 1) / per if per > 0 else float("inf")
        return min(workers / t, 1 / step if step > 0 else float("inf"), cap)
    if per <= 0 or not r["batches"]:
        return None
    if workers == 0:
        return 1 / (per + step)
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
