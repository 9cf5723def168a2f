"""sluice.Loader against torch's DataLoader, DistributedSampler and torchdata's StatefulDataLoader, where their APIs
overlap: each scenario is what an ordinary training script does, run against sluice (always: numpy arrays where
torch is absent) and, where torch is installed, against torch side by side, and the two must agree (issue #53):
epochs and reshuffling, batches held across steps and list(loader), the short last batch, ranks and repeats,
len(), a pass broken off and begun again, a resume then the next epoch, types, arguments, and sluice.Dataset
inside torch's DataLoader with worker processes under each start method."""
import json
import random
import subprocess
import sys

import numpy as np
import pytest

import sluice
from conftest import SLUICE

N = 1000

try:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed: the peer's side is not run")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """N JSON records: n (their number, an integer), f (a float), t (a variable-length string)."""
    tmp = tmp_path_factory.mktemp("contract")
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps({"n": i, "f": i / 2, "t": "x" * (i % 7)}) + "\n"
                           for i in range(N)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,f,t", "--shard-size", "8K", "--quiet",
                    str(tmp / "ds")], check=True, capture_output=True)
    return str(tmp / "ds")


def _n(batch):
    """The record numbers of a batch, from sluice's or torch's."""
    x = batch["n"]
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


class _Records(torch.utils.data.Dataset if torch else object):
    """The same N records as a torch map-style dataset: what a script had before sluice."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"n": i, "f": i / 2}


def test_each_pass_is_the_next_epoch_reshuffled(path):
    """for epoch in range(3): for batch in loader: three full epochs, each in a new order (DataLoader with shuffle:
    the same); set_epoch(e) names the next pass's epoch, as DistributedSampler's does."""
    ld = sluice.Loader(path, batch_size=100, shuffle=True, seed=4)
    passes = [[i for b in ld for i in _n(b)] for _ in range(3)]
    for p in passes:
        assert sorted(p) == list(range(N))
    assert len({tuple(p) for p in passes}) == 3
    # The order is the epoch's alone: epoch 1 again is the second pass, and a new loader agrees.
    ld.set_epoch(1)
    assert [i for b in ld for i in _n(b)] == passes[1]
    assert [i for b in ld for i in _n(b)] == passes[2]
    again = sluice.Loader(path, batch_size=50, shuffle=True, seed=4, epoch=2)
    assert [i for b in again for i in _n(b)] == passes[2]
    if torch is not None:
        dl = DataLoader(_Records(), batch_size=100, shuffle=True)
        theirs = [[i for b in dl for i in _n(b)] for _ in range(3)]
        assert [len(p) for p in theirs] == [len(p) for p in passes] == [N] * 3
        assert len({tuple(p) for p in theirs}) == 3


def test_list_of_the_loader_holds_each_batch_its_own_values(path):
    """batches = list(loader): 10 distinct batches, each its own records (every batch showed the last's)."""
    ds = sluice.Dataset(path)
    batches = list(sluice.Loader(ds, batch_size=100, shuffle=True))
    assert len(batches) == 10
    assert sorted(i for b in batches for i in _n(b)) == list(range(N))
    for b in batches:
        for j, i in enumerate(b.ids):
            assert _n(b)[j] == int(i) and float(b["f"][j]) == int(i) / 2
            data, offs = b["t"]
            assert bytes(np.asarray(data[int(offs[j]):int(offs[j + 1])], np.uint8)) == bytes(ds[int(i)]["t"])
    if torch is not None:
        theirs = list(DataLoader(_Records(), batch_size=100, shuffle=True))
        assert len(theirs) == 10 and sorted(i for b in theirs for i in _n(b)) == list(range(N))


def test_a_batch_held_across_later_steps_is_unchanged(path):
    """Gradient accumulation, a metric computed later: a batch kept while 5 more are taken keeps its values."""
    ld = sluice.Loader(path, batch_size=64, shuffle=True, prefetch=2)
    kept, want = [], []
    for step, b in enumerate(ld):
        kept.append(b)
        want.append((_n(b), np.array(b["f"]).copy(), bytes(np.asarray(b["t"][0], np.uint8))))
        if len(kept) > 5:
            old, (n, f, t) = kept.pop(0), want.pop(0)
            assert _n(old) == n and np.array_equal(np.array(old["f"]), f), step
            assert bytes(np.asarray(old["t"][0], np.uint8)) == t, step


def test_the_usual_loop_costs_no_memory_past_the_ring(path):
    """A loop that lets go of each batch when it takes the next gives the ring its buffers back in turn: no batch
    is moved into memory of its own (stats: held_moved), not even the pass's last, which the loop's variable still
    holds as the next pass begins; so a hold_bytes below a batch serves it. list() moves all but the ring's, and
    they cost memory."""
    ld = sluice.Loader(path, batch_size=10, shuffle=True, hold_bytes=1)
    for _ in range(3):
        for b in ld:
            assert len(_n(b)) == 10
    st = ld.stats()
    assert st["batches"] == 300 and st["held_moved"] == 0 and st["held_bytes"] == 0
    ld = sluice.Loader(path, batch_size=10, shuffle=True)
    kept = list(ld)
    st = ld.stats()
    assert len(kept) == 100 and st["held_moved"] >= 100 - 9 and st["held_bytes"] > 0


def test_the_last_batch_is_short_and_no_record_twice(path):
    """drop_last=False, 1000 records, batch 300: 300, 300, 300, 100, as DataLoader gives them."""
    ours = [len(_n(b)) for b in sluice.Loader(path, batch_size=300)]
    assert ours == [300, 300, 300, 100]
    assert [len(_n(b)) for b in sluice.Loader(path, batch_size=300, drop_last=True)] == [300, 300, 300]
    assert [len(_n(b)) for b in sluice.Loader(path, batch_size=300, even_batches=True)] == [300] * 4
    assert len(sluice.Loader(path, batch_size=300)) == 4
    if torch is not None:
        assert [len(_n(b)) for b in DataLoader(_Records(), batch_size=300)] == ours
        assert len(DataLoader(_Records(), batch_size=300)) == 4


@pytest.mark.parametrize("world,batch", [(3, 64), (4, 300), (16, 7), (7, 1000)])
def test_ranks_get_distributed_samplers_share(path, world, batch):
    """world ranks, drop_last=False: each rank ceil(N / world) samples, at most world - 1 repeats, the same batch
    sizes and len() on every rank, as DistributedSampler and DataLoader give them."""
    per, seen, sizes = -(-N // world), [], set()
    for r in range(world):
        ld = sluice.Loader(path, batch_size=batch, rank=r, world_size=world, shuffle=True, seed=1)
        got = [len(_n(b)) for b in ld]
        seen += [i for b in ld for i in _n(b)]  # a second pass: the next epoch, the same shape
        assert sum(got) == per and len(got) == len(ld)
        sizes.add(tuple(got))
        if torch is not None:
            ds = DistributedSampler(_Records(), num_replicas=world, rank=r, shuffle=True, seed=1)
            theirs = [len(_n(b)) for b in DataLoader(_Records(), batch_size=batch, sampler=ds)]
            assert theirs == got and len(DataLoader(_Records(), batch_size=batch, sampler=ds)) == len(ld)
    assert len(sizes) == 1
    assert set(seen) == set(range(N)) and len(seen) - N == per * world - N < world


@pytest.mark.parametrize("world,batch", [(3, 2), (3, 64), (4, 7)])
def test_drop_last_with_ranks_takes_no_record_twice(path, world, batch):
    """drop_last=True under ranks: no partial batch and no record twice, as DistributedSampler(drop_last=True) with
    DataLoader(drop_last=True) give them (the sampler's default, drop_last=False, pads with repeats first, which can
    make one batch more: the guide says so)."""
    seen = []
    for r in range(world):
        ld = sluice.Loader(path, batch_size=batch, rank=r, world_size=world, shuffle=True, seed=1, drop_last=True)
        got = [_n(b) for b in ld]
        assert len(got) == len(ld) == N // world // batch and all(len(b) == batch for b in got)
        seen += [i for b in got for i in b]
        if torch is not None:
            ds = DistributedSampler(_Records(), num_replicas=world, rank=r, shuffle=True, seed=1, drop_last=True)
            dl = DataLoader(_Records(), batch_size=batch, sampler=ds, drop_last=True)
            assert [len(_n(b)) for b in dl] == [len(b) for b in got] and len(dl) == len(ld)
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_batch_size_past_the_dataset_is_one_batch_of_every_record(path, drop_last):
    """batch_size larger than the dataset: one batch of every record (none with drop_last), as DataLoader gives;
    the loader's memory is sized for the records, not for batch_size of them (it refused, or took gigabytes)."""
    for batch in (N + 1, 40 * N, 10**8):
        got = [_n(b) for b in sluice.Loader(path, batch_size=batch, shuffle=True, drop_last=drop_last)]
        assert [sorted(b) for b in got] == ([] if drop_last else [list(range(N))])
        if torch is not None:
            theirs = [len(_n(b)) for b in DataLoader(_Records(), batch_size=batch, drop_last=drop_last)]
            assert theirs == [len(b) for b in got]
    # Over ranks, DistributedSampler's share of it: ceil(N / world) each.
    assert [[len(_n(b)) for b in sluice.Loader(path, batch_size=10**6, rank=r, world_size=3, drop_last=drop_last)]
            for r in range(3)] == [[] if drop_last else [-(-N // 3)]] * 3


def test_a_batch_past_a_shorter_nodes_sequence_is_as_large_as_the_longer_nodes(tmp_path):
    """101 records on 2 nodes of 2 ranks (sequences of 50 and 51), a batch past either: every rank ceil(101 / 4)
    records, every record seen (the shorter node's memory was sized for its own sequence, and overrun)."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"n": i, "f": 0.0, "t": "x" * (i % 7)}) + "\n" for i in range(101)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,f,t", "--quiet", str(tmp_path / "s")],
                   check=True, capture_output=True)
    for batch in (40, 100, 10**6):
        seen = []
        for r in range(4):
            got = [_n(b) for b in sluice.Loader(str(tmp_path / "s"), batch_size=batch, rank=r, world_size=4, nodes=2,
                                                 shuffle=True, numpy=True)]
            assert [len(b) for b in got] == [26], (batch, r)
            seen += [i for b in got for i in b]
        assert set(seen) == set(range(101)) and len(seen) == 104


def test_breaking_off_a_pass_then_iterating_begins_a_new_one(path):
    """break out of a pass, then for batch in loader: a new whole pass (it gave the rest of the old one)."""
    ld = sluice.Loader(path, batch_size=100, shuffle=True)
    for k, _ in enumerate(ld):
        if k == 2:
            break
    assert len([i for b in ld for i in _n(b)]) == N
    it = iter(ld)
    next(it)
    fresh = iter(ld)  # a new pass ends the old one, which says so rather than go on
    with pytest.raises(RuntimeError, match="a new pass over this loader began"):
        next(it)
    assert len([i for b in fresh for i in _n(b)]) == N
    if torch is not None:
        dl = DataLoader(_Records(), batch_size=100, shuffle=True)
        for k, _ in enumerate(dl):
            if k == 2:
                break
        assert len([i for b in dl for i in _n(b)]) == N


def test_a_resumed_loader_finishes_its_epoch_then_goes_on_to_whole_ones(path):
    """state_dict() mid-epoch, a new loader load_state_dict()'s it: the rest of that epoch, then full epochs
    (it gave 0 batches after the resumed epoch), as torchdata's StatefulDataLoader does."""
    ld = sluice.Loader(path, batch_size=100, shuffle=True, seed=2)
    it = iter(ld)
    first = [i for _ in range(3) for i in _n(next(it))]
    state = ld.state_dict()
    assert state["epoch"] == 0 and state["position"] == 300
    rest = [i for b in it for i in _n(b)]
    after = sluice.Loader(path, batch_size=100, shuffle=True, seed=2)
    after.load_state_dict(state)
    resumed = [i for b in after for i in _n(b)]
    assert resumed == rest and sorted(first + resumed) == list(range(N))
    assert after.state_dict() == {"seed": 2, "epoch": 1, "position": 0, "records": N}
    nxt = [i for b in after for i in _n(b)]
    assert sorted(nxt) == list(range(N)) and nxt == [i for b in ld for i in _n(b)]
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return
    dl = StatefulDataLoader(_Records(), batch_size=100, shuffle=True)
    it = iter(dl)
    for _ in range(3):
        next(it)
    s = dl.state_dict()
    dl2 = StatefulDataLoader(_Records(), batch_size=100, shuffle=True)
    dl2.load_state_dict(s)
    assert len(list(dl2)) == 7 and len(list(dl2)) == 10


def test_the_pass_after_the_last_epoch_is_an_error_not_epoch_0(path):
    """Each pass is the next epoch; past 2**64 - 1 there is none: an error, where ctypes wrapped it to epoch 0."""
    ld = sluice.Loader(path, batch_size=500)
    ld.set_epoch((1 << 64) - 1)
    assert sum(len(_n(b)) for b in ld) == N
    with pytest.raises(ValueError, match="next pass's epoch=18446744073709551616 is out of range"):
        iter(ld)


def test_a_state_of_another_dataset_is_refused(path, tmp_path):
    """A state carries its dataset's record count: loaded into a loader of another dataset, whose positions are
    other records, it is refused naming both (it gave a pass of the wrong records, or an empty one)."""
    ld = sluice.Loader(path, batch_size=10)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    assert state["records"] == N
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"n": i, "f": 0.0, "t": ""}) + "\n" for i in range(10)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,f,t", "--quiet", str(tmp_path / "s")],
                   check=True, capture_output=True)
    with pytest.raises(ValueError, match=f"a dataset of {N} records, and .* has 10"):
        sluice.Loader(str(tmp_path / "s"), batch_size=3).load_state_dict(state)


def test_batches_are_torch_tensors_where_torch_is_installed(path):
    """device="cpu" with torch installed: torch tensors (model(batch["x"]) works), numpy with numpy=True or without
    torch; a variable-length field padded with lengths, or nested, where asked."""
    b = next(iter(sluice.Loader(path, batch_size=10)))
    kind = torch.Tensor if torch is not None else np.ndarray
    assert isinstance(b["n"], kind) and isinstance(b["f"], kind) and tuple(b["f"].shape) == (10,)
    assert all(isinstance(x, kind) for x in b["t"])
    b = next(iter(sluice.Loader(path, batch_size=10, numpy=True)))
    assert isinstance(b["n"], np.ndarray) and b["n"].shape == (10,)
    padded, lengths = next(iter(sluice.Loader(path, batch_size=10, ragged="padded")))["t"]
    assert [int(x) for x in lengths] == [i % 7 for i in range(10)] and tuple(padded.shape) == (10, 6)
    assert [int(v) for v in padded[6]] == [ord("x")] * 6 and [int(v) for v in padded[3]] == [ord("x")] * 3 + [0] * 3
    if torch is not None:
        nested = next(iter(sluice.Loader(path, batch_size=10, ragged="nested")))["t"]
        assert nested.is_nested and [len(x) for x in nested.unbind()] == [i % 7 for i in range(10)]
        assert isinstance(torch.as_tensor(b["f"]) + 1, torch.Tensor)


def test_dataloaders_arguments_mean_the_same_or_are_refused_in_a_sentence(path):
    """Loader(path) opens the dataset; DataLoader's names mean the same where sluice has the notion, and are
    refused saying what sluice does instead where it has none."""
    ld = sluice.Loader(path, batch_size=10, shuffle=False, drop_last=True, pin_memory=True, persistent_workers=True,
                       prefetch_factor=2, num_workers=0, timeout=0)
    assert [i for b in ld for i in _n(b)] == list(range(N))  # shuffle=False: the dataset's order, as DataLoader
    assert [i for b in sluice.Loader(path, batch_size=10) for i in _n(b)] == list(range(N))  # the default too
    for kw, says in [({"num_workers": 4}, "no worker processes"), ({"collate_fn": lambda x: x}, "collated in C"),
                     ({"sampler": [1, 2]}, "samples itself"), ({"generator": object()}, "seed="),
                     ({"multiprocessing_context": "spawn"}, "no worker processes")]:
        with pytest.raises(ValueError, match=says):
            sluice.Loader(path, batch_size=10, **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        sluice.Loader(path, batch_size=10, bogus=1)
    # A yes-or-no option given a string is refused naming it (DataLoader takes 'no' as true, and shuffles).
    for name in ("shuffle", "drop_last", "pin_memory", "even_batches", "numpy"):
        with pytest.raises(TypeError, match=rf"Loader\({name}='no'\): True or False"):
            sluice.Loader(path, batch_size=10, **{name: "no"})


def test_a_scalar_field_is_a_scalar_as_default_collate_stacks_it(path):
    """ds[i]["n"] of an integer field: a scalar (it was array([i]), which default_collate makes [batch, 1])."""
    ds = sluice.Dataset(path)
    assert ds[5]["n"] == 5 and np.ndim(ds[5]["n"]) == 0 and ds[5]["f"] == 2.5 and np.ndim(ds[5]["f"]) == 0
    if torch is not None:
        from torch.utils.data import default_collate
        got = default_collate([{k: v for k, v in ds[i].items() if k != "t"} for i in range(4)])
        assert tuple(got["n"].shape) == (4,) and tuple(got["f"].shape) == (4,)


_IN_WORKERS = """
import json, sys, torch, sluice
from torch.utils.data import DataLoader


def rows(samples):
    return [[int(r["n"]), bytes(r["t"]).decode()] for r in samples]


if __name__ == "__main__":
    ds = sluice.Dataset(sys.argv[1])
    ds[0]  # opened, and read, in the parent before the workers start
    dl = DataLoader(ds, batch_size=50, num_workers=2, multiprocessing_context=sys.argv[2], collate_fn=rows)
    print(json.dumps([r for b in dl for r in b]))
"""


@needs_torch
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_sluice_dataset_inside_dataloader_workers(path, method, tmp_path):
    """DataLoader(sluice.Dataset(p), num_workers=2) under each start method: every record, equal to what one
    process reads (spawn and forkserver failed: ctypes pointers cannot be pickled)."""
    script = tmp_path / "train.py"
    script.write_text(_IN_WORKERS)
    r = subprocess.run([sys.executable, str(script), path, method], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == [[i, "x" * (i % 7)] for i in range(N)]


def test_a_dataset_pickles_as_its_path(path, tmp_path, monkeypatch):
    """A Dataset pickles (for DataLoader workers) as its path, a relative one made absolute when it opened: after a
    chdir to where another dataset has that name, the worker's is still the same one (it opened the other)."""
    import os
    import pickle
    ds = pickle.loads(pickle.dumps(sluice.Dataset(path)))
    assert len(ds) == N and ds[7]["n"] == 7
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"n": i, "f": 0.0, "t": ""}) + "\n" for i in range(10)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,f,t", "--quiet",
                    str(tmp_path / os.path.basename(path))], check=True, capture_output=True)
    monkeypatch.chdir(os.path.dirname(path))
    rel = sluice.Dataset(os.path.basename(path))
    monkeypatch.chdir(tmp_path)
    assert len(sluice.Dataset(os.path.basename(path))) == 10  # the other one, here
    assert len(pickle.loads(pickle.dumps(rel))) == N and rel.path == os.path.basename(path)


_FORKED = """
import gc, os, sys, sluice
ld = sluice.Loader(sys.argv[1], batch_size=10, numpy=True, prefetch=4)
held = [b for _, b in zip(range(30), ld)]
want = sum(int(b["n"].sum()) for b in held)
if os.fork() == 0:
    try:
        if sys.argv[2] == "iterate":
            print(sum(len(b["n"]) for b in ld))
        else:
            print("held", sum(int(b["n"].sum()) for b in held) == want)
            del held
            gc.collect()
            ld.close()
            del ld
            gc.collect()
    except RuntimeError as e:
        print(e)
    os._exit(0)
_, status = os.wait()
print("child", status, sum(len(b["n"]) for b in ld))
"""


@pytest.mark.parametrize("what", ["iterate", "drop"])
def test_a_forked_child_refuses_the_parents_loader_and_lets_it_go_without_a_crash(path, what):
    """A process forked from one with a Loader: iterating it is an error saying to make one there (it segfaulted:
    its threads are the parent's); the batches it holds read as they were, and letting them and the loader go
    touches nothing of the parent's (it crashed, or hung, joining threads that are not there). The parent goes on."""
    r = subprocess.run([sys.executable, "-c", _FORKED, path, what], capture_output=True, text=True, timeout=120)
    out = r.stdout.split("\n")
    assert r.returncode == 0 and out[-2] == f"child 0 {N}", (r.stdout[-400:], r.stderr[-400:])
    assert ("before a fork" in out[0]) if what == "iterate" else out[0] == "held True", out


def test_closing_the_loader_and_dataset_closes_the_shard_files(path):
    """Once a Loader and its Dataset are closed, no descriptor of the dataset's files is left open (the engine kept
    up to 256 of them, two descriptors each, and with them the space of files deleted since)."""
    import gc
    import os

    def fds():
        n = 0
        for f in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{f}").startswith(path)
            except OSError:
                pass
        return n

    ds = sluice.Dataset(path)
    ld = sluice.Loader(ds, batch_size=10, shuffle=True)
    assert sum(len(_n(b)) for b in ld) == N and fds() > 0
    ld.close()
    ds.close()
    del ld, ds
    gc.collect()
    assert fds() == 0


def test_a_copy_of_a_loader_is_refused_not_shared(path):
    """copy.copy or deepcopy of a Loader would share its C loader, so a pass of the copy took the original's: each
    is refused saying to make another Loader."""
    import copy
    ld = sluice.Loader(path, batch_size=100)
    for f in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="make another"):
            f(ld)
    assert sum(len(_n(b)) for b in ld) == N


def test_held_batches_never_change_in_a_soak_of_random_holds(path):
    """10,000 batches over many epochs, each kept for a random number of later steps (0 to 40) and checked when
    let go against the records it held when it came: never a value changed."""
    rng = random.Random(5)
    ld = sluice.Loader(path, batch_size=4, shuffle=True, prefetch=3, numpy=True)
    held, taken = [], 0
    while taken < 10_000:
        for b in ld:
            taken += 1
            held.append((taken + rng.randint(0, 40), b, _n(b), b["f"].copy(), b["t"][0].copy()))
            for item in [h for h in held if h[0] <= taken]:
                _, hb, n, f, t = item
                assert _n(hb) == n and np.array_equal(hb["f"], f) and n == [int(i) for i in hb.ids]
                assert np.array_equal(hb["t"][0], t)
                held.remove(item)
            if taken == 10_000:
                break
    assert taken == 10_000
