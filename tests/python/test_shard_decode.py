"""sluice_dataset_read_shard: a shard whole into memory, zstd blocks decoded on the CPU or (nvCOMP) the GPU."""
import ctypes
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import sluice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """The same 3,000 JSON lines packed plain and in zstd blocks of 1 MiB, shards of 4 MiB."""
    d = tmp_path_factory.mktemp("zs")
    rng = np.random.default_rng(3)
    with open(d / "in.jsonl", "w") as f:
        for i in range(3000):
            f.write(json.dumps({"text": "word%d " % rng.integers(50) * int(rng.integers(20, 400)), "n": i}) + "\n")
    for name, extra in (("plain", []), ("zstd", ["--zstd", "3", "--block-size", "1M"])):
        subprocess.run([SLUICE, "pack", "--from-jsonl", str(d / "in.jsonl"), "--fields", "text,n", "--shard-size",
                        "4M", "--quiet", *extra, str(d / name)], check=True, capture_output=True)
    return d


def records_of(ds, s, buf):
    """Each record of shard s: its bytes in buf are those sluice_dataset_read gives (CRC checked there)."""
    n = 0
    one = np.zeros(1 << 20, np.uint8)
    for i in range(len(ds)):
        loc = sluice._lib.RecordLoc()
        sluice._lib.check(sluice.lib.sluice_dataset_locate(ds._h, i, ctypes.byref(loc)))
        if loc.shard != s:
            continue
        got = sluice._lib.check(sluice.lib.sluice_dataset_read(ds._h, i, one.ctypes.data, one.size, None))
        assert got == loc.length
        assert np.array_equal(buf[loc.offset - 4096: loc.offset - 4096 + loc.length], one[:got]), i
        n += 1
    return n


def test_zstd_shards_decode_on_the_cpu(packs):
    z, p = sluice.Dataset(packs / "zstd"), sluice.Dataset(packs / "plain")
    assert sluice.lib.sluice_dataset_shards(z._h) >= 2
    total = alike = 0
    for s in range(sluice.lib.sluice_dataset_shards(z._h)):
        recs, nbytes = z.shard_bytes(s)
        out = np.zeros(nbytes, np.uint8)
        rep = z.read_shard(s, out, decoder="cpu")
        assert rep["decoder"] == "cpu" and rep["bytes"] == nbytes and rep["blocks"] >= 1
        assert rep["stored"] < nbytes  # compressed
        assert records_of(z, s, out) == recs
        total += recs
        # The same records as the plain pack's shard, byte for byte, when the shards split alike.
        if p.shard_bytes(s) == (recs, nbytes):
            plain = np.zeros(nbytes, np.uint8)
            assert p.read_shard(s, plain)["decoder"] == "none"
            assert np.array_equal(out, plain)
            alike += 1
    assert total == len(z) == 3000 and alike >= 1
    # auto into host memory decodes on the CPU and says why not the GPU.
    recs, nbytes = z.shard_bytes(0)
    rep = z.read_shard(0, np.zeros(nbytes, np.uint8))
    assert rep["decoder"] == "cpu" and rep["why_not_gpu"] == "the destination is host memory"


def test_read_shard_refusals(packs, tmp_path, monkeypatch):
    z = sluice.Dataset(packs / "zstd")
    recs, nbytes = z.shard_bytes(0)
    with pytest.raises(sluice.SluiceError, match="holds %d bytes, the buffer %d" % (nbytes, nbytes - 1)):
        z.read_shard(0, np.zeros(nbytes - 1, np.uint8))
    with pytest.raises(sluice.SluiceError, match="GPU decoding asked for, but the destination is host memory"):
        z.read_shard(0, np.zeros(nbytes, np.uint8), decoder="gpu")
    monkeypatch.setenv("SLUICE_DECODE", "fpga")
    with pytest.raises(sluice.SluiceError, match='SLUICE_DECODE="fpga"'):
        z.read_shard(0, np.zeros(nbytes, np.uint8))
    monkeypatch.delenv("SLUICE_DECODE")
    # A damaged block is named, with its shard file.
    bad = tmp_path / "bad"
    shutil.copytree(packs / "zstd", bad)
    shard = sorted(f for f in os.listdir(bad) if f != "index.sli")[0]
    with open(bad / shard, "r+b") as f:
        f.seek(4096 + 2000)
        b = f.read(64)
        f.seek(4096 + 2000)
        f.write(bytes(x ^ 0x5A for x in b))
    with pytest.raises(sluice.SluiceError, match=f"{shard}: block 0"):
        sluice.Dataset(bad).read_shard(0, np.zeros(nbytes, np.uint8), decoder="cpu")


def test_zstd_shards_decode_on_the_gpu(packs):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or sluice.gpu_count() == 0:
        pytest.skip("no CUDA GPU")
    z = sluice.Dataset(packs / "zstd")
    for s in range(sluice.lib.sluice_dataset_shards(z._h)):
        recs, nbytes = z.shard_bytes(s)
        host = np.zeros(nbytes, np.uint8)
        z.read_shard(s, host, decoder="cpu")
        for dec in ("cpu", "auto"):
            t = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
            rep = z.read_shard(s, t, decoder=dec)
            if dec == "auto" and rep["decoder"] != "gpu":
                pytest.skip(f"nvCOMP unusable here: {rep['why_not_gpu']}")
            assert rep["decoder"] == ("gpu" if dec == "auto" else "cpu")
            assert np.array_equal(t.cpu().numpy(), host)
