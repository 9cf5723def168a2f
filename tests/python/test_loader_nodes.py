"""The loader on several nodes: each node reads only its contiguous share of the shuffled shards, every record once
an epoch (apart from the documented fill of a shorter node's last batch), every rank the same number of batches,
and an epoch stopped and resumed on another node count (2 -> 3 -> 1, 4 -> 2 -> 3 -> 3 -> 1) goes on exactly.  Each
rank runs here as its own loader, one after another, with rank=, world_size= and nodes= given, so a loader that
needed its peers would hang the test."""
import ctypes
import json
import math
import subprocess

import pytest

import sluice
from sluice import _lib
from conftest import SLUICE

B = 5  # records per batch per rank
N = 1003


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """1003 records of one size in 4 KiB shards: 14 shards of 54 to 73 records."""
    tmp = tmp_path_factory.mktemp("nodes")
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps({"n": i, "pad": "x" * 40}) + "\n" for i in range(N)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,pad", "--shard-size", "4K", "--quiet",
                    str(tmp / "ds")], check=True, capture_output=True)
    d = sluice.Dataset(str(tmp / "ds"))
    assert len(d) == N
    return d


def _shard(ds, i):
    loc = _lib.RecordLoc()
    _lib.check(sluice.lib.sluice_dataset_locate(ds._h, i, ctypes.byref(loc)))
    return loc.shard


def _phase(ds, nodes, local, state, batches, drop_last, seed=11):
    """nodes x local ranks from state (None: the epoch's start), each taking `batches` batches (None: to the
    epoch's end): each node's ids (its ranks' together, rank after rank), the batches each rank took, and the
    state every rank reports after (they must agree)."""
    world = nodes * local
    ids, counts, states = [[] for _ in range(nodes)], [], []
    for r in range(world):
        ld = sluice.Loader(ds, B, seed=seed, rank=r, world_size=world, nodes=nodes, drop_last=drop_last, prefetch=2,
                           even_batches=True)  # every batch full: the fill of a shorter node is what is tested
        if state is not None:
            ld.load_state_dict(state)
        got, last = 0, ld.state_dict()
        for b in ld:
            assert len(b.ids) == B
            ids[r // local] += [int(x) for x in b.ids]
            got += 1
            last = ld.state_dict()  # saved with the step's checkpoint (once the pass ends: the next epoch's start)
            if got == batches:
                break
        counts.append(got)
        states.append(last)
    assert len(set(counts)) == 1, f"ranks got {counts} batches"
    assert all(s == states[0] for s in states), f"ranks disagree on the state: {states}"
    return ids, counts[0], states[0]


@pytest.mark.parametrize("nodes,local", ((2, 2), (3, 1)))
@pytest.mark.parametrize("drop_last", (False, True))
def test_an_epoch_on_nodes_reads_each_record_once_and_few_shards_a_node(ds, nodes, local, drop_last):
    ids, k, state = _phase(ds, nodes, local, None, None, drop_last)
    per_node = k * B * local
    shortest, longest = N // nodes, -(-N // nodes)
    assert k == (shortest // (B * local) if drop_last else -(-longest // (B * local)))
    assert state["segments"] == [[nodes, per_node]]
    ranges = [set(x) for x in ids]
    for a in range(nodes):
        for b in range(a + 1, nodes):
            assert not ranges[a] & ranges[b], "two nodes read one record"
    shards = len({_shard(ds, i) for i in range(N)})
    for node, got in enumerate(ids):
        assert len(got) == per_node
        # At most its share of the shards and one more: a node's range of S cuts only the shards at its ends.
        assert len({_shard(ds, i) for i in got}) <= math.ceil(shards / nodes) + 1, node
        if drop_last:
            assert len(ranges[node]) == per_node  # nothing twice
    if drop_last:
        assert N - sum(map(len, ranges)) < nodes * (B * local + 1)  # each node less than a global batch, + 1
        return
    assert set().union(*ranges) == set(range(N))
    for node, got in enumerate(ids):
        # Each node holds its whole range, its last batch filled from its own start: with one rank a node the
        # ids are the node's sequence itself, so the fill repeats its first records.
        assert len(ranges[node]) in (shortest, longest)
        fill = per_node - len(ranges[node])
        if local == 1:
            assert got[len(ranges[node]):] == got[:fill]


def test_the_order_depends_on_the_node_count_not_the_ranks_in_a_node(ds):
    """2 nodes of 2 ranks and 2 nodes of 1: node k's global batch g under 2 x 2 holds what 2 x 1 gives in its
    batches 2g and 2g + 1; with one node, the order of one rank alone (nodes=1 is the order before nodes)."""
    two_by_two, _, _ = _phase(ds, 2, 2, None, None, True)
    two_by_one, _, _ = _phase(ds, 2, 1, None, None, True)
    for node in range(2):
        a, b = two_by_two[node], two_by_one[node]
        half = len(a) // 2  # the node's first rank's batches, then its second's: B each of a global batch
        for g in range(half // B):
            both = a[g * B:(g + 1) * B] + a[half + g * B:half + (g + 1) * B]
            assert sorted(both) == sorted(b[2 * g * B:(2 * g + 2) * B])
    one, _, state = _phase(ds, 1, 1, None, None, True)
    plain = [int(x) for b in sluice.Loader(ds, B, seed=11, rank=0, world_size=1, drop_last=True) for x in b.ids]
    assert one[0] == plain and "segments" not in state


def _check_resumed(phases, drop_last):
    """Every phase's ids: none twice but the last phase's fill, none lost but less than one global batch under
    drop_last."""
    seen = [i for ids in phases[:-1] for node in ids for i in node]
    last = [i for node in phases[-1] for i in node]
    assert len(seen) == len(set(seen)) and not set(seen) & set(last)
    if drop_last:
        assert len(last) == len(set(last)) and N - len(seen) - len(last) < 4 * B
    else:
        assert set(seen) | set(last) == set(range(N))
    return seen, last


CHAINS = {
    "2x2 -> 3x1 -> 1x4": [(2, 2, 3), (3, 1, 5), (1, 4, None)],
    "4x1 -> 2x2 -> 3x1 -> 3x2 -> 1x4": [(4, 1, 2), (2, 2, 3), (3, 1, 3), (3, 2, 2), (1, 4, None)],
}


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("drop_last", (False, True))
def test_resume_across_node_counts_is_exact(ds, chain, drop_last):
    """Stopped and resumed on other node counts, twice or more, the same count with another world size among them
    (a position not a multiple of the new global batch): no record lost, none twice but the fill, every rank of a
    phase the same number of batches, and the state says each phase."""
    state, phases, want = None, [], []
    for nodes, local, batches in CHAINS[chain]:
        ids, k, state = _phase(ds, nodes, local, state, batches, drop_last)
        phases.append(ids)
        if batches is not None:
            assert k == batches
        if not want or want[-1][0] != nodes:
            want.append([nodes, 0])
        want[-1][1] += k * B * local
        # A phase on the node count of the last goes on: one segment, further on.
        assert state["segments"][:-1] == want[:-1] and state["segments"][-1][0] == nodes
        if batches is not None:
            assert state["segments"][-1] == want[-1]
    _check_resumed(phases, drop_last)


def test_an_old_state_dict_resumes_on_nodes(ds):
    """A state of a loader from before nodes ({"seed", "epoch", "position"}, one node) goes on exactly on 2 nodes
    of 2 ranks, and a state of one node gains no "segments"."""
    first, k, state = _phase(ds, 1, 4, None, 4, False)
    assert set(state) == {"seed", "epoch", "position", "records"} and state["position"] == k * B * 4
    rest, _, after = _phase(ds, 2, 2, state, None, False)
    assert after["segments"][0] == [1, state["position"]]
    _check_resumed([first, rest], False)
    # And on one node again, as before: the same as the old resume.
    again, _, _ = _phase(ds, 1, 2, state, None, True)
    _check_resumed([first, again], True)


def test_bad_node_options_are_named(ds, monkeypatch):
    with pytest.raises(sluice.SluiceError, match="not a multiple of nodes 2"):
        sluice.Loader(ds, B, rank=0, world_size=3, nodes=2)
    ld = sluice.Loader(ds, B, rank=0, world_size=4, nodes=4)
    too_many = {"seed": 0, "epoch": 0, "position": 0, "segments": [[2, 1], [3, 1]] * 8}
    with pytest.raises(sluice.SluiceError, match="resume on 3 nodes"):
        ld.load_state_dict(too_many)
    ld = sluice.Loader(ds, B, rank=0, world_size=3, nodes=3)
    ld.load_state_dict(too_many)  # on its last phase's node count: that phase goes on
    assert ld.state_dict()["segments"] == [[2, 1], [3, 1]] * 8
    with pytest.raises(ValueError, match="at most 16"):
        ld.load_state_dict({**too_many, "segments": too_many["segments"] + [[2, 1]]})


def test_nodes_from_torchrun_environment(ds, monkeypatch):
    """nodes=None: WORLD_SIZE // LOCAL_WORLD_SIZE as torchrun sets them, a GROUP_RANK that disagrees refused; an
    explicit nodes= wins; without WORLD_SIZE (and torch.distributed), one node."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert "segments" not in sluice.Loader(ds, B, rank=0, world_size=1).state_dict()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("GROUP_RANK", "1")
    assert sluice.Loader(ds, B).state_dict()["segments"] == [[2, 0]]
    assert "segments" not in sluice.Loader(ds, B, nodes=1).state_dict()
    monkeypatch.setenv("GROUP_RANK", "0")
    with pytest.raises(ValueError, match="GROUP_RANK=0"):
        sluice.Loader(ds, B)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.delenv("GROUP_RANK")
    with pytest.raises(ValueError, match="not a multiple of LOCAL_WORLD_SIZE=3"):
        sluice.Loader(ds, B)


def test_a_state_whose_segments_are_not_pairs_is_refused_by_name(ds):
    ld = sluice.Loader(ds, 4, seed=1, rank=0, world_size=1)
    for bad in ([[2, 4, 9]], [[True, 3]], [2, 4], "2,4"):
        with pytest.raises(ValueError, match="segments must be a list of"):
            ld.load_state_dict({"seed": 1, "epoch": 0, "position": 0, "segments": bad})
