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
