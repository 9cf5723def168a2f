"""sluice: files and datasets into GPU (or host) memory at the speed of the hardware.

Arrays: numpy arrays for host memory; any object with __cuda_array_interface__ (torch CUDA tensors, CuPy
arrays) or DLPack (__dlpack__: JAX, TensorFlow, ...) for GPU or host memory.  Errors from the C library arrive as sluice.SluiceError carrying its detail.
"""
import ctypes as C
import json
import os
import sys

import numpy as np

from ._lib import (Batch, CheckpointReport, CopyReport, XferReport, ShardReport, LoaderOptions, PackedRow, PackerOptions, PackOptions, PackReport, PACK_PROGRESS, Record, RecordLoc, SluiceError, check, lib)

__all__ = ["SluiceError", "read", "read_to_gpu", "write", "write_from_gpu", "copy", "pack", "Client", "Dataset", "Loader", "Packer",
           "gpu_count", "save", "load", "read_async", "write_async", "Future", "profile"]

# sluice_dtype codes (include/sluice.h) as numpy dtypes; bytes are uint8.
_NP = [np.uint8, np.uint8, np.uint16, np.uint32, np.int32, np.int64, np.float16, None, np.float32, np.int8,
       np.int16, np.float64]
_NAMES = ["bytes", "u8", "u16", "u32", "i32", "i64", "f16", "bf16", "f32", "i8", "i16", "f64"]

_engine = None


def _device():
    """The GPU this process uses: SLUICE_DEVICE_IDS, else torch's current device, else LOCAL_RANK."""
    if "SLUICE_DEVICE_IDS" in os.environ:
        return None  # the engine reads it
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None


def _eng():
    """The process's engine, opened on first use with the SLUICE_* environment's settings."""
    global _engine
    if _engine is None:
        cfg, e = C.c_void_p(), C.c_void_p()
        check(lib.sluice_config_new(C.byref(cfg)))
        try:
            dev = _device()
            if dev is not None:
                check(lib.sluice_config_set_device(cfg, dev))
            check(lib.sluice_engine_open(C.byref(e), cfg))
        finally:
            lib.sluice_config_free(cfg)
        _engine = e
    return _engine


def gpu_count():
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


def _dlpack(a):
    """(pointer, bytes, capsule) of an object that only speaks DLPack; the capsule keeps the memory alive."""
    cap = a.__dlpack__()
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


def _buffer(a, writable):
    """(pointer, bytes, keep) of a contiguous host (numpy), __cuda_array_interface__ or DLPack array; keep is
    what must stay alive while sluice uses the memory."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        item, shape = np.dtype(cai["typestr"]).itemsize, tuple(cai["shape"])
        if not _contiguous(shape, cai.get("strides"), item):  # strides None means C-contiguous
            raise ValueError("sluice needs a C-contiguous GPU array")
        return cai["data"][0], int(np.prod(shape, dtype=np.int64)) * item, a
    if not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__"):
        return _dlpack(a)
    a = np.asarray(a)
    if not a.flags["C_CONTIGUOUS"] or (writable and not a.flags["WRITEABLE"]):
        raise ValueError("sluice needs a C-contiguous%s numpy array" % (" writable" if writable else ""))
    return a.ctypes.data, a.nbytes, a


def read(path, out, offset=0, report=None):
    """Reads len(out) bytes of path at offset into out (GPU or host array); returns the bytes read.  report (a
    dict, or None) receives what the call did: bytes, seconds, the path taken, and bytes_verified (a whole
    s3:// object matched against its checksum)."""
    ptr, n, keep = _buffer(out, True)
    rep = XferReport()
    got = check(lib.sluice_read_to_gpu(_eng(), os.fsencode(path), offset, n, ptr, C.byref(rep)))
    if report is not None:
        report.update(bytes=rep.bytes, seconds=rep.seconds, path=rep.path.decode(), bytes_verified=rep.bytes_verified)
    return got


def read_broadcast(path, outs, offset=0):
    """Reads min(len of each out) bytes of path at offset once and delivers them to every array in outs (GPU
    tensors on any GPUs, or host arrays): storage is read once, the other copies go GPU to GPU.  Returns the
    bytes read."""
    bufs = [_buffer(o, True) for o in outs]
    n = min(b[1] for b in bufs)
    ptrs = (C.c_void_p * len(bufs))(*[b[0] for b in bufs])
    return check(lib.sluice_read_broadcast(_eng(), os.fsencode(path), offset, n, ptrs, len(bufs), None))


def write(path, array):
    """Writes array as the whole new content of path, durably and atomically; returns the bytes written."""
    ptr, n, keep = _buffer(array, False)
    return check(lib.sluice_write_from_gpu(_eng(), os.fsencode(path), ptr, n, None))


read_to_gpu, write_from_gpu = read, write


def copy(src, dst, recursive=False):
    """Copies between a local path and s3:// either way, as `sluice cp` does (a file, or with recursive a
    whole directory or prefix); returns {"files", "bytes", "seconds"}."""
    rep = CopyReport()
    check(lib.sluice_copy(os.fsencode(src), os.fsencode(dst), 1 if recursive else 0, C.byref(rep)))
    return {"files": rep.files, "bytes": rep.bytes, "seconds": rep.seconds, "files_verified": rep.files_verified}


_PACK_SOURCES = {"dataset": 1, "dir": 2, "jsonl": 3, "tokens": 4}


def pack(out, *, dataset=None, dir=None, jsonl=None, fields=None, tokens=None, doc_lengths=None, dtype=None,
         pack_context=0, greedy=False, all_files=False, follow_symlinks=False, threads=0, shard_size=0, zstd=0,
         block_size=0, progress=None):
    """Packs one source into sluice shards at out, in this process (the library's sluice_pack, as `sluice pack`):
    dataset= any dataset sluice reads; dir= an ImageFolder tree (torchvision's classes, order and extensions,
    all_files=True for every file); jsonl= a JSON lines file with fields="k1,k2"; tokens= a token array (.npy, or
    raw .bin of dtype "u16"/"u32") with doc_lengths=, packed into rows of pack_context tokens when given.
    progress(done, total, bytes) is called now and then.  Returns the report as a dict; raises SluiceError
    naming the file, line, record or option."""
    given = {k: v for k, v in (("dataset", dataset), ("dir", dir), ("jsonl", jsonl), ("tokens", tokens)) if v}
    if len(given) != 1:
        raise ValueError("sluice.pack: give one of dataset=, dir=, jsonl=, tokens=")
    (kind, src), = given.items()
    o = PackOptions()
    o.size, o.source, o.from_ = C.sizeof(PackOptions), _PACK_SOURCES[kind], os.fsencode(src)
    o.fields = fields.encode() if fields else None
    o.doc_lengths = os.fsencode(doc_lengths) if doc_lengths else None
    o.dtype = dtype.encode() if dtype else None
    o.pack_context, o.greedy, o.all_files, o.follow_symlinks = pack_context, int(greedy), int(all_files), int(follow_symlinks)
    o.threads = threads
    o.writer.shard_size, o.writer.zstd_level, o.writer.block_size = shard_size, zstd, block_size
    cb = PACK_PROGRESS((lambda done, total, nbytes, arg: progress(done, total, nbytes)) if progress else 0)
    o.progress = cb
    rep = PackReport()
    rep.size = C.sizeof(PackReport)
    check(lib.sluice_pack(os.fsencode(out), C.byref(o), C.byref(rep)))
    return {"records": rep.records, "bytes": rep.bytes, "documents": rep.documents, "tokens": rep.tokens,
            "fill": rep.fill, "seconds": rep.seconds, "labelled": bool(rep.labelled),
            "from_format": rep.from_format.decode(), "dtype": rep.dtype.decode()}


def metrics_text():
    """This process's figures (engine I/O, each open loader) in Prometheus's text format."""
    n = lib.sluice_metrics_text(None, 0) + 4096
    buf = C.create_string_buffer(n)
    lib.sluice_metrics_text(buf, n)
    return buf.value.decode()


def serve_metrics(port=0):
    """Serves metrics_text() at http://0.0.0.0:PORT/metrics (0: a free port; once per process, as
    SLUICE_METRICS_PORT does); returns the port."""
    bound = C.c_uint()
    check(lib.sluice_metrics_serve(port, C.byref(bound)))
    return bound.value


def checkpoint_process(pid, suspend=True, resume=True, timeout_ms=0):
    """Suspends the CUDA process pid (its GPU memory to host memory) and/or resumes it, through the driver's
    checkpoint functions; returns {"lock_s", "checkpoint_s", "restore_s", "unlock_s", "gpu_bytes", "state"}."""
    rep = CheckpointReport()
    check(lib.sluice_process_checkpoint(pid, (1 if suspend else 0) | (2 if resume else 0), timeout_ms, C.byref(rep)))
    return {"lock_s": rep.lock_s, "checkpoint_s": rep.checkpoint_s, "restore_s": rep.restore_s,
            "unlock_s": rep.unlock_s, "gpu_bytes": rep.gpu_bytes,
            "state": lib.sluice_process_state_name(rep.state).decode()}


def _b(s):
    return None if s is None else s.encode()


_DONE_CB = C.CFUNCTYPE(None, C.c_ssize_t, C.c_void_p)


class Client:
    """An S3-compatible store, by bucket and key, on the process's engine (any path argument of sluice may also
    be s3://BUCKET/KEY, with settings from the AWS_* environment and ~/.aws files).  endpoint, access_key,
    secret_key, region: None to take each the same way; a key pair given here wins.  The knobs, under the
    engine's names (buffer_pool_size, max_transfer_size: each ranged GET's size, queue_depth, threads: the GETs
    in flight, device_ids: the GPUs its engine serves, enable_p2p), give the client an engine of its own with
    those settings."""

    _h = None  # set once the C client is open; close() and __del__ look at it

    def __init__(self, endpoint=None, access_key=None, secret_key=None, region=None, buffer_pool_size=None,
                 max_transfer_size=None, queue_depth=None, threads=None, device_ids=None, enable_p2p=None):
        h = C.c_void_p()
        knobs = {"buffer_pool_size": buffer_pool_size, "max_transfer_size": max_transfer_size,
                 "queue_depth": queue_depth, "threads": threads, "enable_p2p": enable_p2p}
        if device_ids is not None:
            ids = (C.c_int * len(device_ids))(*device_ids)
            knobs["device_ids"] = (ids, len(device_ids))
        if all(v is None for v in knobs.values()):
            check(lib.sluice_s3_open(C.byref(h), _eng(), _b(endpoint), _b(access_key), _b(secret_key), _b(region)))
        else:
            cfg = C.c_void_p()
            check(lib.sluice_config_new(C.byref(cfg)))
            try:
                for name, v in knobs.items():
                    if v is not None:
                        check(getattr(lib, "sluice_config_set_" + name)(cfg, *(v if isinstance(v, tuple) else (v,))))
                check(lib.sluice_s3_open_config(C.byref(h), cfg, _b(endpoint), _b(access_key), _b(secret_key),
                                                _b(region)))
            finally:
                lib.sluice_config_free(cfg)
        self._h = h

    def _async(self, write, bucket, key, buffer, offset, length, callback):
        ptr, n, keep = _buffer(buffer, not write)
        if length is not None:
            if length > n:
                raise ValueError(f"sluice: length {length} is larger than the buffer ({n} bytes)")
            n = length
        cb = _DONE_CB(lambda result, user: callback(result)) if callback else None
        fut = C.c_void_p()
        if write:
            check(lib.sluice_s3_write_async(self._h, bucket.encode(), key.encode(), ptr, n,
                                            C.cast(cb, C.c_void_p) if cb else None, None, C.byref(fut)))
        else:
            check(lib.sluice_s3_read_async(self._h, bucket.encode(), key.encode(), ptr, offset, n,
                                           C.cast(cb, C.c_void_p) if cb else None, None, C.byref(fut)))
        f = Future(fut, None, (buffer, keep, cb, self))
        return f

    def async_read(self, bucket, key, buffer, offset=0, length=None, callback=None):
        """Starts reading bucket/key into buffer (GPU or host) and returns a Future at once; .wait() gives the
        bytes read.  callback(result), if given, is called from a sluice thread when the read is done (result:
        bytes, or a negative error code).  Keep buffer alive until then."""
        return self._async(False, bucket, key, buffer, offset, length, callback)

    def async_write(self, bucket, key, buffer, callback=None):
        """Starts writing buffer as the whole object bucket/key; a Future, and callback(result), as async_read."""
        return self._async(True, bucket, key, buffer, 0, None, callback)

    def read_to_gpu(self, bucket, key, buffer, offset=0, length=None):
        """Reads length bytes (default: all of buffer) of bucket/key at offset into buffer (a GPU or host
        array); returns the bytes read."""
        ptr, n, keep = _buffer(buffer, True)
        if length is not None:
            if length > n:
                raise ValueError(f"sluice: length {length} is larger than the buffer ({n} bytes)")
            n = length
        return check(lib.sluice_s3_read_to_gpu(self._h, bucket.encode(), key.encode(), ptr, offset, n, None))

    def write_from_gpu(self, bucket, key, buffer):
        """Writes buffer (a GPU or host array) as the whole object bucket/key; returns the bytes written."""
        ptr, n, keep = _buffer(buffer, False)
        return check(lib.sluice_s3_write_from_gpu(self._h, bucket.encode(), key.encode(), ptr, n, None))

    def size(self, bucket, key):
        """The object's size in bytes."""
        out = C.c_uint64()
        check(lib.sluice_s3_size(self._h, bucket.encode(), key.encode(), C.byref(out)))
        return out.value

    def close(self):
        """Closes the client; transfers still running must be waited for first."""
        if self._h:
            lib.sluice_s3_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Future:
    """An asynchronous transfer ordered on a CUDA stream (see sluice_read_async in sluice.h)."""

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
    ptr, n, keep = _buffer(array, not write)
    if stream is None:
        import torch
        stream = torch.cuda.current_stream().cuda_stream
    f, fut = C.c_void_p(), C.c_void_p()
    check(lib.sluice_file_open(C.byref(f), _eng(), os.fsencode(path), 3 if write else 0))
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


class Dataset:
    """Map-style view of any dataset sluice reads (its own shards, Megatron .bin/.idx, WebDataset tars).

    ds[i] is a dict of field name -> numpy array (a copy): typed fields get their dtype and, where the shape
    is fixed, their shape; bytes fields are uint8 arrays.  .metadata is what the dataset's writer stored with it
    (a dict; {} for none); .class_to_idx, for a packed ImageFolder, the class of each label as torchvision's
    ImageFolder gives it.
    """

    _h = None  # set once the C dataset is open; close() and __del__ look at it

    def __init__(self, path):
        h = C.c_void_p()
        check(lib.sluice_dataset_open(C.byref(h), os.fsencode(path)))
        self._h, self.path = h, path
        self.fields = []
        for f in range(lib.sluice_dataset_nfields(h)):
            fd = lib.sluice_dataset_field(h, f).contents
            shape = tuple(fd.shape[d] for d in range(fd.ndim))
            self.fields.append((fd.name.decode(), _NAMES[fd.dtype], shape))
        self.format = lib.sluice_dataset_format(h).decode()
        meta = lib.sluice_dataset_metadata(h)
        self.metadata = json.loads(meta.decode()) if meta else {}
        self.class_to_idx = self.metadata.get("class_to_idx")
        self._buf = np.empty(0, np.uint8)

    def __len__(self):
        return lib.sluice_dataset_count(self._h)

    def __getitem__(self, i):
        if i < 0:
            i += len(self)
        loc = RecordLoc()
        check(lib.sluice_dataset_locate(self._h, i, C.byref(loc)))
        if self._buf.size < loc.length:
            self._buf = np.empty(loc.length, np.uint8)
        rec = Record()
        check(lib.sluice_dataset_read(self._h, i, self._buf.ctypes.data, self._buf.size, C.byref(rec)))
        out = {}
        for k, (name, dtype, shape) in enumerate(self.fields):
            raw = np.ctypeslib.as_array((C.c_uint8 * rec.len[k]).from_address(rec.data[k])) if rec.len[k] else \
                np.empty(0, np.uint8)
            out[name] = _typed(raw.copy(), dtype, shape)
        return out

    def shard_bytes(self, s):
        """Shard s's records, and the bytes of its records back to back (uncompressed): what read_shard needs."""
        r, b = C.c_uint64(), C.c_uint64()
        check(lib.sluice_dataset_shard_info(self._h, s, C.byref(r), C.byref(b)))
        return r.value, max(b.value - 4096, 0)

    def read_shard(self, s, out, decoder="auto"):
        """Shard s whole into out (numpy array or GPU tensor of at least shard_bytes(s)[1] bytes): its records
        back to back, zstd blocks decoded on the GPU by nvCOMP or on the CPU (decoder auto|gpu|cpu).  Returns
        {"bytes", "stored", "blocks", "read_s", "decode_s", "decoder", "why_not_gpu"}."""
        _find_nvcomp()
        ptr, n, keep = _buffer(out, True)
        rep = ShardReport()
        check(lib.sluice_dataset_read_shard(_eng(), self._h, s, ptr, n, {"auto": 0, "cpu": 1, "gpu": 2}[decoder],
                                            C.byref(rep)))
        return {"bytes": rep.bytes, "stored": rep.stored, "blocks": rep.blocks, "read_s": rep.read_s,
                "decode_s": rep.decode_s, "decoder": rep.decoder.decode(), "why_not_gpu": rep.why_not_gpu.decode()}

    def close(self):
        if self._h:
            lib.sluice_dataset_close(self._h)
            self._h = None

    def __del__(self):
        self.close()


def _find_nvcomp():
    """Points SLUICE_NVCOMP_LIB at the nvidia-libnvcomp wheel's library when one is installed and nothing else
    was set (the C library reads it on its first GPU decode)."""
    if os.environ.get("SLUICE_NVCOMP_LIB"):
        return
    try:
        import nvidia.libnvcomp as w
    except ImportError:
        return
    for d in getattr(w, "__path__", []):
        lib_path = os.path.join(d, "lib64", "libnvcomp.so.6")
        if os.path.exists(lib_path):
            os.environ["SLUICE_NVCOMP_LIB"] = lib_path
            return


def _typed(raw, dtype, shape=()):
    t = _NP[_NAMES.index(dtype)]
    if t is None:  # bf16: numpy has none; the raw 16-bit words
        t = np.uint16
    a = raw.view(t)
    return a.reshape(shape) if shape and all(d > 0 for d in shape) else a


class _CudaArray:
    """A GPU buffer described by __cuda_array_interface__, so torch.as_tensor or cupy.asarray take it in place."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "version": 3, "strides": None}


def _env_rank():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class Loader:
    """Shuffled, distributed, resumable batches of a Dataset (see docs/LOADER.md for the order).

    Iterating yields dicts: fixed-size fields as arrays of shape [batch, ...]; other fields as (data, offsets)
    pairs.  device="cpu" gives numpy arrays, device="cuda" torch tensors (or, with cupy=True, CuPy arrays) in GPU
    memory, ordered on the current stream.  A batch's arrays are views of the loader's ring: valid until the
    next batch is taken; .copy()/.clone() what must outlive that.
    """

    def __init__(self, dataset, batch_size, shuffle=True, seed=0, epoch=0, device="cpu", fields=None,
                 drop_last=False, rank=None, world_size=None, prefetch=0, window_bytes=0, skip_corrupt=False):
        if rank is None or world_size is None:
            r, w = _env_rank()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        self.dataset, self.device = dataset, device
        index, self._gpu = 0, None
        if device != "cpu":
            # "cuda" is the engine's (first) GPU; "cuda:N" must be one of those it serves (SLUICE_DEVICE_IDS).
            ids = [int(x) for x in os.environ["SLUICE_DEVICE_IDS"].split(",")] if os.environ.get(
                "SLUICE_DEVICE_IDS") else [_device() or 0]
            want = int(device.split(":")[1]) if ":" in device else ids[0]
            if want not in ids:
                raise ValueError(f"Loader(device={device!r}): the engine serves GPUs {ids} (SLUICE_DEVICE_IDS)")
            index, self._gpu = ids.index(want), want
        self._opt = LoaderOptions(batch_size=batch_size, gpu=int(device != "cpu"), prefetch=prefetch, seed=seed,
                                  epoch=epoch, rank=rank, world_size=world_size, drop_last=int(drop_last),
                                  shuffle=int(shuffle), window_bytes=window_bytes, skip_corrupt=int(skip_corrupt),
                                  device_index=index)
        self._names = None
        if fields is not None:
            self._names = (C.c_char_p * (len(fields) + 1))(*[f.encode() for f in fields], None)
            self._opt.fields = C.cast(self._names, C.POINTER(C.c_char_p))
        self._types = {n: (t, s) for n, t, s in dataset.fields}
        self._h = None
        self._open(0)
        global _last_loader
        import weakref
        _last_loader = weakref.ref(self)

    def _open(self, position):
        if self._h:
            lib.sluice_loader_close(self._h)
            self._h = None
        self._opt.position = position
        h = C.c_void_p()
        check(lib.sluice_loader_open(C.byref(h), _eng(), self.dataset._h, C.byref(self._opt)))
        self._h, self._views, self._meta = h, {}, None

    def __len__(self):
        return lib.sluice_loader_batches(self._h)

    def set_epoch(self, epoch):
        self._opt.epoch = epoch
        check(lib.sluice_loader_set_epoch(self._h, epoch))

    def state_dict(self):
        s, e, p = C.c_uint64(), C.c_uint64(), C.c_uint64()
        lib.sluice_loader_state(self._h, C.byref(s), C.byref(e), C.byref(p))
        return {"seed": s.value, "epoch": e.value, "position": p.value}

    def load_state_dict(self, state):
        self._opt.seed, self._opt.epoch = state["seed"], state["epoch"]
        self._open(state["position"])

    def stats(self):
        buf = C.create_string_buffer(8192)
        n = lib.sluice_loader_stats_json(self._h, buf, len(buf))
        if n >= len(buf):
            buf = C.create_string_buffer(n + 1)
            lib.sluice_loader_stats_json(self._h, buf, len(buf))
        return json.loads(buf.value)

    def __iter__(self):
        b = Batch()
        stream = None
        if self.device != "cpu":
            import torch
            stream = C.c_void_p(torch.cuda.current_stream(self._gpu).cuda_stream)
        while True:
            r = check(lib.sluice_loader_next(self._h, C.byref(b), stream))
            if r == 0:
                return
            if self._meta is None:  # per field of the batch: name, dtype, item shape, element size
                self._meta = []
                for k in range(b.nfields):
                    name = b.field[k].name.decode()
                    dtype, shape = self._types[name]
                    self._meta.append((name, dtype, tuple(shape),
                                       np.dtype(_NP[_NAMES.index(dtype)] or np.uint16).itemsize))
            yield self._convert(b)

    def _array(self, ptr, nbytes, dtype, shape, host=False):
        key = (ptr, dtype, shape)
        a = self._views.get(key)
        if a is not None:
            return a
        t = np.uint64 if dtype == "ids" else _NP[_NAMES.index(dtype)] or np.uint16
        if self.device == "cpu" or host:
            raw = np.ctypeslib.as_array((C.c_uint8 * nbytes).from_address(ptr)) if nbytes else np.empty(0, np.uint8)
            a = raw.view(t).reshape(shape)
        else:
            import torch
            a = torch.as_tensor(_CudaArray(ptr, shape, np.dtype(t).str), device=f"cuda:{self._gpu}")
        # The ring's buffers stay where they are while the loader is open, so a view made once serves every
        # batch that lands in the same slot with the same shape (making one costs more than the rest of next()).
        if len(self._views) >= 1024:
            self._views.clear()
        self._views[key] = a
        return a

    def _convert(self, b):
        out = {"ids": self._array(b.ids, 8 * b.size, "ids", (b.size,), host=True).copy()}
        for k in range(b.nfields):
            f = b.field[k]
            name, dtype, shape, esize = self._meta[k]
            if f.item_bytes:
                out[name] = self._array(f.data, b.size * f.item_bytes, dtype, (b.size,) + shape)
            else:
                offs = self._array(f.offsets, 8 * (b.size + 1), "i64", (b.size + 1,))
                last = f.host_offsets[b.size]  # from host memory: no wait on the GPU
                out[name] = (self._array(f.data, last, dtype, (last // esize,)), offs)
        return out

    def close(self):
        if self._h:
            lib.sluice_loader_close(self._h)
            self._h = None

    def __del__(self):
        self.close()


_last_loader = None


class profile:
    """Context manager: what the loader's consumer waited for while the block ran.

        with sluice.profile() as p:      # the last Loader created, or profile(loader)
            for batch in loader: step(batch)
        p.report -> {"gpu_wait_share", "step_us", "loader_us", "h2d_us", "verdict", ...}

    A one-line summary goes to `file` (stderr by default; None for silence) on exit.
    """

    def __init__(self, loader=None, file=...):
        self.loader, self.file, self.report = loader, file, None

    def __enter__(self):
        self.loader = self.loader or (_last_loader() if _last_loader else None)
        if self.loader is None:
            raise RuntimeError("sluice.profile: no Loader to watch")
        return self

    def __exit__(self, *exc):
        self.report = self.loader.stats()
        r = self.report
        if self.file is not None:
            print(f"sluice: {r['batches']} batches, GPU waited {100 * r['gpu_wait_share']:.1f}% of the time; "
                  f"step {r['step_us']:.0f} us, loader {r['loader_us']:.0f} us a batch: {r['verdict']}",
                  file=sys.stderr if self.file is ... else self.file)
        return False


class Packer:
    """Token packing into rows of `context` tokens (best-fit decreasing, or greedy); see docs/LOADER.md."""

    def __init__(self, context, greedy=False, window=0, pad_id=0, ignore_index=-100):
        self._opt = PackerOptions(context=context, window=window, greedy=int(greedy), pad_id=pad_id,
                                  ignore_index=ignore_index, ignore_index_set=1)
        h = C.c_void_p()
        check(lib.sluice_packer_new(C.byref(h), C.byref(self._opt)))
        self._h, self.context = h, context

    def add(self, tokens):
        """Adds one document: token ids that fit int32 (others are refused, not wrapped)."""
        a = np.asarray(tokens)
        if a.size and a.dtype.kind not in "iub":
            raise SluiceError(-100001, f"Packer.add: tokens of dtype {a.dtype}: token ids are integers")
        if a.size and a.dtype.kind in "iu" and (a.min() < -(1 << 31) or a.max() >= 1 << 31):
            raise SluiceError(-100001, f"Packer.add: token id {a.max() if a.max() >= 1 << 31 else a.min()} "
                              "does not fit int32")
        t = np.ascontiguousarray(a, dtype=np.int32)
        check(lib.sluice_packer_add(self._h, t.ctypes.data_as(C.POINTER(C.c_int32)), t.size))

    def rows(self, flush=False):
        """Yields finished rows as dicts of numpy arrays (copies): input_ids, position_ids, labels, cu_seqlens."""
        r = PackedRow()
        L = self.context
        while check(lib.sluice_packer_row(self._h, C.byref(r), int(flush))) == 1:
            yield {"input_ids": np.ctypeslib.as_array(r.input_ids, shape=(L,)).copy(),
                   "position_ids": np.ctypeslib.as_array(r.position_ids, shape=(L,)).copy(),
                   "labels": np.ctypeslib.as_array(r.labels, shape=(L,)).copy(),
                   "cu_seqlens": np.ctypeslib.as_array(r.cu_seqlens, shape=(r.ndocs + 1,)).copy()}

    def fill(self):
        t, s = C.c_uint64(), C.c_uint64()
        lib.sluice_packer_stats(self._h, C.byref(t), C.byref(s))
        return t.value / s.value if s.value else 0.0

    def __del__(self):
        if getattr(self, "_h", None):
            lib.sluice_packer_free(self._h)
            self._h = None


from .checkpoint import load, save  # noqa: E402  (uses _buffer and _eng above)
