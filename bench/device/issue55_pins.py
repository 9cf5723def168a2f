"""Issue 55: what pinning host memory costs on the GPU machine: cudaHostRegister of memory already touched, 4 MiB
(a bounce slot), 16 MiB (a worker's slots) and 256 MiB (the engine's pool), madvised for huge pages or not."""
import ctypes
import mmap
import time

import torch

torch.empty(1, device="cuda")
rt = torch.cuda.cudart()
libc = ctypes.CDLL(None)
for huge in (1, 0):
    for n in (4 << 20, 16 << 20, 256 << 20):
        m = mmap.mmap(-1, n)
        a = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if huge:
            libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(n), 14)  # MADV_HUGEPAGE
        t0 = time.perf_counter()
        m.write(b"\0" * n)
        t1 = time.perf_counter()
        r = rt.cudaHostRegister(a, n, 0)
        t2 = time.perf_counter()
        rt.cudaHostUnregister(a)
        print(f"huge={huge} {n >> 20} MiB: touch {(t1 - t0) * 1e3:.2f} ms, cudaHostRegister {(t2 - t1) * 1e3:.2f} ms ({r})")
