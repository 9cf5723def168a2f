"""The Python package with GPU memory (torch CUDA tensors); skipped where there is no GPU or no torch."""
import json
import subprocess

import numpy as np
import pytest

import sluice
from test_sluice import SLUICE, DLPackOnly

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or sluice.gpu_count() == 0, reason="no CUDA GPU")


def test_read_write_cuda_tensor(tmp_path):
    a = np.random.default_rng(2).integers(0, 256, size=(8 << 20) + 5, dtype=np.uint8)
    p = tmp_path / "g.bin"
    sluice.write(p, a)
    t = torch.zeros(a.size, dtype=torch.uint8, device="cuda")
    assert sluice.read_to_gpu(p, t) == a.size
    assert torch.equal(t.cpu(), torch.from_numpy(a))
    q = tmp_path / "h.bin"
    sluice.write_from_gpu(q, t)
    back = np.zeros_like(a)
    sluice.read(q, back)
    assert np.array_equal(a, back)


def test_dlpack_cuda(tmp_path):
    t = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
    p = tmp_path / "dl.bin"
    sluice.write_from_gpu(p, DLPackOnly(t))
    u = torch.zeros_like(t)
    assert sluice.read_to_gpu(p, DLPackOnly(u)) == t.numel() * 4
    assert torch.equal(t, u)


def test_loader_to_cuda(tmp_path):
    with open(tmp_path / "in.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"v": [i, i + 1, i + 2], "n": i}) + "\n")
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(tmp_path / "in.jsonl"), "--fields", "v,n", "--quiet",
                    str(tmp_path / "ds")], check=True, capture_output=True)
    ds = sluice.Dataset(str(tmp_path / "ds"))
    ld = sluice.Loader(ds, batch_size=32, device="cuda", seed=1, rank=0, world_size=1)
    count = 0
    for b in ld:
        n = b["n"]
        data, offs = b["v"]
        assert n.is_cuda and n.shape == (len(b.ids),) and len(b.ids) in (32, 300 % 32)  # the last one short
        assert torch.equal(n.cpu(), torch.from_numpy(b["ids"].astype(np.int64)))
        assert torch.equal(data[offs[5]:offs[6]].cpu(), n[5].cpu() + torch.arange(3))  # offsets count elements
        count += 1
    assert count == len(ld) == 10


def test_async_on_the_current_stream(tmp_path):
    a = np.random.default_rng(5).integers(0, 256, size=(16 << 20) + 3, dtype=np.uint8)
    p = tmp_path / "a.bin"
    sluice.write(p, a)
    t = torch.zeros(a.size, dtype=torch.uint8, device="cuda")
    fut = sluice.read_async(p, t)
    total = t.to(torch.int64).sum()  # queued after the read on the same stream
    assert fut.wait() == a.size
    assert int(total) == int(a.astype(np.int64).sum())
    del fut


def test_save_load_cuda(tmp_path):
    sd = {"w": torch.randn(1000, 33, device="cuda"), "b": torch.arange(7, device="cuda", dtype=torch.int64),
          "h": torch.randn(5, device="cuda").to(torch.bfloat16)}
    sluice.save(sd, str(tmp_path / "m.safetensors"))
    back = sluice.load(str(tmp_path / "m.safetensors"), device="cuda")
    for k in sd:
        assert back[k].is_cuda and torch.equal(back[k], sd[k])


def _busy(x, n=30):
    """Queues n slow passes over x on the current stream: work still running when the next call starts."""
    for _ in range(n):
        x.mul_(1.0000001).add_(0.0)


def test_synchronous_transfers_wait_for_the_producers_stream(tmp_path):
    """A tensor whose kernels are still queued on a side stream: write, save and read wait for that stream
    (named by __cuda_array_interface__), so the file holds the finished values and a read is not overwritten
    by a late kernel; the same through DLPack."""
    s = torch.cuda.Stream()
    for i in range(3):
        with torch.cuda.stream(s):
            x = torch.empty(32 << 20, dtype=torch.float32, device="cuda")
            x.fill_(i + 1.0)
            _busy(x)
            sluice.write(tmp_path / "w.bin", x)
            sluice.save({"x": x}, str(tmp_path / "ck.safetensors"))
            y = torch.empty_like(x)
            y.fill_(-1.0)
            _busy(y)
            sluice.read(tmp_path / "w.bin", y)  # the late fill and busy work must not land after the read
            z = torch.empty_like(x)
            z.fill_(-2.0)
            _busy(z)
            sluice.load(str(tmp_path / "ck.safetensors"), into={"x": z})
        s.synchronize()
        want = x.cpu().numpy()
        assert np.array_equal(np.fromfile(tmp_path / "w.bin", np.float32), want), i
        assert np.array_equal(sluice.load(str(tmp_path / "ck.safetensors"), device="numpy")["x"], want), i
        assert torch.equal(y, x) and torch.equal(z, x), i
        with torch.cuda.stream(s):
            d = torch.empty(32 << 20, dtype=torch.float32, device="cuda")
            d.fill_(i + 7.0)
            _busy(d)
            sluice.write(tmp_path / "d.bin", DLPackOnly(d))  # DLPack: handed over on the legacy stream, waited for
        s.synchronize()
        assert np.array_equal(np.fromfile(tmp_path / "d.bin", np.float32), d.cpu().numpy()), i
