"""The wheel that `make wheel` builds (SLUICE_WHEEL: its path; `make test-python` builds it and sets it), installed
into a virtual environment of its own: the library, the command and every library they link come from the wheel,
not from the system, and the package works from there (a round trip through a file, a dataset packed and read,
an object written to and read from the S3 test server, and the `sluice` command)."""
import json
import os
import subprocess
import venv

import pytest

WHEEL = os.environ.get("SLUICE_WHEEL")
pytestmark = pytest.mark.skipif(not WHEEL, reason="SLUICE_WHEEL is not set: `make test-python` builds the wheel "
                                                   "and sets it")

# Libraries that a manylinux wheel may take from the system (the manylinux policy's own): every other library that
# the installed package's library and program need must come from the wheel.
SYSTEM = ("ld-linux", "libc.so", "libm.so", "libpthread", "libdl.so", "librt.so", "libresolv", "libgcc_s",
          "libstdc++", "libz.so", "libutil", "libnsl", "libexpat")

# Runs in the wheel's environment, from a folder with no sluice in it.
CHILD = r"""
import json, os, sys
import numpy as np
import sluice


def mapped():
    return {l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]}

pkg = os.path.dirname(os.path.abspath(sluice.__file__))
libs = os.path.join(os.path.dirname(pkg), "sluice.libs")
out = {"lib": sluice.lib._name, "libs": sorted(os.listdir(libs))}

# A round trip through a file, the engine's whole path (io_uring, the bounce slots, the page-cache choice).
a = np.random.default_rng(7).integers(0, 256, 9_000_011, dtype=np.uint8)
sluice.write("f.bin", a)
b = np.zeros_like(a)
out["file_read"] = int(sluice.read("f.bin", b))
out["file_same"] = bool((a == b).all())

# A dataset: JSON lines packed with zstd blocks, read back by index.
with open("in.jsonl", "w") as f:
    for i in range(1000):
        f.write(json.dumps({"t": f"record {i} " * (i % 7), "x": i}) + "\n")
sluice.pack("ds", jsonl="in.jsonl", fields="t,x", zstd=3)
ds = sluice.Dataset("ds")
out["records"] = len(ds)
out["dataset_same"] = all(bytes(ds[i]["t"]) == (f"record {i} " * (i % 7)).encode() and int(ds[i]["x"][0]) == i
                          for i in range(0, 1000, 37))

# An object of the S3 test server (AWS_* from the test), written by sluice and read back.
obj = np.random.default_rng(8).integers(0, 256, 3_000_017, dtype=np.uint8)
sluice.write(f"s3://{sys.argv[1]}/wheel.bin", obj)
back = np.zeros_like(obj)
out["s3_read"] = int(sluice.read(f"s3://{sys.argv[1]}/wheel.bin", back))
out["s3_same"] = bool((obj == back).all())

# The wheel's libraries are the ones this process maps.
out["from_wheel"] = sorted(os.path.basename(p) for p in mapped() if p.startswith(libs + "/"))
print(json.dumps(out))
"""


def _lib_stem(name):
    """libcurl-02fbea31.so.4.8.0 (auditwheel's renamed copy) -> libcurl; liblber-2-64f183c1.5.so.0 -> liblber-2"""
    base = name.split(".so")[0]
    return base.rsplit("-", 1)[0] if "-" in base else base


def _only_from(root, elf):
    """Every library ldd resolves for elf, all the way down, is under root (the wheel's environment) or one of the
    manylinux policy's own."""
    ldd = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ.get("PATH", "")})
    assert ldd.returncode == 0 and "not found" not in ldd.stdout, ldd.stdout + ldd.stderr
    libs = [line.strip().partition(" => ") for line in ldd.stdout.splitlines() if " => " in line]
    assert len(libs) > 20, ldd.stdout  # curl's, libarchive's and the rest: a short list would test nothing
    for name, _, where in libs:
        assert name.startswith(SYSTEM) or where.startswith(str(root)), f"{elf}: {name} => {where}"


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """A virtual environment (this Python's, without its packages) with the wheel and numpy installed."""
    root = tmp_path_factory.mktemp("wheel-venv")
    venv.create(root, with_pip=True, clear=True)
    py = str(root / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", WHEEL],
                       capture_output=True, text=True, timeout=600, env=_clean_env(root))
    assert r.returncode == 0, r.stderr
    return root


def _clean_env(root):
    """The environment's bin first on PATH; nothing that points at this tree's build or package."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SLUICE_LIB", "SLUICE_BIN", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SLUICE_PYTHON")}
    env.update(PATH=f"{root}/bin:{env.get('PATH', '')}", PYTHONNOUSERSITE="1", SLUICE_CONFIG="")
    return env


def test_the_installed_package_runs_on_the_wheels_libraries(wheel_env, s3, tmp_path):
    env = _clean_env(wheel_env)
    r = subprocess.run([str(wheel_env / "bin" / "python"), "-c", CHILD, "pytest"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["lib"].startswith(str(wheel_env)) and got["lib"].endswith("/sluice/libsluice.so"), got["lib"]
    assert got["file_read"] == 9_000_011 and got["file_same"]
    assert got["records"] == 1000 and got["dataset_same"]
    assert got["s3_read"] == 3_000_017 and got["s3_same"]
    # Every library the package's library needs is the wheel's or the policy's own (Python's modules may map the
    # system's copies of some, as its ssl does libcrypto: those are Python's), and these are mapped from the wheel.
    _only_from(wheel_env, got["lib"])
    stems = {_lib_stem(n) for n in got["from_wheel"]}
    for need in ("liburing", "libisal", "libcurl", "libarchive", "libjansson", "libzstd", "libmicrohttpd",
                 "libcrypto"):
        assert need in stems, (need, got["from_wheel"])
    # Each bundled package's licence notice is shipped beside the libraries.
    lic = os.listdir(os.path.join(os.path.dirname(got["lib"]), "..", "sluice.libs", "licenses"))
    assert "README" in lic and "libcurl4" in lic and "liburing2" in lic, lic


def test_the_sluice_command_is_the_wheels(wheel_env, tmp_path):
    env = _clean_env(wheel_env)
    r = subprocess.run(["sluice", "version"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    # The command's entry point loads neither the package nor numpy: it only runs the program.
    r = subprocess.run([str(wheel_env / "bin" / "python"), "-c", "import sys, sluice_cmd; print(sorted(m for m in "
                        "sys.modules if m.split('.')[0] in ('sluice', 'numpy')))"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    r = subprocess.run(["sluice", "info"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # The program it runs resolves every library it needs inside the environment, or to the policy's own.
    _only_from(wheel_env, next((wheel_env / "lib").glob("python3*/site-packages/sluice/_bin/sluice")))
    # Its Python-driven command finds its experiments in the package, and runs them with the environment's Python.
    r = subprocess.run(["sluice", "journey", "--help"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stdout + r.stderr
