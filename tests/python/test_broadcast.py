"""sluice.read_broadcast: storage read once, the bytes delivered to several buffers (every GPU's, or host);
and one engine serving several GPUs (SLUICE_DEVICE_IDS)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sluice


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    p = tmp_path_factory.mktemp("bc") / "blob"
    data = np.random.default_rng(9).integers(0, 256, size=(130 << 20) + 5, dtype=np.uint8)  # three chunks
    data.tofile(p)
    return p, data


def test_broadcast_to_host_buffers(blob):
    p, data = blob
    outs = [np.zeros(data.size, np.uint8) for _ in range(3)]
    assert sluice.read_broadcast(p, outs) == data.size
    for o in outs:
        assert np.array_equal(o, data)
    part = [np.zeros(1000, np.uint8), np.zeros(2000, np.uint8)]
    assert sluice.read_broadcast(p, part, offset=77 << 20) == 1000  # the shortest buffer's length
    assert np.array_equal(part[0], data[77 << 20:(77 << 20) + 1000]) and np.array_equal(part[1][:1000], part[0])
    with pytest.raises(sluice.SluiceError, match="range"):
        sluice.read_broadcast(p, [np.zeros(10, np.uint8)], offset=data.size)


def test_broadcast_to_every_gpu(blob):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or sluice.gpu_count() == 0:
        pytest.skip("no CUDA GPU")
    p, data = blob
    # One buffer on each GPU, and a second on the first (a one-GPU machine still broadcasts to two).
    devs = list(range(torch.cuda.device_count())) + [0]
    outs = [torch.zeros(data.size, dtype=torch.uint8, device=f"cuda:{d}") for d in devs]
    assert sluice.read_broadcast(p, outs) == data.size
    want = torch.from_numpy(data)
    for o in outs:
        assert torch.equal(o.cpu(), want)


DEVICE_IDS_CHILD = r"""
import sys, numpy as np, torch, sluice
data = np.fromfile(sys.argv[1], np.uint8)
outs = [torch.zeros(data.size, dtype=torch.uint8, device=f"cuda:{d}") for d in range(torch.cuda.device_count())]
for o in outs:
    assert sluice.read(sys.argv[1], o) == data.size
    sluice.write(sys.argv[1] + f".{o.device.index}", o)
print(all(torch.equal(o.cpu(), torch.from_numpy(data)) for o in outs))
"""


def test_one_engine_serves_every_gpu(blob, tmp_path):
    """SLUICE_DEVICE_IDS=0,1,...: the engine's workers split among the GPUs, each reading into and writing
    from its own GPU's memory."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("fewer than two GPUs")
    p, data = blob
    ids = ",".join(str(d) for d in range(torch.cuda.device_count()))
    env = dict(os.environ, SLUICE_DEVICE_IDS=ids)
    from test_sluice import SLUICE
    info = subprocess.run([SLUICE, "info", "--json"], capture_output=True, text=True, env=env)
    assert json.loads(info.stdout)["ngpus"] == torch.cuda.device_count()
    r = subprocess.run([sys.executable, "-c", DEVICE_IDS_CHILD, str(p)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
    for d in range(torch.cuda.device_count()):
        assert np.array_equal(np.fromfile(f"{p}.{d}", np.uint8), data)



@pytest.mark.parametrize("ids,says", [("0,0", "device id 0 is listed twice"), ("0;1", "not a list of GPU ordinals"),
                                      ("", "not a list of GPU ordinals"), (",".join(["0"] * 17), "at most 16")])
def test_device_ids_refused_by_name(ids, says):
    from test_sluice import SLUICE
    r = subprocess.run([SLUICE, "info"], capture_output=True, text=True, env=dict(os.environ, SLUICE_DEVICE_IDS=ids))
    assert r.returncode != 0 and "SLUICE_DEVICE_IDS" in r.stderr and says in r.stderr, r.stderr


LOADERS_CHILD = r"""
import sys, numpy as np, torch, sluice
ds = sluice.Dataset(sys.argv[1])
want = [b["n"].copy() for b in sluice.Loader(ds, batch_size=50, shuffle=False, device="cpu")]
for d in range(torch.cuda.device_count()):
    got = []
    for b in sluice.Loader(ds, batch_size=50, shuffle=False, device=f"cuda:{d}"):
        assert b["n"].device.index == d, b["n"].device
        got.append(b["n"].cpu().numpy().copy())
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want)), d
try:
    sluice.Loader(ds, batch_size=50, device=f"cuda:{torch.cuda.device_count()}")
except ValueError as e:
    print("refused:", e)
print("ok")
"""


def test_loaders_on_every_gpu_of_one_engine(ds_path):
    """SLUICE_DEVICE_IDS=0,1,...: a loader per GPU of one process, each delivering into its own GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("fewer than two GPUs")
    ids = ",".join(str(d) for d in range(torch.cuda.device_count()))
    r = subprocess.run([sys.executable, "-c", LOADERS_CHILD, ds_path], capture_output=True, text=True,
                       env=dict(os.environ, SLUICE_DEVICE_IDS=ids))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr
    assert "refused: Loader(device='cuda:" in r.stdout and "the engine serves GPUs" in r.stdout
