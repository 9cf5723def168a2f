"""Fixtures the Python tests share."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


@pytest.fixture(scope="session")
def ds_path(tmp_path_factory):
    """A sluice dataset of 500 records (text, n) in shards of 8 KiB, packed by `sluice pack`."""
    d = tmp_path_factory.mktemp("ds")
    with open(d / "in.jsonl", "w") as f:
        for i in range(500):
            f.write(json.dumps({"text": "row %d " % i * (1 + i % 7), "n": i}) + "\n")
    out = d / "ds"
    subprocess.run([SLUICE, "pack", "--from-jsonl", str(d / "in.jsonl"), "--fields", "text,n", "--shard-size", "8K",
                    "--quiet", str(out)], check=True, capture_output=True)
    return str(out)
