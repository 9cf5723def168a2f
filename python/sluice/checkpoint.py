"""Checkpoints in the safetensors layout (see _safetensors), moved by sluice's engine.

save: one file, or shards and their index as Hugging Face tools write them.  load: a whole checkpoint (a file,
a directory, an index, a list of files; local, s3:// or http(s)://) planned as one batched read of every
tensor asked for, whole or one rank's slice, into new tensors or straight into a model's own.
"""
import ctypes as C
import errno
import fnmatch
import itertools
import json
import numbers
import os
import re
import socket
import uuid
from collections.abc import Mapping

import numpy as np

from ._lib import ESHORT, Range, SluiceError, XferReport, check, cpath, lib, names_of, shown
from ._safetensors import (BITS, DT, SIZE, bad, header_bytes, is_remote, nbytes, open_file,
                           read_small, regular_target, st_dtype)
from .buffers import _buffer, _eng, _ready, write
from .s3 import listdir, remove

INDEX = "model.safetensors.index.json"
_ALIGN = 64  # where load places each tensor in a buffer of its own making
# struct sluice_range as numpy lays it out: the planned reads go to the library as one array.
_RANGE = np.dtype([("file", np.uintp), ("offset", np.uint64), ("len", np.uintp), ("buf", np.uintp)])


def _host_bytes(t):
    """A tensor's bytes in host memory, as a flat uint8 numpy array (GPU tensors copied over)."""
    if hasattr(t, "detach"):
        import torch
        return t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()
    return np.ascontiguousarray(t).reshape(-1).view(np.uint8)


def _layout(tensors, metadata):
    """(header dict, [(tensor, data offset, bytes)], data bytes) of the tensors in name order."""
    items, header, off = [], {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        # np.asarray, not np.ascontiguousarray: that makes a 0-d array (or a numpy scalar) one of shape [1]
        t = t.contiguous() if hasattr(t, "contiguous") else np.asarray(t, order="C")
        dt = st_dtype(t)
        n = nbytes(t, dt)
        shape = list(t.shape)
        if dt == "F4" and shape:
            shape[-1] *= 2  # the file counts 4-bit elements
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        items.append((t, off, n))
        off += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    return header, items, off


def _fsync_dir(d):
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# A durable write's temporary is ".BASE.sluice-tmp-HOST-PID-N" beside its target, as sluice.write's (src/xfer/
# file.c): those of this host whose writer is gone (killed before its rename) are removed by the next save there.
_TMP = re.compile(r"\.(?P<base>.+)\.sluice-tmp-(?P<host>[^-]*)-(?P<pid>\d+)-\d+\Z", re.S)
_seq = itertools.count()


def _host():
    return (socket.gethostname()[:63] or "host").replace("/", "_").replace("-", "_")


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


def _reclaim(d, which):
    """Removes the temporaries in directory d of targets which(base) names whose writer (of this host) is gone."""
    host = _host()
    for n in os.listdir(d):
        m = _TMP.match(n)
        if m and m["host"] == host and which(m["base"]) and _gone(int(m["pid"])):
            try:
                os.unlink(os.path.join(d, n))
            except FileNotFoundError:
                pass


def _tmp_for(path):
    """(temporary file name, its open descriptor) of a durable write of path, made beside it (O_EXCL), the
    temporaries of killed writes of path removed first."""
    regular_target(path)
    d, base = os.path.split(os.path.abspath(path))
    _reclaim(d, lambda b: b == base)
    while True:
        tmp = os.path.join(d, f".{base}.sluice-tmp-{_host()}-{os.getpid()}-{next(_seq)}")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue


def _save_file(tensors, path, metadata):
    """One safetensors file, durably and atomically (see save); returns {name: (file offset, bytes)}."""
    header, items, size = _layout(tensors, metadata)
    head = header_bytes(header)
    base = len(head)
    if is_remote(path):
        whole = np.empty(base + size, np.uint8)
        whole[:base] = np.frombuffer(head, np.uint8)
        for t, o, n in items:
            if n:
                whole[base + o:base + o + n] = _host_bytes(t)
        write(path, whole)
        return _placed(header, base)
    d = os.path.dirname(os.path.abspath(path))
    tmp, fd = _tmp_for(path)
    f = None
    try:
        with open(fd, "wb") as h:
            h.write(head)
        _ready([t for t, _, _ in items])  # the kernels that made GPU tensors are done before the engine reads them
        f = open_file(tmp, 1)
        ranges = (Range * max(1, len(items)))()
        k = 0
        for t, o, n in items:
            if n:
                ptr = t.data_ptr() if hasattr(t, "data_ptr") else _buffer(t, False, ordered=False)[0]
                ranges[k] = Range(f, base + o, n, ptr)
                k += 1
        if k:
            check(lib.sluice_write_batch(_eng(), ranges, k, None))
        check(lib.sluice_file_sync(f))
        lib.sluice_file_close(f)
        f = None
        os.replace(tmp, path)
        _fsync_dir(d)
    except BaseException:
        if f:
            lib.sluice_file_close(f)
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return _placed(header, base)


def _placed(header, base):
    return {k: (base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
            for k, v in header.items() if k != "__metadata__"}


def _write_whole(path, data):
    """A small file (an index, a DCP checkpoint's metadata) of bytes, durably and atomically."""
    if is_remote(path):
        write(path, np.frombuffer(data, np.uint8))
        return
    tmp, fd = _tmp_for(path)
    try:
        with open(fd, "wb") as h:
            h.write(data)
            h.flush()
            os.fsync(h.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


# The shards of a sharded save: Hugging Face's model-0000K-of-0000N, and the save's own mark (12 hex digits, new
# for every save), so a save never overwrites a shard of the checkpoint it replaces.
_SHARD = re.compile(r"model-\d{5,}-of-\d{5,}-[0-9a-f]{12}\.safetensors\Z")
# A checkpoint of the same (default) variant the index replaces, as transformers' save_pretrained removes them
# after a save: model.safetensors, and shards of Hugging Face's names.
_STALE = re.compile(r"model(?:-\d{5}-of-\d{5})?\.safetensors\Z")


def _join(base, name):
    return f"{base.rstrip('/')}/{name}" if is_remote(base) else os.path.join(base, name)


def _save_sharded(tensors, directory, metadata, max_shard_size):
    """Shards of at most max_shard_size data bytes (a larger tensor alone in its own), under names new for this
    save, then the index (the one rename that replaces the old checkpoint by the new), then the files of the old
    checkpoint (those its index named, and a model.safetensors of the same variant), of killed saves (shards of
    our names no index names, temporaries of writers that are gone) removed."""
    shards, cur, cur_bytes = [], {}, 0
    for name in sorted(tensors):
        n = nbytes(tensors[name], st_dtype(tensors[name]))
        if cur and cur_bytes + n > max_shard_size:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = tensors[name]
        cur_bytes += n
    shards.append(cur)
    if not is_remote(directory):
        os.makedirs(directory, exist_ok=True)
    index_path = _join(directory, INDEX)
    try:  # the old checkpoint's shards, to remove once the new index has replaced it
        old = set(_index_files(index_path, read_small(index_path)))
    except SluiceError:
        old = set()
    mark = uuid.uuid4().hex[:12]
    weight_map, total = {}, 0
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}-{mark}.safetensors"
        _save_file(part, _join(directory, fname), metadata)
        total += sum(nbytes(t, st_dtype(t)) for t in part.values())
        weight_map.update({name: fname for name in part})
    index = {"metadata": {"total_size": total, **({str(k): str(v) for k, v in metadata.items()} if metadata else {})},
             "weight_map": dict(sorted(weight_map.items()))}
    _write_whole(index_path, json.dumps(index, indent=2).encode())
    keep = set(weight_map.values())
    for f in listdir(directory):
        base = f.rsplit("/", 1)[-1]
        if base not in keep and (_SHARD.match(base) or _STALE.match(base) or
                                 (base in old and base.endswith(".safetensors"))):
            remove(f)
    if not is_remote(directory):
        _reclaim(directory, lambda b: b == INDEX or _SHARD.match(b) is not None)


def _check_names(tensors, metadata):
    """save's names, as the format holds them: tensor names, metadata keys and values all str (nothing turned
    into one silently), no tensor named __metadata__ (the header's metadata)."""
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"sluice.save: tensor name {name!r} is not a str")
        if name == "__metadata__":
            raise ValueError("sluice.save: a tensor named '__metadata__', the name of the file's metadata")
    for k, v in metadata.items():
        if not isinstance(k, str):
            raise TypeError(f"sluice.save: metadata key {k!r} is not a str")
        if not isinstance(v, str):
            raise TypeError(f"sluice.save: metadata {k!r}: {v!r} is not a str (safetensors metadata holds strings)")


def save(tensors, path, metadata=None, max_shard_size=None):
    """Writes a dict of name -> tensor (numpy, or torch on CPU or GPU) in the safetensors layout, with
    {"format": "pt"} in the file's __metadata__ as transformers writes it (unless metadata gives a format).
    Names and metadata (keys and values) are str, as the format holds them; no tensor is named __metadata__.
    Without max_shard_size, to the file path, durably and atomically: a temporary file beside it, the data
    straight from each tensor's memory, fdatasync, rename, directory fsync; a crash leaves the previous file or
    the whole new one (and the next save there removes the temporary of a killed one).  With max_shard_size
    (bytes), path is a directory: files model-0000K-of-0000N-MARK.safetensors (MARK: 12 hex digits new for
    every save) of at most that many data bytes each (a larger tensor alone in one), then
    model.safetensors.index.json naming them, the layout Hugging Face tools read; then the files of the
    checkpoint it replaced are removed.  The index's rename is the one step that replaces the old checkpoint by
    the new, so a crash leaves the old checkpoint or the new one, whole (a directory of new shards beside an old
    model.safetensors and no index is refused by load; a finished save removes that model.safetensors).  An s3:// path is written as objects
    (each one multipart upload that appears whole or not at all)."""
    _check_names(tensors, metadata or {})
    metadata = {"format": "pt", **(metadata or {})}
    if max_shard_size is None:
        _save_file(tensors, path, metadata)
    elif int(max_shard_size) <= 0:
        raise ValueError(f"sluice.save: max_shard_size {max_shard_size} is not a positive byte count")
    else:
        _save_sharded(tensors, path, metadata, int(max_shard_size))


def _index_files(path, raw):
    """The files an index's bytes name, checked by the library as a load checks them (sluice_st_index_files),
    without opening them.  (Only a save reads one here, for the files of the checkpoint it replaces.)"""
    return names_of(lib.sluice_st_index_files, cpath(path), raw, len(raw))


def _url_exists(path):
    try:
        lib.sluice_file_close(open_file(path, 0))
        return True
    except SluiceError:
        return False


def _remote_dir(path):
    """Whether a remote path without its '/' names a directory (its store says so when it is opened)."""
    try:
        lib.sluice_file_close(open_file(path, 0))
        return False
    except SluiceError as e:
        if e.code == -errno.EISDIR:
            return True
        raise


def _probed(source, variant):
    """A directory its store cannot list (a web server without listings): its index, else model.safetensors."""
    v = f".{variant}" if variant else ""
    for name in (f"model.safetensors.index{v}.json", f"model{v}.safetensors"):
        if _url_exists(source + name):
            return _from_index(source + name) if name.endswith(".json") else _Source([source + name])
    raise SluiceError(-errno.ENOENT, f"{shown(source)}: no listing, and no model.safetensors.index{v}.json and no "
                      f"model{v}.safetensors")


class _Source:
    """A checkpoint as resolved: its files in order, or an index's path and its bytes as read (the library reads
    the files its weight_map names; the bytes tell whether the index changed)."""

    def __init__(self, files, index=None, raw=None):
        self.files, self.index, self.raw = files, index, raw

    def index_changed(self):
        try:
            return read_small(self.index) != self.raw
        except SluiceError:
            return True


def _from_index(path):
    return _Source(None, path, read_small(path))


_INDEX_NAME = re.compile(r".+\.safetensors\.index(?:\.(?P<v>[^.]+))?\.json\Z", re.S)
_FILE_NAME = re.compile(r"[^.]+\.(?P<v>[^.]+?)(?:-\d+-of-\d+)?\.safetensors\Z")
_PART = re.compile(r"(?P<pre>.*)-(?P<k>\d+)-of-(?P<n>\d+)(?P<post>[^.]*)\.safetensors\Z", re.S)


def _variant(name):
    """(is an index, variant) of a checkpoint file's name as transformers names variants: model.safetensors and
    model.safetensors.index.json (None), model.fp16.safetensors, model.fp16-00001-of-00002.safetensors and
    model.safetensors.index.fp16.json ("fp16"); None where the name is no checkpoint file."""
    m = _INDEX_NAME.match(name)
    if m:
        return True, m["v"]
    if name.endswith(".safetensors"):
        m = _FILE_NAME.match(name)
        return False, m["v"] if m else None
    return None


def _from_listing(where, names, variant):
    """The checkpoint in a directory or prefix of files names: its index, else its .safetensors; of one variant
    (the only one there, or variant's)."""
    kinds = {}
    for n in sorted(names):
        v = _variant(n)
        if v is not None:
            kinds.setdefault(v[1], []).append((v[0], n))
    if variant is None and len(kinds) > 1:
        listed = "; ".join(", ".join(n for _, n in kinds[v]) for v in sorted(kinds, key=lambda v: v or ""))
        other = sorted(v for v in kinds if v)[0]
        raise bad(where, f"holds {len(kinds)} variants of a checkpoint ({listed}): name the one to load by its "
                         f"file or index path, or pass variant='{other}'")
    v = variant if variant is not None else next(iter(kinds), None)
    if v not in kinds:
        raise SluiceError(-errno.ENOENT, f"{shown(where)}: " + (f"no variant '{variant}' (model.{variant}.safetensors or "
                                                         f"model.safetensors.index.{variant}.json)"
                                                         if variant else "no .safetensors files and no index"))
    indexes = [n for is_index, n in kinds[v] if is_index]
    if len(indexes) > 1:
        raise bad(where, f"several indexes ({', '.join(indexes)}): name the one to load")
    if indexes:
        return _join(where, indexes[0]), None
    files = [n for _, n in kinds[v]]
    # Without an index, shards of a save (K of N) are a checkpoint only all together, and of one save.
    parts = {}
    for n in files:
        m = _PART.match(n)
        if m:
            parts.setdefault((m["pre"], int(m["n"]), m["post"]), set()).add(int(m["k"]))
    others = [n for n in files if not _PART.match(n)]
    for (pre, total, post), ks in parts.items():
        if others:  # a save of shards killed before its index, over a single-file checkpoint: old and new
            raise bad(where, f"holds no index, shards {pre}-K-of-{total}{post} and {', '.join(others[:3])}: an "
                             f"unfinished save over another checkpoint, not a checkpoint (name its files to load "
                             f"them anyway)")
        if ks != set(range(1, total + 1)) or len(parts) > 1:
            raise bad(where, f"holds no index and shards {pre}-K-of-{total}{post} of {len(ks)} of {total} files"
                             f"{' beside shards of other saves' if len(parts) > 1 else ''}: an unfinished save, not "
                             f"a checkpoint (name its files to load them anyway)")
    return None, [_join(where, n) for n in files]


def _sources(source, variant=None):
    """The safetensors files of a checkpoint given as a file, a directory or prefix ending in / (its index, else
    its *.safetensors; on a web server that gives no listing, its model.safetensors.index.json or
    model.safetensors), an index, or a list of files, as a _Source."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("sluice.load: an empty list of files")
        return _Source([os.fspath(s) for s in source])
    source = os.fspath(source)
    if _INDEX_NAME.match(source.rsplit("/", 1)[-1]):
        return _from_index(source)
    if is_remote(source) and not source.endswith("/"):
        if source.endswith((".safetensors", ".json")) or not _remote_dir(source):
            return _Source([source])
        source += "/"
    if is_remote(source):
        try:
            names = [f.rsplit("/", 1)[-1] for f in listdir(source)]
        except SluiceError as e:
            if e.code != -errno.EOPNOTSUPP:
                raise
            return _probed(source, variant)  # a web server that gives no listing
    elif os.path.isdir(source):
        names = os.listdir(source)
    else:
        return _Source([source])
    index, files = _from_listing(source.rstrip("/") if is_remote(source) else source, names, variant)
    return _from_index(index) if index else _Source(files)


class _Entry:
    """A tensor of the checkpoint: its file's index, dtype, shape and bytes' place in that file."""
    __slots__ = ("fi", "dtype", "shape", "offset", "n")

    def __init__(self, fi, dtype, shape, offset, n):
        self.fi, self.dtype, self.shape, self.offset, self.n = fi, dtype, shape, offset, n


def _table(ck):
    """(file paths, their handles, {name: _Entry} in file and offset order) of an open sluice_ckpt."""
    nf, n = lib.sluice_ckpt_files(ck), lib.sluice_ckpt_count(ck)
    files = [os.fsdecode(lib.sluice_ckpt_file(ck, i)) for i in range(nf)]
    handles = [lib.sluice_ckpt_handle(ck, i) for i in range(nf)]
    table = {}
    ts = lib.sluice_ckpt_tensor(ck, 0) if n else None  # the table is one array
    for i in range(n):
        t = ts[i]
        table[t.name.decode()] = _Entry(t.file, t.dtype.decode(), tuple(t.shape[:t.ndim]), t.offset, t.bytes)
    return files, handles, table


class _Open:
    """A checkpoint opened by the library (sluice_ckpt_open_files): its files open, their headers read once and
    checked there (a name in two files, an index's rules); files (their paths), handles (one a file, through
    which its header was read and its data is), table {name: _Entry}, in file and offset order.  A load reads
    through it (_load), as many as the caller makes before close()."""

    def __init__(self, src):
        self.src, ck = src, C.c_void_p()
        if src.index is not None:
            check(lib.sluice_ckpt_open_files(C.byref(ck), _eng(), None, 0, cpath(src.index), src.raw, len(src.raw)))
        else:
            paths = (C.c_char_p * len(src.files))(*map(cpath, src.files))
            check(lib.sluice_ckpt_open_files(C.byref(ck), _eng(), paths, len(src.files), None, None, 0))
        self._ck = ck
        try:
            self.files, self.handles, self.table = _table(ck)
        except BaseException:
            self.close()
            raise

    def check_unchanged(self):
        """-ESTALE naming a local file rewritten in place since its open (its size or times changed: its header
        may no longer say where its data is); one replaced by a rename is the file opened, read whole, and
        passes."""
        check(lib.sluice_ckpt_check(self._ck))

    def listing(self):
        """{name: (dtype, shape)} of every tensor a load would read, without reading their bytes."""
        return {n: (e.dtype, e.shape) for n, e in self.table.items()}

    def by_file(self):
        """[{name: (offset, bytes, dtype, shape)}] of each file's tensors, in the files' order."""
        out = [{} for _ in self.files]
        for n, e in self.table.items():
            out[e.fi][n] = (e.offset, e.n, e.dtype, e.shape)
        return out

    def close(self):
        if self._ck is not None:
            ck, self._ck = self._ck, None
            lib.sluice_ckpt_close(ck)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _listing(source, variant=None):
    """{name: (dtype, shape)} of every tensor load would read of source (the same files, the same checks),
    without reading their bytes."""
    with _Open(_sources(source, variant)) as ckp:
        return ckp.listing()


def _named(source):
    """load's source (a path, a URL or a list of them) as messages name it (no query, no password)."""
    return ", ".join(map(shown, source)) if isinstance(source, (list, tuple)) else shown(source)


def _listed(names, n=5):
    return ", ".join(repr(m) for m in names[:n]) + (f" (and {len(names) - n} more)" if len(names) > n else "")


def _select(table, keys, source):
    """The names to load, in the checkpoint's order: keys (names or globs), else all."""
    if keys is None:
        return list(table)
    if isinstance(keys, str):
        keys = [keys]
    missing = [k for k in keys if not any(c in k for c in "*?[") and k not in table]
    if missing:
        raise KeyError(f"sluice.load: {_named(source)} has no tensor {_listed(missing)}")
    pats = [k for k in keys if k not in table and any(c in k for c in "*?[")]  # a name it holds is that name
    want = set(k for k in keys if k in table)
    return [n for n in table if n in want or any(fnmatch.fnmatchcase(n, p) for p in pats)]


def _ties(into):
    """into's names grouped by the memory they share (tied weights: one tensor under several names)."""
    groups = {}
    for name, t in into.items():
        if hasattr(t, "data_ptr"):
            n = t.numel() * t.element_size()
            key = (t.data_ptr(), n, str(t.dtype), tuple(t.shape), str(getattr(t, "device", "")))
        else:
            n = t.nbytes
            key = (t.__array_interface__["data"][0], n, str(t.dtype), tuple(t.shape), "")
        groups.setdefault(key if n else ("empty", name), []).append(name)
    return list(groups.values())


def _select_into(table, keys, into, strict, source):
    """(names to read, names filled, missing, unexpected) of a load into into, as load_state_dict counts them:
    missing are into's names the checkpoint lacks, unexpected the checkpoint's names into lacks (with keys,
    only of the tensors keys picks); a group of tied names is filled once, from the first of its names the
    checkpoint holds, and none of them is missing if the checkpoint holds one."""
    names = list(into)
    if keys is not None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        absent = [k for k in keys if not any(c in k for c in "*?[") and k not in into]
        if absent:
            raise ValueError(f"sluice.load: keys {_listed(absent)} are not in into=")
        names = [n for n in names if any(fnmatch.fnmatchcase(n, k) for k in keys)]
    read, filled, missing = [], set(), []
    for group in _ties({n: into[n] for n in names}):
        held = [n for n in group if n in table]
        if held:
            read.append(held[0])
            filled.update(group)
        else:
            missing += group
    unexpected = [n for n in table if n not in into] if keys is None else []
    if strict and (missing or unexpected):
        raise ValueError(f"sluice.load: into= does not match {_named(source)}: " + "; ".join(
            w for w in ((f"missing keys (in into=, not in the checkpoint): {_listed(missing, 20)}" if missing else ""),
                        (f"unexpected keys (in the checkpoint, not in into=): {_listed(unexpected, 20)}"
                         if unexpected else "")) if w) + " (strict=False loads the tensors both hold)")
    order = {n: i for i, n in enumerate(table)}
    return sorted(read, key=order.get), [n for n in names if n in filled], missing, unexpected


def _is_shard(spec):
    return isinstance(spec, (tuple, list)) and len(spec) == 3 and all(
        isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) for x in spec)


def _check_args(keys, into, shard):
    """load's arguments of the wrong type, named (rather than numpy's or ctypes' error, or a bool as a dim)."""
    for k in ([keys] if isinstance(keys, str) else keys or ()):
        if not isinstance(k, str):
            raise TypeError(f"sluice.load: keys= holds {k!r}, not a str (a tensor name or glob)")
    if into is not None and not isinstance(into, Mapping):
        raise TypeError(f"sluice.load: into= is a {type(into).__name__}, not a dict of name -> tensor")
    if shard is not None and not callable(shard) and not _is_shard(shard):
        raise TypeError(f"sluice.load: shard={shard!r} is not (dim, rank, world) integers, a callable or None")


def _slice_of(shard, name, shape):
    """(dim, lo, hi) of one rank's part of a tensor, or None for the whole: shard is (dim, rank, world) for every
    tensor with that dim, or a callable(name, shape) giving that or None.  Parts are as torch.chunk cuts them:
    ceil(size / world) each, the last ones shorter or empty."""
    spec = shard(name, tuple(shape)) if callable(shard) else shard
    if spec is None:
        return None
    if not _is_shard(spec):
        raise TypeError(f"sluice.load: shard= gives {spec!r} for tensor '{name}', not (dim, rank, world) integers")
    dim, rank, world = (int(x) for x in spec)
    if dim < 0:
        dim += len(shape)
    if not 0 <= dim < len(shape):
        return None  # a tensor without that dimension (a bias, a norm) is whole on every rank
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"sluice.load: tensor '{name}': rank {rank} of world {world}")
    step = -(-shape[dim] // world)
    lo = min(rank * step, shape[dim])
    return dim, lo, min(lo + step, shape[dim])


def _plan(e, sl, name):
    """(shape out, file offsets, lengths, bytes) of a tensor (an _Entry), whole (one range, as plain numbers: a
    checkpoint has thousands) or the slice sl (arrays, a range per outer index)."""
    shape, dt, b = list(e.shape), e.dtype, e.offset
    if sl is None:
        return shape, (b,), (e.n,), e.n
    if BITS[dt] % 8:
        raise ValueError(f"sluice.load: tensor '{name}' of {dt}: sub-byte elements are loaded whole, not sliced")
    dim, lo, hi = sl
    inner = int(np.prod(shape[dim + 1:], dtype=np.int64)) * (BITS[dt] // 8)
    outer = int(np.prod(shape[:dim], dtype=np.int64))
    out = shape[:dim] + [hi - lo] + shape[dim + 1:]
    if hi == lo or inner == 0 or outer == 0:
        return out, (), (), 0
    offs = b + (np.arange(outer, dtype=np.uint64) * shape[dim] + lo) * inner
    return out, offs, np.full(outer, (hi - lo) * inner, np.uint64), outer * (hi - lo) * inner


def _check_into(name, t, dt, shape):
    """A caller's tensor to load name into: its dtype, shape and layout must be the checkpoint's."""
    got = str(t.dtype).replace("torch.", "")
    npd, tname = DT[dt]
    if not (got == tname or (npd is not None and got == np.dtype(npd).name)):
        raise ValueError(f"sluice.load: into['{name}'] is {got}, the checkpoint's is {dt}")
    want = list(shape)
    if dt == "F4" and want:
        want[-1] //= 2
    if list(t.shape) != want:
        raise ValueError(f"sluice.load: into['{name}'] has shape {list(t.shape)}, the checkpoint's is {want}")
    if hasattr(t, "is_contiguous") and not t.is_contiguous():
        raise ValueError(f"sluice.load: into['{name}'] is not contiguous")


def _alloc(total, device):
    """(buffer, its address, torch module or None) of total bytes on device."""
    if device != "numpy":
        try:
            import torch
        except ImportError:
            if device != "cpu":
                raise ValueError(f"sluice.load: device={device!r} needs torch (without it: 'cpu' or 'numpy')") \
                    from None
        else:
            buf = torch.empty(max(1, total), dtype=torch.uint8, device=device)
            _ready([buf])  # memory the caching allocator hands out again may still be in use by queued kernels
            return buf, buf.data_ptr(), torch
    buf = np.empty(max(1, total), np.uint8)
    return buf, buf.ctypes.data, None


def _view(buf, torch, o, n, dt, shape):
    """The tensor of dtype dt and shape at buf[o:o + n] (its bytes where the dtype has no equivalent)."""
    npd, tname = DT[dt]
    shape = list(shape)
    if dt == "F4" and shape:
        shape[-1] //= 2  # two elements a byte: torch's float4_e2m1fn_x2 counts bytes
    piece = buf[o:o + n]
    if torch is not None:
        if tname is None or not hasattr(torch, tname):
            return piece
        return piece.view(getattr(torch, tname)).reshape(shape)
    if npd is None:  # bf16 as its 16-bit pattern; the other small floats as their bytes
        return piece.view(np.uint16).reshape(shape) if dt == "BF16" else piece
    return piece.view(npd).reshape(shape)


class _Planned:
    """One tensor to read: its file, dtype, shape out, the file ranges of its bytes, and where they land."""
    __slots__ = ("name", "fi", "dt", "shape", "offs", "lens", "n", "whole", "dst", "in_run")

    def __init__(self, name, fi, dt, shape, offs, lens, n, whole):
        self.name, self.fi, self.dt, self.shape, self.offs, self.lens, self.n = name, fi, dt, shape, offs, lens, n
        self.whole, self.dst, self.in_run = whole, None, False


def _place(plans, own, start=0):
    """Where each tensor lands in a buffer of load's own (own: its offset there, from start) and which land
    together: whole tensors that follow one another in a file land as they lie there, one range for all of them
    (fewer, larger reads and copies), as long as each stays aligned to its dtype; slices get places of their
    own.  Returns (buffer bytes, runs as [file index, file offset, bytes, buffer offset])."""
    if not own:
        return 0, []
    total, runs, run = start, [], None
    for p in sorted(plans, key=lambda p: (p.fi, int(p.offs[0]) if len(p.offs) else -1)):
        whole = len(p.offs) == 1
        if whole and run and run[0] == p.fi and p.offs[0] == run[1] + run[2] and (p.offs[0] - run[1]) % SIZE[p.dt] == 0:
            p.dst, p.in_run = run[3] + int(p.offs[0]) - run[1], True
            run[2] += p.n
            total = run[3] + run[2]  # a run is always the buffer's last
            continue
        total = -(-total // _ALIGN) * _ALIGN
        p.dst, total = total, total + p.n
        run = [p.fi, int(p.offs[0]), p.n, p.dst] if whole else None
        if run:
            p.in_run = True
            runs.append(run)
    return total, runs


def _ranges(plans, runs, files, base):
    """The reads as struct sluice_range entries: one per run, and each other tensor's ranges back to back from
    its destination (base + its offset in load's buffer, or a caller's tensor's address with base 0)."""
    rest = [p for p in plans if not p.in_run and len(p.offs)]
    n = len(runs) + sum(len(p.offs) for p in rest)
    r = np.empty(n, _RANGE)
    if runs:
        a = np.array(runs, np.uint64)
        r["file"][:len(runs)] = np.array(files, np.uintp)[a[:, 0].astype(np.intp)]
        r["offset"][:len(runs)], r["len"][:len(runs)] = a[:, 1], a[:, 2]
        r["buf"][:len(runs)] = a[:, 3] + np.uint64(base)
    k = len(runs)
    for p in rest:
        m = len(p.offs)
        r["file"][k:k + m], r["offset"][k:k + m], r["len"][k:k + m] = files[p.fi], p.offs, p.lens
        r["buf"][k:k + m] = np.uint64(base + p.dst) + np.concatenate((np.zeros(1, np.uint64),
                                                                       np.cumsum(p.lens[:-1], dtype=np.uint64)))
        k += m
    return r[r["len"] > 0]


def _clip(r, lo, hi):
    """The ranges r cut to the destination addresses [lo, hi)."""
    s = np.maximum(r["buf"].astype(np.uint64), np.uint64(lo))
    e = np.minimum(r["buf"].astype(np.uint64) + r["len"], np.uint64(hi))
    keep = e > s
    out = r[keep]
    out["offset"] += s[keep] - out["buf"].astype(np.uint64)
    out["len"], out["buf"] = e[keep] - s[keep], s[keep]
    return out


# Bytes a rank reads of each round of a process group's load: round k's all-gather runs while round k+1 is read.
_ROUND = 256 << 20


class _Group:
    """load's part in a torch.distributed process group: the group reads each whole tensor's bytes once; a
    rank's slices it reads alone.  Into load's own buffer, the whole tensors (the same on every rank) lie first,
    cut in rounds of world equal pieces: each rank reads its piece of a round, and the ranks all-gather that
    round while the next is read.  Into a caller's tensors (into=), each whole tensor has an owner (runs of the
    files' order, equal in bytes): the owner reads it into place and broadcasts it."""

    def __init__(self, group):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.group = torch, dist, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.piece, self.rounds, self.pending = 0, 0, []

    def place(self, plans):
        s, runs = _place([p for p in plans if p.whole], True)
        self.piece = min(_ROUND, -(-s // self.world // _ALIGN) * _ALIGN)
        self.rounds = -(-s // (self.piece * self.world)) if self.piece else 0
        shared = self.piece * self.world * self.rounds
        total, more = _place([p for p in plans if not p.whole], True, shared)
        return max(total, shared), runs + more

    def mine(self, ranges, base):
        """What this rank reads, a batch a round: its piece of each round, its slices with the first."""
        p, w = self.piece, self.world
        shared = ranges["buf"] < base + p * w * self.rounds
        out = [_clip(ranges[shared], base + (k * w + self.rank) * p, base + (k * w + self.rank + 1) * p)
               for k in range(self.rounds)] or [ranges[:0]]
        out[0] = np.concatenate((out[0], ranges[~shared]))
        return out

    def gather(self, buf, k):
        """Starts round k's all-gather (every rank's piece to every rank), in place on NCCL."""
        p, w, r = self.piece, self.world, self.rank
        if w == 1 or k >= self.rounds:
            return
        whole, own = buf[k * w * p:(k + 1) * w * p], buf[(k * w + r) * p:(k * w + r + 1) * p]
        if self.dist.get_backend(self.group) == "nccl":
            self.pending.append(self.dist.all_gather_into_tensor(whole, own, group=self.group, async_op=True))
        else:
            self.pending.append(self.dist.all_gather([whole[i * p:(i + 1) * p] for i in range(w)], own.clone(),
                                                     group=self.group, async_op=True))

    def agree(self, ok):
        """True where every rank's read went right (ok on each): an all-reduce (MIN) of the ranks' flags, so that
        the group keeps a load only whole, every rank's part of it read."""
        dev = f"cuda:{self.torch.cuda.current_device()}" if self.dist.get_backend(self.group) == "nccl" else "cpu"
        flag = self.torch.tensor([1 if ok else 0], dtype=self.torch.int32, device=dev)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def exchange(self):
        """Waits for the rounds' all-gathers; returns the bytes received."""
        for work in self.pending:
            work.wait()
        self.pending = []
        return self.piece * (self.world - 1) * self.rounds if self.world > 1 else 0

    def assign(self, plans):
        """Owners of the whole tensors for into=: in file order, each rank an equal share of the bytes."""
        whole = sorted((p for p in plans if p.whole), key=lambda p: (p.fi, int(p.offs[0])))
        total, at = max(1, sum(p.n for p in whole)), 0
        self.owner = {}
        for p in whole:
            self.owner[p.name] = min(self.world - 1, at * self.world // total)
            at += p.n

    def reads(self, p):
        return not p.whole or self.owner[p.name] == self.rank

    def broadcast(self, plans, into):
        """Each whole tensor from its owner to the others; returns the bytes received."""
        got = 0
        for p in plans:
            if p.whole and self.world > 1 and p.n:  # as bytes: NCCL and gloo lack some dtypes (int16, fp8)
                self.dist.broadcast(into[p.name].view(-1).view(self.torch.uint8),
                                    self.dist.get_global_rank(self.group, self.owner[p.name]), group=self.group)
                got += p.n if self.owner[p.name] != self.rank else 0
        return got


def _read_ranges(handles, batches, after=None):
    """Reads the ranges (struct sluice_range entries; or a list of such batches, read one after another,
    after(k) called when batch k has landed); returns the transfer's report, the batches' figures added."""
    total = XferReport()
    for k, ranges in enumerate(batches if isinstance(batches, list) else [batches]):
        rep = XferReport()
        if len(ranges):
            check(lib.sluice_read_batch(_eng(), ranges.ctypes.data_as(C.POINTER(Range)), len(ranges), C.byref(rep)))
            for f in ("bytes", "bytes_direct", "bytes_buffered", "ios", "seconds", "bytes_verified", "bytes_storage"):
                setattr(total, f, getattr(total, f) + getattr(rep, f))
            total.path = rep.path
        if after:
            after(k)
    return total


_ATTEMPTS = 4  # loads of a checkpoint that changes while it is read, before the error


def load(source, device="cpu", keys=None, into=None, shard=None, report=None, process_group=None, strict=True,
         variant=None):
    """Reads a checkpoint in the safetensors layout into a dict of name -> tensor.

    source: a .safetensors file; a directory (its *.safetensors.index.json, else its *.safetensors); an index;
    a list of files; or s3:// and http(s):// URLs of any of these (a prefix ends in /; an http(s):// one holds
    model.safetensors.index.json or model.safetensors).  With an index, exactly the tensors it names are read,
    each from the file it names (one its file lacks is an error naming it); without one, a directory's shards
    K-of-N are read only if all N are there.  Every tensor asked for, from every file, is planned as one batched
    read: the engine reads the files together and coalesces neighbouring tensors.  Each file's header and data
    are read through one open: a file replaced while it is loaded gives its old version whole (a local file) or
    starts the load again (s3://, http(s)://: its ETag changed), a few times, then fails naming it.
    variant: which of a directory's variants to load ("fp16": model.fp16.safetensors or
    model.safetensors.index.fp16.json, as transformers names them); a directory of several is an error
    listing them.
    keys: names and globs ("model.layers.0.*") of the tensors to read (a key the checkpoint holds as a name is
    that name, not a glob); only theirs are delivered (the engine
    reads through a gap under SLUICE_READ_GAP, no longer than the tensor after it, where the file is not read
    from the page cache: the report's bytes_storage says what the I/Os spanned).
    shard: one rank's slice of each tensor, (dim, rank, world) for every tensor that has dim, or a
    callable(name, shape) -> (dim, rank, world) or None (whole); only the slice is delivered (a slice of dim 0
    is one range, of a later dim one range per outer index).  Slices are cut as torch.chunk cuts.
    into: a dict of name -> tensor (a module's state_dict()) to load straight into: no other buffer, so GPU
    memory stays the model's; dtype and shape (of the slice, with shard) must match; returns those tensors.
    strict (with into, as torch's load_state_dict): True, a ValueError naming every missing key (into's, not the
    checkpoint's) and unexpected key (the checkpoint's, not into's) before anything is read; False, the tensors
    both hold are loaded and report receives missing_keys and unexpected_keys.  Tied tensors (one memory under
    several names, as lm_head.weight and embed_tokens.weight) are filled once, and none of their names is
    missing where the checkpoint holds one.
    device: where new tensors go: torch tensors on "cpu", "cuda" or "cuda:N", or numpy arrays for "numpy" (and
    "cpu" without torch).  They are views of one buffer, each at an aligned place whatever its offset in the file.
    A list of devices (["cuda:0", "cuda:1"]) replicates: storage is read once, into the first, and the buffer
    copied GPU to GPU to the others; returns a list of dicts, one per device.
    process_group: a torch.distributed group whose ranks all load the same checkpoint (with the same keys and
    shard), each onto its own device: the group reads each whole tensor's bytes once, each rank an equal part,
    and all-gathers the parts (NCCL in place on GPUs; any backend works), or with into= each tensor's owner
    reads it into place and broadcasts it; a rank's slices it reads itself.  Use
    a group of one node's ranks where the nodes' links are slower than their storage.  (A checkpoint that
    changes during a group's load fails it rather than starting again: the ranks would disagree.)
    report (a dict, or None) receives the read's figures: files, tensors, bytes (payload), bytes_storage (what
    the I/Os spanned, gaps read through included), ios, seconds, path; with process_group, this rank's read and
    bytes_exchanged (received from the others)."""
    _check_args(keys, into, shard)
    devices = list(device) if isinstance(device, (list, tuple)) else None
    if devices is not None and (not devices or into is not None):
        raise ValueError("sluice.load: a list of devices needs at least one, and no into= (load into each instead)")
    if process_group is not None and (devices is not None or device == "numpy"):
        raise ValueError("sluice.load: process_group= loads onto one torch device a rank (not a list, not numpy)")
    for attempt in range(1, _ATTEMPTS + 1):
        src = _sources(source, variant)
        try:
            with _Open(src) as ckp:
                return _load(ckp, source, device, devices, keys, into, shard, report, process_group, strict)
        except SluiceError as e:
            # Changed while read: an object's ETag (-ESTALE), a file cut short, or a shard an index named gone
            # and the index changed (a save replaced the checkpoint).  Loaded again from the start, index included.
            gone = e.code == -errno.ENOENT and src.index is not None
            if gone and not src.index_changed():
                raise SluiceError(e.code, f"{shown(src.index)}: names a file that is not there: {e.detail}") from None
            changed = e.code in (-errno.ESTALE, ESHORT) or gone
            if not changed or process_group is not None:
                raise
            if attempt == _ATTEMPTS:
                raise SluiceError(e.code, f"{_named(source)}: changed during each of {_ATTEMPTS} loads, the last: "
                                          f"{e.detail}") from None


def _load_from(ckp, source, device="cpu", keys=None, report=None, process_group=None, variant=None):
    """load() of a checkpoint the caller holds open (an _Open, its headers read for a listing), through the same
    opens: its headers are not read again.  Where it changed since (an object's ETag, a file cut short), load()
    from the start, which tries again: the caller checks what it gets against the listing it planned with."""
    try:
        return _load(ckp, source, device, None, keys, None, None, report, process_group, True)
    except SluiceError as e:
        if e.code not in (-errno.ESTALE, ESHORT) or process_group is not None:
            raise
    return load(source, device=device, keys=keys, report=report, process_group=process_group, variant=variant)


def _load(ckp, source, device, devices, keys, into, shard, report, process_group, strict):
    """One load of the open checkpoint ckp (an _Open)."""
    handles, table = ckp.handles, ckp.table
    if into is None:
        names, filled = _select(table, keys, source), None
    else:
        names, filled, missing, unexpected = _select_into(table, keys, into, strict, source)
        if report is not None:
            report.update(missing_keys=missing, unexpected_keys=unexpected)
    plans = []
    for name in names:
        e = table[name]
        sl = None if shard is None else _slice_of(shard, name, e.shape)
        shape, offs, lens, n = _plan(e, sl, name)
        if into is not None:
            _check_into(name, into[name], e.dtype, shape)
        plans.append(_Planned(name, e.fi, e.dtype, shape, offs, lens, n, sl is None))
    grp = _Group(process_group) if process_group is not None else None
    torch = None
    if into is None:
        total, runs = grp.place(plans) if grp else _place(plans, True)
        buf, base, torch = _alloc(total, devices[0] if devices else device)
        if grp and torch is None:
            raise ValueError("sluice.load: process_group= needs torch")
    else:
        base, runs = 0, []
        if grp:
            grp.assign(plans)
        _ready([into[p.name] for p in plans])  # kernels still using the caller's tensors finish first
        for p in plans:
            p.dst = _buffer(into[p.name], True, ordered=False)[0]
    if grp and into is not None:
        batches = _ranges([p for p in plans if grp.reads(p)], runs, handles, base)
    else:
        batches = _ranges(plans, runs, handles, base)
        batches = grp.mine(batches, base) if grp else batches
    posted, failed = set(), None

    def after(k):  # round k read: its all-gather starts while the next is read
        posted.add(k)
        grp.gather(buf, k)
    try:
        rep = _read_ranges(handles, batches, after if grp and into is None else None)
        ckp.check_unchanged()  # before anything read is handed out
    except SluiceError as e:
        if grp is None:
            raise
        failed = e
    if grp:
        # A rank whose read failed still joins every collective of the others (no rank waits forever), then
        # the whole group fails: the others' buffers would hold its part unread.
        for k in range(grp.rounds if into is None else 0):
            if k not in posted:
                grp.gather(buf, k)
        if not grp.agree(failed is None):
            if into is None:
                grp.exchange()
            raise failed or SluiceError(-errno.EIO, f"{_named(source)}: another rank of the group failed its read: "
                                                    f"the group's load fails with it (its part would be missing)")
    if report is not None:
        report.update(files=len(ckp.files), tensors=len(names), bytes=rep.bytes, bytes_storage=rep.bytes_storage,
                      ios=rep.ios, seconds=rep.seconds, path=rep.path.decode())
    if grp:
        got = grp.exchange() if into is None else grp.broadcast(plans, into)
        if report is not None:
            report["bytes_exchanged"] = got
    if into is not None:
        return {name: into[name] for name in filled}
    if devices is None:
        return {p.name: _view(buf, torch, p.dst, p.n, p.dt, p.shape) for p in plans}
    if torch is None:
        raise ValueError("sluice.load: a list of devices needs torch")
    bufs = [buf] + [buf.to(d) for d in devices[1:]]  # GPU to GPU (peer to peer where the GPUs allow it)
    return [{p.name: _view(b, torch, p.dst, p.n, p.dt, p.shape) for p in plans} for b in bufs]
