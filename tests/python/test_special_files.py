"""Special files where a regular file is expected: a FIFO (which holds a plain open(2) until a writer comes) or a
character device such as /dev/zero (which streams forever) named as a file to read, a dataset's shard or index,
a WebDataset tar or a token array.  Each is refused at once with an error naming the path and what it is; every
call runs in a child with a time limit, so a regression fails the test rather than hanging the suite."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sluice

CHILD_TIMEOUT = 60


def _child(code, tmp_path):
    """Runs code in a fresh interpreter (the package as this one imports it); returns (rc, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked on a special file for {CHILD_TIMEOUT} s: {code}")
    return r.returncode, r.stderr


def _refused(code, tmp_path, name, kind="FIFO"):
    rc, err = _child(code, tmp_path)
    assert rc != 0, f"a {kind} was taken: {code}"
    assert name in err and (kind is None or kind in err), err


def _dataset(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"t": f"r{i}"}) + "\n" for i in range(50)))
    sluice.pack(str(tmp_path / "ds"), jsonl=str(src), fields="t")
    return tmp_path / "ds"


def test_a_fifo_read_as_a_file(tmp_path):
    os.mkfifo(tmp_path / "f")
    _refused("import numpy as np, sluice; sluice.read('f', np.empty(16, np.uint8))", tmp_path, "f")


def test_dev_zero_read_as_a_file(tmp_path):
    _refused("import numpy as np, sluice; sluice.read('/dev/zero', np.empty(16, np.uint8))", tmp_path,
             "/dev/zero", "character device")


def test_a_fifo_as_a_datasets_shard(tmp_path):
    ds = _dataset(tmp_path)
    shard = sorted(p for p in os.listdir(ds) if p.endswith(".sls"))[0]
    os.unlink(ds / shard)
    os.mkfifo(ds / shard)
    _refused("import sluice; d = sluice.Dataset('ds'); [d[i] for i in range(len(d))]", tmp_path, shard)


def test_a_fifo_as_a_datasets_index(tmp_path):
    ds = _dataset(tmp_path)
    index = [p for p in os.listdir(ds) if not p.endswith(".sls")][0]
    os.unlink(ds / index)
    os.mkfifo(ds / index)
    _refused("import sluice; sluice.Dataset('ds')", tmp_path, index)


def test_a_fifo_as_a_webdataset_tar(tmp_path):
    """Not a tar sluice reads (a tar is a regular file): refused as no dataset, naming it, without a read."""
    os.mkfifo(tmp_path / "train-0.tar")
    _refused("import sluice; sluice.Dataset('train-0.tar')", tmp_path, "train-0.tar", None)


@pytest.mark.parametrize("name", ["tokens.bin", "tokens.npy"])
def test_a_fifo_as_a_token_array(tmp_path, name):
    np.array([3], np.int64).tofile(tmp_path / "lens.bin")
    os.mkfifo(tmp_path / name)
    _refused(f"import sluice; sluice.pack('out', tokens='{name}', doc_lengths='lens.bin', dtype='u16')", tmp_path,
             name)
