"""What users read says what the code does: the reference is the one generated from the header and the command's
--help (scripts/gen_reference.py), every Python example in the README and the guides runs, and no issue numbers
(the project's own bookkeeping) appear in them."""
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SLUICE

# What users read; docs/BENCHMARKS.md is the benchmark log, a record kept by issue.
READ = [os.path.join(ROOT, "README.md")] + sorted(p for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                       recursive=True)
                                                  if not p.endswith("BENCHMARKS.md"))


def test_the_reference_is_generated_from_the_sources():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_reference.py"), "--check", SLUICE],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _examples():
    for path in READ:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", open(path).read(), re.S)):
            yield pytest.param(block, id=f"{os.path.relpath(path, ROOT)}:{i}")


@pytest.mark.parametrize("code", list(_examples()))
def test_each_python_example_runs(code, tmp_path, s3):
    """In a folder of its own, with the S3 test server's AWS_* variables set (s3) and its bucket my-bucket."""
    if "my-bucket" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket="my-bucket")
    import sluice  # the examples run on the sluice these tests run (the source tree's, or an installed wheel's)
    path = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(sluice.__file__))),
                            os.environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, SLUICE_CONFIG="", PYTHONPATH=path))
    assert r.returncode == 0, r.stderr[-3000:]


def test_no_issue_numbers_in_what_users_read():
    found = [f"{os.path.relpath(p, ROOT)}: {m}" for p in READ for m in re.findall(r"issues? #\d+", open(p).read())]
    assert not found, found
