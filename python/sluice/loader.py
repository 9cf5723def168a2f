"""The loader: batches of a dataset for a training loop, on host memory or a GPU, and where its time goes."""
import ctypes as C
import errno
import json
import os
import re

import numpy as np

from ._lib import (LOADER_SEGMENTS_MAX, Batch as _CBatch, LoaderOptions, LoaderSegment, SluiceError, check, env_int,
                   lib)
from .buffers import _device, _eng
from .dataset import _NAMES, _NP, _find_nvcomp, _int_option


_TRANSFORM = C.CFUNCTYPE(C.c_int, C.POINTER(_CBatch), C.c_void_p, C.c_void_p)


class _Batch(dict):
    """One batch: its keys are the dataset's fields and nothing else, so no field name can hide what the loader
    adds; .ids holds the records' ids (uint64, host memory).  For code written before .ids, the key "ids" also
    gives them, where no field is named "ids"."""

    ids = None


class _CudaArray:
    """A GPU buffer described by __cuda_array_interface__, so torch.as_tensor or cupy.asarray take it in place."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "version": 3, "strides": None}


def _dist():
    """torch.distributed where it is initialised, else None."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist
    except ImportError:
        pass
    return None


def _env_rank(rank=None, world_size=None):
    """This rank and the world's size: those given, else torch.distributed's where it is initialised, else RANK and
    WORLD_SIZE (0 and 1 where unset).  A variable that is no number, a world of no rank, a rank outside the world
    raise ValueError naming the variable, as torch.distributed refuses them (a bare int() named none, and
    WORLD_SIZE=0 was taken as one rank)."""
    dist = _dist() if rank is None or world_size is None else None
    if dist is not None:
        return (dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size)
    u32 = (1 << 32) - 1
    if world_size is None:
        world_size = env_int("Loader", "WORLD_SIZE", 1, 1, u32, ": a world has at least one rank")
    if rank is None:
        ws = os.environ.get("WORLD_SIZE")
        rank = env_int("Loader", "RANK", 0, 0, world_size - 1, f": a rank is below WORLD_SIZE={ws}" if ws is not None
                       else ": WORLD_SIZE is not set, a world of one rank")
    return rank, world_size


def _device_ids():
    """SLUICE_DEVICE_IDS as the engine takes it (0 or 0,1,3: decimal ordinals), or ValueError naming it."""
    v = os.environ["SLUICE_DEVICE_IDS"]
    if not re.fullmatch(r"[0-9]{1,4}(,[0-9]{1,4})*", v):
        raise ValueError(f"Loader: SLUICE_DEVICE_IDS={v!r} is not a list of GPU ordinals such as 0 or 0,1")
    return [int(x) for x in v.split(",")]


def _env_nodes(rank, world_size):
    """The nodes torchrun's environment says the world_size ranks run on: world_size // LOCAL_WORLD_SIZE where
    torch.distributed is initialised or WORLD_SIZE is set and LOCAL_WORLD_SIZE is, else 1.  torchrun numbers ranks
    node-major (RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK); a GROUP_RANK that says otherwise is an error."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if not local or ("WORLD_SIZE" not in os.environ and _dist() is None):  # torch imported only when it can matter
        return 1
    local = env_int("Loader", "LOCAL_WORLD_SIZE", 1, 1, (1 << 32) - 1, ": a node has at least one rank")
    if world_size % local:
        raise ValueError(f"Loader: world_size {world_size} is not a multiple of LOCAL_WORLD_SIZE={local}; pass nodes=")
    group = os.environ.get("GROUP_RANK")
    if group is not None and env_int("Loader", "GROUP_RANK", 0, 0, (1 << 32) - 1) != rank // local:
        raise ValueError(f"Loader: GROUP_RANK={group}, but rank {rank} is on node {rank // local} when ranks are "
                         f"numbered node-major by LOCAL_WORLD_SIZE={local} (as torchrun numbers them); pass nodes= "
                         f"(nodes=1: one order for the whole world, as before nodes)")
    return world_size // local


class Loader:
    """Shuffled, distributed, resumable batches of a Dataset (see docs/LOADER.md for the order).

    Iterating yields dicts of the fields: fixed-size fields as arrays of shape [batch, ...]; other fields as
    (data, offsets) pairs, offsets counting elements of data (data[offsets[j]:offsets[j + 1]] is record j, as with
    cu_seqlens); the batch's .ids are its records' ids.  device="cpu" gives numpy arrays, device="cuda" (or "cuda:N", a GPU of the engine's
    SLUICE_DEVICE_IDS) torch tensors in GPU memory, ordered on the current stream.  A batch's arrays are views
    of the loader's ring: valid until the next batch is taken (or, after close(), for as long as they live);
    .copy()/.clone() what must outlive that.
    fields: the fields to deliver (default all).  rank, world_size: this rank's share (default: torch.distributed's
    when initialised, else RANK and WORLD_SIZE); every rank gets the same number of batches.
    nodes: the machines the ranks run on, numbered node-major as torchrun numbers them (node = rank // (world_size
    // nodes)).  Each node then reads only its own contiguous share of the shuffled shards (at most two shards are
    shared with a neighbouring node), so a machine-wide cache downloads only those; the order depends on the node
    count, never on the ranks within a node.  None (default): from the environment where torch.distributed is
    initialised or WORLD_SIZE is set: world_size // LOCAL_WORLD_SIZE when LOCAL_WORLD_SIZE is set (torchrun sets
    it), else 1; a GROUP_RANK that disagrees with rank // LOCAL_WORLD_SIZE raises ValueError.  nodes=1 gives one
    order for the whole world, the order of loaders before nodes.  Node sequences differ by a record at most: the
    batch count is the longest node's, a shorter node filling its last batch from its own start.
    drop_last: drop the last partial global batch (with nodes, count on the shortest node).  Without it the last
    batch is short, as torch's DataLoader and DistributedSampler make it: every rank gets the same number of
    records, ceil(records / world_size), at most world_size - 1 of them twice (one process: none).
    even_batches: the last batch full on every rank instead, filled from the epoch's start (accelerate's
    even_batches), for models that need one batch shape.  prefetch: batches ready ahead
    (0: by batch size).  window_bytes: the shuffle window (0: 64 MiB).  skip_corrupt: a record whose CRC fails
    is left out (the batch is smaller; one left with no record is not delivered, but with several ranks, which
    must all take the same number of steps) and counted, instead of failing the batch.
    images: a sluice.Images, which decodes and augments one field's encoded images inside the loader (on the GPU with
    device="cuda"): that field arrives as one tensor [B, 3, H, W] ready for the model.
    transform: your own function of each batch (the dict the loop gets), run by the loader's threads after its own
    stages and before the batch is handed out, several batches at once; with device="cuda" inside
    torch.cuda.stream() of the stream the batch was made on, so its GPU work is done before the loop sees the
    batch.  It changes the batch's arrays in place (their shapes stay); an exception it raises is raised by the
    loop, at that batch.
    """

    def __init__(self, dataset, batch_size, shuffle=True, seed=0, epoch=0, device="cpu", fields=None,
                 drop_last=False, rank=None, world_size=None, prefetch=0, window_bytes=0, skip_corrupt=False,
                 images=None, transform=None, nodes=None, even_batches=False):
        if rank is None or world_size is None:
            rank, world_size = _env_rank(rank, world_size)
        if nodes is None:
            nodes = _env_nodes(rank, world_size)
        device = str(device)  # a torch.device too
        if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            raise ValueError(f"Loader(device={device!r}): 'cpu', 'cuda' or 'cuda:N'")
        if not (hasattr(dataset, "_h") and hasattr(dataset, "fields")):
            raise TypeError(f"Loader(dataset={dataset!r}): a sluice.Dataset (sluice.Dataset(path) opens one), as "
                            f"torch's DataLoader takes a dataset, not a path")
        if images is not None and not hasattr(images, "_pointer"):
            raise TypeError(f"Loader(images={images!r}): a sluice.Images")
        if images is not None and images.decode == "gpu" and device == "cpu":
            raise ValueError("Loader: Images(decode='gpu') needs a GPU loader (device='cuda'); decode='cpu' or "
                             "'auto' decode on the CPU")
        self.dataset, self.device = dataset, device
        index, self._gpu = 0, None
        if device != "cpu":
            # "cuda" is the engine's (first) GPU; "cuda:N" must be one of those it serves (SLUICE_DEVICE_IDS).
            ids = _device_ids() if os.environ.get("SLUICE_DEVICE_IDS") else [_device() or 0]
            want = int(device.split(":")[1]) if ":" in device else ids[0]
            if want not in ids:
                raise ValueError(f"Loader(device={device!r}): the engine serves GPUs {ids} (SLUICE_DEVICE_IDS)")
            index, self._gpu = ids.index(want), want
        u32, u64 = (0, (1 << 32) - 1), (0, (1 << 64) - 1)
        self._opt = LoaderOptions(batch_size=_int_option("Loader", "batch_size", batch_size, *u32),
                                  gpu=int(device != "cpu"), prefetch=_int_option("Loader", "prefetch", prefetch, *u32),
                                  seed=_int_option("Loader", "seed", seed, *u64),
                                  epoch=_int_option("Loader", "epoch", epoch, *u64),
                                  rank=_int_option("Loader", "rank", rank, *u32),
                                  world_size=_int_option("Loader", "world_size", world_size, 1, u32[1]),
                                  drop_last=int(drop_last), shuffle=int(shuffle),
                                  window_bytes=_int_option("Loader", "window_bytes", window_bytes, *u64),
                                  skip_corrupt=int(skip_corrupt), device_index=index,
                                  nodes=_int_option("Loader", "nodes", nodes, 1, (1 << 32) - 1),
                                  even_batches=int(even_batches))
        self.images = images
        if images is not None:
            self._opt.image = images._pointer()
        self._transform, self._transform_error, self._cb = transform, None, None
        if transform is not None:
            self._cb = _TRANSFORM(self._run_transform)
            self._opt.transform = C.cast(self._cb, C.c_void_p)
        self._names = None
        if fields is not None:
            self._names = (C.c_char_p * (len(fields) + 1))(*[f.encode() for f in fields], None)
            self._opt.fields = C.cast(self._names, C.POINTER(C.c_char_p))
        self._types = {n: (t, s) for n, t, s in dataset.fields}
        self._h = self._owner = None
        self._open(0)
        global _last_loader
        import weakref
        _last_loader = weakref.ref(self)

    def _open(self, position):
        self._h = self._owner = None  # the previous C loader closes once no batch of its is left
        # Before the C loader starts: its threads call the transform, which makes views, at once.
        self._views, self._meta = {}, None
        self._opt.position = _int_option("Loader", "position", position, 0, (1 << 64) - 1)
        h = C.c_void_p()
        if self._opt.gpu:  # a GPU loader decodes a zstd dataset's blocks with nvCOMP where it is found
            _find_nvcomp()
        check(lib.sluice_loader_open(C.byref(h), _eng(), self.dataset._h, C.byref(self._opt)))
        self._h, self._owner = h, _Owner(h, self.dataset)
        self._owner.transform = self._cb  # the loader's threads call it for as long as the C loader lives

    def _run_transform(self, bp, stream, arg):
        """The loader's threads call this for each batch: the user's transform on the batch's arrays."""
        try:
            batch = self._convert(bp.contents)
            if stream:
                import torch
                with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=f"cuda:{self._gpu}")):
                    self._transform(batch)
            else:
                self._transform(batch)
            return 0
        except BaseException as e:  # noqa: B902 - it cannot cross into C; the loop raises it at this batch
            self._transform_error = e
            return -errno.ECANCELED

    def _handle(self):
        if self._h is None:
            raise ValueError("sluice.Loader: the loader is closed")
        return self._h

    def __len__(self):
        return lib.sluice_loader_batches(self._handle())

    def set_epoch(self, epoch):
        """Starts epoch `epoch` from its first batch: a new order, the same on every rank (seed and epoch)."""
        h = self._handle()
        self._opt.epoch = _int_option("Loader.set_epoch", "epoch", epoch, 0, (1 << 64) - 1)
        check(lib.sluice_loader_set_epoch(h, epoch))

    def state_dict(self):
        """{"seed", "epoch", "position"}: where the next batch starts, to save with the model's checkpoint.  A
        loader on several nodes, or one resumed from such a state, adds "segments": [[nodes, position], ...], the
        epoch's phases oldest first (each: the node count, and the positions of each node's own sequence consumed
        in it), the last being this loader's; "position" is then the epoch's records consumed by all nodes, a
        figure: the segments are the state."""
        h = self._handle()
        s, e, p = C.c_uint64(), C.c_uint64(), C.c_uint64()
        lib.sluice_loader_state(h, C.byref(s), C.byref(e), C.byref(p))
        state = {"seed": s.value, "epoch": e.value, "position": p.value}
        seg = (LoaderSegment * LOADER_SEGMENTS_MAX)()
        n = check(lib.sluice_loader_state_ex(h, C.byref(s), C.byref(e), seg, len(seg)))
        if n > 1 or seg[0].nodes != 1:
            state["segments"] = [[seg[i].nodes, seg[i].position] for i in range(n)]
        return state

    def load_state_dict(self, state):
        """Continues from a state_dict() taken by a loader with any world size, batch size and node count (a dict
        without "segments", from one node or from before nodes, too): no record of the epoch repeats and none is
        skipped.  A state that ran on 16 node counts, this loader's aside, is refused: resume it on its last one."""
        self._handle()
        where = "Loader.load_state_dict"
        self._opt.seed = _int_option(where, "seed", state["seed"], 0, (1 << 64) - 1)
        self._opt.epoch = _int_option(where, "epoch", state["epoch"], 0, (1 << 64) - 1)
        segments = state.get("segments") or []
        if not isinstance(segments, (list, tuple)) or not all(
                isinstance(g, (list, tuple)) and len(g) == 2 and not any(isinstance(x, bool) for x in g)
                for g in segments):
            raise ValueError(f"{where}: segments must be a list of [nodes, position] pairs of integers, not "
                             f"{segments!r:.200}")
        if len(segments) > LOADER_SEGMENTS_MAX:
            raise ValueError(f"{where}: {len(segments)} segments; a state holds at most {LOADER_SEGMENTS_MAX}")
        resume = (LoaderSegment * max(len(segments), 1))(
            *[LoaderSegment(_int_option(where, "segment nodes", k, 1, (1 << 32) - 1),
                            _int_option(where, "segment position", c, 0, (1 << 64) - 1)) for k, c in segments])
        self._opt.resume, self._opt.nresume = (resume, len(segments)) if segments else (None, 0)
        try:  # the C loader reads the segments while it opens, and keeps none of them
            self._open(0 if segments else state["position"])
        finally:
            self._opt.resume, self._opt.nresume = None, 0

    def stats(self):
        """Where the time went since the loader opened: batches, records and bytes delivered, reads (bytes, I/Os,
        sequential_fraction), each stage's histogram, gpu_wait_share, step_us, loader_us, h2d_us and the
        verdict (compute-, loader- or transfer-bound), as a dict."""
        h = self._handle()
        buf = C.create_string_buffer(8192)
        n = lib.sluice_loader_stats_json(h, buf, len(buf))
        if n >= len(buf):
            buf = C.create_string_buffer(n + 1)
            lib.sluice_loader_stats_json(h, buf, len(buf))
        return json.loads(buf.value)

    def __iter__(self):
        self._handle()
        b = _CBatch()
        b.struct_size = C.sizeof(b)
        stream = None
        if self.device != "cpu":
            import torch
            stream = C.c_void_p(torch.cuda.current_stream(self._gpu).cuda_stream)
        while True:
            try:
                r = check(lib.sluice_loader_next(self._handle(), C.byref(b), stream))
            except SluiceError as e:
                if self._transform_error is not None and "transform" in str(e):
                    raise self._transform_error from e
                raise
            if r == 0:
                return
            yield self._convert(b)

    def _array(self, ptr, nbytes, dtype, shape, host=False, channels_last=False):
        key = (ptr, dtype, shape, channels_last)
        a = self._views.get(key)
        if a is not None:
            return a
        t = np.uint64 if dtype == "ids" else _NP[_NAMES.index(dtype)] or np.uint16
        # Each view holds the C loader (its _Owner), so a batch kept after the loop, or after the Loader is gone,
        # still points at the ring, not at freed memory.
        if self.device == "cpu" or host:
            raw = np.empty(0, np.uint8)
            if nbytes:
                mem = (C.c_uint8 * nbytes).from_address(ptr)
                mem._owner = self._owner
                raw = np.ctypeslib.as_array(mem)
            a = raw.view(t).reshape(shape)
            if channels_last:
                a = a.transpose(0, 3, 1, 2)
        else:
            import torch
            cai = _CudaArray(ptr, shape, np.dtype(t).str)
            cai._owner = self._owner
            a = torch.as_tensor(cai, device=f"cuda:{self._gpu}")
            if dtype == "bf16":  # no typestr names bfloat16: its bits, viewed
                a = a.view(torch.bfloat16)
            if channels_last:  # [B, H, W, 3] in memory: the model's [B, 3, H, W] in channels_last
                a = a.permute(0, 3, 1, 2)
        # The ring's buffers stay where they are while the loader is open, so a view made once serves every
        # batch that lands in the same slot with the same shape (making one costs more than the rest of next()).
        if len(self._views) >= 1024:
            self._views.clear()
        self._views[key] = a
        return a

    def _fields_meta(self, b):
        """Per field of the batch: name, dtype, item shape, element size (made once)."""
        if self._meta is None:
            meta = []
            for k in range(b.nfields):
                name = b.field[k].name.decode()
                dtype, shape = self._types[name]
                meta.append((name, dtype, tuple(shape), np.dtype(_NP[_NAMES.index(dtype)] or np.uint16).itemsize))
            self._meta = meta
        return self._meta

    def _convert(self, b):
        self._fields_meta(b)
        out = _Batch()
        out.ids = self._array(b.ids, 8 * b.size, "ids", (b.size,), host=True).copy()
        if "ids" not in self._types:
            out["ids"] = out.ids
        for k in range(b.nfields):
            f = b.field[k]
            name, dtype, shape, esize = self._meta[k]
            if self.images is not None and name == self.images.field:
                shp = tuple(f.shape[d] for d in range(f.ndim))
                out[name] = self._array(f.data, b.size * f.item_bytes, self.images.dtype, shp,
                                        channels_last=self.images.channels_last)
            elif f.item_bytes:
                out[name] = self._array(f.data, b.size * f.item_bytes, dtype, (b.size,) + shape)
            else:
                # Offsets count elements of the field's dtype, so data[offs[j]:offs[j + 1]] is record j.
                offs = self._array(f.offsets, 8 * (b.size + 1), "i64", (b.size + 1,))
                last = f.host_offsets[b.size]  # from host memory: no wait on the GPU
                out[name] = (self._array(f.data, last * esize, dtype, (last,)), offs)
        return out

    def close(self):
        """Closes the loader: it yields no more batches and its methods raise.  The C loader and its ring are freed
        now, or, while arrays of its batches are still alive, once the last of them goes (they stay valid)."""
        self._h = self._owner = None
        self._views = {}  # the views kept for reuse hold the C loader too


class _Owner:
    """A C loader and the dataset it reads: closed when the last of its Loader and the arrays of its batches
    (views of its ring) is gone."""

    def __init__(self, h, dataset):
        self.h, self.dataset = h, dataset

    def close(self):
        if self.h:
            lib.sluice_loader_close(self.h)
            self.h = None

    def __del__(self):
        self.close()


_last_loader = None
