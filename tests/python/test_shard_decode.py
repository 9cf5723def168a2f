"""sluice_dataset_read_shard: a shard whole into memory, zstd blocks decoded on the CPU or (nvCOMP) the GPU."""
import ctypes
import json
import os
import shutil
import subprocess
import sys

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
    with pytest.raises(ValueError, match="decoder='CPU'.*one of auto, gpu, cpu"):
        z.read_shard(0, np.zeros(nbytes, np.uint8), decoder="CPU")
    n = sluice.lib.sluice_dataset_shards(z._h)
    with pytest.raises(sluice.SluiceError, match=f"no shard {n + 5} \\(the dataset has {n}\\)"):
        z.read_shard(n + 5, np.zeros(nbytes, np.uint8))
    bad_block = subprocess.run([SLUICE, "pack", "--from-jsonl", str(packs / "in.jsonl"), "--fields", "text,n",
                                "--zstd", "3", "--block-size", "1K", "--quiet", str(tmp_path / "small")],
                               capture_output=True, text=True)
    assert bad_block.returncode != 0 and "zstd block size 1024 bytes out of range" in bad_block.stderr
    assert "level" not in bad_block.stderr


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


def _crc32c(b):
    f = sluice.lib.sluice_crc32c
    f.restype, f.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
    return f(0, bytes(b), len(b))


def _without_block_crcs(src, dst):
    """A copy of a zstd pack as sluice wrote it before block CRCs: each shard's flags 1, its block table without
    the stored bytes' CRCs (and the header's and table's CRCs made again)."""
    shutil.copytree(src, dst)
    for name in os.listdir(dst):
        if name == "index.sli":
            continue
        with open(dst / name, "r+b") as f:
            h = bytearray(f.read(4096))
            assert int.from_bytes(h[36:40], "little") == 3
            off, nb = int.from_bytes(h[40:48], "little"), int.from_bytes(h[48:56], "little")
            f.seek(off)
            table = f.read(24 * nb)
            h[8:12] = (1).to_bytes(4, "little")  # they were version 1 shards too
            h[32:36] = _crc32c(h[:32]).to_bytes(4, "little")
            h[36:40] = (1).to_bytes(4, "little")
            h[56:60] = _crc32c(table).to_bytes(4, "little")
            h[60:64] = _crc32c(h[36:60]).to_bytes(4, "little")
            f.seek(0)
            f.write(h)
            f.truncate(off + 24 * nb)
    return dst


def test_packs_written_before_block_crcs_still_read(packs, tmp_path):
    """Shards whose block tables carry no CRCs of the stored bytes (flags 1) read as before, by the CPU."""
    old, p = sluice.Dataset(_without_block_crcs(packs / "zstd", tmp_path / "old")), sluice.Dataset(packs / "plain")
    for i in range(0, len(p), 97):
        assert bytes(old[i]["text"]) == bytes(p[i]["text"])
    recs, nbytes = old.shard_bytes(0)
    host = np.zeros(nbytes, np.uint8)
    assert old.read_shard(0, host)["decoder"] == "cpu"


def test_an_uncompressed_shard_read_whole_has_its_records_checked(packs, tmp_path):
    """read_shard of a plain pack: every record's CRC checked (a flipped byte is an error naming the file and the
    record, never returned), the padding between records read too, the same bytes as each record read alone."""
    p = sluice.Dataset(packs / "plain")
    recs, nbytes = p.shard_bytes(0)
    out = np.full(nbytes, 0xEE, np.uint8)
    assert p.read_shard(0, out)["decoder"] == "none"
    assert records_of(p, 0, out) == recs
    loc = sluice._lib.RecordLoc()
    sluice._lib.check(sluice.lib.sluice_dataset_locate(p._h, 7, ctypes.byref(loc)))
    bad = tmp_path / "bad"
    shutil.copytree(packs / "plain", bad)
    shard = sorted(f for f in os.listdir(bad) if f != "index.sli")[loc.shard]
    with open(bad / shard, "r+b") as f:
        f.seek(loc.offset + loc.length // 2)
        b = f.read(1)
        f.seek(loc.offset + loc.length // 2)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(sluice.SluiceError, match=f"{shard}: record 7 .*CRC mismatch"):
        sluice.Dataset(bad).read_shard(loc.shard, np.zeros(nbytes, np.uint8))


def test_an_uncompressed_shard_read_whole_into_gpu_memory(packs):
    """The same record-checked read of a plain shard into GPU memory: the host read's bytes."""
    torch = _cuda_or_skip()
    p = sluice.Dataset(packs / "plain")
    for s in range(sluice.lib.sluice_dataset_shards(p._h)):
        recs, nbytes = p.shard_bytes(s)
        host = np.zeros(nbytes, np.uint8)
        p.read_shard(s, host)
        t = torch.full((nbytes,), 0xEE, dtype=torch.uint8, device="cuda")
        assert p.read_shard(s, t)["decoder"] == "none"
        assert np.array_equal(t.cpu().numpy(), host)


def test_a_loader_over_zstd_counts_what_it_read(packs):
    """The loader's stats over a zstd pack decoded by the CPU: the blocks' stored bytes and reads counted (they were
    0), at most the pack's stored bytes a window read, and fewer than the records' decoded bytes."""
    z = sluice.Dataset(packs / "zstd")
    ld = sluice.Loader(z, batch_size=64, seed=4, fields=["text"])
    n = sum(len(b["ids"]) for b in ld)
    st = ld.stats()
    stored = sum(os.path.getsize(packs / "zstd" / f) for f in os.listdir(packs / "zstd") if f != "index.sli")
    assert n > 0 and st["zstd_blocks_cpu"] > 0 and st["zstd_blocks_gpu"] == 0
    assert 0 < st["read_ios"] and 0 < st["read_bytes"] <= stored * st["stages"]["read"]["count"]
    assert st["read_bytes"] < st["bytes"]
    assert st["stages"]["zstd_window_decode"]["count"] == st["stages"]["read"]["count"]  # each window, timed
    assert st["stages"]["zstd_window_read"]["count"] == 0  # nvCOMP's phase


def test_shards_of_version_1_still_read(packs, tmp_path):
    """Shards written before the index's version 2 say version 1 in their header: they read as before."""
    d = tmp_path / "v1"
    shutil.copytree(packs / "plain", d)
    for name in os.listdir(d):
        if name != "index.sli":
            with open(d / name, "r+b") as f:
                h = bytearray(f.read(36))
                h[8:12] = (1).to_bytes(4, "little")
                h[32:36] = _crc32c(h[:32]).to_bytes(4, "little")
                f.seek(0)
                f.write(h)
    v1, p = sluice.Dataset(d), sluice.Dataset(packs / "plain")
    for i in range(0, len(p), 101):
        assert bytes(v1[i]["text"]) == bytes(p[i]["text"])
    out = np.zeros(v1.shard_bytes(0)[1], np.uint8)
    v1.read_shard(0, out)
    assert records_of(v1, 0, out) == v1.shard_bytes(0)[0]
    check = subprocess.run([SLUICE, "verify", str(d)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def _cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or sluice.gpu_count() == 0:
        pytest.skip("no CUDA GPU")
    return torch


def _epoch(ld):
    """Every batch of one epoch as host copies: ids, text's bytes and its offsets."""
    def host(x):
        return x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)
    out = []
    for b in ld:
        data, offs = b["text"]
        out.append((np.array(b["ids"]), bytes(host(data)), host(offs).copy()))
    return out


def test_a_gpu_loader_decodes_zstd_blocks_with_nvcomp(packs, monkeypatch):
    """A GPU loader over a zstd dataset decodes its windows' blocks with nvCOMP: the same batches as the CPU
    loader over the plain pack, the stats count the blocks, and SLUICE_DECODE=cpu keeps nvCOMP out."""
    torch = _cuda_or_skip()
    z, p = sluice.Dataset(packs / "zstd"), sluice.Dataset(packs / "plain")
    if z.read_shard(0, torch.zeros(z.shard_bytes(0)[1], dtype=torch.uint8, device="cuda"))["decoder"] != "gpu":
        pytest.skip("nvCOMP unusable here")
    want = _epoch(sluice.Loader(p, batch_size=64, seed=4, fields=["text"]))
    ld = sluice.Loader(z, batch_size=64, seed=4, fields=["text"], device="cuda")
    got = _epoch(ld)
    assert len(got) == len(want) > 10
    for (gi, gd, go), (wi, wd, wo) in zip(got, want):
        assert np.array_equal(gi, wi) and np.array_equal(go, wo) and gd == wd
    st = ld.stats()
    assert st["zstd_blocks_gpu"] > 0 and st["zstd_blocks_cpu"] == 0
    assert st["stages"]["zstd_window_read"]["count"] == st["stages"]["zstd_window_decode"]["count"] > 0
    old = sluice.Dataset(_without_block_crcs(packs / "zstd", packs.parent / (packs.name + "-old")))
    rep = old.read_shard(0, torch.zeros(old.shard_bytes(0)[1], dtype=torch.uint8, device="cuda"))
    assert rep["decoder"] == "cpu" and "CRC" in rep["why_not_gpu"]
    ld = sluice.Loader(old, batch_size=64, seed=4, fields=["text"], device="cuda")
    assert [g[0].tolist() for g in _epoch(ld)] == [w[0].tolist() for w in want]
    st = ld.stats()
    assert st["zstd_blocks_gpu"] == 0 and st["zstd_blocks_cpu"] > 0
    monkeypatch.setenv("SLUICE_DECODE", "cpu")
    ld = sluice.Loader(z, batch_size=64, seed=4, fields=["text"], device="cuda")
    assert [g[0].tolist() for g in _epoch(ld)] == [w[0].tolist() for w in want]
    st = ld.stats()
    assert st["zstd_blocks_gpu"] == 0 and st["zstd_blocks_cpu"] > 0


def test_a_gpu_loader_finds_the_nvcomp_wheel_by_itself(packs):
    """A process whose first use of nvCOMP is a GPU loader (no read_shard before it, SLUICE_NVCOMP_LIB unset)
    still finds the nvidia-libnvcomp wheel's library: the loader's blocks are decoded by nvCOMP."""
    _cuda_or_skip()
    pytest.importorskip("nvidia.libnvcomp")
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_NVCOMP_LIB"}
    code = ("import sys, sluice\n"
            "ld = sluice.Loader(sluice.Dataset(sys.argv[1]), batch_size=64, fields=['text'], device='cuda')\n"
            "n = sum(1 for _ in ld)\n"
            "st = ld.stats()\n"
            "print(n, st['zstd_blocks_gpu'], st['zstd_blocks_cpu'])\n")
    out = subprocess.run([sys.executable, "-c", code, str(packs / "zstd")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    n, gpu, cpu = map(int, out.stdout.split())
    assert n > 10 and gpu > 0 and cpu == 0, out.stdout


@pytest.mark.parametrize("where", ["frame", "data"])
def test_a_gpu_loader_over_a_corrupt_zstd_block_names_it_or_skips_its_records(packs, tmp_path, where):
    """Bytes flipped in a stored block (its frame header, or its compressed data) never come out as records: the
    GPU loader fails naming the shard file, or with skip_corrupt the block's records are skipped and counted."""
    torch = _cuda_or_skip()
    bad = tmp_path / "bad"
    shutil.copytree(packs / "zstd", bad)
    shard = sorted(f for f in os.listdir(bad) if f != "index.sli")[0]
    with open(bad / shard, "r+b") as f:
        at = 4096 + (0 if where == "frame" else 3000)
        f.seek(at)
        b = f.read(64)
        f.seek(at)
        f.write(bytes(x ^ 0x5A for x in b))
    ds = sluice.Dataset(bad)
    if ds.read_shard(1, torch.zeros(ds.shard_bytes(1)[1], dtype=torch.uint8, device="cuda"))["decoder"] != "gpu":
        pytest.skip("nvCOMP unusable here")
    with pytest.raises(sluice.SluiceError, match=shard):
        _epoch(sluice.Loader(ds, batch_size=64, seed=4, fields=["text"], device="cuda"))
    plain = sluice.Dataset(packs / "plain")
    clean = sum(len(g[0]) for g in _epoch(sluice.Loader(plain, batch_size=64, seed=4, fields=["text"])))
    ld = sluice.Loader(ds, batch_size=64, seed=4, fields=["text"], device="cuda", skip_corrupt=True)
    got = _epoch(ld)
    skipped = ld.stats()["skipped"]
    assert skipped > 0 and sum(len(g[0]) for g in got) + skipped == clean
    for ids, data, offs in got:  # every record that came is the plain pack's
        for j, i in enumerate(ids):
            assert data[offs[j]:offs[j + 1]] == bytes(plain[int(i)]["text"]), int(i)
