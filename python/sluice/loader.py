"""The loader: batches of a dataset for a training loop, on host memory or a GPU, and where its time goes."""
import ctypes as C
import errno
import json
import os
import re
import weakref

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


# DataLoader's arguments sluice has no use for: each refused, unless given as DataLoader's default, with what
# sluice does instead.
_DATALOADER_ONLY = {
    "sampler": (None, "the Loader samples itself (shuffle=, seed=, rank=, world_size=: DistributedSampler's notions)"),
    "batch_sampler": (None, "the Loader makes its batches itself (batch_size=, drop_last=)"),
    "collate_fn": (None, "batches are collated in C, each field one array; for Python transforms of samples keep "
                         "torch's DataLoader over sluice.Dataset, or give the Loader transform= (a function of the "
                         "batch)"),
    "worker_init_fn": (None, "the Loader has no worker processes"),
    "generator": (None, "the order is a function of seed= and the epoch alone, on every machine"),
    "multiprocessing_context": (None, "the Loader has no worker processes"),
    "timeout": (0, "a stalled read is retried, then an error, by the engine's own bounds (SLUICE_* settings)"),
    "pin_memory_device": ("", "host batches are in pinned memory wherever the engine has a GPU"),
    "in_order": (True, "batches always come in order"),
}


class _During:
    """What the arrays of a batch a transform is given hold: the call's, so that one outliving it is found, and the
    C loader, so that such an array points at memory that is still there."""

    __slots__ = ("owner", "__weakref__")

    def __init__(self, owner):
        self.owner = owner


class _Hold:
    """One batch the loop was handed: its memory is the loop's until this goes, which happens once no array of
    the batch is left (each holds it), and the ring then reuses it.  Holds the C loader open meanwhile."""

    __slots__ = ("owner", "hold", "__weakref__")

    def __init__(self, owner, hold):
        self.owner, self.hold = owner, hold

    def __del__(self):
        h = self.owner.h
        if h and self.hold and self.owner.pid == os.getpid():  # after a fork, the ring is the parent's
            lib.sluice_loader_release(h, self.hold)


def _flag(name, v):
    """A yes-or-no option as a bool, or TypeError naming it (a string such as 'no' would be true)."""
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise TypeError(f"Loader({name}={v!r}): True or False")


def _torch():
    """torch where it is installed (imported on first use), else None."""
    global _torch_mod
    if _torch_mod is False:
        import importlib.util
        _torch_mod = None
        if importlib.util.find_spec("torch") is not None:
            import torch
            _torch_mod = torch
    return _torch_mod


_torch_mod = False


class Loader:
    """Shuffled, distributed, resumable batches of a Dataset (see docs/LOADER.md for the order), with the contract
    of torch's DataLoader (and its DistributedSampler and torchdata's StatefulDataLoader) where the APIs overlap.

    dataset: a sluice.Dataset, or a path (or s3:// or http(s):// URL) it opens.  batch_size: records per batch per
    rank (1, as DataLoader).  shuffle: False (as DataLoader) or True: the order of each epoch, from seed and the
    epoch alone (any machine, any world size).
    Each iter(loader) is a pass over the next epoch: the first pass is epoch `epoch`, each later one the one after,
    or the one set_epoch() named (as DistributedSampler.set_epoch); breaking out of a pass ends it.  len(loader) is
    the batches of one pass on this rank.
    Iterating yields dicts of the fields: fixed-size fields as tensors of shape [batch, ...] (torch tensors where
    torch is installed, numpy arrays where it is not or with numpy=True); other fields as (data, offsets) pairs,
    offsets counting elements of data (data[offsets[j]:offsets[j + 1]] is record j, as with cu_seqlens), or with
    ragged="padded" as (padded [batch, longest], lengths [batch]), or with ragged="nested" as a torch.nested
    tensor; the batch's .ids are its records' ids (numpy uint64), also under the key "ids" where no field is
    named so.  device="cpu" gives host memory (pinned where the engine has a GPU), device="cuda" (or "cuda:N", a
    GPU of the engine's SLUICE_DEVICE_IDS) torch tensors in GPU memory, ordered on the current stream.
    A batch's arrays stay valid and unchanged for as long as any of them is held (list(loader) is correct): the
    ring moves a batch still held into memory of its own when it needs its place again.  hold_bytes: the most
    that memory may take (0: a quarter of the host's memory); past it, the batch that needs more raises
    SluiceError naming hold_bytes.
    fields: the fields to deliver (default all).  rank, world_size: this rank's share (default: torch.distributed's
    when initialised, else RANK and WORLD_SIZE); every rank gets the same number of batches and records.
    drop_last: drop the last partial global batch (with nodes, count on the shortest node).  Without it the last
    batch is short, as torch's DataLoader and DistributedSampler make it: every rank gets the same number of
    records, ceil(records / world_size), at most world_size - 1 of them twice (one process: none).
    even_batches: the last batch full on every rank instead, filled from the epoch's start (accelerate's
    even_batches), for models that need one batch shape.
    nodes: the machines the ranks run on, numbered node-major as torchrun numbers them (node = rank // (world_size
    // nodes)).  Each node then reads only its own contiguous share of the shuffled shards (at most two shards are
    shared with a neighbouring node), so a machine-wide cache downloads only those; the order depends on the node
    count, never on the ranks within a node.  None (default): from the environment where torch.distributed is
    initialised or WORLD_SIZE is set: world_size // LOCAL_WORLD_SIZE when LOCAL_WORLD_SIZE is set (torchrun sets
    it), else 1; a GROUP_RANK that disagrees with rank // LOCAL_WORLD_SIZE raises ValueError.  nodes=1 gives one
    order for the whole world, the order of loaders before nodes.
    prefetch (or DataLoader's prefetch_factor): batches ready ahead (0: by batch size).  window_bytes: the shuffle
    window (0: 64 MiB).  skip_corrupt: a record whose CRC fails is left out (the batch is smaller; one left with no
    record is not delivered, but with several ranks, which must all take the same number of steps) and counted,
    instead of failing the batch.
    images: a sluice.Images, which decodes and augments one field's encoded images inside the loader (on the GPU with
    device="cuda"): that field arrives as one tensor [B, 3, H, W] ready for the model.
    transform: your own function of each batch (the dict the loop gets), run by the loader's threads after its own
    stages and before the batch is handed out, several batches at once; with device="cuda" inside
    torch.cuda.stream() of the stream the batch was made on, so its GPU work is done before the loop sees the
    batch.  It changes the batch's arrays in place (their shapes stay) and returns None; the arrays are the ring's
    memory for the call only, so one it keeps (copy it instead), a field it assigns anew or a batch it returns is
    an error, as is an exception it raises: each raised by the loop, at that batch.
    DataLoader's num_workers (0), pin_memory and persistent_workers are taken (the loader's threads read, decode and
    collate in C and live as long as it does; host batches are pinned where there is a GPU); its other arguments
    are refused with a sentence saying what sluice does instead.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, seed=0, epoch=0, device="cpu", fields=None,
                 drop_last=False, rank=None, world_size=None, prefetch=0, window_bytes=0, skip_corrupt=False,
                 images=None, transform=None, nodes=None, even_batches=False, hold_bytes=0, numpy=False,
                 ragged="offsets", num_workers=0, pin_memory=False, persistent_workers=False, prefetch_factor=None,
                 **dataloader):
        for k, v in dataloader.items():
            if k not in _DATALOADER_ONLY:
                raise TypeError(f"Loader() got an unexpected keyword argument {k!r}")
            default, instead = _DATALOADER_ONLY[k]
            if v != default:
                raise ValueError(f"Loader({k}={v!r}): torch's DataLoader option has no place here: {instead}")
        if num_workers:
            raise ValueError(f"Loader(num_workers={num_workers!r}): the Loader has no worker processes: its threads "
                             f"read, decode and collate in C (drop num_workers); for Python transforms of each "
                             f"sample, keep torch's DataLoader with num_workers over sluice.Dataset")
        if prefetch_factor is not None:
            if prefetch:
                raise ValueError("Loader: prefetch and prefetch_factor are one setting (batches ready ahead): "
                                 "give one")
            prefetch = prefetch_factor
        if ragged not in ("offsets", "padded", "nested"):
            raise ValueError(f"Loader(ragged={ragged!r}): 'offsets', 'padded' or 'nested'")
        if rank is None or world_size is None:
            rank, world_size = _env_rank(rank, world_size)
        if nodes is None:
            nodes = _env_nodes(rank, world_size)
        device = str(device)  # a torch.device too
        if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            raise ValueError(f"Loader(device={device!r}): 'cpu', 'cuda' or 'cuda:N'")
        if isinstance(dataset, (str, os.PathLike)):
            from .dataset import Dataset
            dataset = Dataset(os.fspath(dataset))
        if not (hasattr(dataset, "_handle") and hasattr(dataset, "fields")):
            raise TypeError(f"Loader(dataset={dataset!r}): a sluice.Dataset or a dataset's path (sluice.Dataset(path) "
                            f"opens one)")
        if images is not None and not hasattr(images, "_pointer"):
            raise TypeError(f"Loader(images={images!r}): a sluice.Images")
        if images is not None and images.decode == "gpu" and device == "cpu":
            raise ValueError("Loader: Images(decode='gpu') needs a GPU loader (device='cuda'); decode='cpu' or "
                             "'auto' decode on the CPU")
        pin_memory, persistent_workers, drop_last, shuffle, numpy, even_batches, skip_corrupt = (
            _flag(k, v) for k, v in (("pin_memory", pin_memory), ("persistent_workers", persistent_workers),
                                     ("drop_last", drop_last), ("shuffle", shuffle), ("numpy", numpy),
                                     ("even_batches", even_batches), ("skip_corrupt", skip_corrupt)))
        self.dataset, self.device = dataset, device
        self.pin_memory, self.persistent_workers, self.num_workers = pin_memory, persistent_workers, 0
        self.batch_size, self.drop_last, self.shuffle = batch_size, drop_last, shuffle
        self._numpy, self._ragged = numpy, ragged
        if ragged == "nested" and (self._numpy or (_torch() is None)):
            raise ValueError("Loader(ragged='nested'): torch.nested tensors need torch (and numpy=False)")
        index, self._gpu = 0, None
        if device != "cpu":
            # "cuda" is the engine's (first) GPU; "cuda:N" must be one of those it serves (SLUICE_DEVICE_IDS).
            ids = _device_ids() if os.environ.get("SLUICE_DEVICE_IDS") else [_device() or 0]
            want = int(device.split(":")[1]) if ":" in device else ids[0]
            if want not in ids:
                raise ValueError(f"Loader(device={device!r}): the engine serves GPUs {ids} (SLUICE_DEVICE_IDS)")
            index, self._gpu = ids.index(want), want
        u32, u64 = (0, (1 << 32) - 1), (0, (1 << 64) - 1)
        self._opt = LoaderOptions(batch_size=_int_option("Loader", "batch_size", batch_size, 1, u32[1]),
                                  gpu=int(device != "cpu"), prefetch=_int_option("Loader", "prefetch", prefetch, *u32),
                                  seed=_int_option("Loader", "seed", seed, *u64),
                                  epoch=_int_option("Loader", "epoch", epoch, *u64),
                                  rank=_int_option("Loader", "rank", rank, *u32),
                                  world_size=_int_option("Loader", "world_size", world_size, 1, u32[1]),
                                  drop_last=int(drop_last), shuffle=int(shuffle),
                                  window_bytes=_int_option("Loader", "window_bytes", window_bytes, *u64),
                                  skip_corrupt=int(skip_corrupt), device_index=index,
                                  nodes=_int_option("Loader", "nodes", nodes, 1, (1 << 32) - 1),
                                  even_batches=int(even_batches), hold=1,
                                  hold_bytes=_int_option("Loader", "hold_bytes", hold_bytes, *u64))
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
        # Passes: _pass counts them (an iterator of an older one stops); _fresh, the C loader stands where the next
        # pass starts (just opened, or resumed), so it needs no restart; _next_epoch, that pass's epoch.
        self._pass, self._fresh, self._next_epoch, self._at_start = 0, True, self._opt.epoch, True
        self._open(0)
        global _last_loader
        _last_loader = weakref.ref(self)

    def __copy__(self):
        raise TypeError("sluice.Loader: a copy would share this loader's reader and its place in the epoch; make "
                        "another Loader with the same arguments")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        raise TypeError("sluice.Loader: a loader holds threads and memory of this process and does not pickle; make "
                        "another Loader with the same arguments where it is needed (sluice.Dataset pickles)")

    def _open(self, position):
        self._h = self._owner = None  # the previous C loader closes once no batch of its is left
        self._meta = None
        self._opt.position = _int_option("Loader", "position", position, 0, (1 << 64) - 1)
        h = C.c_void_p()
        if self._opt.gpu:  # a GPU loader decodes a zstd dataset's blocks with nvCOMP where it is found
            _find_nvcomp()
        check(lib.sluice_loader_open(C.byref(h), _eng(), self.dataset._handle, C.byref(self._opt)))
        self._h, self._owner = h, _Owner(h, self.dataset)
        self._owner.transform = self._cb  # the loader's threads call it for as long as the C loader lives

    def _run_transform(self, bp, stream, arg):
        """The loader's threads call this for each batch: the user's transform on the batch's arrays.  They are the
        ring's memory, which the batch's hold takes only once it is handed out: every array made here holds
        `during`, so one that outlives the call (kept by the transform: it would change under later batches, or
        outlive the ring) is found, and so is a field assigned anew or a batch returned (the loop would get the
        untransformed one)."""
        try:
            during = _During(self._owner)
            alive = weakref.ref(during)
            batch = self._convert(bp.contents, during)
            del during
            given = dict(batch)
            if stream:
                import torch
                with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=f"cuda:{self._gpu}")):
                    r = self._transform(batch)
            else:
                r = self._transform(batch)
            if r is not None:
                raise TypeError(f"sluice.Loader: transform= returned a {type(r).__name__}: it changes the batch's "
                                "arrays in place and returns None (the loop gets the batch it was given)")
            changed = sorted(set(given) ^ set(batch) | {k for k in given if batch.get(k) is not given[k]})
            if changed:
                raise ValueError(f"sluice.Loader: transform= assigned or removed field(s) {', '.join(changed)}: "
                                 "it changes the arrays in place (b['f'][:] = ..., b['f'].mul_(2)), whose memory "
                                 "the loop gets")
            del batch, given
            if alive() is not None:
                raise RuntimeError("sluice.Loader: transform= kept an array of the batch past the call: its memory "
                                   "is the loader's ring, which later batches overwrite; keep a copy instead "
                                   "(.copy(), .clone())")
            return 0
        except BaseException as e:  # noqa: B902 - it cannot cross into C; the loop raises it at this batch
            self._transform_error = e
            return -errno.ECANCELED

    def _handle(self):
        if self._h is None:
            raise ValueError("sluice.Loader: the loader is closed")
        if self._owner.pid != os.getpid():
            raise RuntimeError(f"sluice.Loader: this loader was made in process {self._owner.pid}, before a fork; "
                               "its threads did not cross the fork: make a Loader in this process (a sluice.Dataset "
                               "reopens after a fork, and torch's DataLoader workers take one)")
        return self._h

    def __len__(self):
        return lib.sluice_loader_batches(self._handle())

    def set_epoch(self, epoch):
        """The next pass is epoch `epoch`, from its first batch: a new order, the same on every rank (seed and
        epoch), as DistributedSampler.set_epoch says it; the passes after it take the epochs after it."""
        self._handle()
        self._next_epoch = _int_option("Loader.set_epoch", "epoch", epoch, 0, (1 << 64) - 1)
        # The C loader restarts at the pass, unless it stands at that epoch's start already (its first batches
        # made ahead are kept).
        self._fresh = self._fresh and self._at_start and self._opt.epoch == self._next_epoch
        self._pass += 1  # an iterator of the pass before stops
        self._ended = True  # the state is the next pass's start

    def _state(self):
        h = self._handle()
        s, e, p = C.c_uint64(), C.c_uint64(), C.c_uint64()
        lib.sluice_loader_state(h, C.byref(s), C.byref(e), C.byref(p))
        seg = (LoaderSegment * LOADER_SEGMENTS_MAX)()
        n = check(lib.sluice_loader_state_ex(h, C.byref(s), C.byref(e), seg, len(seg)))
        return s.value, e.value, p.value, [[seg[i].nodes, seg[i].position] for i in range(n)]

    def state_dict(self):
        """{"seed", "epoch", "position", "records"}: where the next batch starts (records: the dataset's, which
        load_state_dict checks), to save with the model's checkpoint; after a
        pass ended (or before the first), the start of the next pass's epoch, as torchdata's StatefulDataLoader
        gives it.  A loader on several nodes, or one resumed from such a state, adds "segments": [[nodes,
        position], ...], the epoch's phases oldest first (each: the node count, and the positions of each node's
        own sequence consumed in it), the last being this loader's; "position" is then the epoch's records
        consumed by all nodes, a figure: the segments are the state."""
        seed, epoch, position, segments = self._state()
        records = len(self.dataset)  # load_state_dict checks it: positions mean nothing in another dataset
        if self._ended:  # a pass ran to its end: the next one starts its epoch
            state = {"seed": seed, "epoch": self._next_epoch, "position": 0, "records": records}
            if self._opt.nodes != 1:
                state["segments"] = [[self._opt.nodes, 0]]
            return state
        state = {"seed": seed, "epoch": epoch, "position": position, "records": records}
        if len(segments) > 1 or segments[0][0] != 1:
            state["segments"] = segments
        return state

    _ended = False  # the next pass starts an epoch of its own: the last ran to its end, or set_epoch() named one

    def load_state_dict(self, state):
        """Continues from a state_dict() taken by a loader with any world size, batch size and node count (a dict
        without "segments", from one node or from before nodes, too): the next pass finishes that epoch, no record
        of it repeated and none skipped, and the passes after it are whole epochs.  A state that ran on 16 node
        counts, this loader's aside, is refused: resume it on its last one."""
        self._handle()
        where = "Loader.load_state_dict"
        if not isinstance(state, dict) or not all(k in state for k in ("seed", "epoch", "position")):
            raise ValueError(f"{where}: a dict with seed, epoch and position (what state_dict() gives), not "
                             f"{state!r:.200}")
        if "records" in state and state["records"] != len(self.dataset):
            raise ValueError(f"{where}: the state is of a dataset of {state['records']!r} records, and "
                             f"{self.dataset.path} has {len(self.dataset)}: its positions would be other records")
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
        self._pass += 1
        self._fresh, self._next_epoch, self._at_start = True, self._opt.epoch, False
        self._ended = False

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
        h = self._handle()
        self._pass += 1
        me, epoch = self._pass, self._next_epoch
        if not self._fresh:
            # ctypes would wrap an epoch past 2**64 - 1 to 0: the pass after the last one is an error
            self._opt.epoch = epoch = _int_option("Loader", "the next pass's epoch", epoch, 0, (1 << 64) - 1)
            check(lib.sluice_loader_set_epoch(h, epoch))
        else:
            epoch = self._opt.epoch
        self._fresh, self._next_epoch, self._ended = False, epoch + 1, False
        return self._batches(me)

    def _batches(self, me):
        b = _CBatch()
        b.struct_size = C.sizeof(b)
        stream = None
        if self.device != "cpu":
            import torch
            stream = C.c_void_p(torch.cuda.current_stream(self._gpu).cuda_stream)
        while True:
            if self._pass != me:
                raise RuntimeError("sluice.Loader: a new pass over this loader began (iter(), set_epoch() or "
                                   "load_state_dict()), which ends this one")
            try:
                r = check(lib.sluice_loader_next(self._handle(), C.byref(b), stream))
            except SluiceError as e:
                if self._transform_error is not None and "transform" in str(e):
                    raise self._transform_error from e
                raise
            if r == 0:
                self._ended = self._pass == me
                return
            yield self._convert(b, _Hold(self._owner, b.hold))

    def _array(self, hold, ptr, nbytes, dtype, shape, host=False, channels_last=False):
        """A view of nbytes at ptr (the batch's memory, which hold keeps): numpy, a torch tensor on the host, or a
        torch tensor on the GPU."""
        t = np.uint64 if dtype == "ids" else _NP[_NAMES.index(dtype)] or np.uint16
        torch = None if self._numpy else _torch()
        if self.device == "cpu" or host:
            raw = np.empty(0, np.uint8)
            if nbytes:
                mem = (C.c_uint8 * nbytes).from_address(ptr)
                mem._hold = hold  # each array of the batch holds its memory
                raw = np.frombuffer(mem, np.uint8)
            a = raw.view(t).reshape(shape)
            if channels_last:
                a = a.transpose(0, 3, 1, 2)
            if torch is not None and not host:
                a = torch.from_numpy(a)
                if dtype == "bf16":
                    a = a.view(torch.bfloat16)
            return a
        import torch
        cai = _CudaArray(ptr, shape, np.dtype(t).str)
        cai._hold = hold  # torch holds cai as long as the tensor's memory lives
        a = torch.as_tensor(cai, device=f"cuda:{self._gpu}")
        if dtype == "bf16":  # no typestr names bfloat16: its bits, viewed
            a = a.view(torch.bfloat16)
        if channels_last:  # [B, H, W, 3] in memory: the model's [B, 3, H, W] in channels_last
            a = a.permute(0, 3, 1, 2)
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

    def _ragged_out(self, data, offs):
        """A variable-size field as the loop asked for it: (data, offsets), (padded, lengths) or nested."""
        if self._ragged == "offsets":
            return data, offs
        torch = None if self._numpy else _torch()
        if self._ragged == "nested":
            return torch.nested.nested_tensor_from_jagged(data, offs.to(torch.int64))
        lens = offs[1:] - offs[:-1]
        n = len(lens)
        longest = int(lens.max()) if n else 0
        if torch is not None and not isinstance(data, np.ndarray):
            pos = torch.arange(longest, device=data.device)
            mask = pos[None, :] < lens[:, None]
            padded = torch.zeros((n, longest), dtype=data.dtype, device=data.device)
            padded[mask] = data[:int(offs[-1])] if n else data[:0]
            return padded, lens
        mask = np.arange(longest)[None, :] < lens[:, None]
        padded = np.zeros((n, longest), dtype=data.dtype)
        padded[mask] = data[:int(offs[-1])] if n else data[:0]
        return padded, lens

    def _convert(self, b, hold):
        self._fields_meta(b)
        out = _Batch()
        out.ids = np.ctypeslib.as_array((C.c_uint64 * b.size).from_address(b.ids)).copy() if b.size else \
            np.empty(0, np.uint64)
        if "ids" not in self._types:
            out["ids"] = out.ids
        for k in range(b.nfields):
            f = b.field[k]
            name, dtype, shape, esize = self._meta[k]
            if self.images is not None and name == self.images.field:
                shp = tuple(f.shape[d] for d in range(f.ndim))
                out[name] = self._array(hold, f.data, b.size * f.item_bytes, self.images.dtype, shp,
                                        channels_last=self.images.channels_last)
            elif f.item_bytes:
                out[name] = self._array(hold, f.data, b.size * f.item_bytes, dtype, (b.size,) + shape)
            else:
                # Offsets count elements of the field's dtype, so data[offs[j]:offs[j + 1]] is record j.
                offs = self._array(hold, f.offsets, 8 * (b.size + 1), "i64", (b.size + 1,))
                last = f.host_offsets[b.size]  # from host memory: no wait on the GPU
                out[name] = self._ragged_out(self._array(hold, f.data, last * esize, dtype, (last,)), offs)
        return out

    def close(self):
        """Closes the loader: it yields no more batches and its methods raise.  The C loader and its ring are freed
        now, or, while arrays of its batches are still alive, once the last of them goes (they stay valid)."""
        self._h = self._owner = None


class _Owner:
    """A C loader and the dataset it reads: closed when the last of its Loader and the arrays of its batches
    (views of its ring) is gone."""

    def __init__(self, h, dataset):
        self.h, self.dataset, self.pid = h, dataset, os.getpid()

    def close(self):
        # In a process forked from the opener, the C loader's threads are not there to join, and its lock may
        # have been held by one of them at the fork: it is left as it is (the parent's to close).
        if self.h and self.pid == os.getpid():
            lib.sluice_loader_close(self.h)
        self.h = None

    def __del__(self):
        self.close()


_last_loader = None
