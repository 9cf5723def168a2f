"""Page-cache pages straight to the GPU (issue #25, part 2): a warm file's pages registered with the driver and
copied by DMA with no CPU copy, against sluice's copy path, at sizes from 1 MiB to the file's, with the link's
rate beside them; and the copy path's knobs, into GPU and into plain host memory, against plain preads.

Contenders, in one process, passes interleaved, medians, every one checked once against the file (a sum of
64-bit words; on the GPU for GPU memory):

  link                    the same bytes copied from pinned host memory (the warm ceiling)
  sluice (defaults)       sluice.read with the defaults (the default engine of the Python package)
  page-cache DMA          sluice.read with page-cache DMA at every size of --dma-range (SLUICE_PAGECACHE_DMA_MIN
                          and _MAX)
  copy path               sluice.read: page cache -> pinned slot -> GPU (engines of T threads and S-byte slots;
                          "copy path (defaults)": the defaults); SLUICE_PAGECACHE_DMA_MAX=0 for these
  register+DMA            the file mmapped, chunk by chunk registered read-only with cuMemHostRegister
                          (CU_MEMHOSTREGISTER_READ_ONLY) by T threads, each chunk copied with cuMemcpyHtoDAsync
                          once registered and unregistered once copied: registration, DMA and unregistration
                          overlap across threads; "register only" times the registration alone
  host: pread xT          T threads of plain preads (8 MiB each) of the page cache into plain memory
  host: sluice            sluice.read into the same plain memory

A size below the file's is read as consecutive calls of that size covering --span bytes (a call each, as a
user reading 1 MiB records makes): sluice_read_to_gpu(path, ...), which opens the file each call, or
sluice_file_read on one handle ("one handle").

    python3 bench/pagecache_dma.py --size 8G --sizes 1M,16M,256M,4G,8G --reps 5 --sweep
"""
import argparse
import ctypes as C
import mmap
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import GB, Results, make_file, parse_size, side_by_side  # noqa: E402

READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY


def threaded(threads, size, piece, fn):
    """fn(off, n) for every piece of [0, size), by threads threads taking the next piece; raises the first
    error."""
    nxt, lock, errs = [0], threading.Lock(), []

    def worker():
        try:
            while True:
                with lock:
                    off = nxt[0]
                    nxt[0] += piece
                if off >= size or errs:
                    return
                fn(off, min(piece, size - off))
        except Exception as e:
            errs.append(e)
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/sluice-pagecache.bin")
    ap.add_argument("--size", default="8G", help="the file's size")
    ap.add_argument("--sizes", default="1M,16M,256M,4G,8G", help="bytes a call")
    ap.add_argument("--span", default="1G", help="bytes a pass covers at sizes below it")
    ap.add_argument("--knobs", default="12x4M,16x4M,12x1M,16x1M,16x2M", help="copy-path engines: THREADSxSLOT")
    ap.add_argument("--dma-range", default="256K-16M", help="the page-cache DMA engine's MIN-MAX")
    ap.add_argument("--sweep", action="store_true", help="at the file's size, register+DMA's chunks and threads too")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="pagecache_dma.json")
    a = ap.parse_args()
    import torch
    import sluice
    from sluice._lib import lib, check
    size, span = parse_size(a.size), parse_size(a.span)
    make_file(a.file, size)
    with open(a.file, "rb") as f:  # warm: every page in the page cache
        while f.read(64 << 20):
            pass
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    plain = np.ones(size, dtype=np.uint8)  # touched: no first-touch faults in the timed passes
    want = int(torch.from_file(a.file, size=size // 8, dtype=torch.int64).sum())
    cu = C.CDLL("libcuda.so.1")
    ctx = C.c_void_p()
    assert cu.cuCtxGetCurrent(C.byref(ctx)) == 0 and ctx.value, "no current CUDA context (torch starts one)"
    libc = C.CDLL(None, use_errno=True)  # the file mapped through libc, where ctypes sees its address
    libc.mmap.restype = C.c_void_p
    libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
    fd = os.open(a.file, os.O_RDONLY)
    host = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if host in (None, C.c_void_p(-1).value):
        raise SystemExit(f"mmap of {a.file} failed: {os.strerror(C.get_errno())}")
    pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
    pinned.copy_(torch.from_file(a.file, size=size, dtype=torch.uint8))

    def engine(threads=None, slot=None, dma=(0, 0)):
        """An engine (the defaults but for threads and slot given) doing page-cache DMA for calls of dma's
        bytes (0, 0: never): the setting is read at the engine's open."""
        cfg, e = C.c_void_p(), C.c_void_p()
        check(lib.sluice_config_new(C.byref(cfg)))
        if threads:
            check(lib.sluice_config_set_threads(cfg, threads))
        if slot:
            check(lib.sluice_config_set_max_transfer_size(cfg, slot))
        os.environ.update(SLUICE_PAGECACHE_DMA_MIN=str(max(dma[0], 4096)), SLUICE_PAGECACHE_DMA_MAX=str(dma[1]))
        try:
            check(lib.sluice_engine_open(C.byref(e), cfg))
        finally:
            for k in ("SLUICE_PAGECACHE_DMA_MIN", "SLUICE_PAGECACHE_DMA_MAX"):
                os.environ.pop(k, None)
        lib.sluice_config_free(cfg)
        return e

    def calls(n, one):
        """A pass of calls of n bytes: one(off, n) over [0, max(n, span)), timed."""
        cover = max(n, min(span, size) // n * n)

        def run():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for off in range(0, cover, n):
                one(off, n)
            torch.cuda.synchronize()
            return {"gb_s": cover / (time.perf_counter() - t0) / GB, "bytes": cover}
        return run

    def link(off, n):
        dev[off:off + n].copy_(pinned[off:off + n], non_blocking=True)

    def copy_path(eng, dst):
        def one(off, n):
            check(lib.sluice_read_to_gpu(eng, os.fsencode(a.file), off, n, C.c_void_p(dst + off), None))
        return one

    lib.sluice_file_read.restype = C.c_ssize_t
    lib.sluice_file_read.argtypes = [C.c_void_p, C.c_uint64, C.c_size_t, C.c_void_p, C.c_void_p]

    def handle_path(eng, dst):
        """sluice_file_read on one handle kept open (its mapping, for page-cache DMA, made once)."""
        f = C.c_void_p()
        check(lib.sluice_file_open(C.byref(f), eng, os.fsencode(a.file), 0))

        def one(off, n):
            check(lib.sluice_file_read(f, off, n, C.c_void_p(dst + off), None))
        return one

    streams = threading.local()  # a stream a thread, made once, outside every pass's time

    def stream():
        if not hasattr(streams, "s"):
            cu.cuCtxSetCurrent(ctx)
            streams.s = C.c_void_p()
            if cu.cuStreamCreate(C.byref(streams.s), 1):
                raise RuntimeError("cuStreamCreate")
        return streams.s

    def register(chunk, threads, copy=True):
        pool = ThreadPoolExecutor(threads)  # kept between passes, as its streams are

        def piece(o, m):
            s, p = stream(), C.c_void_p(host + o)
            rc = cu.cuMemHostRegister_v2(p, C.c_size_t(m), READ_ONLY)
            if rc:
                raise RuntimeError(f"cuMemHostRegister: {rc}")
            if copy:
                rc = cu.cuMemcpyHtoDAsync_v2(C.c_uint64(dev.data_ptr() + o), p, C.c_size_t(m), s)
                rc = rc or cu.cuStreamSynchronize(s)
            cu.cuMemHostUnregister(p)
            if rc:
                raise RuntimeError(f"cuMemcpyHtoDAsync: {rc}")

        def one(off, n):
            pieces = [(o, min(chunk, off + n - o)) for o in range(off, off + n, chunk)]
            if len(pieces) == 1:
                piece(*pieces[0])
            else:
                list(pool.map(lambda om: piece(*om), pieces))
        return one

    def pread(threads, piece=8 << 20):
        view = memoryview(plain)

        def one(off, n):
            def rd(o, m):
                if os.preadv(fd, [view[off + o:off + o + m]], off + o) != m:
                    raise RuntimeError("short pread")
            threaded(threads, n, piece, rd)
        return one

    engines = {}
    for k in a.knobs.split(","):
        t, s = k.split("x")
        engines[k] = engine(int(t), parse_size(s))
    default = sluice.buffers._eng()
    copy_only, dma = engine(), engine(dma=tuple(parse_size(x) for x in a.dma_range.split("-")))

    def checked(name, fn):
        """One pass, its bytes checked; the contender is kept only if they match."""
        dev.zero_()
        plain[:] = 0
        r = fn()
        n = r["bytes"]
        got = int(plain[:n].view(np.int64).sum()) if name.startswith("host") else int(dev[:n].view(torch.int64).sum())
        if got != (want if n == size else int(torch.from_file(a.file, size=n // 8, dtype=torch.int64).sum())):
            raise RuntimeError(f"{name}: the bytes differ from the file")
        return fn

    res = Results(a.out, bench="pagecache_dma", size=size, span=span)
    say = lambda m: print(f"[pagecache] {m}", flush=True)  # noqa: E731
    # 1. By size: the link, the copy path (defaults), register+DMA at its best chunk and thread count of the
    #    knob sweep below, one call of each size or a run of them.
    for s_name in a.sizes.split(","):
        n = parse_size(s_name)
        if n > size:
            continue
        cont = {"link": calls(n, link), "sluice (defaults)": calls(n, copy_path(default, dev.data_ptr())),
                "copy path (defaults)": calls(n, copy_path(copy_only, dev.data_ptr())),
                f"page-cache DMA {a.dma_range}": calls(n, copy_path(dma, dev.data_ptr())),
                "copy path, one handle": calls(n, handle_path(copy_only, dev.data_ptr())),
                "page-cache DMA, one handle": calls(n, handle_path(dma, dev.data_ptr()))}
        for chunk in sorted({min(n, 32 << 20), min(n, 128 << 20)}):
            cont[f"register+DMA {chunk >> 10}K x8"] = calls(n, register(chunk, 8))
        if n == size and a.sweep:
            for chunk in (8 << 20, 32 << 20, 128 << 20):
                for t in (1, 4, 8, 16):
                    cont[f"register+DMA {chunk >> 20}M x{t}"] = calls(n, register(chunk, t))
                    cont[f"register only {chunk >> 20}M x{t}"] = calls(n, register(chunk, t, copy=False))
        for k, e in engines.items():
            cont[f"copy path {k}"] = calls(n, copy_path(e, dev.data_ptr()))
        if n == size:
            for k, e in engines.items():
                cont[f"host: sluice {k}"] = calls(n, copy_path(e, plain.ctypes.data))
            cont["host: sluice (defaults)"] = calls(n, copy_path(default, plain.ctypes.data))
            for t in (8, 16, 32):
                cont[f"host: pread x{t}"] = calls(n, pread(t))
        kept = {}
        for name, fn in cont.items():
            try:
                kept[name] = fn if "only" in name else checked(name, fn)
            except Exception as e:
                res[f"{s_name} {name} error"] = repr(e)
                say(f"{s_name} {name}: {e!r}")
        got = side_by_side(kept, a.reps)
        res[s_name] = got
        for name, r in got.items():
            say(f"{s_name:>5} {name:28s} " + (f"{r['gb_s']:6.2f} GB/s  (passes {min(r['passes']):.2f}-"
                                              f"{max(r['passes']):.2f})" if "gb_s" in r else r.get("error", "")))


if __name__ == "__main__":
    main()
