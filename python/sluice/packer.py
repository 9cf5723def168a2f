"""Packing: datasets, trees, JSON lines and token arrays into sluice shards (sluice.pack), and token packing
into fixed-length rows (sluice.Packer)."""
import ctypes as C
import os

import numpy as np

from ._lib import PackedRow, PackerOptions, PackOptions, PackReport, PACK_PROGRESS, SluiceError, check, cpath, lib
from .dataset import _int_option

_U32, _U64, _I32 = (0, (1 << 32) - 1), (0, (1 << 64) - 1), (-(1 << 31), (1 << 31) - 1)


_PACK_SOURCES = {"dataset": 1, "dir": 2, "jsonl": 3, "tokens": 4}


def pack(out, *, dataset=None, dir=None, jsonl=None, fields=None, tokens=None, doc_lengths=None, dtype=None,
         pack_context=0, greedy=False, all_files=False, follow_symlinks=False, threads=0, shard_size=0, zstd=0,
         block_size=0, progress=None, parquet=None, hf=None, overwrite=False):
    """Packs one source into sluice shards at out, in this process (the library's sluice_pack, as `sluice pack`):
    dataset= any dataset sluice reads; dir= an ImageFolder tree (torchvision's classes, order and extensions,
    all_files=True for every file); jsonl= a JSON lines file with fields="k1,k2"; tokens= a token array (.npy, or
    raw .bin of dtype "u16"/"u32") with doc_lengths=, packed into rows of pack_context tokens when given.
    progress(done, total, bytes) is called now and then.  Returns the report as a dict; raises SluiceError
    naming the file, line, record or option.
    out must not hold a dataset already, unless overwrite=True: then the new one replaces it whole or not at all,
    written beside it and swapped in by one rename at the end (a kill at any moment leaves the old dataset or the
    new one, whole); only a local sluice dataset, what an unfinished pack left or an empty directory is replaced,
    anything else refused by name.
    parquet= a Parquet file (or a directory of them), hf= a Hugging Face dataset saved with save_to_disk (or its
    Arrow cache files): through pyarrow, a record batch at a time, each column a field of its type (see
    sluice.arrow); a saved dataset's features (class names) kept as the dataset's metadata."""
    given = {k: v for k, v in (("dataset", dataset), ("dir", dir), ("jsonl", jsonl), ("tokens", tokens),
                               ("parquet", parquet), ("hf", hf)) if v}
    if len(given) != 1:
        raise ValueError("sluice.pack: give one of dataset=, dir=, jsonl=, tokens=, parquet=, hf=")
    (kind, src), = given.items()
    if kind in ("parquet", "hf"):
        from . import arrow
        src = os.fspath(src)
        if "://" in src:  # not echoed: a URL may carry credentials
            raise SluiceError(-100001, f"sluice.pack({kind}=): reads local files and directories, not URLs (copy it "
                              f"here first: sluice cp)")
        batches = arrow.parquet_batches(src) if kind == "parquet" else arrow.hf_batches(src)
        rep = arrow.pack_arrow(os.fspath(out), batches, f"{kind}: {src}",
                               shard_size=_int_option("sluice.pack", "shard_size", shard_size, *_U64),
                               zstd=_int_option("sluice.pack", "zstd", zstd, *_I32),
                               block_size=_int_option("sluice.pack", "block_size", block_size, *_U64),
                               metadata=arrow.hf_metadata(src) if kind == "hf" else None, overwrite=bool(overwrite))
        return {**rep, "from_format": kind}
    o = PackOptions()
    o.source, o.from_ = _PACK_SOURCES[kind], cpath(src)
    o.fields = fields.encode() if fields else None
    o.doc_lengths = cpath(doc_lengths) if doc_lengths else None
    o.dtype = dtype.encode() if dtype else None
    # Every integer range-checked here: ctypes would wrap it (pack_context=2**32 + 512 packed rows of 512).
    o.pack_context = _int_option("sluice.pack", "pack_context", pack_context, *_U32)
    o.greedy, o.all_files, o.follow_symlinks = int(greedy), int(all_files), int(follow_symlinks)
    o.threads = _int_option("sluice.pack", "threads", threads, *_U32)
    o.writer.shard_size = _int_option("sluice.pack", "shard_size", shard_size, *_U64)
    o.writer.zstd_level = _int_option("sluice.pack", "zstd", zstd, *_I32)
    o.writer.block_size = _int_option("sluice.pack", "block_size", block_size, *_U64)
    cb = PACK_PROGRESS((lambda done, total, nbytes, arg: progress(done, total, nbytes)) if progress else 0)
    o.progress = cb
    o.overwrite = int(bool(overwrite))
    rep = PackReport()
    check(lib.sluice_pack(cpath(out), C.byref(o), C.byref(rep)))
    return {"records": rep.records, "bytes": rep.bytes, "documents": rep.documents, "tokens": rep.tokens,
            "fill": rep.fill, "seconds": rep.seconds, "labelled": bool(rep.labelled),
            "from_format": rep.from_format.decode(), "dtype": rep.dtype.decode()}


class Packer:
    """Token packing into rows of `context` tokens (best-fit decreasing, or greedy); see docs/LOADER.md."""

    def __init__(self, context, greedy=False, window=0, pad_id=0, ignore_index=-100):
        self._opt = PackerOptions(context=_int_option("Packer", "context", context, *_U32),
                                  window=_int_option("Packer", "window", window, *_U32), greedy=int(greedy),
                                  pad_id=_int_option("Packer", "pad_id", pad_id, *_I32),
                                  ignore_index=_int_option("Packer", "ignore_index", ignore_index, *_I32),
                                  ignore_index_set=1)
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
        """The share of the rows' tokens that are documents' tokens, not padding, so far."""
        t, s = C.c_uint64(), C.c_uint64()
        lib.sluice_packer_stats(self._h, C.byref(t), C.byref(s))
        return t.value / s.value if s.value else 0.0

    def __del__(self):
        if getattr(self, "_h", None):
            lib.sluice_packer_free(self._h)
            self._h = None
