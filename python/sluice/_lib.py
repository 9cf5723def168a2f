"""ctypes view of libsluice (include/sluice.h): library loading, structs, prototypes, errors."""
import ctypes as C
import os

MAX_FIELDS = 64
MAX_NDIM = 4


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.environ.get("SLUICE_LIB"), os.path.join(here, "libsluice.so"),
                 os.path.join(here, "..", "..", "build", "libsluice.so"), "libsluice.so"):
        if path and (os.path.exists(path) or path == "libsluice.so"):
            try:
                return C.CDLL(path)
            except OSError:
                if path != "libsluice.so":
                    raise
    raise OSError("libsluice.so not found: install the package (pip install .) or set SLUICE_LIB")


lib = _load()


# sluice.h's own codes the package raises or tells apart.
ERANGE, ESHORT, EFORMAT, ECRC = -100006, -100007, -100011, -100012


def env_int(where, name, default, lo, hi, why=""):
    """The environment variable name as an int in [lo, hi] (default where unset), or ValueError naming the variable
    (a bare int() says only "invalid literal"); why says what the range means."""
    v = os.environ.get(name)
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"{where}: {name}={v!r} is not a whole number") from None
    if not lo <= n <= hi:
        raise ValueError(f"{where}: {name}={n} is out of range ({lo} to {hi}{why})")
    return n


def json_error(command, status, code, detail):
    """A failure as the sluice command's --json says it (cli/cli.h): {"error": {command, status, code, name, message,
    detail, text}}; code is sluice's or -errno."""
    name = lib.sluice_error_name(code).decode()
    return {"error": {"command": command, "status": status, "code": code, "name": name,
                      "message": lib.sluice_strerror(code).decode(), "detail": detail,
                      "text": f"sluice {command}: {detail}"}}


class SluiceError(RuntimeError):
    """An error from libsluice: .code is its negative code, the message carries the C detail."""

    def __init__(self, code, detail):
        self.code, self.detail = code, detail
        name = lib.sluice_strerror(code).decode()
        super().__init__(f"{detail} ({name})" if detail else name)

    def __reduce__(self):  # pickled whole: torch.distributed hands a rank's errors to the others
        return SluiceError, (self.code, self.detail)


def cpath(path):
    """path as the bytes C takes: a str or bytes path (os.fspath's) encoded as os.fsencode encodes it; a NUL in it
    is a ValueError, as Python's open() says, not a path cut short at the NUL by ctypes."""
    b = os.fsencode(os.fspath(path))
    if b"\0" in b:
        raise ValueError(f"embedded null byte in path {os.fsdecode(b)!r}")
    return b


def shown(url):
    """A path or URL as sluice's messages name it (sluice_url_redact): no query, no password."""
    out = C.create_string_buffer(4096)
    lib.sluice_url_redact(os.fsencode(url), out, len(out))
    return out.value.decode(errors="replace")


def check(rc):
    """Raises SluiceError for a negative return code; returns rc otherwise."""
    if rc < 0:
        raise SluiceError(rc, lib.sluice_last_error_detail().decode(errors="replace"))
    return rc


def names_of(fn, *args):
    """The paths a library call fn(*args, char ***names, unsigned *n) gives back (sluice_list's way), decoded,
    and their array freed (sluice_list_free)."""
    names, n = C.POINTER(C.c_char_p)(), C.c_uint()
    check(fn(*args, C.byref(names), C.byref(n)))
    try:
        return [os.fsdecode(names[i]) for i in range(n.value)]
    finally:
        lib.sluice_list_free(names, n)


class _Sized(C.Structure):
    """A struct that grows (sluice.h's conventions): its first field, its size, is set here, and in nested ones."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.size = C.sizeof(self)
        for name, kind in self._fields_:
            if isinstance(kind, type) and issubclass(kind, _Sized):
                getattr(self, name).size = C.sizeof(kind)


class ShardReport(_Sized):
    _fields_ = [("size", C.c_size_t), ("bytes", C.c_uint64), ("stored", C.c_uint64), ("blocks", C.c_uint), ("read_s", C.c_double),
                ("decode_s", C.c_double), ("decoder", C.c_char * 8), ("why_not_gpu", C.c_char * 256)]


class CpuTimes(C.Structure):
    _fields_ = [("busy_s", C.c_double), ("idle_s", C.c_double), ("iowait_s", C.c_double)]


class DiskCounters(C.Structure):
    _fields_ = [("name", C.c_char * 32), ("reads", C.c_uint64), ("read_bytes", C.c_uint64), ("writes", C.c_uint64),
                ("write_bytes", C.c_uint64), ("read_wait_s", C.c_double), ("busy_s", C.c_double)]


class NicCounters(C.Structure):
    _fields_ = [("name", C.c_char * 32), ("rx_bytes", C.c_uint64), ("tx_bytes", C.c_uint64)]


class ProcCounters(C.Structure):
    _fields_ = [("pid", C.c_int), ("ppid", C.c_int), ("name", C.c_char * 32), ("cpu_s", C.c_double),
                ("rss", C.c_uint64), ("read_bytes", C.c_uint64), ("rchar", C.c_uint64)]


class MachineSample(_Sized):
    _fields_ = [("size", C.c_size_t), ("t", C.c_double), ("ncpus", C.c_uint), ("all", CpuTimes),
                ("cpu", CpuTimes * 256), ("mem_total", C.c_uint64), ("mem_available", C.c_uint64),
                ("page_cache", C.c_uint64), ("dirty", C.c_uint64), ("mlocked", C.c_uint64), ("ndisks", C.c_uint),
                ("disk", DiskCounters * 32), ("nnics", C.c_uint), ("nic", NicCounters * 16), ("nprocs", C.c_uint),
                ("proc", ProcCounters * 256), ("procs_left_out", C.c_uint)]


class GpuSample(C.Structure):
    _fields_ = [("index", C.c_uint), ("name", C.c_char * 96), ("util_pct", C.c_int), ("mem_util_pct", C.c_int),
                ("mem_used", C.c_uint64), ("mem_total", C.c_uint64), ("pcie_rx_mb_s", C.c_double),
                ("pcie_tx_mb_s", C.c_double)]


class CheckpointReport(_Sized):
    _fields_ = [("size", C.c_size_t), ("lock_s", C.c_double), ("checkpoint_s", C.c_double), ("restore_s", C.c_double),
                ("unlock_s", C.c_double), ("gpu_bytes", C.c_uint64), ("state", C.c_int)]


class Field(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("ndim", C.c_int), ("shape", C.c_int64 * MAX_NDIM)]


class Record(C.Structure):
    _fields_ = [("data", C.c_void_p * MAX_FIELDS), ("len", C.c_size_t * MAX_FIELDS)]


class RecordLoc(C.Structure):
    _fields_ = [("shard", C.c_uint), ("offset", C.c_uint64), ("length", C.c_uint32), ("crc", C.c_uint32)]


class ImageOptions(_Sized):
    _fields_ = [("size", C.c_size_t), ("field", C.c_char_p), ("height", C.c_uint32), ("width", C.c_uint32),
                ("mode", C.c_int), ("scale", C.c_float * 2), ("ratio", C.c_float * 2), ("flip", C.c_float),
                ("mean", C.c_float * 3), ("std", C.c_float * 3), ("dtype", C.c_int), ("channels_last", C.c_int),
                ("decode", C.c_int), ("resize", C.c_uint32)]


class ImageBox(C.Structure):
    _fields_ = [(k, C.c_int) for k in ("x", "y", "w", "h", "resized_w", "resized_h", "offset_x", "offset_y", "flip")]


class LoaderSegment(C.Structure):
    _fields_ = [("nodes", C.c_uint), ("position", C.c_uint64)]


LOADER_SEGMENTS_MAX = 16


class LoaderOptions(_Sized):
    _fields_ = [("size", C.c_size_t), ("batch_size", C.c_uint32), ("fields", C.POINTER(C.c_char_p)), ("gpu", C.c_int),
                ("prefetch", C.c_uint), ("seed", C.c_uint64), ("epoch", C.c_uint64), ("position", C.c_uint64),
                ("rank", C.c_uint), ("world_size", C.c_uint), ("drop_last", C.c_int), ("shuffle", C.c_int),
                ("window_bytes", C.c_uint64), ("skip_corrupt", C.c_int), ("device_index", C.c_uint),
                ("image", C.POINTER(ImageOptions)), ("transform", C.c_void_p), ("transform_arg", C.c_void_p),
                ("nodes", C.c_uint), ("resume", C.POINTER(LoaderSegment)), ("nresume", C.c_uint),
                ("even_batches", C.c_int), ("hold", C.c_int), ("hold_bytes", C.c_uint64)]


class BatchField(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("data", C.c_void_p), ("offsets", C.c_void_p),
                ("item_bytes", C.c_uint64), ("host_offsets", C.POINTER(C.c_uint64)), ("ndim", C.c_int),
                ("shape", C.c_int64 * (MAX_NDIM + 1)), ("strides", C.c_int64 * (MAX_NDIM + 1))]


class Batch(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("index", C.c_uint64), ("size", C.c_uint32), ("nfields", C.c_uint),
                ("field", BatchField * MAX_FIELDS), ("ids", C.c_void_p), ("event", C.c_void_p), ("hold", C.c_uint64)]


class PackerOptions(_Sized):
    _fields_ = [("size", C.c_size_t), ("context", C.c_uint32), ("window", C.c_uint32), ("greedy", C.c_int), ("pad_id", C.c_int32),
                ("ignore_index", C.c_int32), ("ignore_index_set", C.c_int)]


class PackedRow(C.Structure):
    _fields_ = [("input_ids", C.POINTER(C.c_int32)), ("position_ids", C.POINTER(C.c_int32)),
                ("labels", C.POINTER(C.c_int32)), ("cu_seqlens", C.POINTER(C.c_int32)), ("ndocs", C.c_uint32),
                ("tokens", C.c_uint32)]


class CopyReport(_Sized):
    _fields_ = [("size", C.c_size_t), ("files", C.c_uint64), ("bytes", C.c_uint64), ("seconds", C.c_double),
                ("files_verified", C.c_uint64), ("checksum", C.c_char * 64), ("skipped", C.c_uint64)]


class XferReport(_Sized):
    """struct sluice_xfer_report."""
    _fields_ = [("size", C.c_size_t), ("bytes", C.c_uint64), ("bytes_direct", C.c_uint64), ("bytes_buffered", C.c_uint64),
                ("ios", C.c_uint64), ("seconds", C.c_double), ("path", C.c_char * 96),
                ("bytes_verified", C.c_uint64), ("bytes_storage", C.c_uint64), ("checksum", C.c_char * 64)]


class S3Object(C.Structure):
    """struct sluice_s3_object."""
    _fields_ = [("key", C.c_char_p), ("buf", C.c_void_p), ("cap", C.c_size_t), ("result", C.c_ssize_t),
                ("size", C.c_uint64)]


class WriterOptions(_Sized):
    _fields_ = [("size", C.c_size_t), ("shard_size", C.c_uint64), ("zstd_level", C.c_int), ("block_size", C.c_size_t), ("metadata", C.c_char_p)]


PACK_PROGRESS = C.CFUNCTYPE(None, C.c_uint64, C.c_uint64, C.c_uint64, C.c_void_p)


class PackOptions(_Sized):
    _fields_ = [("size", C.c_size_t), ("source", C.c_int), ("from_", C.c_char_p), ("fields", C.c_char_p),
                ("doc_lengths", C.c_char_p), ("dtype", C.c_char_p), ("pack_context", C.c_uint), ("greedy", C.c_int),
                ("all_files", C.c_int), ("follow_symlinks", C.c_int), ("threads", C.c_uint), ("writer", WriterOptions),
                ("progress", PACK_PROGRESS), ("progress_arg", C.c_void_p), ("overwrite", C.c_int)]


class PackReport(_Sized):
    _fields_ = [("size", C.c_size_t), ("records", C.c_uint64), ("bytes", C.c_uint64), ("documents", C.c_uint64),
                ("tokens", C.c_uint64), ("fill", C.c_double), ("seconds", C.c_double), ("labelled", C.c_int),
                ("from_format", C.c_char * 32), ("dtype", C.c_char * 16)]


class Range(C.Structure):
    _fields_ = [("file", C.c_void_p), ("offset", C.c_uint64), ("len", C.c_size_t), ("buf", C.c_void_p)]


class CkptTensor(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_char_p), ("torch_dtype", C.c_char_p), ("ndim", C.c_uint),
                ("shape", C.POINTER(C.c_uint64)), ("chunk", C.POINTER(C.c_uint64)), ("file", C.c_uint),
                ("offset", C.c_uint64), ("bytes", C.c_uint64), ("at", C.c_uint64)]


P = C.c_void_p
_protos = {
    "sluice_file_open": (C.c_int, [C.POINTER(P), P, C.c_char_p, C.c_int]),
    "sluice_file_close": (None, [P]),
    "sluice_file_size": (C.c_uint64, [P]),
    "sluice_st_header_read": (C.c_int, [C.POINTER(P), P, C.c_char_p]),
    "sluice_st_header_json": (C.c_void_p, [P, C.POINTER(C.c_size_t)]),
    "sluice_st_header_data_start": (C.c_uint64, [P]),
    "sluice_st_header_free": (None, [P]),
    "sluice_ckpt_open_files": (C.c_int, [C.POINTER(P), P, C.POINTER(C.c_char_p), C.c_uint, C.c_char_p, C.c_char_p,
                                         C.c_size_t]),
    "sluice_ckpt_close": (None, [P]),
    "sluice_ckpt_count": (C.c_size_t, [P]),
    "sluice_ckpt_tensor": (C.POINTER(CkptTensor), [P, C.c_size_t]),
    "sluice_ckpt_files": (C.c_uint, [P]),
    "sluice_ckpt_file": (C.c_char_p, [P, C.c_uint]),
    "sluice_ckpt_handle": (P, [P, C.c_uint]),
    "sluice_ckpt_check": (C.c_int, [P]),
    "sluice_dcp_metadata_check": (C.c_int, [C.c_char_p, C.c_size_t, C.c_char_p]),
    "sluice_st_index_files": (C.c_int, [C.c_char_p, C.c_char_p, C.c_size_t, C.POINTER(C.POINTER(C.c_char_p)),
                                        C.POINTER(C.c_uint)]),
    "sluice_s3_open": (C.c_int, [C.POINTER(P), P, C.c_char_p, C.c_char_p, C.c_char_p, C.c_char_p]),
    "sluice_s3_close": (None, [P]),
    "sluice_s3_open_config": (C.c_int, [C.POINTER(P), P, C.c_char_p, C.c_char_p, C.c_char_p, C.c_char_p]),
    "sluice_s3_read_async": (C.c_int, [P, C.c_char_p, C.c_char_p, P, C.c_uint64, C.c_size_t, P, P, C.POINTER(P)]),
    "sluice_s3_write_async": (C.c_int, [P, C.c_char_p, C.c_char_p, P, C.c_size_t, P, P, C.POINTER(P)]),
    "sluice_config_set_threads": (C.c_int, [P, C.c_uint]),
    "sluice_config_set_queue_depth": (C.c_int, [P, C.c_uint]),
    "sluice_config_set_max_transfer_size": (C.c_int, [P, C.c_size_t]),
    "sluice_config_set_buffer_pool_size": (C.c_int, [P, C.c_size_t]),
    "sluice_config_set_device_ids": (C.c_int, [P, C.POINTER(C.c_int), C.c_uint]),
    "sluice_config_set_enable_p2p": (C.c_int, [P, C.c_int]),
    "sluice_s3_read_to_gpu": (C.c_ssize_t, [P, C.c_char_p, C.c_char_p, P, C.c_uint64, C.c_size_t, P]),
    "sluice_s3_write_from_gpu": (C.c_ssize_t, [P, C.c_char_p, C.c_char_p, P, C.c_size_t, P]),
    "sluice_s3_size": (C.c_int, [P, C.c_char_p, C.c_char_p, C.POINTER(C.c_uint64)]),
    "sluice_s3_get_many": (C.c_int, [P, C.c_char_p, C.POINTER(S3Object), C.c_size_t, C.c_uint]),
    "sluice_copy": (C.c_int, [C.c_char_p, C.c_char_p, C.c_uint, C.POINTER(CopyReport)]),
    "sluice_metrics_text": (C.c_size_t, [C.c_char_p, C.c_size_t]),
    "sluice_read_broadcast": (C.c_ssize_t, [P, C.c_char_p, C.c_uint64, C.c_size_t, C.POINTER(P), C.c_uint, P]),
    "sluice_process_checkpoint": (C.c_int, [C.c_int, C.c_uint, C.c_uint, C.POINTER(CheckpointReport)]),
    "sluice_process_state_name": (C.c_char_p, [C.c_int]),
    "sluice_metrics_serve": (C.c_int, [C.c_uint, C.POINTER(C.c_uint)]),
    "sluice_file_sync": (C.c_int, [P]),
    "sluice_list": (C.c_int, [C.c_char_p, C.c_int, C.POINTER(C.POINTER(C.c_char_p)), C.POINTER(C.c_uint)]),
    "sluice_list_free": (None, [C.POINTER(C.c_char_p), C.c_uint]),
    "sluice_remove": (C.c_int, [C.c_char_p]),
    "sluice_path_store": (C.c_char_p, [C.c_char_p, C.POINTER(C.c_uint)]),
    "sluice_gpu_stream_sync": (C.c_int, [P, P]),
    "sluice_read_batch": (C.c_ssize_t, [P, C.POINTER(Range), C.c_size_t, P]),
    "sluice_write_batch": (C.c_ssize_t, [P, C.POINTER(Range), C.c_size_t, P]),
    "sluice_strerror": (C.c_char_p, [C.c_int]),
    "sluice_error_name": (C.c_char_p, [C.c_int]),
    "sluice_url_redact": (None, [C.c_char_p, C.c_char_p, C.c_size_t]),
    "sluice_version": (C.c_char_p, []),
    "sluice_last_error_detail": (C.c_char_p, []),
    "sluice_config_new": (C.c_int, [C.POINTER(P)]),
    "sluice_config_free": (None, [P]),
    "sluice_config_set_device": (C.c_int, [P, C.c_int]),
    "sluice_engine_open": (C.c_int, [C.POINTER(P), P]),
    "sluice_read_async": (C.c_int, [P, C.c_uint64, C.c_size_t, P, P, C.POINTER(P)]),
    "sluice_write_async": (C.c_int, [P, C.c_uint64, C.c_size_t, P, P, C.POINTER(P)]),
    "sluice_future_wait": (C.c_ssize_t, [P, P]),
    "sluice_future_free": (None, [P]),
    "sluice_engine_close": (None, [P]),
    "sluice_read_to_gpu": (C.c_ssize_t, [P, C.c_char_p, C.c_uint64, C.c_size_t, P, P]),
    "sluice_write_from_gpu": (C.c_ssize_t, [P, C.c_char_p, P, C.c_size_t, P]),
    "sluice_gpu_count": (C.c_int, []),
    "sluice_dataset_open": (C.c_int, [C.POINTER(P), C.c_char_p]),
    "sluice_dataset_close": (None, [P]),
    "sluice_dataset_count": (C.c_uint64, [P]),
    "sluice_dataset_format": (C.c_char_p, [P]),
    "sluice_dataset_metadata": (C.c_char_p, [P]),
    "sluice_dataset_nfields": (C.c_uint, [P]),
    "sluice_dataset_field": (C.POINTER(Field), [P, C.c_uint]),
    "sluice_dataset_locate": (C.c_int, [P, C.c_uint64, C.POINTER(RecordLoc)]),
    "sluice_dataset_read": (C.c_ssize_t, [P, C.c_uint64, P, C.c_size_t, C.POINTER(Record)]),
    "sluice_dataset_shards": (C.c_uint, [P]),
    "sluice_dataset_shard_info": (C.c_int, [P, C.c_uint, C.POINTER(C.c_uint64), C.POINTER(C.c_uint64)]),
    "sluice_dataset_read_shard": (C.c_ssize_t, [P, P, C.c_uint, P, C.c_size_t, C.c_int, C.POINTER(ShardReport)]),
    "sluice_loader_open": (C.c_int, [C.POINTER(P), P, P, C.POINTER(LoaderOptions)]),
    "sluice_loader_next": (C.c_int, [P, C.POINTER(Batch), P]),
    "sluice_loader_batches": (C.c_uint64, [P]),
    "sluice_loader_release": (C.c_int, [P, C.c_uint64]),
    "sluice_loader_state": (None, [P, C.POINTER(C.c_uint64), C.POINTER(C.c_uint64), C.POINTER(C.c_uint64)]),
    "sluice_loader_state_ex": (C.c_int, [P, C.POINTER(C.c_uint64), C.POINTER(C.c_uint64), C.POINTER(LoaderSegment),
                                         C.c_uint]),
    "sluice_loader_set_epoch": (C.c_int, [P, C.c_uint64]),
    "sluice_loader_stats_json": (C.c_size_t, [P, C.c_char_p, C.c_size_t]),
    "sluice_loader_close": (None, [P]),
    "sluice_image_plan": (C.c_int, [C.POINTER(ImageOptions), C.c_uint64, C.c_uint64, C.c_uint64, C.c_uint32,
                                    C.c_uint32, C.POINTER(ImageBox)]),
    "sluice_packer_new": (C.c_int, [C.POINTER(P), C.POINTER(PackerOptions)]),
    "sluice_packer_add": (C.c_int, [P, C.POINTER(C.c_int32), C.c_size_t]),
    "sluice_packer_row": (C.c_int, [P, C.POINTER(PackedRow), C.c_int]),
    "sluice_packer_stats": (None, [P, C.POINTER(C.c_uint64), C.POINTER(C.c_uint64)]),
    "sluice_packer_free": (None, [P]),
    "sluice_pack": (C.c_int, [C.c_char_p, C.POINTER(PackOptions), C.POINTER(PackReport)]),
    "sluice_writer_open": (C.c_int, [C.POINTER(C.c_void_p), C.c_char_p, C.POINTER(Field), C.c_uint,
                                     C.POINTER(WriterOptions)]),
    "sluice_writer_open_overwrite": (C.c_int, [C.POINTER(C.c_void_p), C.c_char_p, C.POINTER(Field), C.c_uint,
                                               C.POINTER(WriterOptions)]),
    "sluice_writer_add": (C.c_int, [C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)]),
    "sluice_writer_close": (C.c_int, [C.c_void_p]),
    "sluice_writer_abort": (None, [C.c_void_p]),
    "sluice_sizeof": (C.c_size_t, [C.c_char_p]),
    "sluice_machine_sample": (C.c_int, [C.POINTER(MachineSample), C.c_int]),
    "sluice_gpu_sample": (C.c_int, [C.POINTER(GpuSample), C.c_uint]),
}
for _name, (_res, _args) in _protos.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args
