"""A short kill -9 soak (bench/kill_soak.py runs the long one): a durable write, a pack and a multipart upload,
each killed at random moments, leave the old or the whole new file, object or dataset, never a torn one."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import kill_soak  # noqa: E402


def test_kill_soak(s3, tmp_path, monkeypatch):
    for k, v in s3.sluice_server.env().items():
        monkeypatch.setenv(k, v)
    res = kill_soak.run(trials=4, s3=True, seed=22, work=str(tmp_path))
    for name, r in res.items():
        assert r["failure"] is None, (name, r)
        assert sum(r["ended"].values()) == 4, (name, r)


def test_pack_on_a_full_disk(tmp_path):
    """sluice pack into a 4 MiB tmpfs that a 12 MB tree cannot fit: a clear error naming what could not be
    written, no index (the output does not open), and the dataset already stored there still verifies.  Root
    only (mounting); skipped otherwise."""
    import subprocess
    from conftest import SLUICE, small_tmpfs
    with small_tmpfs(tmp_path / "small", "4m") as mnt:
        small, big = tmp_path / "small-tree" / "c", tmp_path / "big-tree" / "c"
        small.mkdir(parents=True)
        big.mkdir(parents=True)
        (small / "a.jpg").write_bytes(os.urandom(100_000))
        for i in range(12):
            (big / f"{i}.jpg").write_bytes(os.urandom(1 << 20))
        assert subprocess.run([SLUICE, "pack", "--from-dir", str(small.parent), "--quiet", str(mnt / "kept")]).returncode == 0
        r = subprocess.run([SLUICE, "pack", "--from-dir", str(big.parent), "--quiet", str(mnt / "full")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and ("No space" in r.stderr or "Too large" in r.stderr or "space" in r.stderr), r.stderr
        assert str(mnt / "full") in r.stderr, r.stderr
        assert not (mnt / "full" / "index.sli").exists()
        assert subprocess.run([SLUICE, "verify", str(mnt / "kept")], capture_output=True).returncode == 0


def test_checkpoint_on_a_full_disk(tmp_path):
    """sluice.write of 8 MiB over a 1 MiB file on a 4 MiB tmpfs: ENOSPC naming the file, the old file intact,
    no temporary left.  Root only (mounting); skipped otherwise."""
    import numpy as np
    import pytest
    import sluice
    from conftest import small_tmpfs
    with small_tmpfs(tmp_path / "small", "4m") as mnt:
        old = os.urandom(1 << 20)
        (mnt / "ckpt.bin").write_bytes(old)
        with pytest.raises(sluice.SluiceError) as e:
            sluice.write(str(mnt / "ckpt.bin"), np.ones(8 << 20, np.uint8))
        assert e.value.code == -28 and "ckpt.bin" in str(e.value), e.value  # ENOSPC
        assert (mnt / "ckpt.bin").read_bytes() == old
        assert os.listdir(mnt) == ["ckpt.bin"]
