"""The loader's promises where peers fail: an epoch stopped mid-way and resumed with another number of ranks
(8 -> 4 -> 16) and another prefetch depth gives exactly the samples that were left, none twice and none lost;
every rank gets the same number of batches, with fewer shards than ranks and sample counts that do not divide,
and no rank waits for another (each rank runs here as its own loader, one after another, so a loader that
needed its peers would hang the test)."""
import json
import os
import subprocess
import sys

import numpy as np
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


def _phase(ds, world, position, batches, seed, drop_last, prefetch, even_batches=True):
    """world ranks from position, each taking `batches` batches (None: to the epoch's end); every rank's ids
    and the position each reports after.  even_batches (here the default): every batch full."""
    ids, counts, positions = [], [], set()
    for r in range(world):
        ld = sluice.Loader(ds, B, seed=seed, rank=r, world_size=world, drop_last=drop_last, prefetch=prefetch,
                           even_batches=even_batches)
        ld.load_state_dict({"seed": seed, "epoch": 0, "position": position})
        got, last = 0, ld.state_dict()
        for b in ld:
            assert len(b["ids"]) == B or not even_batches
            ids += [int(x) for x in b["ids"]]
            got += 1
            last = ld.state_dict()  # saved with the step's checkpoint (once the pass ends: the next epoch's start)
            if batches is not None and got == batches:
                break
        counts.append(got)
        positions.add(last["position"])
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


def test_a_resumed_epoch_ends_as_distributed_sampler_ends_one(tmp_path):
    """Without even_batches, 8 ranks, then 4, then 16 to the end: every record of the epoch once, but at most 15
    (world_size - 1) taken twice by the last batch, which is short and the same size on every rank."""
    n = 1003
    ds = _dataset(tmp_path, n, "6K")
    ids1, _, p1 = _phase(ds, 8, 0, 2, 123, False, prefetch=1, even_batches=False)
    ids2, _, p2 = _phase(ds, 4, p1, 3, 123, False, prefetch=2, even_batches=False)
    ids3, k3, p3 = _phase(ds, 16, p2, None, 123, False, prefetch=8, even_batches=False)
    seen = ids1 + ids2 + ids3
    assert set(seen) == set(range(n)) and len(seen) - n < 16
    assert len(ids3) % 16 == 0 and len(ids3) // 16 == -(-(n - p2) // 16)
    assert p3 == p2 + len(ids3) and p3 - n < 16
    order = _order(ds, 123)
    assert sorted(ids3) == sorted(order[p2:] + order[:p3 - n])


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
for batch in sluice.Loader(ds, 7, seed=3, numpy=True):
    pass
gc.collect()
churn = [np.full(1 << 20, 0xAB, np.uint8) for _ in range(64)]  # memory freed by a closed loader gets reused
ids, n, pad = batch["ids"], batch["n"], batch["pad"]
assert [int(x) for x in n.reshape(-1)] == [int(ds[int(i)]["n"]) for i in ids], (n, ids)
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


def _megatron(prefix, seqs, dtype):
    """A Megatron .bin/.idx pair as MMapIndexedDatasetBuilder writes it (one document a sequence)."""
    import numpy as np
    code = {np.uint16: 8, np.int32: 4, np.int64: 5}[dtype]
    with open(f"{prefix}.bin", "wb") as f:
        for s in seqs:
            f.write(np.asarray(s, dtype).tobytes())
    lens = np.array([len(s) for s in seqs], np.int32)
    ptrs = np.concatenate([[0], np.cumsum(lens[:-1], dtype=np.int64)]).astype(np.int64) * np.dtype(dtype).itemsize
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + np.uint64(1).tobytes() + bytes([code]) + np.uint64(len(seqs)).tobytes() +
                np.uint64(len(seqs) + 1).tobytes() + lens.tobytes() + ptrs.tobytes() +
                np.arange(len(seqs) + 1, dtype=np.int64).tobytes())


def _each_record_by_offsets(ds, field, want, device="cpu"):
    """Every record of an epoch sliced from its batch's (data, offsets) as data[offsets[j]:offsets[j + 1]]:
    the source record, element for element."""
    import numpy as np
    seen = 0
    for b in sluice.Loader(ds, 6, seed=2, rank=0, world_size=1, drop_last=True, device=device,
                              numpy=device == "cpu"):
        data, offs = b[field]
        if device != "cpu":
            data, offs = data.cpu().numpy(), offs.cpu().numpy()
        assert offs[0] == 0 and offs[-1] == len(data)
        for j, i in enumerate(b.ids):
            assert np.array_equal(data[offs[j]:offs[j + 1]], want[int(i)]), (int(i), j)
            seen += 1
    assert seen == len(want) // 6 * 6


SEQS = [[(i * 1000 + k) % 65000 for k in range(i % 13 + 1)] for i in range(97)]


@pytest.mark.parametrize("dtype", ("u16", "i32"))
def test_offsets_index_megatron_tokens(tmp_path, dtype):
    import numpy as np
    t = {"u16": np.uint16, "i32": np.int32}[dtype]
    _megatron(tmp_path / "corpus", SEQS, t)
    _each_record_by_offsets(sluice.Dataset(str(tmp_path / "corpus")), "tokens", [np.array(s, t) for s in SEQS])


def _json_int_lists(tmp_path):
    src = tmp_path / "lists.jsonl"
    src.write_text("".join(json.dumps({"v": [s * 3 - 7 for s in seq]}) + "\n" for seq in SEQS))
    sluice.pack(str(tmp_path / "lists"), jsonl=str(src), fields="v")
    return sluice.Dataset(str(tmp_path / "lists"))


def test_offsets_index_json_integer_lists(tmp_path):
    import numpy as np
    _each_record_by_offsets(_json_int_lists(tmp_path), "v", [np.array([s * 3 - 7 for s in q], np.int64) for q in SEQS])


def test_offsets_index_json_integer_lists_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    import numpy as np
    _each_record_by_offsets(_json_int_lists(tmp_path), "v", [np.array([s * 3 - 7 for s in q], np.int64) for q in SEQS],
                            device="cuda")


CLOSED = """
import sys, numpy as np, sluice
ds = sluice.Dataset(sys.argv[1])
ld = sluice.Loader(ds, 7, seed=3, numpy=True)
batch = next(iter(ld))
ld.close()
churn = [np.full(1 << 20, 0xAB, np.uint8) for _ in range(64)]  # memory freed by a closed loader gets reused
n, pad = batch["n"], batch["pad"]
assert [int(x) for x in n.reshape(-1)] == [int(ds[int(i)]["n"]) for i in batch.ids], (n, batch.ids)
assert bytes(pad[0][pad[1][0]:pad[1][1]]) == bytes(ds[int(batch.ids[0])]["pad"])
for use in (lambda: next(iter(ld)), lambda: len(ld), ld.state_dict, lambda: ld.set_epoch(1)):
    try:
        use()
        raise SystemExit("a closed Loader was used without an error")
    except ValueError as e:
        assert "closed" in str(e), e
ld.close()  # twice: nothing
print("ok")
"""


def test_a_batch_used_after_close_stays_valid(tmp_path):
    """A batch's arrays used after Loader.close(): still the batch's bytes (close leaves the ring to the arrays
    that use it; it segfaulted), and the closed Loader itself raises when used."""
    import sys
    ds = _dataset(tmp_path, 100, "64K")
    r = subprocess.run([sys.executable, "-c", CLOSED, ds.path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def _rows_with_bad_records(tmp_path, n, bad):
    """A pack of n JSON rows whose records in `bad` have their first byte flipped (their CRCs fail)."""
    import ctypes
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"t": "row %d " % i * 5}) + "\n" for i in range(n)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(rows), "--fields", "t", "--quiet", str(tmp_path / "ds")],
                   check=True, capture_output=True)
    ds = sluice.Dataset(str(tmp_path / "ds"))
    for i in bad:
        loc = sluice._lib.RecordLoc()
        sluice._lib.check(sluice.lib.sluice_dataset_locate(ds._h, i, ctypes.byref(loc)))
        name = sorted(f for f in os.listdir(tmp_path / "ds") if f != "index.sli")[loc.shard]
        with open(tmp_path / "ds" / name, "r+b") as f:
            f.seek(loc.offset)
            b = f.read(1)
            f.seek(loc.offset)
            f.write(bytes([b[0] ^ 0xFF]))
    return sluice.Dataset(str(tmp_path / "ds"))


def test_a_batch_of_nothing_but_bad_records_is_not_delivered(tmp_path, capfd):
    """skip_corrupt: a batch whose every record fails its CRC is skipped whole (a model's step on an empty batch
    fails), its records counted; the batches around it arrive whole, in order; the warnings name the first bad
    record of a window read and count the rest (not a line a record). With two ranks the emptied batch is still
    delivered: every rank must take the same number of steps."""
    ds = _rows_with_bad_records(tmp_path, 320, range(64, 128))  # the second batch of 64, in dataset order
    ld = sluice.Loader(ds, batch_size=64, shuffle=False, skip_corrupt=True)
    got = [np.array(b["ids"]) for b in ld]
    assert [len(g) for g in got] == [64, 64, 64, 64]
    assert np.array_equal(np.concatenate(got), np.r_[0:64, 128:320])
    assert ld.stats()["skipped"] == 64
    err = capfd.readouterr().err
    assert "skipping: " in err and "record 64" in err and "skipping 63 more records of window" in err
    # Two lines a window read; the next epoch's first window may be being read ahead (its lines printed, its read
    # not counted yet).
    assert err.count("skipping") <= 2 * (ld.stats()["stages"]["read"]["count"] + 1)
    # With two ranks each takes the same number of steps, an emptied batch included (a collective would wait).
    steps = []
    for rank in range(2):
        ranked = sluice.Loader(ds, batch_size=32, shuffle=False, skip_corrupt=True, rank=rank, world_size=2)
        steps.append([len(b["ids"]) for b in ranked])
    assert len(steps[0]) == len(steps[1]) == len(ranked)
    assert 0 in steps[0] + steps[1] and sum(steps[0]) + sum(steps[1]) == 320 - 64


WINDOWS_SCRIPT = r"""
import sys, sluice
ds = sluice.Dataset(sys.argv[1])
bs, ws, wb, drop = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
seen = []
for r in range(ws):
    ld = sluice.Loader(ds, batch_size=bs, rank=r, world_size=ws, window_bytes=wb, drop_last=drop, seed=1)
    got = [list(map(int, b["ids"])) for b in ld]
    assert len(got) == len(ld), (r, len(got), len(ld))
    seen += [i for b in got for i in b]
print(len(seen), len(set(seen)))
"""


@pytest.mark.parametrize("bs,ws,wb,drop", [(16, 8, 8000, 1), (16, 4, 8000, 1), (10, 2, 1, 0), (3000, 1, 307672, 0)])
def test_a_batch_drawing_on_more_windows_than_its_rank_size_suggests(tmp_path, bs, ws, wb, drop):
    """Each rank reads its share of every window its global batch overlaps, and a batch larger than the dataset
    wraps (one more window each pass): the loader keeps room for all of them instead of waiting forever (found by
    a stranger: 8 ranks of batch 16 over 8-record windows hung at 0% CPU). 300 records of about 1 KB."""
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"text": "x" * 1000, "i": i}) + "\n" for i in range(300)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(rows), "--fields", "text,i", "--quiet", str(tmp_path / "ds")],
                   check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-c", WINDOWS_SCRIPT, str(tmp_path / "ds"), str(bs), str(ws), str(wb),
                        str(drop)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    total, distinct = map(int, r.stdout.split())
    per_global = bs * ws
    assert distinct == (300 // per_global * per_global if drop else 300) and total >= distinct


def test_a_batch_spanning_too_many_windows_is_refused(tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"t": "x" * 100}) + "\n" for i in range(5000)))
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(rows), "--fields", "t", "--quiet", str(tmp_path / "ds")],
                   check=True, capture_output=True)
    with pytest.raises(sluice.SluiceError, match="raise window_bytes"):
        sluice.Loader(sluice.Dataset(str(tmp_path / "ds")), batch_size=5000, window_bytes=1)


def test_an_epoch_of_nothing_but_bad_records_is_an_error_under_skip_corrupt(tmp_path):
    """skip_corrupt leaves bad records out, but an epoch in which every record failed its check is an unreadable
    dataset, not an empty epoch that a training job would take for done (found by a stranger)."""
    ld = sluice.Loader(_rows_with_bad_records(tmp_path, 100, range(100)), batch_size=16, skip_corrupt=True)
    with pytest.raises(sluice.SluiceError, match="every record of epoch 0 this rank read failed its check"):
        for _ in ld:
            pass
    assert ld.stats()["skipped"] >= 100


def test_the_batches_before_a_bad_window_arrive_every_time(tmp_path):
    """A record whose CRC fails is found when its window is read; the batches before the first one drawing on that
    window arrive, every run the same, then the error naming the record (a stranger saw 40 to 64 rows of 64 arrive
    before the error, run to run, when a failed read stopped the whole loader)."""
    ds = _rows_with_bad_records(tmp_path, 400, [300])
    counts, errors = [], set()
    for _ in range(6):
        n = 0
        with pytest.raises(sluice.SluiceError) as e:
            for b in sluice.Loader(ds, batch_size=16, shuffle=False, window_bytes=2000):
                n += len(b.ids)
        counts.append(n)
        errors.add(str(e.value))
    assert len(set(counts)) == 1 and 0 < counts[0] <= 300, counts
    assert len(errors) == 1 and "record 300" in errors.pop()
