"""sluice.profile over pipelines built from real situations (no mocks, no timed assertions): the verdict of each,
and that the evidence it gives agrees with it.  GPU situations (pageable copies, a model's step) are in
test_gpu.py's profile tests."""
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
    assert r["wait_thread_cpu_s"] >= 0.7 * r["wait_s"]
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


def test_batches_slow_to_arrive_with_nothing_busy_are_ipc_bound():
    """Batches that take 20 ms to arrive with no CPU and no reads behind them (a hand-over that waits)."""
    def handed():
        for i in range(25):
            time.sleep(0.02)
            yield i
    p = sluice.profile(handed(), file=None)
    for _ in p:
        pass
    r = p.report
    assert r["verdict"] == "ipc-bound", r["evidence"]
    assert r["wait_thread_cpu_s"] < 0.5 * r["wait_s"]


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
    elif r["verdict"] == "cpu-bound":  # the loop's thread busy, or half busy on a machine with no core idle
        busy, cpu = r["wait_thread_cpu_s"] / r["wait_s"], r["cpu"]
        assert busy >= 0.7 or (busy >= 0.35 and cpu["cores"] - cpu["busy_cores"] < 0.5), (busy, cpu)


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
    assert r["verdict"] == "compute-bound" and r["gpu_wait_share"] == r["loader"]["gpu_wait_share"]
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
    with sluice.profile(src, file=None) as p:
        for _ in src:
            pass
        time.sleep(1.0)
    assert p.report["wait_share"] > 0.8 and p.report["seconds"] < 0.8, p.report["evidence"]


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
    assert p.report["verdict"] == "cpu-bound", p.report["evidence"]
    assert "other threads of the loop's process" in p.report["evidence"][1]


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
