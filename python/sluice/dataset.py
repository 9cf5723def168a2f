"""Datasets: records by index, whole shards into memory, and the dtypes of their fields."""
import ctypes as C
import json
import os

import numpy as np

from ._lib import ERANGE, ShardReport, Record, RecordLoc, SluiceError, check, cpath, lib, shown

from .buffers import _buffer, _eng  # noqa: F401

# sluice_dtype codes (include/sluice.h) as numpy dtypes; bytes are uint8.
_NP = [np.uint8, np.uint8, np.uint16, np.uint32, np.int32, np.int64, np.float16, None, np.float32, np.int8,
       np.int16, np.float64]
_NAMES = ["bytes", "u8", "u16", "u32", "i32", "i64", "f16", "bf16", "f32", "i8", "i16", "f64"]


def _int_option(where, name, value, lo, hi):
    """value as an int for a C integer of range [lo, hi], or ValueError naming the option: ctypes would wrap
    it silently (2**32 + 512 into an unsigned int is 512)."""
    import operator
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {name}={value!r} is not an integer") from None
    if not lo <= v <= hi:
        raise ValueError(f"{where}: {name}={v} is out of range ({lo} to {hi})")
    return v


class _RecordRange(SluiceError, IndexError):
    """A record number past the dataset: SLUICE_ERANGE, and an IndexError, so that `for r in ds` ends."""


class Dataset:
    """Map-style view of any dataset sluice reads (its own shards, Megatron .bin/.idx, WebDataset tars).

    ds[i] is a dict of field name -> numpy value (a copy): a scalar field (one number a record) a numpy scalar, as
    torch's default_collate stacks into [batch]; other typed fields arrays of their dtype and, where the shape is
    fixed, their shape; bytes fields uint8 arrays.  .metadata is what the dataset's writer stored with it (a dict;
    {} for none); .class_to_idx, for a packed ImageFolder, the class of each label as torchvision's ImageFolder
    gives it.
    A map-style dataset for torch's DataLoader too, with worker processes under any start method: it pickles as
    its path (a worker opens it again), and a process forked from the one that opened it reopens it on first use
    (nothing a thread or a ring of the parent's needs is used in the child).
    """

    _h = None  # set once the C dataset is open; close() and __del__ look at it

    def __init__(self, path):
        self._open(path)

    def __reduce__(self):
        return (Dataset, (self._where,))

    def _open(self, path):
        h = C.c_void_p()
        check(lib.sluice_dataset_open(C.byref(h), cpath(path)))
        self._h, self.path, self._pid = h, path, os.getpid()
        # Where a worker, or this process after a fork, opens it again: a local path made absolute now, since
        # the current directory may change before then (and another dataset lie under the same relative name).
        p = os.fsdecode(path)
        self._where = p if "://" in p else os.path.abspath(p)
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

    @property
    def _handle(self):
        """The C dataset of this process: one forked from the opener's opens its own (the parent's is left as it
        is: closing it would touch what the parent's threads own)."""
        if self._pid != os.getpid():
            self._h, path = None, self.path
            self._open(self._where)
            self.path = path
        return self._h

    def __len__(self):
        return lib.sluice_dataset_count(self._handle)

    @property
    def shards(self):
        """The number of the dataset's data files (shards)."""
        return lib.sluice_dataset_shards(self._handle)

    def shard_of(self, i):
        """The shard record i lies in (0 .. shards - 1)."""
        if not 0 <= _int_option("Dataset.shard_of", "index", i, 0, (1 << 64) - 1) < len(self):
            raise _RecordRange(ERANGE, f"{shown(self.path)}: record {i} of {len(self)}")
        loc = RecordLoc()
        check(lib.sluice_dataset_locate(self._handle, i, C.byref(loc)))
        return loc.shard

    def __getitem__(self, i):
        n, i = len(self), _int_option("Dataset", "index", i, -float("inf"), float("inf"))
        if not -n <= i < n:  # checked here, before ctypes could wrap it into range
            raise _RecordRange(ERANGE, f"{shown(self.path)}: record {i} of {n}")
        if i < 0:
            i += n
        loc, h = RecordLoc(), self._handle
        check(lib.sluice_dataset_locate(h, i, C.byref(loc)))
        if self._buf.size < loc.length:
            self._buf = np.empty(loc.length, np.uint8)
        rec = Record()
        check(lib.sluice_dataset_read(h, i, self._buf.ctypes.data, self._buf.size, C.byref(rec)))
        out = {}
        for k, (name, dtype, shape) in enumerate(self.fields):
            raw = np.ctypeslib.as_array((C.c_uint8 * rec.len[k]).from_address(rec.data[k])) if rec.len[k] else \
                np.empty(0, np.uint8)
            out[name] = _typed(raw.copy(), dtype, shape)
        return out

    def shard_bytes(self, s):
        """Shard s's records, and the bytes of its records back to back (uncompressed): what read_shard needs."""
        r, b = C.c_uint64(), C.c_uint64()
        check(lib.sluice_dataset_shard_info(self._handle, _int_option("Dataset.shard_bytes", "s", s, 0, (1 << 32) - 1),
                                            C.byref(r), C.byref(b)))
        return r.value, max(b.value - 4096, 0)

    def read_shard(self, s, out, decoder="auto"):
        """Shard s whole into out (numpy array or GPU tensor of at least shard_bytes(s)[1] bytes): its records
        back to back, zstd blocks decoded on the GPU by nvCOMP or on the CPU (decoder auto|gpu|cpu).  Returns
        {"bytes", "stored", "blocks", "read_s", "decode_s", "decoder", "why_not_gpu"}."""
        decoders = {"auto": 0, "cpu": 1, "gpu": 2}
        if decoder not in decoders:
            raise ValueError(f"Dataset.read_shard(decoder={decoder!r}): one of auto, gpu, cpu")
        _find_nvcomp()
        ptr, n, keep = _buffer(out, True)
        rep = ShardReport()
        s = _int_option("Dataset.read_shard", "s", s, 0, (1 << 32) - 1)
        check(lib.sluice_dataset_read_shard(_eng(), self._handle, s, ptr, n, decoders[decoder],
                                            C.byref(rep)))
        return {"bytes": rep.bytes, "stored": rep.stored, "blocks": rep.blocks, "read_s": rep.read_s,
                "decode_s": rep.decode_s, "decoder": rep.decoder.decode(), "why_not_gpu": rep.why_not_gpu.decode()}

    def close(self):
        """Closes the dataset's files now (a Dataset also closes when it is collected)."""
        if self._h and self._pid == os.getpid():
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
    if not shape and dtype != "bytes" and a.size == 1:  # a scalar field: one number, as a numpy scalar
        return a[0]
    return a.reshape(shape) if shape and all(d > 0 for d in shape) else a
