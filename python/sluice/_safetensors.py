"""The safetensors layout (https://github.com/huggingface/safetensors): an unsigned 64-bit little-endian header
length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the data; offsets are relative to the end of the header.  Its dtypes and the header written (headers are
read and checked by the library alone: sluice_ckpt_open and sluice_ckpt_open_files).  A sharded checkpoint adds
model.safetensors.index.json: {"metadata": {"total_size": bytes}, "weight_map": {name: file}}, as Hugging Face
tools write and read it.
"""
import ctypes as C
import json
import errno
import os
import stat
import struct

import numpy as np

from ._lib import EFORMAT, Range, SluiceError, check, cpath, lib, shown
from .buffers import _eng

# Every dtype of the safetensors specification: its bits per element, its numpy dtype (None: read as raw bytes)
# and its torch dtype's name (None: none; raw bytes).  F4 packs two elements a byte (torch's float4_e2m1fn_x2,
# whose last dimension is half the file's); F6 types have no torch dtype.
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
         "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
         "I64": 64, "U64": 64, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8}
DT = {"F64": (np.float64, "float64"), "F32": (np.float32, "float32"), "F16": (np.float16, "float16"),
       "BF16": (None, "bfloat16"), "I64": (np.int64, "int64"), "I32": (np.int32, "int32"),
       "I16": (np.int16, "int16"), "I8": (np.int8, "int8"), "U8": (np.uint8, "uint8"), "BOOL": (np.bool_, "bool"),
       "U16": (np.uint16, "uint16"), "U32": (np.uint32, "uint32"), "U64": (np.uint64, "uint64"),
       "C64": (np.complex64, "complex64"), "F8_E4M3": (None, "float8_e4m3fn"), "F8_E5M2": (None, "float8_e5m2"),
       "F8_E8M0": (None, "float8_e8m0fnu"), "F4": (None, "float4_e2m1fn_x2"), "F6_E2M3": (None, None),
       "F6_E3M2": (None, None), "F8_E4M3FNUZ": (None, "float8_e4m3fnuz"), "F8_E5M2FNUZ": (None, "float8_e5m2fnuz")}
SIZE = {k: max(1, b // 8) for k, b in BITS.items()}  # bytes an element's view needs aligned


def st_dtype(t):
    """safetensors dtype name of a numpy array or torch tensor."""
    name = str(t.dtype).replace("torch.", "")
    for k, (npd, tname) in DT.items():
        if name == tname or (npd is not None and name == np.dtype(npd).name):
            return k
    raise ValueError(f"sluice.save: dtype {t.dtype} has no safetensors name")


def nbytes(t, dt):
    """Bytes of t in the file: F4's torch dtype holds two elements a byte, as the file does."""
    return int(np.prod(t.shape, dtype=np.int64)) * (1 if dt == "F4" else BITS[dt] // 8)


def store_of(path):
    """(name, flags) of the store that serves path (sluice_path_store): "local", "s3", "http", ..."""
    flags = C.c_uint()
    name = lib.sluice_path_store(cpath(path), C.byref(flags))
    return name.decode(), flags.value


def is_remote(path):
    """A path of a store that is not the local file system's (s3://, http(s)://, ...): read through the engine,
    written whole, never by os calls."""
    return not store_of(path)[1] & 1  # SLUICE_STORE_LOCAL


def open_file(path, flags):
    """A sluice file handle of the engine (flags 0: read, 1: write); close with lib.sluice_file_close."""
    f = C.c_void_p()
    check(lib.sluice_file_open(C.byref(f), _eng(), cpath(path), flags))
    return f


def pread(f, off, n):
    """n bytes at off of the open handle f, read through the engine (so an s3:// or http(s):// handle's reads
    carry the validator pinned at its open)."""
    buf = np.empty(n, np.uint8)
    if n:
        check(lib.sluice_read_batch(_eng(), (Range * 1)(Range(f, off, n, buf.ctypes.data)), 1, None))
    return buf.tobytes()


def bad(path, why):
    """The error of a malformed file or object, named as sluice's messages name it (no query, no password)."""
    return SluiceError(EFORMAT, f"{shown(path)}: {why}")


def parse_json(raw):
    """The JSON document of bytes from outside; a ValueError for anything else (not UTF-8, not JSON, nested
    deeper than Python's parser goes), which callers turn into the error naming the file."""
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def regular_target(path):
    """Refuses (an error naming it) a target of a durable write that exists and is not a regular file: the
    rename over it would replace a directory, a device, a FIFO or a socket by a file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise SluiceError(-(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL),
                          f"{shown(path)}: exists and is {kind}, which a save does not replace")


SMALL_MAX = 256 << 20  # the most an index or a DCP checkpoint's metadata may hold


def read_small(path, limit=SMALL_MAX, what="an index or a metadata file"):
    """The whole of a small file or object (an index, a DCP checkpoint's metadata), as bytes: through the engine's
    one open (a local path must be a regular file: a FIFO or a device is refused by it before any read), at most
    limit bytes (what: the kind of file, for the error), whatever its size or a server claims it to be."""
    f = open_file(path, 0)
    try:
        size = lib.sluice_file_size(f)
        if size > limit:
            raise bad(path, f"is {size} bytes, more than the {limit} {what} may hold")
        return pread(f, 0, size)
    finally:
        lib.sluice_file_close(f)


DATA_ALIGN = 4096  # where the data of a file sluice writes starts: O_DIRECT writes (and reads) from byte one


def header_bytes(header):
    """The bytes before the data: length and JSON, padded with spaces (as safetensors pads to 8) so the data
    starts 4 KiB aligned: the tensors then go to the file in direct writes, not through the page cache."""
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-(len(hj) + 8) % DATA_ALIGN)
    return struct.pack("<Q", len(hj)) + hj
