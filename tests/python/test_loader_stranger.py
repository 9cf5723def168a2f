"""sluice.Loader and sluice.Dataset as a stranger uses them (issue #53's DataLoader contract, attacked): what an ML
engineer plausibly writes, and hostile scripts, beyond what test_dataloader_contract.py holds.  The defects this
attack found are held where their fixes are (the contract suite, test_images.py's transform tests)."""
import collections
import copy
import gc
import json
import os
import pickle
import subprocess

import numpy as np
import pytest

import sluice
from conftest import SLUICE


def _pack(tmp, name, n):
    src = tmp / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"n": i, "f": i / 2, "t": "x" * (i % 7)}) + "\n" for i in range(n)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(src), "--fields", "n,f,t", "--shard-size", "8K", "--quiet",
                    str(tmp / name)], check=True, capture_output=True)
    return str(tmp / name)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """1000 records in 5 shards: n (its number), f (n / 2), t ("x" * (n % 7))."""
    return _pack(tmp_path_factory.mktemp("stranger"), "ds", 1000)


def _n(b):
    return [int(v) for v in b["n"]]


def test_views_slices_and_copies_of_held_fields_keep_their_values(path):
    """Only a slice, a .view(), np.asarray, a memoryview, the data of a ragged field, copy/deepcopy/pickle of the
    batch kept while the batch dict goes: each keeps its values over the pass."""
    torch = pytest.importorskip("torch")
    ld = sluice.Loader(path, batch_size=10, shuffle=True, prefetch=2)
    kept = []
    for b in ld:
        ids = [int(i) for i in b.ids]
        kept.append((ids, b["n"][2:5], b["f"].view(torch.int64), np.asarray(b["n"]), memoryview(b["n"].numpy()),
                     b["t"][0], copy.deepcopy(b), pickle.loads(pickle.dumps(b))))
    gc.collect()
    for ids, sl, v, a, m, t, dc, pk in kept:
        assert sl.tolist() == ids[2:5] and v.view(torch.float64).tolist() == [i / 2 for i in ids]
        assert a.tolist() == ids and list(np.frombuffer(m, np.int64)) == ids
        assert bytes(t.numpy()) == b"".join(b"x" * (i % 7) for i in ids)
        assert _n(dc) == ids and _n(pk) == ids and list(dc.ids) == ids


def test_batches_held_and_dropped_by_other_threads_in_cycles_keep_their_values(path):
    """Four threads take batches from the loop, keep random numbers of them, drop some into reference cycles and
    gc.collect() at odd times: every batch checked when let go equals what it held when it came."""
    import queue
    import random
    import threading
    ld = sluice.Loader(path, batch_size=4, shuffle=True, prefetch=3, numpy=True)
    q, bad = queue.Queue(maxsize=64), []

    def worker(seed):
        rng, local = random.Random(seed), []
        while (item := q.get()) is not None:
            local.append(item)
            rng.shuffle(local)
            while len(local) > rng.randint(0, 20):
                b, want = local.pop()
                if _n(b) != want or [int(i) for i in b.ids] != want:
                    bad.append(want)
                if rng.random() < 0.3:
                    cycle = {"b": b}
                    cycle["self"] = cycle
                del b
                if rng.random() < 0.05:
                    gc.collect()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for k, b in zip(range(3000), (b for _ in range(20) for b in ld)):
        q.put((b, _n(b)))
    del b
    for t in threads:
        q.put(None)
    for t in threads:
        t.join()
    gc.collect()
    assert not bad and ld.stats()["held_bytes"] == 0


def test_batches_held_across_set_epoch_resume_and_close_keep_their_values(path):
    ld = sluice.Loader(path, batch_size=16, shuffle=True, prefetch=2, numpy=True)
    kept = []
    for rep in range(6):
        it = iter(ld)
        kept += [(b, _n(b), b["t"][0].copy()) for b in (next(it) for _ in range(5))]
        if rep % 3 == 0:
            ld.set_epoch(rep)
        else:
            ld.load_state_dict(ld.state_dict() if rep % 3 == 1 else {"seed": 0, "epoch": 7, "position": 100})
        kept += [(b, _n(b), b["t"][0].copy()) for k, b in zip(range(30), ld) if k % 4 == 0]
    it = iter(ld)
    next(it)
    ld.close()
    gc.collect()
    assert all(_n(b) == n == [int(i) for i in b.ids] and np.array_equal(b["t"][0], t) for b, n, t in kept)
    with pytest.raises(ValueError, match="closed"):
        next(it)


# --- hold_bytes ----------------------------------------------------------------------------------------------------

def test_a_hold_bytes_below_a_batch_fails_at_once_or_never(path):
    """The usual loop over epochs under a hold_bytes below one batch: the loop's variable holds the last batch of a
    pass as the next begins, which the ring no longer needs back first (it failed at the second pass)."""
    try:
        ld = sluice.Loader(path, batch_size=10, shuffle=True, hold_bytes=1000)
    except ValueError as e:
        assert "hold_bytes" in str(e)
        return
    for _ in range(2):
        for b in ld:
            pass


def test_the_pass_after_a_hold_bytes_error_is_whole(path):
    """list(loader) past hold_bytes raises naming it; the batches it gave keep their values, and once they go the
    next pass is a whole epoch."""
    ld = sluice.Loader(path, batch_size=10, shuffle=True, numpy=True, hold_bytes=20000)
    kept = []
    with pytest.raises(sluice.SluiceError, match="hold_bytes of 20000"):
        for b in ld:
            kept.append((b, _n(b)))
    assert kept and all(_n(b) == n for b, n in kept)
    del kept, b
    gc.collect()
    assert ld.stats()["held_bytes"] == 0 and sorted(i for b in ld for i in _n(b)) == list(range(1000))


def test_a_state_at_any_step_resumes_to_the_uninterrupted_run(path):
    """state_dict() after k batches of epoch 1 (k = 0 .. 16, the end), loaded into a new loader: the rest of epoch 1
    then epoch 2, record for record as one loader gives them; and between ranks of other world sizes."""
    kw = dict(batch_size=64, shuffle=True, seed=3, numpy=True)
    ref = sluice.Loader(path, **kw)
    ref = [[i for b in ref for i in _n(b)] for _ in range(3)]
    for k in range(17):
        ld = sluice.Loader(path, **kw)
        for _ in ld:
            pass
        it, seen = iter(ld), []
        for _ in range(k):
            seen += _n(next(it))
        r = sluice.Loader(path, **kw)
        r.load_state_dict(ld.state_dict())
        assert seen + [i for b in r for i in _n(b)] == ref[1] and [i for b in r for i in _n(b)] == ref[2], k
    for w0, b0, k, w1, b1 in [(2, 64, 3, 4, 64), (4, 7, 5, 3, 11), (3, 100, 3, 5, 1)]:
        seen, after = [], []
        for r in range(w0):
            ld = sluice.Loader(path, batch_size=b0, rank=r, world_size=w0, shuffle=True, seed=9, numpy=True)
            it = iter(ld)
            seen += [i for _ in range(k) for i in _n(next(it))]
        for r in range(w1):
            lr = sluice.Loader(path, batch_size=b1, rank=r, world_size=w1, shuffle=True, seed=9, numpy=True)
            lr.load_state_dict(ld.state_dict())
            after += [i for b in lr for i in _n(b)]
        c = collections.Counter(seen + after)
        assert set(c) == set(range(1000)) and sum(c.values()) - 1000 < max(w0, w1)


# --- resources -----------------------------------------------------------------------------------------------------

def test_many_loaders_and_passes_leave_no_threads(path):
    def threads():
        return len(os.listdir("/proc/self/task"))

    gc.collect()
    before = threads()
    for k in range(30):
        ld = sluice.Loader(path, batch_size=10, shuffle=True, numpy=True, transform=(lambda b: None) if k % 2 else None)
        for b in ld:
            pass
        next(iter(ld))
        ld.set_epoch(k)
    kept = [next(iter(sluice.Loader(path, batch_size=10, numpy=True))) for _ in range(10)]
    assert [_n(b) for b in kept] == [list(range(10))] * 10
    del ld, b, kept
    gc.collect()
    assert threads() == before
