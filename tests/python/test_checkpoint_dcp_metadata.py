"""sluice.dcp's metadata without torch (sluice._dcpmeta): the JSON sluice reads instead of a pickle and its
checks, the check of each item against its file's safetensors header, the exact allow-list of the pickle read
only where the caller opts in, and what torch's own reader makes of the .metadata sluice writes."""
import io
import os
import pickle
import random
import re

import numpy as np
import pytest

import sluice
from sluice import _dcpmeta as dm
from sluice import checkpoint
from st_header import read_header


def doc():
    """The metadata of a checkpoint of two chunks of a float32 tensor and one blob, in one rank's file."""
    f = "__0_0123456789ab.safetensors"
    return {"tensors": {"w": {"dtype": "float32", "size": [4, 3], "requires_grad": False, "layout": "strided",
                              "memory_format": "contiguous_format", "pin_memory": False,
                              "chunks": [{"offsets": [0, 0], "sizes": [2, 3]}, {"offsets": [2, 0], "sizes": [2, 3]}]}},
            "bytes": ["lr"],
            "items": [{"fqn": "w", "offset": [0, 0], "index": 0, "file": f, "name": "w@0,0", "at": 4096, "length": 24},
                      {"fqn": "w", "offset": [2, 0], "index": 1, "file": f, "name": "w@2,0", "at": 4120, "length": 24},
                      {"fqn": "lr", "offset": None, "index": None, "file": f, "name": "lr", "at": 4144, "length": 5}],
            "planner_data": {"w": ["w"], "lr": ["lr"]}, "storage_meta": {"checkpoint_id": "/ck", "save_id": "x"}}


def test_metadata_round_trip():
    raw = dm.encode(doc())
    got = dm.decode(raw, "/ck/.metadata")
    assert {k: got[k] for k in doc()} == doc()


def test_torchs_reader_stops_on_sluices_metadata_with_a_clear_message():
    """torch's FileSystemReader.read_metadata is pickle.load of .metadata: it stops at the first opcode, naming
    sluice and its StorageReader, and runs nothing."""
    raw = dm.encode(doc())
    for load in (pickle.load, lambda f: pickle._Unpickler(f).load()):  # C and Python unpicklers
        with pytest.raises(ModuleNotFoundError, match=r"checkpoint of sluice.*StorageReader"):
            load(io.BytesIO(raw))


def _damaged(mutate):
    d = doc()
    mutate(d)
    return dm.encode(d)


@pytest.mark.parametrize("case,mutate", [
    ("file elsewhere", lambda d: d["items"][0].update(file="../../etc/passwd")),
    ("negative offset", lambda d: d["items"][0].update(at=-1)),
    ("length not the chunk's", lambda d: d["items"][0].update(length=23)),
    ("chunk past the tensor", lambda d: d["tensors"]["w"]["chunks"][1].update(offsets=[3, 0])),
    ("unknown dtype", lambda d: d["tensors"]["w"].update(dtype="object")),
    ("a chunk no item stores", lambda d: d["items"].pop(1)),
    ("an item of no chunk", lambda d: d["items"][0].update(offset=[1, 0])),
    ("an item twice", lambda d: d["items"].append(dict(d["items"][0]))),
    ("bytes of no name", lambda d: d["items"][2].update(fqn="nope")),
    ("float offset", lambda d: d["items"][0].update(at=4096.0)),
    ("planner data", lambda d: d.update(planner_data={"w": [{"a": 1}]})),
    ("version", lambda d: d.update(version=9)),
])
def test_damaged_metadata_is_refused_naming_the_file(case, mutate):
    with pytest.raises(dm.Damaged, match=r"/ck/\.metadata: damaged metadata"):
        dm.decode(_damaged(mutate), "/ck/.metadata")


def _swap(i, j, *fields):
    def mutate(d):
        a, b = d["items"][i], d["items"][j]
        for f in fields:
            a[f], b[f] = b[f], a[f]
    return mutate


def _file_of(mark):
    return lambda d: d["items"][1].update(file=f"__1_{mark}.safetensors")


@pytest.mark.parametrize("case,mutate,want", [
    ("two chunks' offsets swapped", _swap(0, 1, "offset"), "item 'w@2,0' is stored as 'w@0,0'"),
    ("a tensor's and a blob's fqn swapped", _swap(0, 2, "fqn", "offset"), "item 'w' at [0, 0]: 5 bytes"),
    ("and their lengths", _swap(0, 2, "fqn", "offset", "length"), "item 'lr' is stored as 'w@0,0'"),
    ("names swapped", _swap(0, 1, "name"), "item 'w@0,0' is stored as 'w@2,0'"),
    ("a blob named as a chunk", lambda d: d["items"][2].update(name="w@0,0"), "item 'lr' is stored as 'w@0,0'"),
    ("a file of another save", _file_of("fedcba987654"), "files of 2 saves"),
    ("a save id of another save", lambda d: d["storage_meta"].update(save_id="fedcba9876543210"),
     "a file of another save than fedcba9876543210's"),
])
def test_an_item_stored_under_another_items_name_is_refused(case, mutate, want):
    """Each item must be stored under the name sluice.dcp gives it (fqn, or fqn@offsets), once in its file, and
    in files of one save: metadata whose fqns or names are swapped, or that names a file of another save, is
    refused naming the file, whatever the items' places, dtypes and shapes (the same here)."""
    with pytest.raises(dm.Damaged, match=r"/ck/\.metadata: damaged metadata \(.*" + re.escape(want)):
        dm.decode(_damaged(mutate), "/ck/.metadata")


def test_two_items_of_one_name_in_a_file_are_refused():
    """Bytes named "v@0" beside tensor v's chunk at [0] share a name in the file (the writer refuses to make
    such a file): metadata saying so is refused rather than loading one item's bytes as both."""
    d = doc()
    d["tensors"]["v"] = {**d["tensors"]["w"], "dtype": "uint8", "size": [5], "chunks": [{"offsets": [0], "sizes": [5]}]}
    d["bytes"].append("v@0")
    f = d["items"][0]["file"]
    d["items"] += [{"fqn": "v", "offset": [0], "index": 0, "file": f, "name": "v@0", "at": 4149, "length": 5},
                   {"fqn": "v@0", "offset": None, "index": None, "file": f, "name": "v@0", "at": 4149, "length": 5}]
    with pytest.raises(dm.Damaged, match="two items are stored as 'v@0' of __0_0123456789ab.safetensors"):
        dm.decode(dm.encode(d), "/ck/.metadata")


def test_item_names_are_the_writers():
    assert dm.item_name("w", None) == "w" and dm.item_name("w", [2, 0]) == "w@2,0" and dm.item_name("s", []) == "s@"
    assert dm.DATA.match("__3_0123456789ab.safetensors")["save"] == "0123456789ab"


def damaged(good, seed, n, start=0):
    """n damaged copies of good (bytes flipped past start, cut, a stretch repeated), seeded."""
    rng = random.Random(seed)
    for _ in range(n):
        b = bytearray(good)
        kind = rng.randrange(3)
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(start, len(b))] = rng.randrange(256)
        elif kind == 1:
            b = b[:rng.randrange(len(b))]
        else:
            i = rng.randrange(len(b))
            b = b[:i] + b[i:i + rng.randint(1, 64)] * 2 + b[i:]
        yield bytes(b)


def test_fuzzed_metadata_is_loaded_or_refused():
    """1000 damaged copies: each decodes or is refused with Damaged naming the file; nothing else escapes."""
    for b in damaged(dm.encode(doc()), 37, 1000, len(dm.MAGIC)):
        try:
            dm.decode(b, "/ck/.metadata")
        except dm.Damaged as e:
            assert "/ck/.metadata" in str(e)


def test_items_are_checked_against_their_files_header(tmp_path):
    """Stored offsets and lengths that are not exactly a tensor of the file's header (damaged metadata, or a file
    of another save) are refused, naming the file: never other bytes loaded as a tensor."""
    p = str(tmp_path / "__0_0123456789ab.safetensors")
    sluice.save({"w@0,0": np.zeros((2, 3), np.float32), "w@2,0": np.ones((2, 3), np.float32),
                 "lr": np.frombuffer(b"hello", np.uint8)}, p)
    with checkpoint._Open(checkpoint._Source([p])) as ckp:
        (entries,) = ckp.by_file()
    header, start = read_header(p)  # the header as read apart: the library's places are the file's
    at = {k: start + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
    assert {k: v[0] for k, v in entries.items()} == at
    dm.check_item(p, entries, at["w@2,0"], 24, "w@2,0", "F32", [2, 3])
    dm.check_item(p, entries, at["lr"], 5, "lr", "U8", [5])
    dm.check_item(p, entries, at["w@0,0"], 24)  # pickled metadata of older versions: no name
    for bad in ((at["w@2,0"] + 4, 24, "w@2,0", "F32", [2, 3]),   # shifted
                (at["w@2,0"], 20, "w@2,0", "F32", [2, 3]),       # cut
                (at["w@0,0"], 24, "w@2,0", "F32", [2, 3]),       # another tensor's place
                (at["w@2,0"], 24, "w@2,0", "I32", [2, 3]),       # another dtype
                (at["w@2,0"], 24, "w@2,0", "F32", [3, 2]),       # another shape
                (at["w@2,0"], 24, "nope", "F32", [2, 3]),        # no such tensor
                (at["w@0,0"] + 8, 8, None, None, None)):         # inside a tensor
        with pytest.raises(dm.Damaged, match="__0_0123456789ab.safetensors: holds no tensor"):
            dm.check_item(p, entries, *bad)


def _stack_global(module, name, arg):
    """A protocol-4 pickle calling module's name (STACK_GLOBAL: a dotted name resolves attribute by attribute)
    with one string argument."""
    def s(x):
        b = x.encode()
        return b"\x8c" + bytes([len(b)]) + b
    return b"\x80\x04" + s(module) + s(name) + b"\x93" + s(arg) + b"\x85R."


@pytest.mark.parametrize("module,name", [("torch.distributed.checkpoint.metadata", "os.system"),
                                         ("sluice.dcp", "os.system"), ("torch", "os.system"),
                                         ("os", "system"), ("builtins", "eval"), ("builtins", "getattr"),
                                         ("torch", "load"), ("torch.serialization", "load")])
def test_pickled_metadata_naming_anything_else_is_refused_before_it_runs(tmp_path, module, name):
    """The pickle read only where the caller opts in: each (module, name) allowed exactly, so neither a dotted
    name through an allowed module nor any other callable is built, and nothing runs."""
    ran = tmp_path / "ran"
    raw = _stack_global(module, name, f"touch {ran}")
    with pytest.raises(pickle.UnpicklingError, match="not part of a checkpoint's metadata"):
        dm.MetadataUnpickler(io.BytesIO(raw)).load()
    assert not ran.exists()
    with pytest.raises(pickle.UnpicklingError):  # the same by the GLOBAL opcode of older protocols
        dm.MetadataUnpickler(io.BytesIO(b"c" + module.encode() + b"\n" + name.encode() + b"\n.")).load()
    assert ("torch.distributed.checkpoint.metadata", "Metadata") in dm.MetadataUnpickler.ALLOWED
    assert not [n for _, n in dm.MetadataUnpickler.ALLOWED if "." in n]


def test_a_metadata_file_that_is_a_fifo_or_huge_is_refused(tmp_path):
    from sluice._safetensors import read_small
    os.mkfifo(tmp_path / ".metadata")
    with pytest.raises(sluice.SluiceError, match="not a regular file"):
        read_small(str(tmp_path / ".metadata"))
    os.unlink(tmp_path / ".metadata")
    with open(tmp_path / ".metadata", "wb") as h:
        h.truncate(1 << 40)
    with pytest.raises(sluice.SluiceError, match=r"\.metadata: is 1099511627776 bytes"):
        read_small(str(tmp_path / ".metadata"))


def test_float4_chunks_count_torchs_bytes():
    """float4_e2m1fn_x2 holds two values in each of torch's elements, one byte: a [4, 4] chunk is 16 bytes (as
    the writer stores it), not 0."""
    d = {"tensors": {"q": {"dtype": "float4_e2m1fn_x2", "size": [4, 4], "requires_grad": False, "layout": "strided",
                           "memory_format": "contiguous_format", "pin_memory": False,
                           "chunks": [{"offsets": [0, 0], "sizes": [4, 4]}]}},
         "bytes": [], "planner_data": None, "storage_meta": None}
    item = {"fqn": "q", "offset": [0, 0], "index": 0, "file": "__0_0123456789ab.safetensors", "name": "q@0,0", "at": 4096}
    dm.decode(dm.encode({**d, "items": [{**item, "length": 16}]}), "ck/.metadata")
    with pytest.raises(dm.Damaged, match="0 bytes, its chunk"):
        dm.decode(dm.encode({**d, "items": [{**item, "length": 0}]}), "ck/.metadata")


def test_metadata_of_many_items_is_checked_whole():
    """40000 bytes items (metadata may hold 256 MB): each found among the blobs by a search of the sorted names in
    the library, never a scan (quadratic took seconds); one blob no item stores is still found."""
    n = 40000
    blobs = [f"b{i}" for i in range(n)]
    d = {"tensors": {}, "bytes": blobs, "planner_data": None, "storage_meta": None,
         "items": [{"fqn": b, "offset": None, "index": 0, "file": "__0_0123456789ab.safetensors", "name": b,
                    "at": 0, "length": 1} for b in blobs]}
    assert len(dm.decode(dm.encode(d), "ck/.metadata")["items"]) == n
    d["items"].pop(n // 2)
    with pytest.raises(dm.Damaged, match=f"no item stores 'b{n // 2}'"):
        dm.decode(dm.encode(d), "ck/.metadata")
