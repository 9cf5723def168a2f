"""sluice.dcp: torch.distributed.checkpoint's save, async_save and load through sluice, one rank and several
(gloo on the host; NCCL where two GPUs are), resharded, on the GPU, to S3, and killed midway."""
import os
import re
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
import sluice  # noqa: E402
from sluice.dcp import StorageReader, StorageWriter  # noqa: E402
from conftest import run_ranks  # noqa: E402


def state(seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(50, 16, generator=g).to(device),
            "layers": {str(i): {"w": torch.randn(24, 16, generator=g).to(torch.bfloat16).to(device),
                                "b": torch.randn(16, generator=g).to(device)} for i in range(3)},
            "step": torch.tensor(seed + 7), "lr": 0.5 + seed, "name": f"run-{seed}", "empty": torch.zeros(0)}


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    return torch.zeros_like(sd) if isinstance(sd, torch.Tensor) else None


def same(a, b):
    assert type(a) is type(b) or isinstance(a, torch.Tensor), (a, b)
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    else:
        assert a == b


def test_save_and_load_one_process(tmp_path):
    """A nested state dict of tensors of several dtypes and plain values: loaded back equal, in place."""
    sd = state()
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    got = zeros_like(sd)
    got.update(lr=None, name=None)
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    same(got, sd)
    names = sorted(os.listdir(tmp_path / "ck"))
    assert names[0] == ".metadata" and len(names) == 2 and names[1].endswith(".safetensors"), names


def test_loaded_into_another_dtype_and_part_of_a_tensor(tmp_path):
    """Loading converts to the state dict's dtype (the chunk read whole, then copied), and a tensor whose
    shape differs is refused by DCP's planner, not filled wrongly."""
    sd = {"w": torch.arange(60, dtype=torch.float32).reshape(6, 10)}
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    got = {"w": torch.zeros(6, 10, dtype=torch.float64)}
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    assert torch.equal(got["w"], sd["w"].double())
    with pytest.raises(BaseException, match="Size mismatch"):  # DCP's CheckpointException is a BaseException
        dcp.load({"w": torch.zeros(7, 10)}, storage_reader=StorageReader(tmp_path / "ck"))


def test_a_second_save_replaces_the_first_and_removes_its_files(tmp_path):
    dcp.save(state(0), storage_writer=StorageWriter(tmp_path / "ck"))
    first = set(os.listdir(tmp_path / "ck"))
    dcp.save(state(1), storage_writer=StorageWriter(tmp_path / "ck"))
    second = set(os.listdir(tmp_path / "ck"))
    assert first & second == {".metadata"} and len(second) == 2
    (tmp_path / "ck" / "notes.txt").write_text("mine")  # not the checkpoint's: left alone
    dcp.save(state(2), storage_writer=StorageWriter(tmp_path / "ck"))
    assert "notes.txt" in os.listdir(tmp_path / "ck")
    got = zeros_like(state(2))
    got.update(lr=None, name=None)
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    same(got, state(2))
    with pytest.raises(BaseException, match="overwrite=False"):
        dcp.save(state(3), storage_writer=StorageWriter(tmp_path / "ck", overwrite=False))


def test_async_save(tmp_path):
    sd = state(4)
    fut = dcp.async_save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    fut.result()
    got = zeros_like(sd)
    got.update(lr=None, name=None)
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    same(got, sd)


def test_a_foreign_or_damaged_checkpoint_is_refused(tmp_path):
    sd = {"w": torch.arange(1000, dtype=torch.float32)}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "torch")))
    with pytest.raises(ValueError, match="not the metadata"):
        StorageReader(tmp_path / "torch").read_metadata()
    # torch's format ties no name to an item's bytes (see the guide): not read even with allow_pickle=True.
    with pytest.raises(ValueError, match="not the metadata.*_StorageInfo is not part of a checkpoint's metadata"):
        StorageReader(tmp_path / "torch", allow_pickle=True).read_metadata()
    with pytest.raises(BaseException):  # some torch versions pass read_metadata's message on, some do not
        dcp.load({"w": torch.zeros(1000)}, storage_reader=StorageReader(tmp_path / "torch"))
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    data = [n for n in os.listdir(tmp_path / "ck") if n.endswith(".safetensors")][0]
    os.truncate(tmp_path / "ck" / data, 2000)  # the file cut short: the read past its end fails, naming it
    with pytest.raises(BaseException, match=data):
        dcp.load({"w": torch.zeros(1000)}, storage_reader=StorageReader(tmp_path / "ck"))


def test_metadata_that_would_run_code_is_refused(tmp_path):
    """.metadata is data (JSON) that sluice reads without unpickling.  A pickle there (here one running
    os.system, by name and by a dotted name through DCP's metadata module) is refused unless the caller opts in
    with allow_pickle=True, and then refused too before it runs, naming the file; metadata naming a file
    outside the checkpoint (../) is refused; a cut one too."""
    import pickle

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    def dotted(module, name, arg):  # protocol 4's STACK_GLOBAL, which resolves a dotted name attribute by attribute
        enc = lambda x: b"\x8c" + bytes([len(x.encode())]) + x.encode()  # noqa: E731
        return b"\x80\x04" + enc(module) + enc(name) + b"\x93" + enc(arg) + b"\x85R."
    dcp.save({"w": torch.ones(3)}, storage_writer=StorageWriter(tmp_path / "ck"))
    good = (tmp_path / "ck" / ".metadata").read_bytes()
    for hostile in (pickle.dumps(Evil()),
                    dotted("torch.distributed.checkpoint.metadata", "os.system", f"touch {tmp_path / 'ran'}")):
        (tmp_path / "ck" / ".metadata").write_bytes(hostile)
        with pytest.raises(ValueError, match=r"\.metadata: not the metadata of a checkpoint .*allow_pickle=True"):
            StorageReader(tmp_path / "ck").read_metadata()
        with pytest.raises(ValueError, match=r"\.metadata: not the metadata of a checkpoint .*system"):
            StorageReader(tmp_path / "ck", allow_pickle=True).read_metadata()
        assert not (tmp_path / "ran").exists()
    # Metadata naming a file outside the checkpoint (../) is refused, not followed.
    from sluice.dcp import _Stored
    (tmp_path / "ck" / ".metadata").write_bytes(good)
    r = StorageReader(tmp_path / "ck")
    md = r.read_metadata()
    md.storage_data = {k: _Stored("../../etc/passwd", 0, 12) for k in md.storage_data}
    with pytest.raises(ValueError, match="damaged metadata.*etc/passwd"):
        r.set_up_storage_reader(md, True)
    (tmp_path / "ck" / ".metadata").write_bytes(good[:len(good) - 40])
    with pytest.raises(ValueError, match=r"\.metadata: damaged metadata"):
        StorageReader(tmp_path / "ck").read_metadata()


def test_pickled_metadata_of_older_versions_with_allow_pickle(tmp_path):
    """A checkpoint whose .metadata is the pickle older sluice versions wrote loads with allow_pickle=True (its
    items checked against their files' headers by place), and is refused without."""
    import pickle
    sd = state(3)
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    from sluice.dcp import _Stored
    md = StorageReader(tmp_path / "ck").read_metadata()
    md.storage_data = {k: _Stored(v.relative_path, v.offset, v.length) for k, v in md.storage_data.items()}
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(md))
    got = zeros_like(sd)
    got.update(lr=None, name=None)
    with pytest.raises(ValueError, match="allow_pickle"):
        StorageReader(tmp_path / "ck").read_metadata()
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck", allow_pickle=True))
    same(got, sd)


def test_torchs_own_reader_says_it_is_a_sluice_checkpoint(tmp_path):
    """torch's FileSystemReader on a checkpoint StorageWriter wrote: an error naming sluice and its reader (the
    first opcode of .metadata), not a pickle's puzzle, and nothing run."""
    dcp.save({"w": torch.ones(3)}, storage_writer=StorageWriter(tmp_path / "ck"))
    with pytest.raises(BaseException, match=r"checkpoint of sluice.*StorageReader"):
        dcp.FileSystemReader(str(tmp_path / "ck")).read_metadata()
    # dcp.load runs the reader inside torch's own steps, which (torch 2.11) replace the reader's error with
    # "metadata is None": it fails, and loads nothing, but the message is torch's.
    w = torch.zeros(3)
    with pytest.raises(BaseException):
        dcp.load({"w": w}, storage_reader=dcp.FileSystemReader(str(tmp_path / "ck")))
    assert torch.equal(w, torch.zeros(3))


@pytest.mark.parametrize("field,delta", [("at", 4), ("at", -4), ("length", -4), ("name", None), ("fqn", None)])
def test_metadata_with_damaged_places_loads_no_other_bytes(tmp_path, field, delta, caplog):
    """An item's place in the JSON metadata moved, cut or renamed, or the fqns of two tensors of one shape and
    dtype swapped: refused, naming the file; the state dict is not filled with other bytes."""
    import json
    from sluice import _dcpmeta as dm
    sd = {"a": torch.arange(16, dtype=torch.float32), "b": torch.arange(16, 32, dtype=torch.float32)}
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    raw = (tmp_path / "ck" / ".metadata").read_bytes()
    doc = json.loads(raw[len(dm.MAGIC):])
    it = next(i for i in doc["items"] if i["fqn"] == "b")
    if field == "name":
        it["name"] = next(i for i in doc["items"] if i["fqn"] == "a")["name"]
    elif field == "fqn":
        next(i for i in doc["items"] if i["fqn"] == "a")["fqn"], it["fqn"] = "b", "a"
    else:
        it[field] += delta
        if field == "length":  # the chunk's size too, so the document itself is consistent
            t = doc["tensors"]["b"]
            t["size"], t["chunks"][0]["sizes"] = [15], [15]
    (tmp_path / "ck" / ".metadata").write_bytes(dm.MAGIC + json.dumps(doc).encode())
    got = {"a": torch.zeros(16), "b": torch.zeros(16 if field != "length" else 15)}
    # A place is refused against the file's header; a name at once, as not the item's own.
    # torch before 2.15 says only "metadata is None" of what read_metadata raised: the reader logs it too.
    with pytest.raises(BaseException) as e:
        dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    assert re.search(r"__0_[0-9a-f]{12}\.safetensors(: holds no tensor|, another item's name)",
                     str(e.value) + caplog.text), (str(e.value), caplog.text)
    assert not got["b"].any() and not got["a"].any()


class RunsCode:
    """A value whose pickle runs `touch PATH` when unpickled (what a hostile checkpoint's bytes item holds)."""
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _replace_bytes(ck, items):
    """Rewrites ck's data file with the bytes of items {fqn: bytes} in place of theirs, and its metadata to match:
    what whoever can write the directory (or the s3:// prefix) can do."""
    import json
    import numpy as np
    from sluice import _dcpmeta as dm
    from st_header import read_header
    data = next(ck / n for n in os.listdir(ck) if n.endswith(".safetensors"))
    t = sluice.load(str(data), device="numpy")
    t.update({k: np.frombuffer(v, np.uint8) for k, v in items.items()})
    sluice.save(t, str(data))
    header, start = read_header(str(data))
    doc = json.loads((ck / ".metadata").read_bytes()[len(dm.MAGIC):])
    for it in doc["items"]:
        b, e = header[it["name"]]["data_offsets"]
        it["at"], it["length"] = start + b, e - b
    (ck / ".metadata").write_bytes(dm.encode({k: v for k, v in doc.items() if k not in ("format", "version")}))


def test_bytes_items_that_would_run_code_are_refused(tmp_path):
    """A bytes item (DCP's save planner torch.save's every non-tensor value) whose pickle runs code: DCP's load
    planner unpickles what the reader gives it with torch.load(weights_only=False).  StorageReader gives it
    only what torch.load(weights_only=True) built, so the load is refused naming the file, the item and what
    it named, and nothing runs: a torch.save'd pickle, and a plain one (which torch.load's legacy path
    unpickles first).  allow_pickle=True hands the item over as it is: the code runs (the exploit is real)."""
    import pickle
    ran = tmp_path / "ran"
    dcp.save({"w": torch.ones(3), "evil": RunsCode(ran), "plain": 1}, storage_writer=StorageWriter(tmp_path / "ck"))
    assert not ran.exists()
    for hostile in (None, pickle.dumps(RunsCode(ran), protocol=2)):
        if hostile:
            _replace_bytes(tmp_path / "ck", {"evil": hostile})
        got = {"w": torch.zeros(3), "evil": None, "plain": None}
        with pytest.raises(BaseException, match=r"__0_[0-9a-f]{12}\.safetensors: item 'evil' is not data "
                                                r"torch\.load\(weights_only=True\) reads \(.*(posix|os)\.system.*"
                                                r"allow_pickle=True"):
            dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
        assert not ran.exists() and got["evil"] is None
        try:  # torch's legacy format then finds no magic number: the code has run all the same
            dcp.load(got, storage_reader=StorageReader(tmp_path / "ck", allow_pickle=True))
        except BaseException:
            assert hostile
        assert ran.exists()
        ran.unlink()


def test_bytes_items_load_as_torchs_own_reader_loads_them(tmp_path):
    """Plain values (ints, floats, str, None, tuples, torch.Size, bytes, dicts and lists holding tensors, Python's
    RNG state, an OrderedDict) load through weights_only=True equal to what torch's own FileSystemReader loads
    of the same state dict; a value weights_only refuses (a numpy array) is refused by name, and loads with
    allow_pickle=True."""
    import collections
    import random
    import numpy as np
    sd = {"step": 12, "lr": 0.25, "name": "run", "none": None, "flag": True, "betas": (0.9, 0.999),
          "size": torch.Size([3, 4]), "raw": b"\x00\x01", "rng": random.Random(5).getstate(),
          "od": collections.OrderedDict(b=1, a=[1, 2]), "opt": {"state": {"0": {"m": torch.arange(4.0), "t": 3}},
                                                                  "groups": [{"lr": 0.1, "params": [0, 1]}]},
          "w": torch.randn(5, generator=torch.Generator().manual_seed(2))}

    def empty(v):  # the state dict's shape (DCP flattens dicts and lists), its tensors zero, its values None
        if isinstance(v, dict):
            return type(v)((k, empty(x)) for k, x in v.items())
        if type(v) is list:
            return [empty(x) for x in v]
        return torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "torch")))
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    theirs, ours = empty(sd), empty(sd)
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(str(tmp_path / "torch")))
    dcp.load(ours, storage_reader=StorageReader(tmp_path / "ck"))

    def same_as(a, b):
        assert type(a) is type(b), (a, b)
        if isinstance(a, dict):
            assert list(a) == list(b)
            for k in a:
                same_as(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                same_as(x, y)
        elif isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b)
        else:
            assert a == b
    same_as(ours, theirs)
    assert ours["rng"] == sd["rng"] and ours["step"] == 12
    dcp.save({"a": np.arange(3)}, storage_writer=StorageWriter(tmp_path / "np"))
    with pytest.raises(BaseException, match=r"item 'a' is not data torch\.load\(weights_only=True\) reads \(.*numpy"):
        dcp.load({"a": None}, storage_reader=StorageReader(tmp_path / "np"))
    got = {"a": None}
    dcp.load(got, storage_reader=StorageReader(tmp_path / "np", allow_pickle=True))
    assert np.array_equal(got["a"], np.arange(3))


def test_a_bytes_item_named_as_a_tensors_chunk_is_refused_at_save(tmp_path):
    """A bytes item "w@0" and tensor w's chunk at [0] would share one name in the rank's file, and an item named
    __metadata__ would be the header's own: refused before anything is written, naming both (the file held one
    of them twice; a header whose __metadata__ is a tensor)."""
    with pytest.raises(BaseException, match=r"item 'w' at \[0\] and 'w@0' would be stored under one name, 'w@0'|"
                                            r"item 'w@0' and 'w' at \[0\] would be stored under one name, 'w@0'"):
        dcp.save({"w": torch.ones(2), "w@0": 5}, storage_writer=StorageWriter(tmp_path / "ck"))
    with pytest.raises(BaseException, match=r"item '__metadata__' and the file's own metadata would be stored"):
        dcp.save({"w": torch.ones(2), "__metadata__": 5}, storage_writer=StorageWriter(tmp_path / "ck"))
    assert not (tmp_path / "ck" / ".metadata").exists()


@pytest.mark.parametrize("pickled", [False, True])
def test_swapped_items_load_their_own_values_or_are_refused(tmp_path, pickled, caplog):
    """400 seeded edits of the metadata, each swapping fields (fqn and offsets, name, place and length) of two
    items, tensors of one shape and dtype among them: each load gives every item its own saved value or fails
    naming the file; never another item's bytes (a swapped fqn pair loaded them before).  With pickled metadata (older
    versions, no names in it) the header's names hold the items all the same."""
    import dataclasses
    import json
    import pickle
    import random
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from sluice import _dcpmeta as dm
    from sluice.dcp import _Stored
    sd = {"a": torch.arange(16, dtype=torch.float32), "b": torch.arange(16, 32, dtype=torch.float32),
          "c": torch.arange(16, dtype=torch.int32).reshape(4, 4), "n": 3, "m": 4}
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    good = (tmp_path / "ck" / ".metadata").read_bytes()
    md = StorageReader(tmp_path / "ck").read_metadata()
    doc = json.loads(good[len(dm.MAGIC):])
    rng = random.Random(52)
    fields = [("fqn", "offset"), ("fqn",), ("name",), ("at", "length"), ("fqn", "offset", "name"),
              ("fqn", "offset", "at", "length"), ("name", "at", "length"),
              ("fqn", "offset", "name", "at", "length", "index"), ("index",)]  # the last two change nothing
    loaded = refused = 0
    for _ in range(400 if not pickled else 100):
        d = json.loads(json.dumps(doc))
        i, j = rng.sample(range(len(d["items"])), 2)
        for f in rng.choice(fields):
            d["items"][i][f], d["items"][j][f] = d["items"][j][f], d["items"][i][f]
        if pickled:  # the same edit of older versions' pickled metadata, whose items carry no name
            raw = pickle.dumps(dataclasses.replace(md, storage_meta=None, storage_data={
                MetadataIndex(it["fqn"], None if it["offset"] is None else torch.Size(it["offset"]), it["index"]):
                _Stored(it["file"], it["at"], it["length"]) for it in d["items"]}))
        else:
            raw = dm.MAGIC + json.dumps(d).encode()
        (tmp_path / "ck" / ".metadata").write_bytes(raw)
        got = {"a": torch.zeros(16), "b": torch.zeros(16), "c": torch.zeros(4, 4, dtype=torch.int32), "n": None,
               "m": None}
        try:
            dcp.load(got, storage_reader=StorageReader(tmp_path / "ck", allow_pickle=pickled))
        except BaseException as e:
            said = str(e) + caplog.text  # torch before 2.15 keeps read_metadata's error out of its own
            caplog.clear()
            assert "sluice.dcp" in said or "Size mismatch" in said or "Missing key" in said, said[-600:]
            refused += 1
            continue
        same(got, sd)
        loaded += 1
    assert refused and loaded


def test_damaged_metadata_gives_a_clear_error(tmp_path):
    """300 damaged copies of a real .metadata (bytes flipped, cut, repeated; seeded): each loads as metadata or
    is refused with ValueError naming the file; nothing else escapes, nothing hangs."""
    from test_checkpoint_dcp_metadata import damaged
    dcp.save(state(), storage_writer=StorageWriter(tmp_path / "ck"))
    good = (tmp_path / "ck" / ".metadata").read_bytes()
    for b in damaged(good, 24, 300):
        (tmp_path / "ck" / ".metadata").write_bytes(bytes(b))
        r = StorageReader(tmp_path / "ck")
        try:
            r.set_up_storage_reader(r.read_metadata(), True)
        except ValueError as e:
            assert ".metadata" in str(e)


# A child that saves state(SEED) to PATH and is killed (SIGKILL) at STAGE: "data" after its data file is durable,
# before the metadata; "metadata" during the metadata's write (its temporary file written, not renamed);
# "sleep:S" S seconds into a large save.
KILLED = """
import os, signal, sys, time, threading
import torch, torch.distributed.checkpoint as dcp
import sluice.dcp as sd
sys.path.insert(0, sys.argv[4])
from test_dcp import state
path, seed, stage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if stage == "data":
    sd._write_whole = die
elif stage == "metadata":
    real = os.replace
    os.replace = lambda a, b: die() if b.endswith(".metadata") else real(a, b)
s = state(seed)
if stage.startswith("sleep:"):
    s["big"] = torch.randn(64 << 20)
    threading.Timer(float(stage[6:]), die).start()
dcp.save(s, storage_writer=sd.StorageWriter(path))
"""


@pytest.mark.parametrize("stage", ["data", "metadata", "sleep:0.3", "sleep:0.8"])
def test_killed_during_a_save_the_previous_checkpoint_loads(tmp_path, stage):
    """kill -9 while a save replaces a checkpoint: the old one loads whole (or, if the kill came after the
    rename, the new one); never a mix, never an error."""
    dcp.save(state(0), storage_writer=StorageWriter(tmp_path / "ck"))
    # The child imports the sluice this test runs (the source tree's, or an installed wheel's).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(sluice.__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "ck"), "1", stage, os.path.dirname(__file__)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    got = zeros_like(state(0))
    got.update(lr=None, name=None)
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    if stage in ("data", "metadata"):
        same(got, state(0))
    else:
        assert got["step"].item() in (7, 8)
        same(got, state(got["step"].item() - 7))
    dcp.save(state(2), storage_writer=StorageWriter(tmp_path / "ck"))  # the next save clears what was left
    assert len([n for n in os.listdir(tmp_path / "ck") if n != ".metadata"]) == 1


# One rank of a group: saves a state dict of DTensors sharded by rows (each rank its part), loads it into
# DTensors sharded by columns (every rank reads parts of other ranks' files) and into a replicated tensor,
# and checks both against the whole.  argv: path, backend, device ("cpu" or "cuda").
RANK = """
import json, os, sys
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from sluice.dcp import StorageReader, StorageWriter
path, backend, dev = sys.argv[1:4]
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if dev == "cuda":
    torch.cuda.set_device(rank)
mesh = init_device_mesh(dev, (world,))
g = torch.Generator().manual_seed(3)
whole = {"w": torch.randn(37, 24, generator=g), "v": torch.randn(10, 6, 5, generator=g).to(torch.bfloat16)}
sd = {k: distribute_tensor(v.to(dev), mesh, [Shard(0)]) for k, v in whole.items()}
sd["step"] = torch.tensor(5)
dcp.save(sd, storage_writer=StorageWriter(path))
cols = {k: distribute_tensor(torch.zeros_like(v).to(dev), mesh, [Shard(1)]) for k, v in whole.items()}
cols["step"] = torch.tensor(0)
dcp.load(cols, storage_reader=StorageReader(path))
rep = {k: distribute_tensor(torch.zeros_like(v).to(dev), mesh, [Replicate()]) for k, v in whole.items()}
dcp.load(rep, storage_reader=StorageReader(path))
ok = all(torch.equal(cols[k].full_tensor().cpu(), v) and torch.equal(rep[k].to_local().cpu(), v)
         for k, v in whole.items())
print(json.dumps({"rank": rank, "ok": ok and cols["step"].item() == 5}))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # past torch's teardown, which once aborted a gloo rank at exit ("terminate called ...")
"""


def _ranks(path, world, backend, dev):
    return run_ranks(RANK, (path, backend, dev), world)


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_state_dicts_on_several_ranks(tmp_path, world):
    """FSDP-style DTensors: each rank writes its file; loads resharded by columns and replicated are equal to
    the whole tensors on every rank."""
    pytest.importorskip("torch.distributed.tensor")
    reps = _ranks(tmp_path / "ck", world, "gloo", "cpu")
    assert all(r["ok"] for r in reps), reps
    assert len([n for n in os.listdir(tmp_path / "ck") if n.endswith(".safetensors")]) == world


def test_sharded_state_dicts_on_two_gpus(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("fewer than two GPUs")
    reps = _ranks(tmp_path / "ck", 2, "nccl", "cuda")
    assert all(r["ok"] for r in reps), reps


def test_on_the_gpu(tmp_path):
    """GPU tensors written straight from GPU memory and read straight into it."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    sd = state(5, "cuda")
    dcp.save(sd, storage_writer=StorageWriter(tmp_path / "ck"))
    got = zeros_like(sd)
    got.update(lr=None, name=None)
    dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    same(got, sd)
    assert got["embed"].is_cuda


def test_to_s3_and_back(s3):
    """An s3:// prefix: objects written whole, the metadata last; a second save removes the first's objects."""
    import sluice
    url = "s3://pytest/dcp/step1"
    dcp.save(state(0), storage_writer=StorageWriter(url))
    first = sluice.listdir(url)
    dcp.save(state(1), storage_writer=StorageWriter(url))
    second = sluice.listdir(url)
    assert len(first) == len(second) == 2 and set(first) & set(second) == {url + "/.metadata"}
    got = zeros_like(state(1))
    got.update(lr=None, name=None)
    dcp.load(got, storage_reader=StorageReader(url))
    same(got, state(1))


def test_a_failed_metadata_read_fails_the_load_without_a_second_read(tmp_path, monkeypatch, caplog):
    """torch's load reads the metadata again as rank-local metadata (read_metadata(rank=...)) when the first
    read fails, where the reader takes **kwargs, and then loads without collectives: in a group, a rank whose
    first read failed (a transient error, a metadata file that appeared just after) left the others waiting in
    a collective it never joined, and the job hung.  sluice writes no rank-local metadata: one read, and its
    failure is the load's."""
    dcp.save(state(), storage_writer=StorageWriter(tmp_path / "ck"))
    import sluice.dcp as sd
    real, reads = sd.read_small, []

    def flaky(path, *a, **k):
        reads.append(path)
        if len(reads) == 1:
            raise sluice.SluiceError(-5, f"{path}: transient failure")
        return real(path, *a, **k)
    monkeypatch.setattr(sd, "read_small", flaky)
    got = zeros_like(state())
    got.update(lr=None, name=None)
    # torch before 2.15 says only "metadata is None" of what read_metadata raised: the reader logs it too.
    with pytest.raises(BaseException) as e:
        dcp.load(got, storage_reader=StorageReader(tmp_path / "ck"))
    assert "transient failure" in str(e.value) + caplog.text, (str(e.value), caplog.text)
    assert len(reads) == 1


# Two ranks load a checkpoint; rank 1's first read of the metadata fails (argv: path, mode "flaky"), or rank 1
# reads another save of it, as when a save replaces the checkpoint between the ranks' reads (mode "other":
# rank 1 reads path + ".other").  Each prints what its load did.
LOAD_RANK = """
import io, json, logging, os, sys
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import sluice.dcp as sd
path, mode = sys.argv[1:3]
log = io.StringIO()  # what the reader logs (torch before 2.15 keeps only "metadata is None" of its error)
logging.getLogger("sluice").addHandler(logging.StreamHandler(log))
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "flaky" and rank == 1:
    real, n = sd.read_small, []
    def flaky(p, *a, **k):
        n.append(p)
        if len(n) == 1:
            raise sd.SluiceError(-5, f"{p}: transient failure")
        return real(p, *a, **k)
    sd.read_small = flaky
if mode == "other" and rank == 1:
    path += ".other"
got = {"w": torch.zeros(8, 4), "step": torch.tensor(0)}
try:
    dcp.load(got, storage_reader=sd.StorageReader(path))
    out = {"rank": rank, "step": got["step"].item()}
except BaseException as e:
    out = {"rank": rank, "error": (str(e) + log.getvalue())[-3000:]}
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)
"""


def test_a_rank_whose_metadata_read_fails_fails_the_group_without_a_hang(tmp_path):
    """Two gloo ranks, rank 1's first metadata read failing: every rank's load fails, naming the failure
    (before: rank 0 waited for ever in a collective rank 1 had skipped)."""
    dcp.save({"w": torch.ones(8, 4), "step": torch.tensor(3)}, storage_writer=StorageWriter(tmp_path / "ck"))
    reps = run_ranks(LOAD_RANK, (tmp_path / "ck", "flaky"), 2)
    # Every rank's load fails; rank 1's names the failure (torch before 2.15: in the reader's log), rank 0's names
    # it or rank 1, as torch's CheckpointException does.
    errors = {r["rank"]: r.get("error", "") for r in reps}
    assert all(errors.values()) and "transient failure" in errors[1], reps
    assert "transient failure" in errors[0] or "RANK 1" in errors[0], reps


def test_ranks_that_read_the_metadata_of_two_saves_are_refused(tmp_path):
    """Each rank reads the metadata itself; a save that replaces the checkpoint between two ranks' reads gives
    them the metadata of two saves, and each would load its part of the state dict from its own: a model of
    two checkpoints, silently.  The coordinator compares the saves the ranks' plans come from and fails the
    load on every rank, naming both."""
    dcp.save({"w": torch.ones(8, 4), "step": torch.tensor(3)}, storage_writer=StorageWriter(tmp_path / "ck"))
    dcp.save({"w": torch.ones(8, 4), "step": torch.tensor(4)}, storage_writer=StorageWriter(tmp_path / "ck.other"))
    reps = run_ranks(LOAD_RANK, (tmp_path / "ck", "other"), 2)
    assert all("2 saves (rank 0" in r.get("error", "") for r in reps), reps
    assert [r["step"] for r in run_ranks(LOAD_RANK, (tmp_path / "ck", "same"), 2)] == [3, 3]
