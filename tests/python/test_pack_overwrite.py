"""sluice.pack(overwrite=True) and `sluice pack --overwrite` replace a dataset whole, or not at all: the new one is
written beside the old and swapped in by one rename. A directory that is not a sluice dataset is refused by name,
and left as it was. `sluice pack --overwrite` killed (SIGKILL, from outside) while it writes its shards, or at any
moment, leaves the old dataset or the new one whole. (tests/unit/t_pack.c kills it before each of its file system
steps in turn.)"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import sluice
from conftest import SLUICE


def _jsonl(path, tag, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"v": f"{tag}-{i}"}) + "\n")
    return str(path)


def _which(path, **counts):
    """The tag whose records (counts[tag] of "TAG-i", in order) path holds whole; None where it does not."""
    try:
        ds = sluice.Dataset(str(path))
    except sluice.SluiceError:
        return None
    for tag, n in counts.items():
        if len(ds) == n and all(bytes(ds[i]["v"]) == f"{tag}-{i}".encode() for i in range(n)):
            return tag
    return None


def _staging(parent):
    return [n for n in os.listdir(parent) if ".sluice-new-" in n]


def test_overwrite_replaces_the_dataset_whole(tmp_path):
    a, b = _jsonl(tmp_path / "a.jsonl", "a", 500), _jsonl(tmp_path / "b.jsonl", "b", 90)
    out = tmp_path / "ds"
    sluice.pack(str(out), jsonl=a, fields="v", shard_size=8 << 10)
    with pytest.raises(sluice.SluiceError, match="already holds a dataset.*overwrite"):
        sluice.pack(str(out), jsonl=b, fields="v")
    assert _which(out, a=500, b=90) == "a"
    sluice.pack(str(out), jsonl=b, fields="v", overwrite=True)
    assert _which(out, a=500, b=90) == "b" and sorted(os.listdir(out)) == ["index.sli", "shard-000000.sls"]
    assert _staging(tmp_path) == []
    # A dataset packed over itself (here: compressed), read whole before the swap.
    sluice.pack(str(out), dataset=str(out), zstd=3, overwrite=True)
    info = json.loads(subprocess.run([SLUICE, "inspect", "--json", str(out)], capture_output=True, text=True,
                                     timeout=60, check=True).stdout)
    assert _which(out, b=90) == "b" and info["compression"] == "zstd"


def test_the_command_overwrites_too(tmp_path):
    a, b = _jsonl(tmp_path / "a.jsonl", "a", 50), _jsonl(tmp_path / "b.jsonl", "b", 60)
    out = str(tmp_path / "ds")
    run = lambda *args: subprocess.run([SLUICE, "pack", *args, "--quiet", out], capture_output=True, text=True,
                                       timeout=120)
    assert run("--from-jsonl", a, "--fields", "v").returncode == 0
    r = run("--from-jsonl", b, "--fields", "v")
    assert r.returncode != 0 and "--overwrite" in r.stderr, r.stderr
    r = run("--from-jsonl", b, "--fields", "v", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert _which(out, a=50, b=60) == "b"


def test_parquet_overwrites_through_the_python_writer(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    for tag, n in (("a", 40), ("b", 30)):
        pq.write_table(pa.table({"v": [f"{tag}-{i}" for i in range(n)]}), str(tmp_path / f"{tag}.parquet"))
    out = str(tmp_path / "ds")
    sluice.pack(out, parquet=str(tmp_path / "a.parquet"))
    with pytest.raises(sluice.SluiceError, match="already holds"):
        sluice.pack(out, parquet=str(tmp_path / "b.parquet"))
    sluice.pack(out, parquet=str(tmp_path / "b.parquet"), overwrite=True)
    assert _which(out, a=40, b=30) == "b"
    r = subprocess.run([SLUICE, "pack", "--from-parquet", str(tmp_path / "a.parquet"), "--overwrite", "--json", out],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "SLUICE_PYTHON": sys.executable})
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 40, r.stderr
    assert _which(out, a=40, b=30) == "a" and _staging(tmp_path) == []


def test_what_is_no_sluice_dataset_is_refused_by_name_and_kept(tmp_path):
    b = _jsonl(tmp_path / "b.jsonl", "b", 10)
    photos = tmp_path / "photos"
    (photos / "cat").mkdir(parents=True)
    (photos / "cat" / "1.jpg").write_bytes(b"\xff\xd8 not much of a photo")
    with pytest.raises(sluice.SluiceError, match="photos holds 'cat'"):
        sluice.pack(str(photos), jsonl=b, fields="v", overwrite=True)
    assert (photos / "cat" / "1.jpg").read_bytes().startswith(b"\xff\xd8")
    with pytest.raises(sluice.SluiceError, match="b.jsonl is a regular file"):
        sluice.pack(b, jsonl=b, fields="v", overwrite=True)
    # A WebDataset or Megatron dataset is no sluice dataset either.
    (tmp_path / "wds").mkdir()
    (tmp_path / "wds" / "train-000000.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(sluice.SluiceError, match="train-000000.tar"):
        sluice.pack(str(tmp_path / "wds"), jsonl=b, fields="v", overwrite=True)
    assert _staging(tmp_path) == []
    # What a killed pack left (shards without their index) is a sluice dataset's, and is replaced.
    (tmp_path / "left").mkdir()
    (tmp_path / "left" / "shard-000000.sls").write_bytes(b"\0" * 4096)
    (tmp_path / "left" / ".entries.tmp").write_bytes(b"")
    sluice.pack(str(tmp_path / "left"), jsonl=b, fields="v", overwrite=True)
    assert _which(tmp_path / "left", b=10) == "b"


def test_a_reader_of_the_old_dataset_never_takes_the_new_ones_records(tmp_path):
    """Records the same size, so every offset of the old index lands on a record of the new shards: each read
    fails its CRC, naming the record, rather than returning the new one's bytes as the old one's."""
    a, b = _jsonl(tmp_path / "a.jsonl", "a", 300), _jsonl(tmp_path / "b.jsonl", "b", 300)
    out = str(tmp_path / "ds")
    sluice.pack(out, jsonl=a, fields="v", shard_size=8 << 10)
    old = sluice.Dataset(out)
    sluice.pack(out, jsonl=b, fields="v", shard_size=8 << 10, overwrite=True)
    with pytest.raises(sluice.SluiceError, match="CRC"):
        old[250]
    with pytest.raises(sluice.SluiceError, match="CRC"):
        for _ in sluice.Loader(old, batch_size=50):
            pass
    assert _which(out, b=300) == "b"


def _shards_beside(parent):
    return sum(1 for d in _staging(parent) for n in os.listdir(parent / d) if n.endswith(".sls"))


# A child packing B over A with overwrite=True, which kills itself (SIGKILL) from its progress callback once
# argv[4] lines are packed: the pack's state after that many records, whatever the machine's speed.
KILLED_AT = """
import os, signal, sys, sluice
def progress(done, total, nbytes):
    if done >= int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
sluice.pack(sys.argv[1], jsonl=sys.argv[2], fields="v", shard_size=int(sys.argv[3]), overwrite=True,
            progress=progress)
"""


@pytest.mark.parametrize("lines", [10000, 20000, 30000])
def test_killed_after_n_shards_leaves_the_old_dataset_whole(tmp_path, lines):
    a, b = _jsonl(tmp_path / "a.jsonl", "a", 300), _jsonl(tmp_path / "b.jsonl", "b", 40000)
    out = tmp_path / "ds"
    sluice.pack(str(out), jsonl=a, fields="v")
    r = subprocess.run([sys.executable, "-c", KILLED_AT, str(out), b, "2048", str(lines)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert _shards_beside(tmp_path) >= lines // 200  # killed with shards written beside: 2 KiB is ~120 records
    assert _which(out, a=300, b=40000) == "a"
    # The next overwrite takes the path and removes what the killed one left beside it.
    sluice.pack(str(out), jsonl=b, fields="v", overwrite=True)
    assert _which(out, a=300, b=40000) == "b" and _staging(tmp_path) == []


def test_killed_at_random_moments_leaves_one_dataset_whole(tmp_path):
    """`sluice pack --overwrite` killed from outside at a random moment of its run, each round: the path holds A
    or B whole (which one depends on the moment), and the next overwrite there removes what the kill left."""
    rng = random.Random(17)
    a, b = _jsonl(tmp_path / "a.jsonl", "a", 3000), _jsonl(tmp_path / "b.jsonl", "b", 20000)
    seen = []
    for k in range(8):
        parent = tmp_path / f"r{k}"
        parent.mkdir()
        out = str(parent / "ds")
        sluice.pack(out, jsonl=a, fields="v", shard_size=16 << 10)
        p = subprocess.Popen([SLUICE, "pack", "--from-jsonl", b, "--fields", "v", "--shard-size", "16K", "--overwrite",
                              "--quiet", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait()
        got = _which(out, a=3000, b=20000)
        assert got in ("a", "b"), (k, p.returncode, os.listdir(parent), p.stderr.read()[-2000:])
        seen.append(got)
        sluice.pack(out, jsonl=a if got == "b" else b, fields="v", overwrite=True)
        assert _which(out, a=3000, b=20000) == ("a" if got == "b" else "b") and _staging(parent) == []
    print("old whole", seen.count("a"), "times, new whole", seen.count("b"))
