"""Which nvJPEG output formats its hardware backend writes without a kernel of its own per image (issue #38).

A batch of BATCH JPEGs decoded by nvjpegDecodeBatched (NVJPEG_BACKEND_HARDWARE) into each output format, under
torch.profiler: the GPU work each format costs (kernels and copies, their count per image and time).  Per-image
kernels run beside the training step's and cost it far more than their own time.

    python3 bench/nvjpeg_formats.py /var/tmp/sluice-e2e/imgs --batch 256
"""
import argparse
import ctypes as C
import os


class Image(C.Structure):
    _fields_ = [("channel", C.c_void_p * 4), ("pitch", C.c_size_t * 4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lib", default="/usr/local/cuda/lib64/libnvjpeg.so.13")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(a.dir) for f in fs)[: a.batch]
    datas = [open(f, "rb").read() for f in files]
    nj = C.CDLL(a.lib)
    h, st = C.c_void_p(), C.c_void_p()
    assert nj.nvjpegCreateEx(3, None, None, 0, C.byref(h)) == 0, "no hardware backend"
    assert nj.nvjpegJpegStateCreate(h, C.byref(st)) == 0
    stream = torch.cuda.Stream()
    n = len(datas)
    bufs = (C.c_char_p * n)(*datas)
    lens = (C.c_size_t * n)(*[len(d) for d in datas])
    for fmt, name in ((5, "RGBI"), (3, "RGB"), (1, "YUV"), (0, "UNCHANGED"), (2, "Y")):
        out = (Image * n)()
        keep = []
        for i, d in enumerate(datas):
            nc, sub = C.c_int(), C.c_int()
            w, hh = (C.c_int * 4)(), (C.c_int * 4)()
            assert nj.nvjpegGetImageInfo(h, d, len(d), C.byref(nc), C.byref(sub), w, hh) == 0
            planes = {5: [(w[0] * 3, hh[0])], 3: [(w[0], hh[0])] * 3, 2: [(w[0], hh[0])]}.get(
                fmt, [(w[c], hh[c]) for c in range(nc.value)])
            for c, (pw, ph) in enumerate(planes):
                t = torch.empty(pw * ph, dtype=torch.uint8, device="cuda")
                keep.append(t)
                out[i].channel[c], out[i].pitch[c] = t.data_ptr(), pw
        r = nj.nvjpegDecodeBatchedInitialize(h, st, n, 1, fmt)
        for rep in range(2):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                r = r or nj.nvjpegDecodeBatched(h, st, bufs, lens, out, C.c_void_p(stream.cuda_stream))
                torch.cuda.synchronize()
        if r:
            print(f"{name}: status {r}")
            continue
        ev = [e for e in prof.key_averages() if e.device_time_total > 0 or e.count]
        gpu = [(e.key[:50], e.count, e.device_time_total) for e in ev if e.device_time_total > 0]
        print(f"{name}: " + "; ".join(f"{k} x{c / n:.2f}/image {t / 1e3:.2f} ms" for k, c, t in gpu))


if __name__ == "__main__":
    main()
