"""sluice.read_broadcast: storage read once, the bytes delivered to several buffers (every GPU's, or host)."""
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
