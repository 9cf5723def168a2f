"""sluice checkpoint: a CUDA process suspended to host memory and resumed, its GPU data intact."""
import json
import os
import subprocess
import sys

import pytest

import sluice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))

CHILD = r"""
import sys, torch
g = torch.Generator(device="cuda").manual_seed(1234)
x = torch.randint(-2**62, 2**62, (int(sys.argv[1]) // 8,), dtype=torch.int64, device="cuda", generator=g)
torch.cuda.synchronize()
print("ready", int(x.sum()), int(x[::997].sum()), flush=True)
sys.stdin.readline()                      # the parent suspends and resumes us meanwhile
s = x[: 1 << 20]
y = s * 3 + 1                             # new GPU work after the restore (int64 wraps as the sums do)
ok = (int(y.sum()) - (int(s.sum()) * 3 + s.numel())) % 2**64 == 0
print("after", int(x.sum()), int(x[::997].sum()), ok, flush=True)
"""


def test_checkpoint_refuses_clearly_without_a_process():
    r = subprocess.run([SLUICE, "checkpoint", "--json", str(2**30)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "sluice checkpoint: suspend:" in r.stderr
    assert any(w in r.stderr for w in ("libcuda.so.1", "lacks cuCheckpointProcess", f"pid {2**30}"))
    assert subprocess.run([SLUICE, "checkpoint"], capture_output=True).returncode == 2
    assert subprocess.run([SLUICE, "checkpoint", "--hold", "x", "12"], capture_output=True).returncode == 2


def test_suspend_resume_keeps_gpu_data(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or sluice.gpu_count() == 0:
        pytest.skip("no CUDA GPU")
    size = 2 << 30
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        ready = p.stdout.readline().split()
        assert ready and ready[0] == "ready", p.stderr.read()
        # Suspend: its GPU memory goes to host memory and leaves the GPU.
        r = subprocess.run([SLUICE, "checkpoint", "--json", "--suspend", str(p.pid)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        assert s["state"] == "checkpointed" and s["checkpoint_s"] > 0
        assert s["gpu_bytes_moved"] >= size, s  # the tensor and the context
        st = subprocess.run([SLUICE, "checkpoint", "--json", "--suspend", str(p.pid)], capture_output=True, text=True)
        assert st.returncode == 1 and "is checkpointed, not running" in st.stderr
        # Resume: back on the GPU, running.
        r = subprocess.run([SLUICE, "checkpoint", "--json", "--resume", str(p.pid)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        q = json.loads(r.stdout)
        assert q["state"] == "running" and q["restore_s"] > 0 and q["gpu_bytes_restored"] >= size
        # A round trip in one call, then the data checked by the process itself.
        r = subprocess.run([SLUICE, "checkpoint", "--json", "--hold", "0.2", str(p.pid)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rt = json.loads(r.stdout)
        assert rt["state"] == "running" and rt["gpu_bytes_moved"] >= size and rt["held_s"] == 0.2
        p.stdin.write("go\n")
        p.stdin.flush()
        after = p.stdout.readline().split()
        assert after == ["after", ready[1], ready[2], "True"], (after, ready, p.stderr.read())
    finally:
        p.kill()
        p.wait()
