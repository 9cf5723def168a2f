"""Page-cache pages straight to the GPU (issue #25, part 2), an experiment: a warm file mmapped, its pages
registered with the driver read-only chunk by chunk (cuMemHostRegister, CU_MEMHOSTREGISTER_READ_ONLY) by
T threads at once, each chunk copied to the GPU as soon as it is registered (cuMemcpyHtoDAsync on the thread's
stream) and unregistered once its copy is done, so registration, DMA and unregistration overlap.  Beside it, in
the same process and passes interleaved: the link's rate (the same bytes copied from pinned memory) and
sluice.read of the warm file into GPU memory (its copy path: page cache -> pinned slot -> GPU).  Every pass's
bytes are checked against the file (a sum of 64-bit words on the GPU).

    python3 bench/pagecache_dma.py --size 4G --chunks 16M,64M --threads 1,4,8,16 --reps 5

GB/s, medians; the registration alone (no copy) is timed too, as it was the limit of a one-thread try (one
thread registered about 24 GB/s).
"""
import argparse
import ctypes as C
import mmap
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import GB, Results, parse_size, side_by_side  # noqa: E402

READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/sluice-pagecache.bin")
    ap.add_argument("--size", default="4G")
    ap.add_argument("--chunks", default="16M,64M")
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="pagecache_dma.json")
    a = ap.parse_args()
    import torch
    import sluice
    size = parse_size(a.size)
    if not os.path.exists(a.file) or os.path.getsize(a.file) != size:
        with open(a.file, "wb") as f:
            for _ in range(size >> 26):
                f.write(os.urandom(64 << 20))
    with open(a.file, "rb") as f:  # warm: every page in the page cache
        while f.read(64 << 20):
            pass
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    want = int(torch.from_file(a.file, size=size // 8, dtype=torch.int64).sum())
    cu = C.CDLL("libcuda.so.1")
    ctx = C.c_void_p()
    assert cu.cuCtxGetCurrent(C.byref(ctx)) == 0 and ctx.value, "no current CUDA context (torch starts one)"
    # The file mapped through libc, where ctypes sees its address.
    libc = C.CDLL(None, use_errno=True)
    libc.mmap.restype = C.c_void_p
    libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
    fd = os.open(a.file, os.O_RDONLY)
    host = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if host in (None, C.c_void_p(-1).value):
        raise SystemExit(f"mmap of {a.file} failed: {os.strerror(C.get_errno())}")

    def check():
        torch.cuda.synchronize()
        got = int(dev.view(torch.int64).sum())
        if got != want:
            raise RuntimeError("the GPU's bytes differ from the file")

    def register_pass(chunk, threads, copy=True):
        def run():
            nxt, lock, errs = [0], threading.Lock(), []

            def worker():
                cu.cuCtxSetCurrent(ctx)
                stream = C.c_void_p()
                cu.cuStreamCreate(C.byref(stream), 1)
                while True:
                    with lock:
                        off = nxt[0]
                        nxt[0] += chunk
                    if off >= size:
                        break
                    n = min(chunk, size - off)
                    p = C.c_void_p(host + off)
                    rc = cu.cuMemHostRegister_v2(p, C.c_size_t(n), READ_ONLY)
                    if rc:
                        errs.append(f"cuMemHostRegister {rc}")
                        break
                    if copy:
                        rc = cu.cuMemcpyHtoDAsync_v2(C.c_uint64(dev.data_ptr() + off), p, C.c_size_t(n), stream)
                        rc = rc or cu.cuStreamSynchronize(stream)
                    cu.cuMemHostUnregister(p)
                    if rc:
                        errs.append(f"copy {rc}")
                        break
                cu.cuStreamDestroy_v2(stream)
            ts = [threading.Thread(target=worker) for _ in range(threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            secs = time.perf_counter() - t0
            if errs:
                raise RuntimeError(errs[0])
            return {"gb_s": size / secs / GB, "seconds": secs}
        return run

    pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
    pinned.copy_(torch.from_file(a.file, size=size, dtype=torch.uint8))

    def link():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()
        return {"gb_s": size / (time.perf_counter() - t0) / GB}

    def sluice_read():
        t0 = time.perf_counter()
        sluice.read(a.file, dev)
        torch.cuda.synchronize()
        return {"gb_s": size / (time.perf_counter() - t0) / GB}

    contenders = {"link: pinned to GPU": link, "sluice.read (copy path)": sluice_read}
    for ch in (parse_size(c) for c in a.chunks.split(",")):
        for t in (int(x) for x in a.threads.split(",")):
            contenders[f"register+DMA {ch >> 20}M x{t}"] = register_pass(ch, t)
            contenders[f"register only {ch >> 20}M x{t}"] = register_pass(ch, t, copy=False)
    for name, fn in contenders.items():  # each once, checked
        if "only" in name:
            continue
        dev.zero_()
        try:
            fn()
            check()
        except Exception as e:
            print(f"[pagecache] {name}: {e!r}", flush=True)
    got = side_by_side(contenders, a.reps)
    res = Results(a.out, bench="pagecache_dma", size=size)
    res["passes"] = got
    for name, r in got.items():
        print(f"[pagecache] {name:32s} " + (f"{r['gb_s']:6.2f} GB/s" if "gb_s" in r else r.get("error", "")),
              flush=True)


if __name__ == "__main__":
    main()
