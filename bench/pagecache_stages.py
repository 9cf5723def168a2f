"""Where page-cache DMA spends its time (issue #25, part 2): a warm file's pages registered read-only with
cuMemHostRegister, copied with cuMemcpyHtoDAsync and unregistered, one call of N MiB at a time over 256 MiB of
a 1 GiB file, each step timed (median per call over 3 passes): on the main thread, waiting on an event instead
of the stream, with a mapping made per call, and handed to another thread (as the engine hands a call to a
worker), pinned to the GPU's NUMA node or not; beside them sluice's copy path and its page-cache DMA on one
handle (SLUICE_PAGECACHE_DMA_MAX).  bench/pagecache_dma.py measures the rates at more sizes, bytes checked.

    python3 bench/pagecache_stages.py 1,4,16
"""
import ctypes as C
import mmap
import os
import queue
import statistics
import sys
import threading
import time

import torch
from sluice._lib import lib, check

F = "/tmp/pcx.bin"
SIZE, SPAN = 1 << 30, 256 << 20
READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY


def cpu_list(text):
    """The CPUs of a sysfs cpulist ("0-7,16-23")."""
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def main():
    with open(F, "wb") as f:
        f.write(os.urandom(SIZE))
    with open(F, "rb") as f:  # warm
        while f.read(64 << 20):
            pass
    want = torch.from_file(F, size=SPAN, dtype=torch.uint8).cuda()
    dev = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
    cu = C.CDLL("libcuda.so.1")
    ctx, d, bus = C.c_void_p(), C.c_int(), C.create_string_buffer(64)
    cu.cuCtxGetCurrent(C.byref(ctx))
    cu.cuCtxGetDevice(C.byref(d))
    cu.cuDeviceGetPCIBusId(bus, 64, d)
    libc = C.CDLL(None, use_errno=True)
    libc.mmap.restype = C.c_void_p
    libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
    libc.munmap.argtypes = [C.c_void_p, C.c_size_t]
    fd = os.open(F, os.O_RDONLY)
    host = libc.mmap(None, SIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    busid = bus.value.decode().lower()
    try:
        node = int(open(f"/sys/bus/pci/devices/{busid}/numa_node").read())
        cpus = cpu_list(open(f"/sys/devices/system/node/node{max(node, 0)}/cpulist").read().strip())
    except (OSError, ValueError):
        node, cpus = -1, set()
    print(f"GPU {busid}, NUMA node {node}, its CPUs {sorted(cpus)}", flush=True)
    stage = {}

    def stream_and_event():
        s, e = C.c_void_p(), C.c_void_p()
        cu.cuCtxSetCurrent(ctx)
        cu.cuStreamCreate(C.byref(s), 1)  # non-blocking, as the engine's
        cu.cuEventCreate(C.byref(e), 2)  # no timing, as the engine's
        return s, e

    def regdma(off, n, s, ev=None, fresh=False):
        """Register, copy, wait (the stream, or ev), unregister: each step's time kept in stage."""
        t0 = time.perf_counter()
        p = C.c_void_p(libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, off) if fresh else host + off)
        if cu.cuMemHostRegister_v2(p, C.c_size_t(n), READ_ONLY):
            raise RuntimeError("cuMemHostRegister")
        t1 = time.perf_counter()
        rc = cu.cuMemcpyHtoDAsync_v2(C.c_uint64(dev.data_ptr() + off), p, C.c_size_t(n), s)
        if ev is not None:
            rc = rc or cu.cuEventRecord(ev, s) or cu.cuEventSynchronize(ev)
        else:
            rc = rc or cu.cuStreamSynchronize(s)
        t2 = time.perf_counter()
        cu.cuMemHostUnregister(p)
        t3 = time.perf_counter()
        if fresh:
            libc.munmap(p, n)
        if rc:
            raise RuntimeError(f"copy: CUDA error {rc}")
        for k, v in (("register", t1 - t0), ("copy", t2 - t1), ("unregister", t3 - t2)):
            stage.setdefault(k, []).append(v)

    def timed(name, n, one, reps=3):
        gbs = []
        dev.zero_()
        for _ in range(reps):
            stage.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for off in range(0, SPAN, n):
                one(off, n)
            torch.cuda.synchronize()
            gbs.append(SPAN / (time.perf_counter() - t0) / 1e9)
        if not torch.equal(dev[:SPAN], want):
            raise SystemExit(f"{name}: the bytes differ from the file")
        st = " ".join(f"{k} {statistics.median(v) * 1e6:.0f} us" for k, v in stage.items())
        print(f"{n >> 20:>3} MiB  {name:36s} {statistics.median(gbs):6.2f} GB/s  {st}", flush=True)

    class Worker:
        """A thread that does regdma for the caller, handed each call through a queue."""
        def __init__(self, pin):
            self.q, self.r = queue.Queue(), queue.Queue()
            threading.Thread(target=self.run, args=(pin,), daemon=True).start()

        def run(self, pin):
            if pin and cpus:
                os.sched_setaffinity(0, cpus)
            s, e = stream_and_event()
            while True:
                off, n = self.q.get()
                try:
                    regdma(off, n, s, e)
                    self.r.put(None)
                except Exception as ex:
                    self.r.put(ex)

        def one(self, off, n):
            self.q.put((off, n))
            ex = self.r.get()
            if ex:
                raise ex

    def engine(dma_max):
        os.environ.update(SLUICE_PAGECACHE_DMA_MIN="4096", SLUICE_PAGECACHE_DMA_MAX=str(dma_max))
        cfg, e, f = C.c_void_p(), C.c_void_p(), C.c_void_p()
        check(lib.sluice_config_new(C.byref(cfg)))
        check(lib.sluice_engine_open(C.byref(e), cfg))
        check(lib.sluice_file_open(C.byref(f), e, os.fsencode(F), 0))
        return lambda off, n: check(lib.sluice_file_read(f, off, n, C.c_void_p(dev.data_ptr() + off), None))

    lib.sluice_file_read.restype = C.c_ssize_t
    lib.sluice_file_read.argtypes = [C.c_void_p, C.c_uint64, C.c_size_t, C.c_void_p, C.c_void_p]
    s_main, e_main = stream_and_event()
    unpinned, pinned = Worker(False), Worker(True)
    copy_path, dma_path = engine(0), engine(64 << 20)
    for n in [int(x) << 20 for x in (sys.argv[1] if len(sys.argv) > 1 else "1,4,16").split(",")]:
        timed("main thread, stream wait", n, lambda o, m: regdma(o, m, s_main))
        timed("main thread, event wait", n, lambda o, m: regdma(o, m, s_main, e_main))
        timed("main thread, a mapping a call", n, lambda o, m: regdma(o, m, s_main, fresh=True))
        timed("handed to a thread", n, unpinned.one)
        timed("handed to a thread on the GPU's node", n, pinned.one)
        timed("sluice copy path, one handle", n, copy_path)
        timed("sluice page-cache DMA, one handle", n, dma_path)


if __name__ == "__main__":
    main()
