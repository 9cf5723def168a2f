"""Checkpoints in the safetensors layout, moved by sluice's engine.

Layout (https://github.com/huggingface/safetensors): an unsigned 64-bit little-endian header length N, N bytes
of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data;
offsets are relative to the end of the header.  safetensors reads the files written here and sluice reads
theirs.
"""
import ctypes as C
import json
import os
import struct

import numpy as np

from .buffers import _buffer, _eng, read, write
from ._lib import Range, SluiceError, check, lib

# Every dtype of the safetensors specification: its bits per element, its numpy dtype (None: read as raw bytes)
# and its torch dtype's name (None: none; raw bytes).  F4 packs two elements a byte (torch's float4_e2m1fn_x2,
# whose last dimension is half the file's); F6 types have no torch dtype.
_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
         "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
         "I64": 64, "U64": 64}
_DT = {"F64": (np.float64, "float64"), "F32": (np.float32, "float32"), "F16": (np.float16, "float16"),
       "BF16": (None, "bfloat16"), "I64": (np.int64, "int64"), "I32": (np.int32, "int32"),
       "I16": (np.int16, "int16"), "I8": (np.int8, "int8"), "U8": (np.uint8, "uint8"), "BOOL": (np.bool_, "bool"),
       "U16": (np.uint16, "uint16"), "U32": (np.uint32, "uint32"), "U64": (np.uint64, "uint64"),
       "C64": (np.complex64, "complex64"), "F8_E4M3": (None, "float8_e4m3fn"), "F8_E5M2": (None, "float8_e5m2"),
       "F8_E8M0": (None, "float8_e8m0fnu"), "F4": (None, "float4_e2m1fn_x2"), "F6_E2M3": (None, None),
       "F6_E3M2": (None, None)}
_SIZE = {k: max(1, b // 8) for k, b in _BITS.items()}  # bytes an element's view needs aligned
_HEADER_MAX = 100 << 20


def _st_dtype(t):
    """safetensors dtype name of a numpy array or torch tensor."""
    name = str(t.dtype).replace("torch.", "")
    for k, (npd, tname) in _DT.items():
        if name == tname or (npd is not None and name == np.dtype(npd).name):
            return k
    raise ValueError(f"sluice.save: dtype {t.dtype} has no safetensors name")


def _nbytes(t, dt):
    """Bytes of t in the file: F4's torch dtype holds two elements a byte, as the file does."""
    return int(np.prod(t.shape, dtype=np.int64)) * (1 if dt == "F4" else _BITS[dt] // 8)


def _file(path, flags):
    f = C.c_void_p()
    check(lib.sluice_file_open(C.byref(f), _eng(), os.fsencode(path), flags))
    return f


def _is_url(path):
    return str(path).startswith("s3://")


def _host_bytes(t):
    """A tensor's bytes in host memory, as a flat uint8 numpy array (GPU tensors copied over)."""
    if hasattr(t, "detach"):
        import torch
        return t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()
    return np.ascontiguousarray(t).reshape(-1).view(np.uint8)


def save(tensors, path, metadata=None):
    """Writes a dict of name -> tensor (numpy, or torch on CPU or GPU) to path, durably and atomically:
    a temporary file beside it, the data straight from each tensor's memory, fdatasync, rename, directory
    fsync.  A crash leaves the previous file or the whole new one.  An s3:// path is written as one object
    (the file gathered in host memory, then a multipart upload that appears whole or not at all)."""
    items, header, off = [], {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        if hasattr(t, "contiguous"):
            t = t.contiguous()
        else:
            t = np.ascontiguousarray(t)
        dt = _st_dtype(t)
        n = _nbytes(t, dt)
        shape = list(t.shape)
        if dt == "F4" and shape:
            shape[-1] *= 2  # the file counts 4-bit elements
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        items.append((t, off, n))
        off += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-(len(hj) + 8) % 8)  # data 8-byte aligned, as safetensors writes it
    base = 8 + len(hj)
    if _is_url(path):
        whole = np.empty(base + off, np.uint8)
        whole[:base] = np.frombuffer(struct.pack("<Q", len(hj)) + hj, np.uint8)
        for t, o, n in items:
            if n:
                whole[base + o:base + o + n] = _host_bytes(t)
        write(path, whole)
        return
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.sluice-tmp-{os.getpid()}")
    f = None
    try:
        with open(tmp, "wb") as h:
            h.write(struct.pack("<Q", len(hj)) + hj)
        f = _file(tmp, 1)
        ranges = (Range * max(1, len(items)))()
        k = 0
        for t, o, n in items:
            if n:
                ptr = t.data_ptr() if hasattr(t, "data_ptr") else _buffer(t, False)[0]
                ranges[k] = Range(f, base + o, n, ptr)
                k += 1
        if k:
            check(lib.sluice_write_batch(_eng(), ranges, k, None))
        check(lib.sluice_file_sync(f))
        lib.sluice_file_close(f)
        f = None
        os.replace(tmp, path)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if f:
            lib.sluice_file_close(f)
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _head(path, n):
    """Up to n bytes at the start of path (a file or an s3:// object) and its size."""
    if _is_url(path):
        f = _file(path, 0)
        try:
            size = lib.sluice_file_size(f)
        finally:
            lib.sluice_file_close(f)
        buf = np.empty(min(n, size), np.uint8)
        if buf.size:
            read(path, buf)
        return buf.tobytes(), size
    with open(path, "rb") as h:
        return h.read(n), os.path.getsize(path)


def _bad(path, why):
    return SluiceError(-100011, f"{path}: {why}")


def read_header(path):
    """(header dict, data start) of a safetensors file, checked as strictly as safetensors checks it: a JSON
    object of tensors {dtype, shape, data_offsets} and an optional __metadata__ of strings; every dtype one of
    the specification's; shapes of non-negative integers whose element count fits 64 bits and fills whole
    bytes; the tensors' byte ranges, in offset order, tiling the data from its start to the end of the file
    (no overlap, no gap, no trailing byte).  Every fault is a SluiceError naming the file and what is wrong."""
    raw, size = _head(path, 8)
    if len(raw) < 8:
        raise _bad(path, "not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw)
    if n > _HEADER_MAX or 8 + n > size:
        raise _bad(path, f"header of {n} bytes does not fit the file ({size} bytes)")
    try:
        header = json.loads(_head(path, 8 + n)[0][8:].decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                 for k, v in meta.items())):
        raise _bad(path, "__metadata__ is not an object of strings")
    spans = []
    for name, v in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(v, dict) or not {"dtype", "shape", "data_offsets"} <= set(v):
            raise _bad(path, f"tensor '{name}' lacks dtype, shape or data_offsets")
        dt, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if dt not in _BITS:
            raise _bad(path, f"tensor '{name}' has dtype {dt!r}, unknown to the safetensors specification")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise _bad(path, f"tensor '{name}' has shape {shape!r}: not a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
            raise _bad(path, f"tensor '{name}' has data_offsets {offs!r}: not two non-negative integers")
        count = 1
        for d in shape:
            count *= d
        if count * _BITS[dt] >= 1 << 64:
            raise _bad(path, f"tensor '{name}' of shape {shape}: its size overflows 64 bits")
        if count * _BITS[dt] % 8:
            raise _bad(path, f"tensor '{name}' of {count} {dt} elements does not fill whole bytes")
        if offs[1] < offs[0] or offs[1] - offs[0] != count * _BITS[dt] // 8:
            raise _bad(path, f"tensor '{name}': data_offsets {offs} do not hold {count} {dt} elements")
        spans.append((offs[0], offs[1], name))
    at, data = 0, size - 8 - n
    for b, e, name in sorted(spans):
        if b != at:
            raise _bad(path, f"tensor '{name}' starts at {b}: " + ("it overlaps the one before" if b < at
                                                                  else f"a gap of {b - at} bytes before it"))
        if e > data:
            raise _bad(path, f"tensor '{name}' ends at {e}, past the {data} data bytes in the file")
        at = e
    if at != data:
        raise _bad(path, f"the tensors end at {at} of {data} data bytes (trailing bytes)")
    return header, 8 + n


def load(path, device="cpu"):
    """Reads a safetensors file into a dict of name -> tensor: torch tensors on `device` ("cpu", "cuda",
    "cuda:N"), or numpy arrays for device="numpy" (and for "cpu" where torch is not installed).
    The data moves in one engine read into one buffer (GPU memory for CUDA devices); the tensors are views
    of it, except ones whose offset does not suit their dtype, which are copied."""
    header, start = read_header(path)
    names = [k for k in header if k != "__metadata__"]
    end = max((header[k]["data_offsets"][1] for k in names), default=0)
    use_torch = device != "numpy"
    if use_torch:
        try:
            import torch
        except ImportError:
            if device != "cpu":
                raise
            use_torch = False
    if use_torch:
        buf = torch.empty(end, dtype=torch.uint8, device=device)
        ptr = buf.data_ptr()
    else:
        buf = np.empty(end, np.uint8)
        ptr = buf.ctypes.data
    if end:
        f = _file(path, 0)
        try:
            r = Range(f, start, end, ptr)
            check(lib.sluice_read_batch(_eng(), C.byref(r), 1, None))
        finally:
            lib.sluice_file_close(f)
    out = {}
    for k in names:
        v = header[k]
        b, e = v["data_offsets"]
        npd, tname = _DT[v["dtype"]]
        shape = list(v["shape"])
        if v["dtype"] == "F4" and shape:
            shape[-1] //= 2  # two elements a byte: torch's float4_e2m1fn_x2 counts bytes
        aligned = b % _SIZE[v["dtype"]] == 0
        if use_torch:
            piece = buf[b:e] if aligned else buf[b:e].clone()
            if tname is None or not hasattr(torch, tname):
                out[k] = piece  # no torch dtype for it here: its bytes
            else:
                out[k] = piece.view(getattr(torch, tname)).reshape(shape)
        else:
            piece = buf[b:e] if aligned else buf[b:e].copy()
            if npd is None:  # bf16 as its 16-bit pattern; the other small floats as their bytes
                out[k] = piece.view(np.uint16).reshape(shape) if v["dtype"] == "BF16" else piece
            else:
                out[k] = piece.view(npd).reshape(shape)
    return out
