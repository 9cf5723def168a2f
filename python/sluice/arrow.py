"""Parquet files and Hugging Face `datasets` (their Arrow files) packed into sluice shards, through pyarrow (an
optional dependency: `pip install pyarrow`), the rows streamed a record batch at a time, never loaded whole.

Column types become field types: integers and floats (and bool, as u8) fixed-size scalars; fixed-size lists of
them fixed shapes; lists of them variable-length arrays; strings (UTF-8) and binary, bytes; an image or audio
struct of Hugging Face's ({"bytes", "path"}), its bytes.  What has no sluice type (uint64, nested lists, other
structs, maps) is refused naming the column, and a null value naming its row and column."""
import ctypes as C
import itertools
import json
import os
import stat

import numpy as np

from ._lib import Field, SluiceError, WriterOptions, check, cpath, json_error, lib, EFORMAT

_EINVAL = -100001  # SLUICE_EINVAL_CONFIG
_DTYPES = {"int8": 9, "int16": 10, "int32": 4, "int64": 5, "uint8": 1, "uint16": 2, "uint32": 3, "float16": 6,
           "float32": 8, "float64": 11, "bool": 1}


def _pa():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
        return pyarrow
    except ImportError:
        raise SluiceError(_EINVAL, "sluice.pack(parquet=/hf=): needs pyarrow (pip install pyarrow)") from None


def _dtype(typ):
    """The sluice dtype of an Arrow number type (or bool), or None."""
    pa = _pa()
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
        return None
    return _DTYPES.get(np.dtype(typ.to_pandas_dtype()).name)


def _plan(schema, where):
    """[(name, kind, dtype, shape)] of the schema's columns: kind "scalar", "fixed", "list", "bytes", "hfbytes"."""
    pa = _pa()
    t = pa.types
    out, seen = [], set()
    for f in schema:
        typ, name = f.type, f.name
        raw = name.encode("utf-8", "surrogateescape")
        if not raw or len(raw) > 255 or b"/" in raw or b"\0" in raw:
            raise SluiceError(_EINVAL, f"{where}: column {name!r}: a field's name is 1-255 bytes, without '/' or NUL")
        if name in seen:
            raise SluiceError(_EINVAL, f"{where}: column {name!r} appears twice")
        seen.add(name)
        if t.is_dictionary(typ):
            typ = typ.value_type
        if _dtype(typ) is not None:
            out.append((name, "scalar", _dtype(typ), ()))
        elif t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ):
            out.append((name, "bytes", 0, ()))
        elif t.is_fixed_size_list(typ) and _dtype(typ.value_type) is not None:
            out.append((name, "fixed", _dtype(typ.value_type), (typ.list_size,)))
        elif (t.is_list(typ) or t.is_large_list(typ)) and _dtype(typ.value_type) is not None:
            out.append((name, "list", _dtype(typ.value_type), (-1,)))
        elif t.is_struct(typ) and typ.get_field_index("bytes") >= 0 and (
                t.is_binary(typ.field("bytes").type) or t.is_large_binary(typ.field("bytes").type)):
            out.append((name, "hfbytes", 0, ()))
        else:
            raise SluiceError(_EINVAL, f"{where}: column '{name}' of type {f.type}: sluice has no field type for it "
                              f"(integers but uint64, floats, bool, strings, binary, lists of numbers, images)")
    if not out:
        raise SluiceError(_EINVAL, f"{where}: no columns")
    if len(out) > 64:
        raise SluiceError(_EINVAL, f"{where}: {len(out)} columns; a sluice dataset holds at most 64 fields")
    return out


def _column(col, kind, dtype, where, name, first):
    """One column of a record batch as (addresses, lengths, what keeps them alive): each row's bytes in place in
    Arrow's buffers (or a numpy copy of them); a null refused naming its row."""
    pa = _pa()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if kind == "hfbytes" and not col.null_count:
        col = col.field("bytes")
    if col.null_count:
        row = first + int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise SluiceError(EFORMAT, f"{where}: row {row}, column '{name}': null (sluice stores no nulls; an image or "
                          f"audio with only a path and no bytes is one)")
    n = len(col)
    if kind == "fixed" and col.flatten().null_count:
        raise SluiceError(EFORMAT, f"{where}: column '{name}': a list holds a null (sluice stores no nulls)")
    if kind in ("scalar", "fixed"):
        a = (col.flatten() if kind == "fixed" else col).to_numpy(zero_copy_only=False)
        a = np.ascontiguousarray(a.astype(np.uint8) if a.dtype == bool else a.astype(_np(dtype), copy=False))
        size = a.nbytes // n if n else 0
        return a.ctypes.data + size * np.arange(n, dtype=np.uint64), np.full(n, size, np.uint64), a
    if kind == "list":
        if col.values.null_count:
            raise SluiceError(EFORMAT, f"{where}: column '{name}': a list holds a null (sluice stores no nulls)")
        off = col.offsets.to_numpy().astype(np.uint64)
        a = np.ascontiguousarray(col.values.to_numpy(zero_copy_only=False).astype(_np(dtype), copy=False))
        size = a.dtype.itemsize
        return a.ctypes.data + off[:-1] * size, (off[1:] - off[:-1]) * size, a
    # strings and binary: Arrow's offsets into its data buffer
    large = pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type)
    bufs = col.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[col.offset:col.offset + n + 1]
    off = off.astype(np.uint64)
    base = bufs[2].address if bufs[2] is not None else 0
    return base + off[:-1], off[1:] - off[:-1], bufs


def _np(dtype):
    return {9: np.int8, 10: np.int16, 4: np.int32, 5: np.int64, 1: np.uint8, 2: np.uint16, 3: np.uint32,
            6: np.float16, 8: np.float32, 11: np.float64}[dtype]


def _columns(schema):
    """What a batch's rows are read by: each column's name and type (not its nullability, nor metadata: a null
    is refused row by row)."""
    return [(f.name, f.type) for f in schema]


def _differ(now, before):
    """How two batches' columns differ, in words."""
    a, b = dict(now), dict(before)
    if list(a) != list(b):
        return f"columns {list(a)} here, {list(b)} before"
    return "; ".join(f"column '{k}' is {a[k]} here, {b[k]} before" for k in a if a[k] != b[k])


def pack_arrow(out, batches, where, shard_size=0, zstd=0, block_size=0, metadata=None, overwrite=False):
    """The record batches, (file, batch) pairs, packed as one dataset at out (where: how errors name the source
    when it has no batch; overwrite: a sluice dataset at out is replaced whole, as sluice.pack's);
    {"records": n, "bytes": the fields' bytes}."""
    batches = iter(batches)
    first_path, first = next(batches, (None, None))
    if first is None:
        raise SluiceError(EFORMAT, f"{where}: no rows")
    plan, cols = _plan(first.schema, first_path), _columns(first.schema)
    fields = (Field * len(plan))()
    for f, (name, _, dtype, shape) in zip(fields, plan):
        f.name, f.dtype, f.ndim = name.encode(), dtype, len(shape)
        for d, n in enumerate(shape):
            f.shape[d] = n
    opt = WriterOptions(shard_size=shard_size, zstd_level=zstd, block_size=block_size,
                        metadata=json.dumps(metadata).encode() if metadata else None)
    w = C.c_void_p()
    opener = lib.sluice_writer_open_overwrite if overwrite else lib.sluice_writer_open
    check(opener(C.byref(w), cpath(out), fields, len(plan), C.byref(opt)))
    rows = nbytes = 0
    try:
        vals, lens = (C.c_void_p * len(plan))(), (C.c_size_t * len(plan))()
        for path, batch in itertools.chain(((first_path, first),), batches):
            if _columns(batch.schema) != cols:
                raise SluiceError(EFORMAT, f"{path}: row {rows} of the whole: its columns differ from "
                                  f"{first_path}'s ({_differ(_columns(batch.schema), cols)})")
            got = [_column(batch.column(k), kind, dtype, path, name, rows)
                   for k, (name, kind, dtype, _) in enumerate(plan)]
            addr, size = [c[0].tolist() for c in got], [c[1].tolist() for c in got]
            nbytes += sum(int(c[1].sum()) for c in got)
            for r in range(batch.num_rows):
                for k in range(len(plan)):
                    vals[k], lens[k] = addr[k][r] or None, size[k][r]
                check(lib.sluice_writer_add(w, vals, lens))
            rows += batch.num_rows
        check(lib.sluice_writer_close(w))
    except BaseException:
        lib.sluice_writer_abort(w)
        raise
    return {"records": rows, "bytes": nbytes}


def _regular(path, what="file"):
    """path, which must be a regular file (a FIFO or a device would hang a read or never end)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise SluiceError(-e.errno, f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SluiceError(EFORMAT, f"{path}: not a regular file (a {what} is one)")
    return path


def _small_json(path, limit, what):
    """The JSON of a regular file of at most limit bytes."""
    with open(_regular(path, what), "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise SluiceError(EFORMAT, f"{path}: over {limit} bytes (a {what} is small)")
    try:
        return json.loads(raw)
    except ValueError:
        raise SluiceError(EFORMAT, f"{path}: not JSON") from None


def _files(src, suffixes):
    if os.path.isdir(src):
        names = sorted(n for n in os.listdir(src) if n.endswith(suffixes))
        if not names:
            raise SluiceError(-2, f"{src}: no {' or '.join(suffixes)} files in it")
        return [_regular(os.path.join(src, n)) for n in names]
    return [_regular(src)]


def parquet_batches(src, batch_rows=4096):
    """The record batches of a Parquet file, or of every .parquet file of a directory in name order."""
    pa = _pa()
    for path in _files(src, (".parquet",)):
        try:
            pf = pa.parquet.ParquetFile(path)
            for batch in pf.iter_batches(batch_size=batch_rows):
                yield path, batch
        except (pa.ArrowException, OSError) as e:
            raise SluiceError(EFORMAT, f"{path}: not a Parquet file sluice reads ({e})") from None


def hf_batches(src):
    """The record batches of a Hugging Face dataset saved with save_to_disk (its state.json's data files, in
    order) or of Arrow files (a datasets cache file, a directory of them in name order), stream or file format."""
    pa = _pa()
    if os.path.isdir(src) and os.path.lexists(os.path.join(src, "dataset_dict.json")):
        splits = sorted(n for n in os.listdir(src) if os.path.isdir(os.path.join(src, n)))
        raise SluiceError(_EINVAL, f"{src}: a DatasetDict (dataset_dict.json): pack one split, "
                          f"{os.path.join(src, splits[0] if splits else 'train')} (splits: {', '.join(splits)})")
    state = os.path.join(src, "state.json") if os.path.isdir(src) else None
    if state and os.path.lexists(state):
        try:
            files = [os.path.join(src, d["filename"]) for d in _small_json(state, 16 << 20, "state.json")["_data_files"]]
        except (KeyError, TypeError):
            raise SluiceError(EFORMAT, f"{state}: not a datasets state.json (no _data_files)") from None
        for p in files:
            if os.path.dirname(os.path.realpath(p)) != os.path.realpath(src):  # by name or by a link
                raise SluiceError(EFORMAT, f"{state}: data file {p!r} lies outside the dataset's directory")
            _regular(p, "data file")
    else:
        files = _files(src, (".arrow",))
    for path in files:
        for batch in _arrow_file(pa, path):
            yield path, batch


def _arrow_file(pa, path):
    """The record batches of one Arrow file, stream or file format, read whole: a stream must end in its
    end-of-stream marker (one cut short would read as fewer rows, with no error from pyarrow)."""
    try:
        with pa.OSFile(path) as source:  # read, not mapped: a file cut short meanwhile is an error, not SIGBUS
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)
                return
            yield from reader
            size = source.size()
            source.seek(max(size - 8, 0))
            tail = source.read(8)
            if source.tell() != size or tail != b"\xff\xff\xff\xff\x00\x00\x00\x00":
                raise SluiceError(EFORMAT, f"{path}: an Arrow stream cut short (no end-of-stream marker)")
    except (pa.ArrowException, OSError) as e:
        raise SluiceError(EFORMAT, f"{path}: not an Arrow file sluice reads ({e})") from None


def hf_metadata(src):
    """What a saved dataset says of its features (class names of a ClassLabel, ...), for the dataset's metadata."""
    info = os.path.join(src, "dataset_info.json") if os.path.isdir(src) else None
    if not info or not os.path.lexists(info):
        return None
    features = _small_json(info, 8 << 20, "dataset_info.json")
    features = features.get("features") if isinstance(features, dict) else None
    return {"features": features} if features else None


def main(argv=None):
    """`sluice pack --from-parquet SRC` / `--from-hf SRC` (cli/cmd_pack.c runs this with the options it has
    checked): KIND SRC OUT SHARD_SIZE ZSTD BLOCK_SIZE [--json] [--overwrite].  The report has the C command's keys."""
    import sys
    import time
    from .packer import pack
    args = sys.argv[1:] if argv is None else argv
    kind, src, out, shard_size, zstd, block_size = args[:6]
    t = time.perf_counter()
    as_json = "--json" in args[6:]
    try:
        rep = pack(out, **{kind: src}, shard_size=int(shard_size), zstd=int(zstd), block_size=int(block_size),
                   overwrite="--overwrite" in args[6:])
    except Exception as e:  # noqa: BLE001 -- whatever it is, the command says it failed, and how
        # --json: the failure as JSON on stdout too, as every sluice command's (cli/cli.h).
        import errno
        code = e.code if isinstance(e, SluiceError) else -e.errno if isinstance(e, OSError) and e.errno else \
            -errno.EINVAL
        if as_json:
            print(json.dumps(json_error("pack", 1, code, str(e))), flush=True)
        sys.exit(f"sluice pack: {e}")
    s = time.perf_counter() - t
    if as_json:
        print(json.dumps({"records": rep["records"], "documents": 0, "tokens": 0, "dtype": "", "bytes": rep["bytes"],
                          "seconds": round(s, 3), "from_format": kind, "labelled": False,
                          "files_per_s": round(rep["records"] / s, 1) if s > 0 else 0.0, "packed_context": 0,
                          "fill": 0.0}))
    else:
        print(f"packed {rep['records']} {kind} rows ({rep['bytes'] / 1e6:.1f} MB) from {src} into {out} in {s:.2f} s")


if __name__ == "__main__":
    main()
