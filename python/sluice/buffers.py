"""The process's engine, the memory sluice moves bytes into (numpy, __cuda_array_interface__, DLPack), and the
transfer calls: read, write, read_broadcast, their async forms and futures."""
import ctypes as C
import os
import sys

import numpy as np

from ._lib import XferReport, SluiceError, check, cpath, env_int, lib

_engine, _engine_pid = None, None


def _device():
    """The GPU this process uses: SLUICE_DEVICE_IDS, else torch's current device, else LOCAL_RANK where there
    is such a GPU."""
    if "SLUICE_DEVICE_IDS" in os.environ:
        return None  # the engine reads it
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    rank = env_int("sluice", "LOCAL_RANK", -1, 0, (1 << 31) - 1)
    return rank if 0 <= rank < lib.sluice_gpu_count() else None  # ranks past the GPUs (host-only jobs): the default


def _eng():
    """The process's engine, opened on first use with the SLUICE_* environment's settings; a process forked from
    the one that opened it opens its own (its workers and rings are the parent's, and no thread of them runs in
    the child; the parent's is left unclosed there)."""
    global _engine, _engine_pid
    if _engine is None or _engine_pid != os.getpid():
        _engine = None
        cfg, e = C.c_void_p(), C.c_void_p()
        check(lib.sluice_config_new(C.byref(cfg)))
        try:
            dev = _device()
            if dev is not None:
                check(lib.sluice_config_set_device(cfg, dev))
            check(lib.sluice_engine_open(C.byref(e), cfg))
        finally:
            lib.sluice_config_free(cfg)
        _engine, _engine_pid = e, os.getpid()
    return _engine


def gpu_count():
    """The GPUs the CUDA driver shows this process (0 without a driver, or with SLUICE_GPU=0)."""
    return lib.sluice_gpu_count()


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):  # the head of DLManagedTensor, what a "dltensor" capsule points to
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice), ("ndim", C.c_int32), ("dtype", _DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


_DL_MEMORY = {1: "host", 2: "GPU", 3: "pinned host", 13: "managed"}  # kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def _contiguous(shape, strides, item):
    """Whether strides (in bytes; None for C order) lay shape out densely in C order."""
    if strides is None:
        return True
    want, acc = [], item
    for d in reversed(shape):
        want.append(acc)
        acc *= d
    return tuple(reversed(want)) == tuple(strides) or int(np.prod(shape, dtype=np.int64)) <= 1


def _dlpack(a, ordered):
    """(pointer, bytes, capsule) of an object that only speaks DLPack; the capsule keeps the memory alive.  With
    ordered, GPU memory is handed over on CUDA's legacy stream (DLPack's stream=1) and that stream is waited for,
    so the producer's queued work is done before sluice touches the memory."""
    gpu = ordered and getattr(a, "__dlpack_device__", lambda: (1, 0))()[0] == 2
    try:
        cap = a.__dlpack__(stream=1) if gpu else a.__dlpack__()
    except TypeError:  # a producer without the stream argument (older DLPack)
        cap = a.__dlpack__()
    if gpu:
        check(lib.sluice_gpu_stream_sync(_eng(), 1))
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    t = C.cast(get(cap, b"dltensor"), C.POINTER(_DLTensor)).contents
    if t.device.device_type not in _DL_MEMORY:
        raise ValueError(f"sluice: DLPack device type {t.device.device_type} is not host or CUDA memory")
    if t.dtype.bits % 8:
        raise ValueError(f"sluice: DLPack element of {t.dtype.bits} bits is not whole bytes")
    item = t.dtype.bits // 8 * t.dtype.lanes
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * item for i in range(t.ndim))
    if not _contiguous(shape, strides, item):
        raise ValueError("sluice needs a C-contiguous array")
    return (t.data or 0) + t.byte_offset, int(np.prod(shape, dtype=np.int64)) * item, cap


def _ready(objs):
    """Waits until the GPU work already queued on these arrays' memory is done: sluice's synchronous transfers
    run on the engine's own streams, so a kernel still writing a tensor (or reading one a transfer overwrites)
    would race them.  torch tensors: their devices' current streams; other __cuda_array_interface__ arrays: the
    stream the interface names."""
    torch_devices, streams = set(), set()
    for a in objs:
        if getattr(a, "is_cuda", False) and hasattr(a, "device"):
            torch_devices.add(a.device)
            continue
        cai = getattr(a, "__cuda_array_interface__", None)
        if cai is not None and cai.get("stream") is not None:
            streams.add(cai["stream"])
    if torch_devices:
        import torch
        for d in torch_devices:
            torch.cuda.current_stream(d).synchronize()
    for s in streams:
        check(lib.sluice_gpu_stream_sync(_eng(), s))


def _buffer(a, writable, ordered=True):
    """(pointer, bytes, keep) of a contiguous host (numpy), __cuda_array_interface__ or DLPack array; keep is
    what must stay alive while sluice uses the memory.  ordered: for a synchronous transfer, the GPU work
    queued on the memory is waited for first (see _ready); async transfers order on their stream instead."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        item, shape = np.dtype(cai["typestr"]).itemsize, tuple(cai["shape"])
        if not _contiguous(shape, cai.get("strides"), item):  # strides None means C-contiguous
            raise ValueError("sluice needs a C-contiguous GPU array")
        if ordered:
            _ready([a])
        return cai["data"][0], int(np.prod(shape, dtype=np.int64)) * item, a
    if not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__"):
        return _dlpack(a, ordered)
    a = np.asarray(a)
    if not a.flags["C_CONTIGUOUS"] or (writable and not a.flags["WRITEABLE"]):
        raise ValueError("sluice needs a C-contiguous%s numpy array" % (" writable" if writable else ""))
    return a.ctypes.data, a.nbytes, a


def read(path, out, offset=0, report=None):
    """Reads len(out) bytes of path at offset into out (GPU or host array); returns the bytes read.  report (a
    dict, or None) receives what the call did: bytes, seconds, the path taken, bytes_verified (a whole s3://
    object matched against its checksum), checksum (which algorithm, or why none) and bytes_storage (what the
    storage I/Os spanned)."""
    ptr, n, keep = _buffer(out, True)
    rep = XferReport()
    got = check(lib.sluice_read_to_gpu(_eng(), cpath(path), offset, n, ptr, C.byref(rep)))
    if report is not None:
        report.update(bytes=rep.bytes, seconds=rep.seconds, path=rep.path.decode(), bytes_verified=rep.bytes_verified,
                      bytes_storage=rep.bytes_storage, checksum=rep.checksum.decode(errors="replace"))
    return got


def read_broadcast(path, outs, offset=0):
    """Reads min(len of each out) bytes of path at offset once and delivers them to every array in outs (GPU
    tensors on any GPUs, or host arrays): storage is read once, the other copies go GPU to GPU.  Returns the
    bytes read."""
    bufs = [_buffer(o, True) for o in outs]
    n = min(b[1] for b in bufs)
    ptrs = (C.c_void_p * len(bufs))(*[b[0] for b in bufs])
    return check(lib.sluice_read_broadcast(_eng(), cpath(path), offset, n, ptrs, len(bufs), None))


def write(path, array):
    """Writes array as the whole new content of path, durably and atomically; returns the bytes written."""
    ptr, n, keep = _buffer(array, False)
    return check(lib.sluice_write_from_gpu(_eng(), cpath(path), ptr, n, None))


read_to_gpu, write_from_gpu = read, write


class Future:
    """An asynchronous transfer ordered on a CUDA stream (see sluice_read_async in sluice.h), as read_async,
    write_async and Client.async_read/async_write return it."""

    def __init__(self, handle, file, keep):
        self._h, self._file, self._keep = handle, file, keep

    def wait(self):
        """Blocks until the storage side is done; returns the bytes moved (raises SluiceError on failure)."""
        return check(lib.sluice_future_wait(self._h, None))

    def __del__(self):
        if getattr(self, "_h", None):
            lib.sluice_future_free(self._h)
            self._h = None
        if getattr(self, "_file", None):
            lib.sluice_file_close(self._file)
            self._file = None


def _async(path, array, offset, write, stream):
    ptr, n, keep = _buffer(array, not write, ordered=False)
    if stream is None:
        import torch
        stream = torch.cuda.current_stream().cuda_stream
    f, fut = C.c_void_p(), C.c_void_p()
    check(lib.sluice_file_open(C.byref(f), _eng(), cpath(path), 3 if write else 0))
    try:
        check((lib.sluice_write_async if write else lib.sluice_read_async)(f, offset, n, ptr, stream, C.byref(fut)))
    except SluiceError:
        lib.sluice_file_close(f)
        raise
    return Future(fut, f, (array, keep))


def read_async(path, out, offset=0, stream=None):
    """Queues a read of path into GPU array out on `stream` (default: torch's current stream): later work on
    the stream sees the bytes.  Returns a Future; keep it (and out) alive until .wait()."""
    return _async(path, out, offset, False, stream)


def write_async(path, array, offset=0, stream=None):
    """Queues a write of GPU array to path at offset after the stream's earlier work (not durable, not
    atomic: for checkpoints use write/save).  Returns a Future."""
    return _async(path, array, offset, True, stream)
