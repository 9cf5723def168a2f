"""Issue 55: which step of a fresh process's first checkpoint open is slow on the GPU machine (the engine ready
before the clock): each file's open, its first and second small reads, then the library's open of the files."""
import ctypes as C
import glob
import sys
import time

import torch

torch.empty(1, device="cuda")
from sluice._lib import lib  # noqa: E402
from sluice.buffers import _eng  # noqa: E402

e = _eng()
info = C.create_string_buffer(lib.sluice_sizeof(b"sluice_engine_info"))
C.c_size_t.from_buffer(info).value = len(info)
lib.sluice_engine_get_info(e, info)
files = sorted(glob.glob(sys.argv[1] + "/*.safetensors"))
buf = C.create_string_buffer(1 << 16)
ms = lambda t: f"{(time.perf_counter() - t) * 1e3:.2f}"  # noqa: E731
for p in files:
    f = C.c_void_p()
    t = time.perf_counter()
    rc = lib.sluice_file_open(C.byref(f), e, p.encode(), 0)
    a = ms(t)
    t = time.perf_counter()
    lib.sluice_file_read(f, C.c_uint64(0), C.c_size_t(8), buf, None)
    b = ms(t)
    t = time.perf_counter()
    lib.sluice_file_read(f, C.c_uint64(8), C.c_size_t(30000), buf, None)
    c = ms(t)
    t = time.perf_counter()
    lib.sluice_file_read(f, C.c_uint64(8), C.c_size_t(30000), buf, None)
    d = ms(t)
    print(f"{p.rsplit('/', 1)[1]}: open {a} ms (rc {rc}), read 8 B {b}, 30 kB {c}, again {d}")
    lib.sluice_file_close(f)
for k in range(2):
    ck = C.c_void_p()
    paths = (C.c_char_p * len(files))(*[p.encode() for p in files])
    t = time.perf_counter()
    rc = lib.sluice_ckpt_open_files(C.byref(ck), e, paths, len(files), None, None, 0)
    print(f"sluice_ckpt_open_files {k}: {ms(t)} ms (rc {rc})")
    lib.sluice_ckpt_close(ck)
