"""sluice.profile: the verdict rules on constructed measurements (every rule, and what it must never advise), and
pipelines built from real situations whose verdicts keep a margin that survives a machine whose every core another
job keeps busy (a loading that burns CPU is measured by its CPU and its wait for a core, not by how fast it went).
No assertion on the direction of a timing.  GPU situations (pageable copies, a model's step) are in test_gpu.py's
profile tests."""
import hashlib
import multiprocessing
import os
import time

import numpy as np
import pytest

import sluice


def _burn(seconds):
    """CPU work (hashing) for about `seconds` of this thread's CPU time: a decode or a transform's worth."""
    t = time.thread_time()
    x = np.arange(4096, dtype=np.uint8).tobytes()
    while time.thread_time() - t < seconds:
        x = hashlib.sha256(x).digest() * 128


def _decode(i):
    _burn(0.03)
    return np.full((64, 64), i, np.uint8)


def test_a_cpu_heavy_transform_in_the_loop_is_cpu_bound():
    """No workers, a transform of 30 ms of CPU a batch, a step of 2: the loop's own thread is busy loading."""
    def batches():
        for i in range(30):
            yield _decode(i)
    p = sluice.profile(batches(), file=None)
    for _ in p:
        time.sleep(0.002)
    r = p.report
    assert r["batches"] == 30 and r["verdict"] == "cpu-bound", r["evidence"]
    assert r["wait_thread_cpu_s"] >= 0.9 * 30 * 0.03  # CPU seconds, whatever else the machine runs
    assert any("busy" in e for e in r["evidence"]) and "ms of loading CPU a batch" in r["evidence"][1]
    if r["expected"]:  # idle cores: more workers, a rate above today's that the loop's own work still allows
        assert r["expected"]["workers"] > 1 and r["expected"]["speedup"] > 1


def test_worker_processes_busy_decoding_are_cpu_bound_and_counted():
    """A pool of 2 worker processes decoding (a DataLoader's shape): their CPU is read from /proc, per process."""
    with multiprocessing.get_context("fork").Pool(2) as pool:
        p = sluice.profile(pool.imap(_decode, range(40)), file=None)
        for _ in p:
            pass
    r = p.report
    workers = [x for x in r["processes"] if x["role"] == "worker"]
    assert len(workers) >= 2 and sum(x["cpu_s"] for x in workers) >= 0.5 * 40 * 0.03
    assert r["verdict"] == "cpu-bound", r["evidence"]
    assert "worker processes busy" in r["evidence"][1]


def test_cannot_watch_a_generator_from_outside():
    with pytest.raises(TypeError, match="iterate through the profiler"):
        with sluice.profile(x for x in range(3)):
            pass


def test_a_step_much_longer_than_the_data_is_compute_bound():
    p = sluice.profile(range(20), file=None)
    for _ in p:
        time.sleep(0.02)
    r = p.report
    assert r["verdict"] == "compute-bound" and r["wait_share"] < 0.05 and r["expected"] is None
    assert "keeps up" in r["fix"]


class Restarting:
    """An iterable whose every iteration starts slowly (half a second, like worker processes starting), then
    hands out its batches at once."""

    def __iter__(self):
        time.sleep(0.5)
        return iter(range(10))


def test_workers_starting_every_epoch_are_startup_bound():
    src = Restarting()
    with sluice.profile(src, file=None) as p:
        for epoch in range(3):
            for _ in src:
                time.sleep(0.005)
    r = p.report
    assert r["epochs"] == 3 and r["verdict"] == "startup-bound", r["evidence"]
    assert r["first_batch_wait_s"] >= 0.5 * r["wait_s"] and "persistent_workers" in r["fix"]
    assert isinstance(src, Restarting) and type(src) is Restarting  # the class is given back


def test_batches_slow_to_arrive_with_nothing_busy_are_latency_bound():
    """Batches that take 50 ms to arrive with no CPU and no reads behind them (a fetch a sample): the loop's own
    thread waits, and loading workers would keep several waits in flight (it was called ipc-bound, with no
    hand-over to blame and advice about batch sizes).  50 ms: a crowded machine's wait for a core at each
    wake-up stays a small share of it."""
    def handed():
        for i in range(12):
            time.sleep(0.05)
            yield i
    p = sluice.profile(handed(), file=None)
    for _ in p:
        pass
    r = p.report
    assert r["verdict"] == "latency-bound", r["evidence"]
    assert r["wait_thread_cpu_s"] < 0.5 * r["wait_s"] and "num_workers" in r["fix"]


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_a_cold_folder_of_small_files_read_one_by_one(tmp_path):
    """400 files of 64 KiB, dropped from the page cache, read in shuffled order with no workers: storage- or
    CPU-bound, whichever this machine shows, and the evidence says so."""
    rng = np.random.default_rng(0)
    files = []
    for i in range(400):
        f = tmp_path / f"{i:04d}.bin"
        f.write_bytes(rng.integers(0, 256, 65536, np.uint8).tobytes())
        files.append(f)
    for f in files:
        _evict(f)
    order = rng.permutation(len(files))

    def samples():
        for i in order:
            with open(files[i], "rb") as fh:
                yield np.frombuffer(fh.read(), np.uint8)
    p = sluice.profile(samples(), file=None)
    for _ in p:
        pass
    r = p.report
    assert r["batches"] == 400 and r["verdict"] in ("storage-bound", "cpu-bound", "compute-bound"), r["evidence"]
    st = r["storage"]
    assert st["rchar"] >= 400 * 65536
    if r["verdict"] == "storage-bound":
        assert st["read_bytes"] > 0.5 * st["rchar"] or st["disk_busy_share"] > 0.5
        assert "read from storage" in r["evidence"][-1] and "sluice pack" in r["fix"]
    elif r["verdict"] == "cpu-bound":  # the loop's thread busy, or waiting for a core (page-cache reads: tmpfs)
        assert "the loop's own thread busy" in r["evidence"][1] and "ms of loading CPU a batch" in r["evidence"][1]


def _tiny(tmp_path, n):
    """A dataset of n rows {"a": i}."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"a": {i}}}\n' for i in range(n)))
    sluice.pack(str(tmp_path / "ds"), jsonl=str(rows), fields="a")
    return sluice.Dataset(str(tmp_path / "ds"))


def test_sluice_loader_through_the_profiler(tmp_path):
    ld = sluice.Loader(_tiny(tmp_path, 2000), batch_size=64)
    with sluice.profile(ld, file=None) as p:
        for _ in ld:
            time.sleep(0.01)
    r = p.report
    assert r["batches"] == len(ld) and r["loader"]["batches"] == len(ld)
    # A 10 ms step keeps ahead of this loader on an idle machine; on a crowded one it may not, so the check is that
    # the verdict follows the figures (the rule itself: the test_rule_* tests, on figures given).
    assert r["gpu_wait_share"] == r["loader"]["gpu_wait_share"]
    waited = r["wait_share"] >= 0.05 or r["loader"]["gpu_wait_share"] >= 0.05
    assert r["verdict"] == "compute-bound" or waited, r["evidence"]
    assert type(ld) is sluice.Loader


def test_the_machine_sample_sees_this_process_and_its_children():
    from sluice._lib import MachineSample, lib
    import ctypes
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_burn, [0.05, 0.05])
        s = MachineSample()
        assert lib.sluice_machine_sample(ctypes.byref(s), 0) == 0
        pids = [s.proc[i].pid for i in range(s.nprocs)]
    assert pids[0] == os.getpid() and len(pids) >= 3
    assert s.ncpus >= 1 and s.mem_total > 0 and s.all.busy_s > 0


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch


def test_pageable_copies_of_large_batches_are_transfer_bound():
    """GPU: 64 MB batches in pageable memory copied up in the loop (as without pin_memory): the copy is the loop's
    work, measured against a pinned one of the same size."""
    torch = _torch_cuda()
    torch.cuda.init()
    batches = [torch.randint(0, 255, (64 << 20,), dtype=torch.uint8) for _ in range(2)]
    p = sluice.profile((batches[i % 2] for i in range(30)), file=None)
    for b in p:
        x = b.cuda()
        x.add_(1)
    torch.cuda.synchronize()
    r = p.report
    assert r["verdict"] == "transfer-bound", r["evidence"]
    assert r["pinned"] is False and r["batch_bytes"] == 64 << 20 and "pin_memory=True" in r["fix"]
    assert r["expected"]["step_ms"] < r["step_ms_p50"]


def test_a_gpu_step_much_longer_than_the_data_is_compute_bound():
    torch = _torch_cuda()
    x = torch.zeros(1, device="cuda")
    p = sluice.profile(range(20), file=None)
    for _ in p:
        torch.cuda._sleep(20_000_000)  # ~10 ms of a kernel
        x.add_(1).item()
    r = p.report
    assert r["verdict"] == "compute-bound", r["evidence"]
    assert r["gpu_step_ms_p50"] > 1 and r["wait_share"] < 0.05


def test_a_webdataset_pipeline_watched_from_outside(tmp_path):
    """A WebDataset pipeline, iterated as its users do, inside `with sluice.profile(pipeline)`."""
    wds = pytest.importorskip("webdataset")
    import tarfile
    import io
    with tarfile.open(tmp_path / "shard-0.tar", "w") as t:
        for i in range(50):
            data = bytes([i]) * 1000
            info = tarfile.TarInfo(f"{i:04d}.bin")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    pipeline = wds.WebDataset(str(tmp_path / "shard-0.tar"), shardshuffle=False)
    cls = type(pipeline)
    with sluice.profile(pipeline, file=None) as p:
        got = [s["bin"][0] for s in pipeline]
    assert got == list(range(50)) and p.report["batches"] == 50 and type(pipeline) is cls
    assert len(p.report["timeline"]["batches"]) == 50 and p.report["batch_bytes"] == 1000  # a sample's bytes


class Slow:
    """Batches 20 ms apart, nothing busy behind them."""

    def __iter__(self):
        for i in range(15):
            time.sleep(0.02)
            yield i


def test_time_after_the_loop_is_not_the_pipelines():
    """Work after the loop (a validation, a save) does not dilute the loop's wait (a stranger saw 90% become 4%)."""
    src = Slow()
    t0 = time.perf_counter()
    with sluice.profile(src, file=None) as p:
        for _ in src:
            pass
        loop = time.perf_counter() - t0
        time.sleep(1.0)
    assert p.report["wait_share"] > 0.8 and p.report["seconds"] <= loop, (loop, p.report["evidence"])


def test_a_profile_runs_once_and_gives_the_class_back_in_any_order():
    src = Slow()
    p = sluice.profile(src, file=None)
    list(p)
    with pytest.raises(RuntimeError, match="make another"):
        list(p)
    a, b = sluice.profile(src, file=None), sluice.profile(src, file=None)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # out of order
    b.__exit__(None, None, None)
    assert type(src) is Slow
    with pytest.raises(ValueError, match="interval"):
        sluice.profile(src, interval=0)


class Indexed:
    """Iterable through __getitem__ alone, as a map-style dataset."""

    def __getitem__(self, i):
        if i >= 5:
            raise IndexError(i)
        return i


def test_an_object_iterable_by_index_is_watched_from_outside():
    src = Indexed()
    with sluice.profile(src, file=None) as p:
        got = list(src)
    assert got == [0, 1, 2, 3, 4] and p.report["batches"] == 5 and type(src) is Indexed


def test_a_loader_closed_inside_the_block_still_reports(tmp_path):
    ld = sluice.Loader(_tiny(tmp_path, 200), batch_size=32)
    with sluice.profile(ld, file=None) as p:
        for _ in ld:
            pass
        ld.close()
    assert p.report["batches"] == 7 and p.report["loader"]["batches"] == 7


def test_loading_in_a_thread_of_the_loop_is_cpu_bound():
    """Batches made by a thread of the loop's process (a prefetcher) busy decoding: its CPU counts as the loading's
    (a stranger saw it called ipc-bound with 0 ms of loading CPU)."""
    import queue
    import threading
    q = queue.Queue(maxsize=2)

    def make():
        for i in range(25):
            q.put(_decode(i))
        q.put(None)
    threading.Thread(target=make, daemon=True).start()

    def batches():
        while (b := q.get()) is not None:
            yield b
    p = sluice.profile(batches(), file=None)
    for _ in p:
        pass
    r = p.report
    # Its CPU is the loading's, whatever the machine runs; the verdict only where the machine leaves it the cores
    # (a thread waits for the GIL, which no count shows: test_rule_a_thread_of_the_loops_process_loading_...).
    assert "other threads of the loop's process" in r["evidence"][1], r["evidence"]
    assert 1e3 * 0.9 * 0.03 <= float(r["evidence"][1].split("; ")[1].split(" ms")[0]), r["evidence"]
    if r["cpu"]["busy_cores"] < r["cpu"]["cores"] - 1.5:
        assert r["verdict"] == "cpu-bound", r["evidence"]


def test_a_sluice_loader_whose_threads_are_busy_is_loader_bound_not_short_of_workers():
    """A sluice.Loader's threads busy (the loop's process's other threads) while the loop waits: the loader is the
    limit, and the fix is its own stages, never "more workers" (it has none to add)."""
    from sluice.profiler import _verdict
    r = {"batches": 32, "seconds": 1.0, "wait_s": 0.4, "wait_share": 0.4, "first_batch_wait_s": 0.01, "epochs": 1,
         "wait_ms_p50": 12.0, "step_ms_p50": 18.0, "batch_bytes": 0, "pinned": True, "on_gpu": False,
         "wait_thread_cpu_s": 0.0, "loop_thread_cpu_s": 0.5,
         "processes": [{"role": "main", "cpu_s": 3.3, "alive_s": 1.0}], "cpu": {"cores": 16, "busy_cores": 3.0},
         "storage": {}, "loader": {"verdict": "compute-bound", "step_us": 18000, "loader_us": 5000, "h2d_us": 0}}
    v = _verdict(r)
    assert v["verdict"] == "loader-bound" and "loader.stats()" in v["fix"] and "workers" not in v["fix"], v
    r.pop("loader")  # the same figures from a loop over some other iterable: its threads are the loading
    assert _verdict(r)["verdict"] == "cpu-bound"


# ---- the verdict rules, on constructed measurements (what a profile's report holds, made up to the point)

def _measured(batches=100, seconds=10.0, wait_s=8.0, step_ms=2.0, workers=(), others=(), known=True, cores=16,
              busy_cores=4.0, epochs=1, first_wait_s=0.1, restart_s=0.0, steady=None, loader=None, dataloader=None,
              storage=None, iowait=0.0, thread_cpu_s=0.0, thread_runq_s=None):
    """A report's figures: workers and others are (busy share, run-queue share) of a process alive the whole
    window; steady is the steady state's (batches, seconds, wait_s), by default the run less its first batch."""
    procs = [{"pid": 1, "name": "python", "role": "main", "cpu_s": 1.0, "alive_s": seconds, "busy_share": 0.1,
              "runq_s": 0.0, "read_bytes": 0, "rchar": 0}]
    for i, (b, q) in enumerate(workers):
        procs.append({"pid": 10 + i, "name": "pt_worker", "role": "worker", "cpu_s": b * seconds, "alive_s": seconds,
                      "busy_share": b, "runq_s": None if q is None else q * seconds, "read_bytes": 0, "rchar": 0})
    for i, (b, q) in enumerate(others):
        procs.append({"pid": 100 + i, "name": "evaluator", "role": "other" if known else "worker",
                      "cpu_s": b * seconds, "alive_s": seconds, "busy_share": b, "runq_s": q * seconds,
                      "read_bytes": 0, "rchar": 0})
    sb, ss, sw = steady or (batches - epochs, seconds - first_wait_s - restart_s, wait_s - first_wait_s - restart_s)
    return {"batches": batches, "seconds": seconds, "wait_s": wait_s, "wait_share": wait_s / seconds,
            "first_batch_wait_s": first_wait_s + restart_s, "epochs": epochs, "wait_ms_p50": 1e3 * sw / sb,
            "step_ms_p50": step_ms, "batch_bytes": 1 << 20, "pinned": True, "on_gpu": False,
            "wait_thread_cpu_s": thread_cpu_s, "loop_thread_cpu_s": 1.0, "workers_known": known and bool(workers),
            "dataloader": dataloader, "loader": loader, "processes": procs, "workers_max": len(workers),
            "window_s": seconds, "cpu": {"cores": cores, "busy_cores": busy_cores, "iowait_cores": iowait},
            "storage": storage or {"read_bytes": 0, "rchar": 0, "disk_busy_share": 0.0, "read_wait_s": 0.0},
            "network": {"rx_bytes_s": 0.0},
            "steady": {"batches": sb, "seconds": ss, "wait_s": sw, "wait_share": sw / ss, "left_out": batches - sb,
                       "startup_wait_s": first_wait_s, "restart_wait_s": restart_s, "wait_thread_cpu_s": thread_cpu_s,
                       "wait_runq_s": thread_runq_s, "loop_thread_cpu_s": 1.0, "loop_thread_runq_s": 0.0}}


def _rule(**kw):
    from sluice.profiler import _verdict
    r = _measured(**kw)
    r.update(_verdict(r))
    return r


DL = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False}


def test_rule_workers_waiting_on_a_fetch_are_latency_bound_and_counted():
    """Two DataLoader workers at 3% of a core each, the loop waiting 80%: each waits on a fetch a sample.  They are
    the workers (named by the DataLoader, busy or not), and more of them is the fix, with its prediction (the
    verdict was ipc-bound, "(no workers)", with advice about batch sizes; 8 workers were 3.4x faster than 2)."""
    r = _rule(workers=[(0.03, 0.0)] * 2, dataloader=DL)
    assert r["verdict"] == "latency-bound", r["evidence"]
    assert "2 worker processes busy 3% of a core each" in r["evidence"][1] and "no workers" not in r["evidence"][1]
    assert "more workers" in r["fix"] and r["expected"]["workers"] > 2 and r["expected"]["speedup"] > 1
    from sluice.profiler import predict_rate
    rate = r["steady"]["batches"] / r["steady"]["seconds"]
    assert abs(predict_rate(r, 4) - 2 * rate) < 1e-9 * rate  # twice the waits in flight: twice the batches
    assert predict_rate(r, 64) <= 1e3 / r["step_ms_p50"]  # never faster than the loop's own work


def test_rule_a_busy_child_that_is_not_a_worker_is_not_the_loading():
    """A child of the script's busy a whole core (an evaluator, a logger) beside two idle DataLoader workers: not
    cpu-bound (it was counted as a loading worker), and the evidence names it for what it is."""
    r = _rule(workers=[(0.03, 0.0)] * 2, others=[(1.0, 0.0)], dataloader=DL)
    assert r["verdict"] == "latency-bound", r["evidence"]
    assert any("process 100 (evaluator) busy 1.00 cores" in e and "not one of the loading workers" in e
               for e in r["evidence"])
    # An iterable that names no workers: every child that works is taken for one, as before.
    assert _rule(others=[(1.0, 0.0)], known=False)["verdict"] == "cpu-bound"


def test_rule_one_epochs_start_up_is_not_startup_bound():
    """16 workers, one epoch: the first batch waited most of the run while the workers started, and the steady
    state after it is CPU-bound.  persistent_workers cannot help a run of one epoch: never advised; the start-up
    is evidence, the verdict the steady state's (it was startup-bound: persistent_workers=True)."""
    dl = {"num_workers": 16, "prefetch_factor": 2, "persistent_workers": False}
    r = _rule(batches=50, seconds=20.0, wait_s=14.0, first_wait_s=12.0, steady=(18, 6.0, 2.0),
              workers=[(0.95, 0.0)] * 16, cores=16, busy_cores=15.8, dataloader=dl)
    assert r["verdict"] == "cpu-bound", r["evidence"]
    assert "persistent_workers" not in r["fix"]
    start = [e for e in r["evidence"] if e.startswith("start-up:")]
    assert start and "its one epoch" in start[0] and "waited 12.00 s" in start[0] and "18 batches" in start[0]
    assert "3.0 batches/s, 0.01x the 500.0 batches/s its own work allows" in start[0]  # the steady rate, and the step's
    # Its steady state keeping up: compute-bound, whatever the start-up cost.
    r = _rule(batches=50, seconds=20.0, wait_s=12.1, first_wait_s=12.0, steady=(18, 6.0, 0.1),
              workers=[(0.5, 0.0)] * 16, dataloader=dl)
    assert r["verdict"] == "compute-bound" and "persistent_workers" not in r["fix"]


def test_rule_workers_starting_again_each_epoch_are_startup_bound_only_where_keeping_them_helps():
    kw = dict(batches=300, seconds=30.0, wait_s=10.0, epochs=3, first_wait_s=3.0, restart_s=6.0,
              steady=(297, 21.0, 1.0), workers=[(0.5, 0.0)] * 2)
    r = _rule(dataloader=DL, **kw)
    assert r["verdict"] == "startup-bound" and "persistent_workers=True" in r["fix"], r["evidence"]
    assert r["expected"]["seconds"] < r["seconds"]
    for dl in ({**DL, "persistent_workers": True}, {**DL, "num_workers": 0}):  # nothing to keep
        assert _rule(dataloader=dl, **kw)["verdict"] != "startup-bound"
    assert _rule(loader={"verdict": "compute-bound", "step_us": 2000}, **kw)["verdict"] != "startup-bound"
    r = _rule(**kw)  # an iterable that does not say what it is: the advice says what it would be for a DataLoader
    assert r["verdict"] == "startup-bound" and "keep its workers" in r["fix"]


def test_rule_another_jobs_disk_traffic_is_not_storage_bound():
    """The disks busy and cores in iowait, but the loop's processes read nothing from storage, or a few pages of a
    crowded machine's: another job's reads (a test of 663 failed this way on a busy machine)."""
    busy_disk = {"read_bytes": 0, "rchar": 50 << 20, "disk_busy_share": 0.9, "read_wait_s": 30.0,
                 "disk_read_bytes_s": 100e6}
    for mine in (0, 64 << 10):
        r = _rule(workers=[(0.03, 0.0)] * 2, dataloader=DL, storage={**busy_disk, "read_bytes": mine,
                                                                      "rchar": mine // 2}, iowait=1.5)
        assert r["verdict"] == "latency-bound", (mine, r["evidence"])
    # The loop's own reads, all of what the disks read (50 MB over the 10 s), their time most of the wait.
    own = {"read_bytes": 50 << 20, "rchar": 50 << 20, "disk_busy_share": 0.2, "read_wait_s": 7.0,
           "disk_read_bytes_s": 5.3e6}
    r = _rule(workers=[(0.03, 0.0)] * 2, dataloader=DL, storage=own)
    assert r["verdict"] == "storage-bound" and "sluice pack" in r["fix"], r["evidence"]
    r = _rule(workers=[(0.03, 0.0)] * 2, dataloader=DL, storage={**own, "read_wait_s": 0.1, "disk_busy_share": 0.9})
    assert r["verdict"] == "storage-bound"  # its reads keep the disk busy


def test_rule_loading_starved_of_cores_is_cpu_bound():
    """Workers running 40% of the time and waiting for a core 55% (other work takes the cores): CPU-bound, and the
    evidence says they queued; more workers are not advised on a machine with no core idle."""
    r = _rule(workers=[(0.40, 0.55)] * 2, cores=2, busy_cores=2.0, dataloader=DL)
    assert r["verdict"] == "cpu-bound", r["evidence"]
    assert "55% more waiting for a free core" in r["evidence"][1] and "more workers" not in r["fix"]
    # Workers asleep instead (3% busy), queued at each wake-up on a crowded machine (40%): latency-bound.
    assert _rule(workers=[(0.03, 0.40)] * 2, cores=2, busy_cores=2.0, dataloader=DL)["verdict"] == "latency-bound"
    # Where the kernel keeps no run-queue count: half busy with no core idle is CPU-bound, as before.
    assert _rule(workers=[(0.40, None)] * 2, cores=2, busy_cores=2.0, dataloader=DL)["verdict"] == "cpu-bound"
    # No workers: the loop's own thread, 30% running and 65% queued in its waits.
    r = _rule(thread_cpu_s=0.30 * 7.9, thread_runq_s=0.65 * 7.9, cores=2, busy_cores=2.0)
    assert r["verdict"] == "cpu-bound" and "the loop's own thread busy 30%" in r["evidence"][1], r["evidence"]


def test_rule_a_thread_of_the_loops_process_loading_is_cpu_bound():
    """A prefetching thread of the loop's process: its CPU is the process's less the loop's thread's and the
    profile's own sampler's; busy, or waiting for a core on a machine with none idle, it is CPU-bound."""
    r = _measured(cores=2, busy_cores=2.0)
    r["processes"][0].update(cpu_s=3.5, runq_s=5.0)  # the process: loop 1.0 s, sampler 0.2 s, the thread 2.3 s
    r["sampler"] = {"cpu_s": 0.2, "runq_s": 0.1}
    r["steady"]["loop_thread_runq_s"] = 0.4
    from sluice.profiler import _verdict
    v = _verdict(r)
    assert v["verdict"] == "cpu-bound", v["evidence"]
    assert "other threads of the loop's process busy 0.23 cores" in v["evidence"][1] and "45% more" in v["evidence"][1]
    r["processes"][0].update(cpu_s=1.2005, runq_s=0.5)  # the sampler's own work alone: not a loading thread
    assert "other threads" not in _verdict(r)["evidence"][1]


def test_rule_the_loops_thread_busy_taking_batches_over_is_ipc_bound():
    r = _rule(workers=[(0.2, 0.0)] * 4, thread_cpu_s=0.8 * 7.9, dataloader={**DL, "num_workers": 4})
    assert r["verdict"] == "ipc-bound" and "taking the batches over" in r["evidence"][-1], r["evidence"]


def test_rule_a_steady_state_that_keeps_up_is_compute_bound():
    r = _rule(wait_s=3.0, first_wait_s=2.95, steady=(99, 7.0, 0.05))
    assert r["verdict"] == "compute-bound" and r["expected"] is None
    assert r["evidence"][-1].startswith("start-up:")
    # Waits that were mostly the loop's own thread queued for a core (a crowded machine preempted it inside next()):
    # not waits for data.
    r = _rule(wait_s=1.0, first_wait_s=0.01, steady=(99, 9.0, 0.99), thread_runq_s=0.9, cores=2, busy_cores=2.0)
    assert r["verdict"] == "compute-bound", r["evidence"]
    assert any("91% of the steady state's waits was the loop's own thread waiting for a free core" in e
               for e in r["evidence"])


def test_a_batch_whose_nbytes_raises_is_still_profiled():
    """A batch type whose nbytes raises (a lazy array, a proxy): its size is not known, the loop goes on."""
    class Lazy:
        @property
        def nbytes(self):
            raise RuntimeError("not materialised")

    class Items(dict):
        def values(self):
            raise ValueError("no values")
    p = sluice.profile([Lazy(), Items(a=1), [Lazy(), b"xy"], np.zeros(8)] * 5, file=None)
    assert len(list(p)) == 20 and p.report["batches"] == 20


def _sleep(i):
    time.sleep(0.05)  # a fetch a sample: the worker waits, its CPU idle
    return i


def _spin(stop):
    while not stop.is_set():
        pass


def test_pool_workers_waiting_are_workers_and_a_busy_child_is_not():
    """A Pool whose workers wait 50 ms a sample (named by the pool, so counted however idle) beside a child of the
    script's that burns a core: the workers are exactly the pool's, the child is "other", and the verdict is not
    cpu-bound on its account (as it was: a busy child was a loading worker)."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    busy = ctx.Process(target=_spin, args=(stop,), daemon=True)
    busy.start()
    try:
        with ctx.Pool(2) as pool:
            pids = {w.pid for w in pool._pool}
            p = sluice.profile(pool.imap(_sleep, range(30)), file=None)
            for _ in p:
                pass
    finally:
        stop.set()
        busy.join()
    r = p.report
    roles = {x["pid"]: x["role"] for x in r["processes"]}
    assert {pid for pid, role in roles.items() if role == "worker"} <= pids and roles.get(busy.pid) == "other"
    assert r["workers_known"] and r["verdict"] == "latency-bound", r["evidence"]
    assert "more workers" in r["fix"]
