"""Checkpoints in the safetensors layout (see _safetensors), moved by sluice's engine.

save: one file, or shards and their index as Hugging Face tools write them.  load: a whole checkpoint (a file,
a directory, an index, a list of files; local, s3:// or http(s)://) planned as one batched read of every
tensor asked for, whole or one rank's slice, into new tensors or straight into a model's own.
"""
import ctypes as C
import fnmatch
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ._lib import Range, SluiceError, XferReport, check, lib
from ._safetensors import BITS, DT, SIZE, bad, header_bytes, is_url, nbytes, open_file, read_header, st_dtype
from .buffers import _buffer, _eng, _ready, read, write
from .s3 import listdir

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
        t = t.contiguous() if hasattr(t, "contiguous") else np.ascontiguousarray(t)
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


def _save_file(tensors, path, metadata):
    """One safetensors file, durably and atomically (see save); returns {name: (file offset, bytes)}."""
    header, items, size = _layout(tensors, metadata)
    head = header_bytes(header)
    base = len(head)
    if is_url(path):
        whole = np.empty(base + size, np.uint8)
        whole[:base] = np.frombuffer(head, np.uint8)
        for t, o, n in items:
            if n:
                whole[base + o:base + o + n] = _host_bytes(t)
        write(path, whole)
        return _placed(header, base)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.sluice-tmp-{os.getpid()}")
    f = None
    try:
        with open(tmp, "wb") as h:
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
    if is_url(path):
        write(path, np.frombuffer(data, np.uint8))
        return
    tmp = f"{path}.sluice-tmp-{os.getpid()}"
    with open(tmp, "wb") as h:
        h.write(data)
        h.flush()
        os.fsync(h.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _save_sharded(tensors, directory, metadata, max_shard_size):
    """Shards of at most max_shard_size data bytes (a larger tensor alone in its own), then the index."""
    shards, cur, cur_bytes = [], {}, 0
    for name in sorted(tensors):
        n = nbytes(tensors[name], st_dtype(tensors[name]))
        if cur and cur_bytes + n > max_shard_size:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = tensors[name]
        cur_bytes += n
    shards.append(cur)
    if not is_url(directory):
        os.makedirs(directory, exist_ok=True)
    weight_map, total = {}, 0
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _save_file(part, f"{directory.rstrip('/')}/{fname}", metadata)
        total += sum(nbytes(t, st_dtype(t)) for t in part.values())
        weight_map.update({name: fname for name in part})
    index = {"metadata": {"total_size": total, **({str(k): str(v) for k, v in metadata.items()} if metadata else {})},
             "weight_map": dict(sorted(weight_map.items()))}
    _write_whole(f"{directory.rstrip('/')}/{INDEX}", json.dumps(index, indent=2).encode())


def save(tensors, path, metadata=None, max_shard_size=None):
    """Writes a dict of name -> tensor (numpy, or torch on CPU or GPU) in the safetensors layout.
    Without max_shard_size, to the file path, durably and atomically: a temporary file beside it, the data
    straight from each tensor's memory, fdatasync, rename, directory fsync; a crash leaves the previous file or
    the whole new one.  With max_shard_size (bytes), path is a directory: files model-0000K-of-0000N.safetensors
    of at most that many data bytes each (a larger tensor alone in one) and model.safetensors.index.json
    written last, the layout Hugging Face tools read; each file is written as above, so a crash leaves every
    file whole, old or new.  An s3:// path is written as objects (each one multipart upload that appears whole
    or not at all)."""
    if max_shard_size is None:
        _save_file(tensors, path, metadata)
    elif int(max_shard_size) <= 0:
        raise ValueError(f"sluice.save: max_shard_size {max_shard_size} is not a positive byte count")
    else:
        _save_sharded(tensors, path, metadata, int(max_shard_size))


def _read_whole(path):
    """The whole of a small file or object (an index, a DCP checkpoint's metadata), as bytes."""
    if not is_url(path):
        with open(path, "rb") as h:
            return h.read()
    f = open_file(path, 0)
    try:
        size = lib.sluice_file_size(f)
    finally:
        lib.sluice_file_close(f)
    buf = np.empty(size, np.uint8)
    if size:
        read(path, buf)
    return buf.tobytes()


def _from_index(path):
    """The files an index names, in order, beside it."""
    try:
        wm = json.loads(_read_whole(path).decode())["weight_map"]
        files = sorted(set(wm.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise bad(path, f"not a safetensors index: {e!r}") from None
    base = path.rsplit("/", 1)[0] if "/" in path else "."
    for f in files:
        if not isinstance(f, str) or "/" in f or f in ("", ".", ".."):
            raise bad(path, f"weight_map names {f!r}, not a file beside the index")
    return [f"{base}/{f}" for f in files]


def _url_exists(path):
    try:
        lib.sluice_file_close(open_file(path, 0))
        return True
    except SluiceError:
        return False


def _sources(source):
    """The safetensors files of a checkpoint given as a file, a directory or prefix ending in / (its index, else
    its *.safetensors; an http(s):// one, which cannot be listed, its model.safetensors), an index, or a list
    of files."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("sluice.load: an empty list of files")
        return [os.fspath(s) for s in source]
    source = os.fspath(source)
    if source.endswith(".index.json"):
        return _from_index(source)
    if is_url(source):
        if not source.endswith("/"):
            return [source]
        if _url_exists(source + INDEX):
            return _from_index(source + INDEX)
        if source.startswith("s3://"):  # a prefix lists its objects; a web server's directory cannot be listed
            files = [f for f in listdir(source) if f.endswith(".safetensors")]
        else:
            files = [source + "model.safetensors"] if _url_exists(source + "model.safetensors") else []
        if not files:
            raise SluiceError(-2, f"{source}: no {INDEX} and no .safetensors there")
        return files
    if not os.path.isdir(source):
        return [source]
    idx = sorted(n for n in os.listdir(source) if n.endswith(".safetensors.index.json"))
    if len(idx) > 1:
        raise bad(source, f"several indexes ({', '.join(idx)}): name the one to load")
    if idx:
        return _from_index(os.path.join(source, idx[0]))
    files = sorted(os.path.join(source, n) for n in os.listdir(source) if n.endswith(".safetensors"))
    if not files:
        raise SluiceError(-2, f"{source}: no .safetensors files and no index")
    return files


def _tensors(files):
    """{name: (file index, entry, data start)} of every tensor of the files (headers read in parallel); a name
    in two files is an error naming both."""
    if len(files) > 4 or any(is_url(f) for f in files):  # round trips worth overlapping
        with ThreadPoolExecutor(min(16, len(files))) as ex:
            headers = list(ex.map(read_header, files))
    else:
        headers = [read_header(f) for f in files]
    table = {}
    for i, (header, start) in enumerate(headers):
        for name, v in header.items():
            if name == "__metadata__":
                continue
            if name in table:
                raise bad(files[i], f"tensor '{name}' is also in {files[table[name][0]]}")
            table[name] = (i, v, start)
    return table


def _select(table, keys, into, source):
    """The names to load, in the checkpoint's order: keys (names or globs), else into's, else all."""
    if keys is None and into is not None:
        keys = list(into)
    if keys is None:
        return list(table)
    if isinstance(keys, str):
        keys = [keys]
    missing = [k for k in keys if not any(c in k for c in "*?[") and k not in table]
    if missing:
        raise KeyError(f"sluice.load: {source} has no tensor {', '.join(repr(m) for m in missing[:5])}"
                       f"{f' (and {len(missing) - 5} more)' if len(missing) > 5 else ''}")
    pats = [k for k in keys if any(c in k for c in "*?[")]
    want = set(k for k in keys if k in table)
    return [n for n in table if n in want or any(fnmatch.fnmatchcase(n, p) for p in pats)]


def _slice_of(shard, name, shape):
    """(dim, lo, hi) of one rank's part of a tensor, or None for the whole: shard is (dim, rank, world) for every
    tensor with that dim, or a callable(name, shape) giving that or None.  Parts are as torch.chunk cuts them:
    ceil(size / world) each, the last ones shorter or empty."""
    spec = shard(name, tuple(shape)) if callable(shard) else shard
    if spec is None:
        return None
    dim, rank, world = spec
    if dim < 0:
        dim += len(shape)
    if not 0 <= dim < len(shape):
        return None  # a tensor without that dimension (a bias, a norm) is whole on every rank
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"sluice.load: tensor '{name}': rank {rank} of world {world}")
    step = -(-shape[dim] // world)
    lo = min(rank * step, shape[dim])
    return dim, lo, min(lo + step, shape[dim])


def _plan(v, start, sl, name):
    """(shape out, file offsets, lengths, bytes) of a tensor, whole (one range, as plain numbers: a checkpoint
    has thousands) or the slice sl (arrays, a range per outer index)."""
    shape, dt = list(v["shape"]), v["dtype"]
    b = start + v["data_offsets"][0]
    if sl is None:
        n = v["data_offsets"][1] - v["data_offsets"][0]
        return shape, (b,), (n,), n
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
                raise
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


def _read_ranges(files, ranges_of, after=None):
    """Opens the files, reads the ranges ranges_of(handles) gives (struct sluice_range entries; or a list of
    such batches, read one after another, after(k) called when batch k has landed); returns the transfer's
    report, the batches' figures added."""
    handles = []
    try:
        handles = [open_file(f, 0) for f in files]
        batches = ranges_of([h.value for h in handles])
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
    finally:
        for h in handles:
            lib.sluice_file_close(h)


def load(source, device="cpu", keys=None, into=None, shard=None, report=None, process_group=None):
    """Reads a checkpoint in the safetensors layout into a dict of name -> tensor.

    source: a .safetensors file; a directory (its *.safetensors.index.json, else its *.safetensors); an index;
    a list of files; or s3:// and http(s):// URLs of any of these (a prefix ends in /; an http(s):// one holds
    model.safetensors.index.json or model.safetensors).  Every tensor asked for, from every file, is planned as
    one batched read: the engine reads the files together and coalesces neighbouring tensors.
    keys: names and globs ("model.layers.0.*") of the tensors to read; only theirs are delivered (the engine
    reads through a gap under SLUICE_READ_GAP, no longer than the tensor after it, where the file is not read
    from the page cache: the report's bytes_storage says what the I/Os spanned).
    shard: one rank's slice of each tensor, (dim, rank, world) for every tensor that has dim, or a
    callable(name, shape) -> (dim, rank, world) or None (whole); only the slice is delivered (a slice of dim 0
    is one range, of a later dim one range per outer index).  Slices are cut as torch.chunk cuts.
    into: a dict of name -> tensor (a module's state_dict()) to load straight into: no other buffer, so GPU
    memory stays the model's; dtype and shape (of the slice, with shard) must match; returns those tensors.
    device: where new tensors go: torch tensors on "cpu", "cuda" or "cuda:N", or numpy arrays for "numpy" (and
    "cpu" without torch).  They are views of one buffer, each at an aligned place whatever its offset in the file.
    A list of devices (["cuda:0", "cuda:1"]) replicates: storage is read once, into the first, and the buffer
    copied GPU to GPU to the others; returns a list of dicts, one per device.
    process_group: a torch.distributed group whose ranks all load the same checkpoint (with the same keys and
    shard), each onto its own device: the group reads each whole tensor's bytes once, each rank an equal part,
    and all-gathers the parts (NCCL in place on GPUs; any backend works), or with into= each tensor's owner
    reads it into place and broadcasts it; a rank's slices it reads itself.  Use
    a group of one node's ranks where the nodes' links are slower than their storage.
    report (a dict, or None) receives the read's figures: files, tensors, bytes (payload), bytes_storage (what
    the I/Os spanned, gaps read through included), ios, seconds, path; with process_group, this rank's read and
    bytes_exchanged (received from the others)."""
    devices = list(device) if isinstance(device, (list, tuple)) else None
    if devices is not None and (not devices or into is not None):
        raise ValueError("sluice.load: a list of devices needs at least one, and no into= (load into each instead)")
    if process_group is not None and (devices is not None or device == "numpy"):
        raise ValueError("sluice.load: process_group= loads onto one torch device a rank (not a list, not numpy)")
    files = _sources(source)
    table = _tensors(files)
    names = _select(table, keys, into, source)
    plans = []
    for name in names:
        fi, v, start = table[name]
        sl = None if shard is None else _slice_of(shard, name, v["shape"])
        shape, offs, lens, n = _plan(v, start, sl, name)
        if into is not None:
            _check_into(name, into[name], v["dtype"], shape)
        plans.append(_Planned(name, fi, v["dtype"], shape, offs, lens, n, sl is None))
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

    def ranges_of(handles):
        if grp and into is not None:
            return _ranges([p for p in plans if grp.reads(p)], runs, handles, base)
        r = _ranges(plans, runs, handles, base)
        return grp.mine(r, base) if grp else r
    rep = _read_ranges(files, ranges_of, (lambda k: grp.gather(buf, k)) if grp and into is None else None)
    if report is not None:
        report.update(files=len(files), tensors=len(names), bytes=rep.bytes, bytes_storage=rep.bytes_storage,
                      ios=rep.ios, seconds=rep.seconds, path=rep.path.decode())
    if grp:
        got = grp.exchange() if into is None else grp.broadcast(plans, into)
        if report is not None:
            report["bytes_exchanged"] = got
    if into is not None:
        return {name: into[name] for name in names}
    if devices is None:
        return {p.name: _view(buf, torch, p.dst, p.n, p.dt, p.shape) for p in plans}
    if torch is None:
        raise ValueError("sluice.load: a list of devices needs torch")
    bufs = [buf] + [buf.to(d) for d in devices[1:]]  # GPU to GPU (peer to peer where the GPUs allow it)
    return [{p.name: _view(b, torch, p.dst, p.n, p.dt, p.shape) for p in plans} for b in bufs]
