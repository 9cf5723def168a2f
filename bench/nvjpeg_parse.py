"""What nvJPEG's header parse costs an image, whole against its header alone (issue #54).

sluice's image stage asks nvJPEG whether its batched hardware decode takes each JPEG (nvjpegJpegStreamParseHeader,
then nvjpegDecodeBatchedSupported) and what sizes it finds, before the batch.  This times that parse on the whole
file against the file's bytes up to the end of its first scan's header (the segment sluice's own probe ends at),
and prints what nvJPEG says of each (supported, components, sizes), which must be the same both ways, for JPEGs
of several kinds: 4:2:0, 4:4:4, 4:2:2, grey, restart markers, progressive.

    python3 bench/nvjpeg_parse.py --reps 2000
"""
import argparse
import ctypes as C
import io
import time

import numpy as np
from PIL import Image


def sos_end(d):
    """The offset just past the first SOS segment (None if there is none)."""
    at = 2
    while at + 4 <= len(d):
        if d[at] != 0xFF:
            return None
        m, n = d[at + 1], int.from_bytes(d[at + 2:at + 4], "big")
        if m == 0xDA:
            return at + 2 + n
        at += 2 + n
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--lib", default="libnvjpeg.so.13")
    a = ap.parse_args()
    nj = C.CDLL(a.lib)
    h, js = C.c_void_p(), C.c_void_p()
    assert nj.nvjpegCreateEx(3, None, None, 0, C.byref(h)) == 0, "no hardware backend"
    assert nj.nvjpegJpegStreamCreate(h, C.byref(js)) == 0
    rng = np.random.default_rng(0)
    base = (rng.random((375, 500, 3)) * 64 + np.linspace(0, 160, 500)[None, :, None]).astype(np.uint8)
    kinds = {"420": dict(subsampling=2), "444": dict(subsampling=0), "422": dict(subsampling=1),
             "grey": dict(mode="L"), "progressive": dict(subsampling=2, progressive=True)}
    for name, kw in kinds.items():
        img = Image.fromarray(base).convert(kw.pop("mode", "RGB"))
        b = io.BytesIO()
        img.save(b, "JPEG", quality=90, **kw)
        d = b.getvalue()
        res = {}
        for part, data in (("whole", d), ("header", d[:sos_end(d)])):
            un, nc = C.c_int(1), C.c_uint()
            w, hh = (C.c_uint * 3)(), (C.c_uint * 3)()
            r = nj.nvjpegJpegStreamParseHeader(h, data, len(data), js)
            r = r or nj.nvjpegDecodeBatchedSupported(h, js, C.byref(un))
            r = r or nj.nvjpegJpegStreamGetComponentsNum(js, C.byref(nc))
            for c in range(min(nc.value, 3)):
                r = r or nj.nvjpegJpegStreamGetComponentDimensions(js, c, C.byref(w, c * 4), C.byref(hh, c * 4))
            t0 = time.perf_counter()
            for _ in range(a.reps):
                nj.nvjpegJpegStreamParseHeader(h, data, len(data), js)
            us = (time.perf_counter() - t0) / a.reps * 1e6
            res[part] = (r, un.value, nc.value, list(w)[:nc.value], list(hh)[:nc.value])
            print(f"{name:12s} {part:7s} {len(data):7d} B  {us:7.2f} us a parse  status, unsupported, components, "
                  f"widths, heights: {res[part]}", flush=True)
        print(f"{name:12s} same both ways: {res['whole'] == res['header']}", flush=True)


if __name__ == "__main__":
    main()
