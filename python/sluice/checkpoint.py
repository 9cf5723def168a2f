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

from . import _buffer, _eng, read, write
from ._lib import Range, SluiceError, check, lib

# safetensors dtype -> (numpy dtype or None, torch dtype name)
_DT = {"F64": (np.float64, "float64"), "F32": (np.float32, "float32"), "F16": (np.float16, "float16"),
       "BF16": (None, "bfloat16"), "I64": (np.int64, "int64"), "I32": (np.int32, "int32"),
       "I16": (np.int16, "int16"), "I8": (np.int8, "int8"), "U8": (np.uint8, "uint8"), "BOOL": (np.bool_, "bool"),
       "U16": (np.uint16, "uint16"), "U32": (np.uint32, "uint32"), "U64": (np.uint64, "uint64")}
_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "U16": 2, "U32": 4, "U64": 8}
_HEADER_MAX = 100 << 20


def _st_dtype(t):
    """safetensors dtype name of a numpy array or torch tensor."""
    name = str(t.dtype).replace("torch.", "")
    for k, (npd, tname) in _DT.items():
        if name == tname or (npd is not None and name == np.dtype(npd).name):
            return k
    raise ValueError(f"sluice.save: dtype {t.dtype} has no safetensors name")


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
        n = int(np.prod(t.shape, dtype=np.int64)) * _SIZE[_st_dtype(t)]
        header[name] = {"dtype": _st_dtype(t), "shape": list(t.shape), "data_offsets": [off, off + n]}
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


def read_header(path):
    """(header dict, data start) of a safetensors file, checked: every tensor inside the file, sizes right."""
    raw, size = _head(path, 8)
    if len(raw) < 8:
        raise SluiceError(-100011, f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw)
    if n > _HEADER_MAX or 8 + n > size:
        raise SluiceError(-100011, f"{path}: header of {n} bytes does not fit the file ({size} bytes)")
    try:
        header = json.loads(_head(path, 8 + n)[0][8:])
    except ValueError as e:
        raise SluiceError(-100011, f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SluiceError(-100011, f"{path}: header is not a JSON object")
    for name, v in header.items():
        if name == "__metadata__":
            continue
        try:
            b, e = v["data_offsets"]
            count = int(np.prod(v["shape"], dtype=np.int64))
            ok = v["dtype"] in _SIZE and 0 <= b <= e <= size - 8 - n and e - b == count * _SIZE[v["dtype"]]
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise SluiceError(-100011, f"{path}: tensor '{name}' is malformed or lies outside the file")
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
        if use_torch:
            tdt = getattr(torch, tname)
            piece = buf[b:e]
            if b % _SIZE[v["dtype"]]:
                piece = piece.clone()
            out[k] = piece.view(tdt).reshape(v["shape"])
        else:
            piece = buf[b:e]
            out[k] = piece.view(npd if npd is not None else np.uint16).reshape(v["shape"]) if \
                b % _SIZE[v["dtype"]] == 0 else piece.copy().view(npd or np.uint16).reshape(v["shape"])
    return out
