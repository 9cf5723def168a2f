"""The metadata of a DCP checkpoint sluice.dcp writes, as data: JSON that sluice reads without unpickling, its
checks, and the check of each item against the tensors of the file that holds it (as the library read its header).  No torch here
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

from ._lib import shown
from ._safetensors import DT, SIZE, parse_json

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


def _ints(v, n=None):
    return isinstance(v, list) and (n is None or len(v) == n) and all(type(x) is int and x >= 0 for x in v)


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
    """The metadata document of .metadata's bytes, checked whole; a Damaged error naming path otherwise.
    {"tensors": {fqn: {"dtype", "size", "requires_grad", "layout", "memory_format", "pin_memory",
                       "chunks": [{"offsets", "sizes"}]}},
     "bytes": [fqn],
     "items": [{"fqn", "offset" (a chunk's offsets, or null for bytes), "index", "file", "name", "at", "length"}],
     "planner_data": {fqn: [key, ...]} or null, "storage_meta": {"checkpoint_id", "save_id"} or null}"""
    def fail(why):
        return Damaged(f"sluice.dcp: {shown(path)}: damaged metadata ({why})")
    if not raw.startswith(MAGIC):
        raise fail("not the metadata sluice.dcp.StorageWriter writes")
    try:
        doc = parse_json(raw[len(MAGIC):])
    except ValueError as e:
        raise fail(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise fail(f"not {FORMAT} version {VERSION}")
    tensors, blobs, items = doc.get("tensors"), doc.get("bytes"), doc.get("items")
    if not isinstance(tensors, dict) or not isinstance(blobs, list) or not isinstance(items, list):
        raise fail("tensors, bytes or items missing")
    if not all(isinstance(b, str) for b in blobs) or set(blobs) & set(tensors):
        raise fail("bytes is not a list of names apart from the tensors'")
    blobs = set(blobs)  # looked up once an item: a list made the check quadratic
    chunks = {}
    for fqn, t in tensors.items():
        if not isinstance(t, dict) or t.get("dtype") not in ST_OF or not _ints(t.get("size")) or \
                t.get("layout") not in LAYOUTS or t.get("memory_format") not in MEMORY_FORMATS or \
                type(t.get("requires_grad")) is not bool or type(t.get("pin_memory")) is not bool or \
                not isinstance(t.get("chunks"), list):
            raise fail(f"tensor '{fqn}': {str(t)[:200]}")
        size = t["size"]
        for c in t["chunks"]:
            if not (isinstance(c, dict) and _ints(c.get("offsets"), len(size)) and _ints(c.get("sizes"), len(size))
                    and all(o + n <= s for o, n, s in zip(c["offsets"], c["sizes"], size))):
                raise fail(f"tensor '{fqn}' of size {size}: chunk {str(c)[:200]}")
            chunks[(fqn, tuple(c["offsets"]))] = (t["dtype"], c["sizes"])
    seen = set()
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("fqn"), str) or not isinstance(it.get("name"), str) or \
                not isinstance(it.get("file"), str) or not DATA.match(it["file"]) or \
                type(it.get("at")) is not int or type(it.get("length")) is not int or it["at"] < 0 or \
                it["length"] < 0 or not (it.get("index") is None or type(it["index"]) is int):
            raise fail(f"item {str(it)[:200]}")
        key = (it["fqn"], None if it.get("offset") is None else tuple(it["offset"]) if _ints(it["offset"]) else "bad")
        if key in seen:
            raise fail(f"item '{it['fqn']}' stored twice")
        seen.add(key)
        if key[1] is None:
            if it["fqn"] not in blobs:
                raise fail(f"item '{it['fqn']}': not one of the checkpoint's tensors or bytes")
            continue
        if key not in chunks:
            raise fail(f"item '{it['fqn']}' at {it.get('offset')}: no such chunk of a tensor")
        dtype, sizes = chunks[key]
        n = SIZE[ST_OF[dtype]]  # bytes of one of torch's elements (float4_e2m1fn_x2: two values, one byte)
        for s in sizes:
            n *= s
        if it["length"] != n:
            raise fail(f"item '{it['fqn']}' at {it['offset']}: {it['length']} bytes, its chunk {sizes} of {dtype} "
                       f"makes {n}")
    missing = set(chunks) - seen | {(b, None) for b in blobs} - seen
    if missing:
        raise fail(f"no item stores {sorted(str(m[0]) for m in missing)[:5]}")
    sm = doc.get("storage_meta")
    if sm is not None and not (isinstance(sm, dict) and all(v is None or isinstance(v, str) for v in sm.values())):
        raise fail("storage_meta is not an object of strings")
    why = stored_fault([(it["fqn"], it.get("offset"), it["file"], it["name"]) for it in items],
                       None if sm is None else sm.get("save_id"))
    if why:
        raise fail(why)
    pd = doc.get("planner_data")
    if pd is not None and not (isinstance(pd, dict) and all(
            isinstance(v, list) and all(type(x) in (str, int) for x in v) for v in pd.values())):
        raise fail("planner_data is not an object of key paths")
    return doc


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
