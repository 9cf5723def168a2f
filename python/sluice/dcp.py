"""torch.distributed.checkpoint (DCP) storage backed by sluice: dcp.save, dcp.async_save and dcp.load of local
paths and s3:// prefixes, with sharded (FSDP-style, DTensor) state dicts on any number of ranks.

    import torch.distributed.checkpoint as dcp
    from sluice.dcp import StorageReader, StorageWriter
    dcp.save(state_dict, storage_writer=StorageWriter("/ckpt/step100"))
    dcp.load(state_dict, storage_reader=StorageReader("/ckpt/step100"))

Layout: each rank's items in one safetensors file, __RANK_SAVE.safetensors (SAVE: 12 hex digits new for every
save), written by sluice.save (straight from GPU memory, fdatasync, rename), and DCP's metadata in .metadata,
written last the same way, as data (JSON, see _dcpmeta: sluice never unpickles it; torch's own FileSystemReader
stops on it with a message saying to use this module's StorageReader).  A save into a directory that holds a
checkpoint writes files of new names, so until its .metadata replaces the old one (one rename) the old
checkpoint is whole and loadable; then the files the new one does not name are removed.  A kill at any moment leaves the old checkpoint or the new one.  Loads read every
item of a rank as one batched read straight into the state dict's tensors (GPU memory included) where the saved
chunk and the tensor agree in dtype and the part asked for is one range; other parts (another sharding, another
dtype) are read whole and copied.  Each item is found in its file's safetensors header under its own name
(fqn, fqn@offsets for a tensor's chunk) and its place, dtype and shape checked against that entry, read
through the same open as its bytes: metadata that gives an item another's place is refused.  A bytes item (DCP
pickles every non-tensor value) reaches DCP's planner, which unpickles with torch.load(weights_only=False),
only as what torch.load(weights_only=True) built of it, unless the reader is told allow_pickle=True.  Needs
torch; `import sluice` does not import this module.
"""
import dataclasses
import errno
import io
import logging
import os
import uuid

import numpy as np
import torch
from torch.distributed.checkpoint import storage
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType

from ._dcpmeta import (DATA as _DATA, MAGIC, ST_OF, MetadataUnpickler, check_item, decode, encode, item_name,
                       stored_fault)
from ._lib import SluiceError, lib, shown
from ._safetensors import is_remote, open_file, read_small
from .buffers import _ready
from .checkpoint import _RANGE, _Open, _Source, _join, _read_ranges, _reclaim, _save_file, _write_whole
from .s3 import listdir, remove

METADATA = ".metadata"


_log = logging.getLogger("sluice")


@dataclasses.dataclass(frozen=True)
class _Stored:
    """Where one item's bytes are: a file of the checkpoint, an offset and a length, and the item's name in the
    file's safetensors header (None in checkpoints older sluice versions wrote)."""
    relative_path: str
    offset: int
    length: int
    name: str = None


@dataclasses.dataclass
class _Prefix:
    prefix: str


@dataclasses.dataclass
class _Save:
    """A load plan's mark of the save its rank's metadata is of: the mark its data files carry."""
    save: str


def _to_doc(md):
    """The metadata document (see _dcpmeta.decode) of DCP's Metadata as StorageWriter makes it."""
    tensors, blobs = {}, []
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            blobs.append(fqn)
            continue
        p = m.properties
        tensors[fqn] = {"dtype": str(p.dtype).replace("torch.", ""), "size": list(m.size),
                        "requires_grad": bool(p.requires_grad), "layout": str(p.layout).replace("torch.", ""),
                        "memory_format": str(p.memory_format).replace("torch.", ""),
                        "pin_memory": bool(p.pin_memory),
                        "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in m.chunks]}
    items = [{"fqn": i.fqn, "offset": None if i.offset is None else list(i.offset), "index": i.index,
              "file": st.relative_path, "name": st.name, "at": st.offset, "length": st.length}
             for i, st in md.storage_data.items()]
    pd = md.planner_data
    if pd is not None and not (isinstance(pd, dict) and all(
            isinstance(k, str) and isinstance(v, (tuple, list)) and all(type(x) in (str, int) for x in v)
            for k, v in pd.items())):
        raise ValueError(f"sluice.dcp: the planner's data ({type(pd).__name__}) is not the key paths of DCP's "
                         f"default planners: StorageWriter stores metadata as data and cannot keep it")
    sm = md.storage_meta
    return {"tensors": tensors, "bytes": blobs, "items": items,
            "planner_data": None if pd is None else {k: list(v) for k, v in pd.items()},
            "storage_meta": None if sm is None else {"checkpoint_id": None if sm.checkpoint_id is None
                                                     else str(sm.checkpoint_id), "save_id": sm.save_id}}


def _torch(path, name):
    """torch's dtype, layout or memory format of that name (a checked one: this torch may lack a newer one)."""
    if not hasattr(torch, name):
        raise ValueError(f"sluice.dcp: {shown(path)}: holds {name}, which this torch ({torch.__version__}) lacks")
    return getattr(torch, name)


def _from_doc(doc, path):
    """DCP's Metadata of a checked metadata document."""
    sd = {fqn: BytesStorageMetadata() for fqn in doc["bytes"]}
    for fqn, t in doc["tensors"].items():
        props = TensorProperties(dtype=_torch(path, t["dtype"]), layout=_torch(path, t["layout"]),
                                 requires_grad=t["requires_grad"], memory_format=_torch(path, t["memory_format"]),
                                 pin_memory=t["pin_memory"])
        sd[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(t["size"]), chunks=[
            ChunkStorageMetadata(offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"])) for c in t["chunks"]])
    storage_data = {MetadataIndex(it["fqn"], None if it.get("offset") is None else torch.Size(it["offset"]),
                                  it.get("index")): _Stored(it["file"], it["at"], it["length"], it["name"])
                    for it in doc["items"]}
    pd, sm = doc.get("planner_data"), doc.get("storage_meta")
    return Metadata(state_dict_metadata=sd, planner_data=None if pd is None else {k: tuple(v) for k, v in pd.items()},
                    storage_data=storage_data, storage_meta=None if sm is None else StorageMeta(
                        checkpoint_id=sm.get("checkpoint_id"), save_id=sm.get("save_id")))


def _key(index):
    return item_name(index.fqn, index.offset)


def _what(index):
    return f"'{index.fqn}'" if index.offset is None else f"'{index.fqn}' at {list(index.offset)}"


class StorageWriter(storage.StorageWriter, BlockingAsyncStager):
    """Writes a DCP checkpoint to path (a directory, or an s3:// prefix): one safetensors file a rank, then the
    metadata; durable (fdatasync, directory fsync) and atomic as the module says.  overwrite=False refuses a
    path that holds a checkpoint.  For dcp.async_save, the state dict is staged into pinned host memory kept
    from one save to the next (cache_staged_state_dict=False: new memory each save, freed after), so the
    training loop waits for one copy, not for pinned allocations."""

    def __init__(self, path, overwrite=True, cache_staged_state_dict=True):
        storage.StorageWriter.__init__(self)
        # Kept staging is pinned memory, which needs CUDA: without it, each save stages afresh.
        BlockingAsyncStager.__init__(self,
                                     cache_staged_state_dict=cache_staged_state_dict and torch.cuda.is_available())
        self.path, self.overwrite = os.fspath(path), overwrite
        self.save_id, self.rank = uuid.uuid4().hex, None

    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.rank = kwargs.get("rank")
        if not kwargs.get("use_collectives", True):
            raise ValueError("sluice.dcp.StorageWriter: use_collectives=False (a metadata file a rank) is not "
                             "supported")

    def _exists(self):
        try:
            lib.sluice_file_close(open_file(_join(self.path, METADATA), 0))
            return True
        except SluiceError as e:  # absent (a file or a 404); any other failure is the caller's to see
            if e.code != -errno.ENOENT:
                raise
            return False

    def prepare_local_plan(self, plan):
        if not is_remote(self.path):
            os.makedirs(self.path, exist_ok=True)
        if not self.overwrite and self._exists():
            raise RuntimeError(f"sluice.dcp: {shown(self.path)} holds a checkpoint and overwrite=False")
        return plan

    def prepare_global_plan(self, plans):
        save = self.save_id[:12]
        return [dataclasses.replace(p, storage_data=_Prefix(f"__{i}_{save}")) for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        name = f"{plan.storage_data.prefix}.safetensors"
        items, out = {}, []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                data = np.frombuffer(data.getbuffer(), np.uint8).copy()
            else:
                data = data.detach()
            k = _key(item.index)
            if k in items or k == "__metadata__":  # bytes named "a@0" beside tensor a's chunk at [0]; the header's own
                other = _what(items[k][0].index) if k in items else "the file's own metadata"
                raise ValueError(f"sluice.dcp: state dict item {_what(item.index)} and {other} would be stored under "
                                 f"one name, '{k}', in {shown(_join(self.path, name))}: rename one")
            items[k] = (item, data)
        placed = _save_file({k: d for k, (_, d) in items.items()}, _join(self.path, name), None)
        for k, (item, data) in items.items():
            off, n = placed[k]
            out.append(storage.WriteResult(index=item.index, size_in_bytes=n, storage_data=_Stored(name, off, n, k)))
        fut = torch.futures.Future()
        fut.set_result(out)
        return fut

    def finish(self, metadata, results):
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = self.storage_meta()
        _write_whole(_join(self.path, METADATA), encode(_to_doc(metadata)))
        keep = {s.relative_path for s in metadata.storage_data.values()}
        for f in listdir(self.path):  # the files of the checkpoint it replaced, and of saves killed midway
            base = f.rsplit("/", 1)[-1]
            if _DATA.match(base) and base not in keep:
                remove(f)
        if not is_remote(self.path):  # temporaries of writers that are gone
            _reclaim(self.path, lambda b: b == METADATA or _DATA.match(b) is not None)

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))


def _span(sizes, offsets, lengths):
    """(first element, count) of the part of a row-major chunk of sizes at offsets, lengths where that part is
    one range; None where it is not."""
    d = next((i for i in range(len(sizes)) if lengths[i] != sizes[i]), len(sizes))
    if any(lengths[i] != 1 for i in range(d)) or any(lengths[i] != sizes[i] for i in range(d + 1, len(sizes))):
        return None
    stride, start = 1, 0
    for i in reversed(range(len(sizes))):
        start += offsets[i] * stride
        stride *= sizes[i]
    return start, int(np.prod(lengths, dtype=np.int64))


class StorageReader(storage.StorageReader):
    """Reads a DCP checkpoint that StorageWriter wrote at path (a directory, or an s3:// prefix), running no code
    it holds: its metadata is data, read without unpickling, and each bytes item is unpickled with
    torch.load(weights_only=True) (torch's allow-list of plain values and tensors, and the classes
    torch.serialization.add_safe_globals adds), DCP's planner getting only what that built; an item that names
    anything else fails the load, naming the file and the item.  allow_pickle=True is for a checkpoint you trust
    as code: bytes items go to the planner as they are (which unpickles them with weights_only=False, as with
    torch's own reader), and the pickled metadata of a checkpoint an older sluice version wrote is read (even
    then building only the classes DCP's metadata holds, each allowed by exact name)."""

    def __init__(self, path, allow_pickle=False):
        super().__init__()
        self.path, self.allow_pickle = os.fspath(path), allow_pickle
        self.storage_data, self.chunks, self.save = {}, {}, None

    def reset(self, checkpoint_id=None):
        self.storage_data, self.chunks, self.save = {}, {}, None
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)

    def read_metadata(self, *args, rank=None):
        """The checkpoint's one metadata file (rank: ignored, sluice writes no metadata a rank).  No **kwargs:
        torch's load, where the reader takes them, reads the metadata a second time as the rank's own when the
        first read fails, and then loads that rank without collectives, so in a group the other ranks wait for
        ever in a collective it never joins; one read, whose failure fails the load on every rank."""
        try:
            return self._read_metadata()
        except Exception as e:
            # torch's load before 2.15 catches what read_metadata raises, logs it at INFO and fails saying only
            # "metadata is None": said here too, so the file and the reason reach the user on any torch.
            _log.warning("%s", e)
            raise

    def _read_metadata(self):
        path = _join(self.path, METADATA)
        raw = read_small(path)
        if raw.startswith(MAGIC):
            return _from_doc(decode(raw, path), path)
        if not self.allow_pickle:
            raise ValueError(f"sluice.dcp: {shown(path)}: not the metadata of a checkpoint sluice.dcp.StorageWriter wrote "
                             f"(a pickle, as torch's own DCP writer and older sluice versions write it?): unpickling "
                             f"can run code, so StorageReader reads one only with allow_pickle=True, for a "
                             f"checkpoint you trust")
        try:
            md = MetadataUnpickler(io.BytesIO(raw)).load()
        except Exception as e:  # whatever a damaged pickle makes the classes it names raise
            raise ValueError(f"sluice.dcp: {shown(path)}: not the metadata of a checkpoint sluice.dcp.StorageWriter "
                             f"wrote ({e})") from None
        if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict) or \
                not all(isinstance(v, _Stored) for v in md.storage_data.values()):
            raise ValueError(f"sluice.dcp: {shown(path)}: not the metadata of a checkpoint sluice.dcp.StorageWriter wrote")
        return md

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data
        self.chunks, self.save = {}, None
        try:
            for k, st in self.storage_data.items():  # only files a save of ours names, beside the metadata
                if not (isinstance(k, MetadataIndex) and isinstance(k.fqn, str) and _DATA.match(str(st.relative_path))
                        and type(st.offset) is int and type(st.length) is int and st.offset >= 0 and st.length >= 0
                        and (st.name is None or isinstance(st.name, str))):
                    raise ValueError(f"'{k}' stored as {st}")
            sm = metadata.storage_meta
            why = stored_fault([(k.fqn, k.offset, st.relative_path, st.name) for k, st in self.storage_data.items()],
                               getattr(sm, "save_id", None))
            if why:
                raise ValueError(why)
            # One save's mark on every file (stored_fault checked); a checkpoint of no items: the writer's id.
            self.save = next((_DATA.match(st.relative_path)["save"] for st in self.storage_data.values()),
                             getattr(sm, "save_id", None))
            blobs = set()
            for fqn, md in metadata.state_dict_metadata.items():
                if isinstance(md, BytesStorageMetadata):
                    blobs.add(MetadataIndex(fqn))
                for c in getattr(md, "chunks", ()):
                    sizes = tuple(int(x) for x in c.sizes)
                    if not isinstance(md.properties.dtype, torch.dtype) or min(sizes, default=0) < 0:
                        raise ValueError(f"tensor '{fqn}': {md.properties.dtype} of {list(sizes)}")
                    self.chunks[MetadataIndex(fqn, c.offsets)] = (sizes, md.properties.dtype)
            # Every chunk and bytes item stored, and nothing else (decode checks the same of JSON metadata;
            # pickled metadata comes here unchecked): a load asks only for what the metadata lists.
            stored, listed = set(self.storage_data), set(self.chunks) | blobs
            if stored - listed:
                raise ValueError(f"item '{min(map(_key, stored - listed))}': not a chunk of a tensor nor bytes of "
                                 f"the checkpoint")
            if listed - stored:
                raise ValueError(f"no item stores '{min(map(_key, listed - stored))}'")
        except Exception as e:
            raise ValueError(f"sluice.dcp: {shown(_join(self.path, METADATA))}: damaged metadata ({e})") from None

    def prepare_local_plan(self, plan):
        # The save this rank's metadata is of, for the coordinator to compare (see prepare_global_plan).
        return dataclasses.replace(plan, storage_data=_Save(self.save))

    def prepare_global_plan(self, plans):
        """Each rank reads the metadata itself, so a save that replaces the checkpoint between two ranks' reads
        gives them the metadata of two saves, and each would load its part of the state dict from its own,
        silently; refused here, on the coordinator, which fails the load on every rank."""
        saves = {p.storage_data.save: r for r, p in enumerate(plans) if isinstance(p.storage_data, _Save)}
        if len(saves) > 1:
            which = ", ".join(f"rank {r}: {s or 'unnamed'}" for s, r in sorted(saves.items(), key=lambda x: x[1]))
            raise ValueError(f"sluice.dcp: {shown(_join(self.path, METADATA))}: the ranks read the metadata of "
                             f"{len(saves)} saves ({which}): the checkpoint was replaced while it was loaded (or "
                             f"the ranks were given different paths); load again")
        return plans

    def _item(self, req, planner, files, entries, reads, after):
        """Plans one item, its place checked against its file's tensors (entries, the library's reading of its
        header): its reads (file, offset, bytes, destination) and what follows them."""
        st = self.storage_data[req.storage_index]
        f = files[st.relative_path]
        path = _join(self.path, st.relative_path)
        # The header entry of the item's own name (set_up_storage_reader checked st.name is that name, or None).
        name = _key(req.storage_index)
        if req.type == LoadItemType.BYTE_IO:
            check_item(path, entries[f], st.offset, st.length, name, "U8", [st.length])
            buf = np.empty(st.length, np.uint8)
            reads.append((f, st.offset, st.length, buf.ctypes.data, buf))
            after.append(lambda: planner.load_bytes(req, self._bytes(path, name, buf)))
            return
        target = planner.resolve_tensor(req).detach()
        sizes, dtype = self.chunks[req.storage_index]
        item = torch.empty((), dtype=dtype).element_size()
        if st.length != int(np.prod(sizes, dtype=np.int64)) * item:
            raise ValueError(f"sluice.dcp: {shown(self.path)}: '{_key(req.storage_index)}' is {st.length} bytes, its "
                             f"shape {list(sizes)} of {dtype} makes {int(np.prod(sizes)) * item}")
        check_item(path, entries[f], st.offset, st.length, name, ST_OF.get(str(dtype).replace("torch.", "")),
                   list(sizes))
        span = _span(sizes, req.storage_offsets, req.lengths)
        if span and target.dtype == dtype and target.is_contiguous() and target.numel() == span[1]:
            reads.append((f, st.offset + span[0] * item, span[1] * item, target.data_ptr(), target))
        else:  # the saved chunk whole, then the part asked for copied (and converted) into place
            tmp = torch.empty(sizes, dtype=dtype, device=target.device)
            reads.append((f, st.offset, st.length, tmp.data_ptr(), tmp))
            after.append(lambda: target.copy_(_narrow(tmp, req.storage_offsets, req.lengths)))
        after.append(lambda: planner.commit_tensor(req, target))

    def _bytes(self, path, name, buf):
        """What the planner gets of a bytes item (a pickle: DCP's save planners torch.save each non-tensor value).
        DCP's load planners unpickle it with torch.load(weights_only=False), which runs whatever the pickle
        names; so, unless allow_pickle, the item is loaded here with weights_only=True (torch's allow-list, and
        the user's torch.serialization.add_safe_globals) and the planner gets that object torch.save'd again:
        bytes sluice made of data torch's allow-list built, never the checkpoint's own."""
        raw = io.BytesIO(buf.tobytes())
        if self.allow_pickle:
            return raw
        try:
            obj = torch.load(raw, weights_only=True)
        except Exception as e:  # an unpickling error naming the global; whatever a damaged item raises
            raise ValueError(f"sluice.dcp: {shown(path)}: item '{name}' is not data torch.load(weights_only=True) "
                             f"reads ({_refusal(e)}): StorageReader loads it only with allow_pickle=True, for a "
                             f"checkpoint you trust (or torch.serialization.add_safe_globals allows its classes by "
                             f"name)") from None
        out = io.BytesIO()
        torch.save(obj, out)
        out.seek(0)
        return out

    def read_data(self, plan, planner):
        files = {}
        for req in plan.items:
            files.setdefault(self.storage_data[req.storage_index].relative_path, len(files))
        paths = [_join(self.path, p) for p in files]
        reads, after = [], []
        # The files opened by the library, their headers read there once (in parallel) and their items' bytes
        # through the same opens: the places checked are the places read.
        with _Open(_Source(paths)) as ckp:
            entries, handles = ckp.by_file(), ckp.handles
            for req in plan.items:
                self._item(req, planner, files, entries, reads, after)
            # Kernels still using the state dict's tensors (or memory the allocator hands out again) finish first.
            _ready([obj for *_, obj in reads if isinstance(obj, torch.Tensor)])
            r = np.array([(handles[f], off, n, dst) for f, off, n, dst, _ in reads], _RANGE)
            _read_ranges(handles, r[r["len"] > 0])
            ckp.check_unchanged()  # a file rewritten in place meanwhile: its header no longer says what was read
        for step in after:
            step()
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))


def _refusal(e):
    """The line of torch.load's weights_only error that says what it refused (its wording changes between torch
    versions; the rest is advice to load with weights_only=False)."""
    for line in str(e).splitlines():
        line = line.split("WeightsUnpickler error:")[-1].strip()
        if line and not line.startswith(("Weights only load failed", "Please file an issue", "Check the documentation",
                                         "(1)", "(2)")):
            return line[:300]
    return type(e).__name__


def _narrow(t, offsets, lengths):
    for d, (o, n) in enumerate(zip(offsets, lengths)):
        t = t.narrow(d, o, n)
    return t
