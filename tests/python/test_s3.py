"""s3:// paths through the Python package, against the S3 test server (tests/remote/s3server.py: moto on
127.0.0.1, signatures checked).  Objects are written with boto3 (moto's own dependency), an independent
client; sluice reads them into numpy arrays and, with a GPU, torch tensors."""
import errno
import os
import sys

import numpy as np
import pytest

import sluice

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
s3server = pytest.importorskip("s3server")
if s3server.ThreadedMotoServer is None:
    pytest.skip(s3server.MOTO_MISSING, allow_module_level=True)
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server (one a process: moto counts its unauthenticated calls per process), a bucket, and the
    AWS_* variables the engine's S3 client reads on its first s3:// path."""
    with s3server.S3Server() as srv:
        saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                 "AWS_REGION", "HOME")}
        os.environ.update(AWS_ENDPOINT_URL=srv.endpoint, AWS_ACCESS_KEY_ID=srv.access_key,
                          AWS_SECRET_ACCESS_KEY=srv.secret_key, AWS_REGION="us-east-1",
                          HOME=str(tmp_path_factory.mktemp("home")))
        client = boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=srv.access_key,
                              aws_secret_access_key=srv.secret_key, region_name="us-east-1")
        client.create_bucket(Bucket="pytest")
        try:
            yield client
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def test_read_object_into_numpy(s3):
    data = np.random.default_rng(5).integers(0, 256, size=(5 << 20) + 333, dtype=np.uint8)
    s3.put_object(Bucket="pytest", Key="a/b.bin", Body=data.tobytes())
    out = np.zeros_like(data)
    assert sluice.read("s3://pytest/a/b.bin", out) == data.nbytes
    assert np.array_equal(out, data)
    part = np.zeros(1000, dtype=np.uint8)
    assert sluice.read("s3://pytest/a/b.bin", part, offset=4_000_001) == 1000
    assert np.array_equal(part, data[4_000_001:4_001_001])


def test_errors_name_the_object(s3):
    with pytest.raises(sluice.SluiceError) as e:
        sluice.read("s3://pytest/missing.bin", np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.ENOENT and "s3://pytest/missing.bin" in str(e.value)
    s3.put_object(Bucket="pytest", Key="small", Body=b"x" * 10)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.read("s3://pytest/small", np.zeros(11, dtype=np.uint8))
    assert "s3://pytest/small" in str(e.value)
    with pytest.raises(sluice.SluiceError) as e:
        sluice.write("s3://pytest/new", np.zeros(10, dtype=np.uint8))
    assert e.value.code == -errno.EROFS


def test_read_object_into_gpu(s3):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    data = np.random.default_rng(6).integers(0, 256, size=(9 << 20) + 7, dtype=np.uint8)
    s3.put_object(Bucket="pytest", Key="gpu.bin", Body=data.tobytes())
    t = torch.empty(data.nbytes, dtype=torch.uint8, device="cuda")
    assert sluice.read("s3://pytest/gpu.bin", t) == data.nbytes
    assert np.array_equal(t.cpu().numpy(), data)
