"""The metadata of a DCP checkpoint sluice.dcp writes, as data: JSON that sluice reads without unpickling (checked
by the library, format/dcp.c), and the check of each item against the tensors of the file that holds it (as the
library read its header).  No torch here
(sluice.dcp converts to and from torch's Metadata classes), so all of it is tested without torch.

.metadata is MAGIC, then the JSON.  MAGIC is a pickle's first opcode, GLOBAL, naming a module whose name is a
sentence no module has: torch's own FileSystemReader, which unpickles .metadata, stops there with
"No module named 'this is a checkpoint of sluice ...'" rather than a puzzle, and without running anything.

DCP's own metadata (and that of checkpoints older sluice versions wrote) is a pickle, which can run code when
read: sluice unpickles it only where the caller opts in, and then with MetadataUnpickler's exact allow-list.
"""
import json
import pickle
import re

from ._lib import lib, shown
from ._safetensors import DT, parse_json

NOTICE = ("this is a checkpoint of sluice (its StorageWriter wrote it), whose metadata is JSON, not a pickle: "
          "load it with StorageReader from the dcp module of sluice")
MAGIC = b"c" + NOTICE.encode() + b"\nStorageReader\n"
FORMAT, VERSION = "sluice-dcp", 1
DATA = re.compile(r"__\d+_(?P<save>[0-9a-f]{12})\.safetensors\Z")  # a rank's file of one save (its mark)
# torch's dtype names (those a safetensors dtype has) -> safetensors dtype
ST_OF = {t: k for k, (_, t) in DT.items() if t is not None}
LAYOUTS = ("strided",)
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")


class Damaged(ValueError):
    pass


def item_name(fqn, offset):
    """The name sluice.dcp gives an item in its rank's safetensors file (every version did): a bytes item's fqn
    (offset None), fqn@O1,O2,... for a tensor's chunk at offsets O.  The reader derives it from the item's own
    fqn and offset, so metadata that puts an item at another item's bytes is refused, whatever their place,
    dtype and shape.  Distinct for distinct items but one pair: bytes named "a@0" and tensor "a"'s chunk at [0],
    which the writer refuses to write into one file."""
    return fqn if offset is None else f"{fqn}@{','.join(map(str, offset))}"


_SAVE_ID = re.compile(r"[0-9a-f]{12,}\Z")


def stored_fault(items, save_id):
    """Why stored items [(fqn, offset or None, file, name or None)] (each file a DATA name) are not the items of
    one save of sluice.dcp, or None.  Each item must be stored under its own name (item_name; None: pickled
    metadata of older versions, whose files' headers name the items so all the same), once in its file, and
    every file must carry one save's mark: that of save_id (the writer's, in the metadata) where it is one of
    the writer's ids.  So no edit of the metadata alone (fqns or names swapped, a file of another save named)
    loads an item from bytes written for another: the safetensors header of each file says whose bytes are
    where, and the reader checks the item against it (check_item)."""
    names, saves = set(), {}
    for fqn, offset, file, name in items:
        own = item_name(fqn, offset)
        if name is not None and name != own:
            return f"item '{own}' is stored as '{name}' of {file}, another item's name"
        if (file, own) in names:
            return f"two items are stored as '{own}' of {file}"
        names.add((file, own))
        saves.setdefault(DATA.match(file)["save"], file)
    if len(saves) > 1:
        return f"items stored in files of {len(saves)} saves ({', '.join(sorted(saves.values())[:3])})"
    if saves and isinstance(save_id, str) and _SAVE_ID.match(save_id) and save_id[:12] not in saves:
        return f"items stored in {next(iter(saves.values()))}, a file of another save than {save_id}'s"
    return None


def encode(doc):
    """.metadata's bytes of a metadata document (see decode)."""
    return MAGIC + json.dumps({"format": FORMAT, "version": VERSION, **doc}, separators=(",", ":")).encode()


def decode(raw, path):
    """The metadata document of .metadata's bytes, checked whole by the library (sluice_dcp_metadata_check, the
    check sluice_ckpt_open makes of it too); a Damaged error naming path otherwise.
    {"tensors": {fqn: {"dtype", "size", "requires_grad", "layout", "memory_format", "pin_memory",
                       "chunks": [{"offsets", "sizes"}]}},
     "bytes": [fqn],
     "items": [{"fqn", "offset" (a chunk's offsets, or null for bytes), "index", "file", "name", "at", "length"}],
     "planner_data": {fqn: [key, ...]} or null, "storage_meta": {"checkpoint_id", "save_id"} or null}"""
    if not raw.startswith(MAGIC):
        raise Damaged(f"sluice.dcp: {shown(path)}: damaged metadata (not the metadata sluice.dcp.StorageWriter "
                      f"writes)")
    rc = lib.sluice_dcp_metadata_check(raw, len(raw), shown(path).encode())
    if rc:
        raise Damaged(f"sluice.dcp: {lib.sluice_last_error_detail().decode(errors='replace')}")
    return parse_json(raw[len(MAGIC):])


def check_item(path, entries, at, length, name=None, dtype=None, shape=None):
    """An item stored at [at, at + length) of the safetensors file path must be one tensor of that file, exactly
    (and the one named name, of dtype and shape, where they are given): damaged metadata must not load other bytes
    as a tensor.  entries: {name: (offset in the file, bytes, dtype, shape)} of the file's tensors, as the
    library read its header.  A Damaged error naming the file otherwise."""
    found = ([entries[name]] if name in entries else []) if name is not None else \
        [v for v in entries.values() if v[0] == at]
    for off, n, dt, shp in found:
        if off == at and n == length and (dtype is None or dt == dtype) and (shape is None or list(shp) == list(shape)):
            return
    want = f"'{name}' " if name is not None else ""
    raise Damaged(f"sluice.dcp: {shown(path)}: holds no tensor {want}of {length} bytes at {at}"
                  f"{f' ({dtype} of {list(shape)})' if dtype is not None else ''}, where the checkpoint's metadata "
                  f"puts one: damaged metadata, or a file of another checkpoint")


class MetadataUnpickler(pickle.Unpickler):
    """DCP's pickled metadata, opted into: builds only what a checkpoint's metadata holds, each name allowed
    exactly as (module, name) (no dotted names, which protocol 4 resolves through a module's imports: a name of
    DCP's metadata module such as "os.system" would reach os)."""
    ALLOWED = frozenset(
        [("torch.distributed.checkpoint.metadata", n) for n in (
            "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
            "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")]
        + [("sluice.dcp", "_Stored"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
           ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")]
        + [("torch", n) for n in (*ST_OF, *LAYOUTS, *MEMORY_FORMATS)])

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")
        return super().find_class(module, name)
