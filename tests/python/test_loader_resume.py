"""The loader's promises where peers fail: an epoch stopped mid-way and resumed with another number of ranks
(8 -> 4 -> 16) and another prefetch depth gives exactly the samples that were left, none twice and none lost;
every rank gets the same number of batches, with fewer shards than ranks and sample counts that do not divide,
and no rank waits for another (each rank runs here as its own loader, one after another, so a loader that
needed its peers would hang the test)."""
import json
import subprocess

import pytest

import sluice
from conftest import SLUICE

B = 5  # records per batch per rank


def _dataset(tmp_path, n, shard):
    src = tmp_path / f"in{n}.jsonl"
    src.write_text("".join(json.dumps({"n": i, "pad": "x" * (i % 97)}) + "\n" for i in range(n)))
    out = tmp_path / f"ds{n}"
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,pad", "--shard-size", shard, "--quiet",
                    str(out)], check=True, capture_output=True)
    return sluice.Dataset(str(out))


def _order(ds, seed):
    """The epoch's order of samples: one rank, one sample a batch."""
    return [int(b["ids"][0]) for b in sluice.Loader(ds, 1, seed=seed, rank=0, world_size=1, drop_last=True)]


def _phase(ds, world, position, batches, seed, drop_last, prefetch):
    """world ranks from position, each taking `batches` batches (None: to the epoch's end); every rank's ids
    and the position each reports after."""
    ids, counts, positions = [], [], set()
    for r in range(world):
        ld = sluice.Loader(ds, B, seed=seed, rank=r, world_size=world, drop_last=drop_last, prefetch=prefetch)
        ld.load_state_dict({"seed": seed, "epoch": 0, "position": position})
        got = 0
        for b in ld:
            assert len(b["ids"]) == B
            ids += [int(x) for x in b["ids"]]
            got += 1
            if batches is not None and got == batches:
                break
        counts.append(got)
        positions.add(ld.state_dict()["position"])
    assert len(set(counts)) == 1, f"ranks got {counts} batches"
    assert len(positions) == 1, f"ranks disagree on the position: {positions}"
    return ids, counts[0], positions.pop()


@pytest.mark.parametrize("drop_last", (False, True))
def test_resume_with_other_world_sizes(tmp_path, drop_last):
    """1003 records in 3 shards (fewer than the ranks), batches of 5: 8 ranks take 2 batches each, then 4
    ranks 3 (position 140: not a multiple of the new global batch, 80), then 16 ranks the rest."""
    n = 1003
    ds = _dataset(tmp_path, n, "6K")
    assert len(ds) == n and ds.format == "sluice"
    seed = 123
    order = _order(ds, seed)
    assert sorted(order) == list(range(n))
    ids1, k1, p1 = _phase(ds, 8, 0, 2, seed, drop_last, prefetch=1)
    ids2, k2, p2 = _phase(ds, 4, p1, 3, seed, drop_last, prefetch=2)
    ids3, k3, p3 = _phase(ds, 16, p2, None, seed, drop_last, prefetch=8)
    assert p1 == k1 * B * 8 and p2 == p1 + k2 * B * 4 and p3 == p2 + k3 * B * 16
    seen = sorted(ids1 + ids2 + ids3)
    if drop_last:
        # Positions [0, p3) of the order, the last partial global batch dropped.
        assert seen == sorted(order[:p3]) and n - p3 < B * 16
    else:
        # Every sample once, the last global batch filled from the epoch's start.
        assert p3 >= n and seen == sorted(order + order[:p3 - n])
    # The ranks of each phase got disjoint samples of the order, in its positions.
    assert sorted(ids1) == sorted(order[:p1]) and sorted(ids2) == sorted(order[p1:p2])


@pytest.mark.parametrize("drop_last", (False, True))
def test_fewer_samples_than_a_global_batch(tmp_path, drop_last):
    """7 records, 16 ranks of 5: with drop_last none gets a batch; without, each gets one (records taken more
    than once, the order from its start again), and together they hold every record.  No rank waits."""
    ds = _dataset(tmp_path, 7, "1G")
    ids, k, p = _phase(ds, 16, 0, None, 5, drop_last, prefetch=2)
    if drop_last:
        assert k == 0 and ids == [] and p == 0
    else:
        assert k == 1 and p == 80 and set(ids) == set(range(7)) and len(ids) == 80
        order = _order(ds, 5)
        assert sorted(ids) == sorted(order[i % 7] for i in range(80))
    # A run resumed at or past the end finds the epoch over, on every rank alike.
    _, k2, p2 = _phase(ds, 4, p, None, 5, drop_last, prefetch=2)
    assert k2 == 0 and p2 == p


def test_uninterrupted_epoch_is_the_same(tmp_path):
    """Stopping and resuming changes nothing: the same samples as one run straight through at the last world
    size."""
    ds = _dataset(tmp_path, 1003, "6K")
    straight, _, _ = _phase(ds, 16, 0, None, 9, True, prefetch=4)
    a, _, p = _phase(ds, 8, 0, 3, 9, True, prefetch=4)
    b, _, _ = _phase(ds, 16, p, None, 9, True, prefetch=4)
    assert len(a + b) == len(set(a + b))
    order = _order(ds, 9)
    assert sorted(a + b) == sorted(order[:len(a + b)])
    assert len(straight) == len(set(straight))


KEPT = """
import gc, sys, numpy as np, sluice
ds = sluice.Dataset(sys.argv[1])
for batch in sluice.Loader(ds, 7, seed=3):
    pass
gc.collect()
churn = [np.full(1 << 20, 0xAB, np.uint8) for _ in range(64)]  # memory freed by a closed loader gets reused
ids, n, pad = batch["ids"], batch["n"], batch["pad"]
assert [int(x) for x in n.reshape(-1)] == [int(ds[int(i)]["n"][0]) for i in ids], (n, ids)
assert bytes(pad[0][pad[1][0]:pad[1][1]]) == bytes(ds[int(ids[0])]["pad"])
print("ok")
"""


def test_a_batch_kept_after_the_loop_stays_valid(tmp_path):
    """The arrays of the last batch, used after the loop ended and its Loader was freed: still the ring's bytes
    (they hold the C loader), not freed memory (a segfault, or wrong bytes, before)."""
    import sys
    ds = _dataset(tmp_path, 100, "64K")
    r = subprocess.run([sys.executable, "-c", KEPT, ds.path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
