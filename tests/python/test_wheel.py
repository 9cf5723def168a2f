"""The wheel that `make wheel` builds (SLUICE_WHEEL: its path; `make test-python` builds it and sets it), installed
into a virtual environment of its own: the library, the command and every library they link come from the wheel,
not from the system, and the package works from there (a round trip through a file, a dataset packed and read,
an object written to and read from the S3 test server, and the `sluice` command).  It claims manylinux_2_28: no
ELF file in it needs a glibc newer than 2.28, and it installs and runs on Debian 11 (glibc 2.31, Python 3.9, pip
20.3: SLUICE_WHEEL_ROOT, scripts/oldroot.sh) with that system's own pip, loader and libraries.  Every CPython 3 it
claims that this machine has is tried."""
import glob
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import uuid
import venv
import zipfile

import pytest

WHEEL = os.environ.get("SLUICE_WHEEL")
OLDROOT = os.environ.get("SLUICE_WHEEL_ROOT")
pytestmark = pytest.mark.skipif(not WHEEL, reason="SLUICE_WHEEL is not set: `make test-python` builds the wheel "
                                                   "and sets it")
# The newest glibc a manylinux_2_28 wheel's files may ask for.
GLIBC_MAX = (2, 28)

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
out["dataset_same"] = all(bytes(ds[i]["t"]) == (f"record {i} " * (i % 7)).encode() and int(ds[i]["x"]) == i
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


def _only_from(root, elf, run=()):
    """Every library ldd resolves for elf, all the way down, is under root (the wheel's environment) or one of the
    manylinux policy's own.  run: a command that ldd runs under (chroot ROOT: the old system's own ldd)."""
    ldd = subprocess.run([*run, "ldd", str(elf)], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})
    assert ldd.returncode == 0 and "not found" not in ldd.stdout, ldd.stdout + ldd.stderr
    libs = [line.strip().partition(" => ") for line in ldd.stdout.splitlines() if " => " in line]
    assert len(libs) >= 16, ldd.stdout  # curl's, libarchive's and the rest: a short list would test nothing
    for name, _, where in libs:
        assert name.startswith(SYSTEM) or where.startswith(str(root)), f"{elf}: {name} => {where}"


def _install(root, python=None):
    """A virtual environment at root (python's, default this one's, without its packages) with the wheel and
    numpy installed."""
    if python is None:
        venv.create(root, with_pip=True, clear=True)
    else:
        r = subprocess.run([python, "-m", "venv", "--clear", str(root)], capture_output=True, text=True, timeout=300,
                           env=_clean_env(root))
        assert r.returncode == 0, r.stderr
    r = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        WHEEL], capture_output=True, text=True, timeout=600, env=_clean_env(root))
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """This Python's environment with the wheel."""
    return _install(tmp_path_factory.mktemp("wheel-venv"))


def _clean_env(root):
    """The environment's bin first on PATH; nothing that points at this tree's build or package."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SLUICE_LIB", "SLUICE_BIN", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SLUICE_PYTHON")}
    env.update(PATH=f"{root}/bin:{env.get('PATH', '')}", PYTHONNOUSERSITE="1", SLUICE_CONFIG="")
    return env


def _child_ran(r, env_root):
    """The CHILD's report, checked: everything it did came out right, on the wheel's own libraries."""
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["lib"].startswith(str(env_root)) and got["lib"].endswith("/sluice/libsluice.so"), got["lib"]
    assert got["file_read"] == 9_000_011 and got["file_same"]
    assert got["records"] == 1000 and got["dataset_same"]
    assert got["s3_read"] == 3_000_017 and got["s3_same"]
    return got


def test_the_installed_package_runs_on_the_wheels_libraries(wheel_env, s3, tmp_path):
    r = subprocess.run([str(wheel_env / "bin" / "python"), "-c", CHILD, "pytest"],
                       capture_output=True, text=True, timeout=300, env=_clean_env(wheel_env), cwd=tmp_path)
    got = _child_ran(r, wheel_env)
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
    # The program run by its own path, with another Python (this one: pyarrow, no sluice installed) finds the
    # wheel's package beside it for --from-parquet.
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"n": pa.array([1, 2, 3], pa.int64())}), tmp_path / "t.parquet")
    program = next((wheel_env / "lib").glob("python3*/site-packages/sluice/_bin/sluice"))
    r = subprocess.run([str(program), "pack", "--json", "--from-parquet", "t.parquet", "o"], capture_output=True,
                       text=True, timeout=120, env={**env, "SLUICE_PYTHON": sys.executable}, cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 3, r.stdout + r.stderr
    # Its Python-driven command finds its experiments in the package, and runs them with the environment's Python.
    r = subprocess.run(["sluice", "journey", "--help"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stdout + r.stderr


def _cpython(minor):
    """An interpreter of CPython 3.minor on this machine: pyenv's build, or one on PATH; None where there is none."""
    home = pwd.getpwuid(os.getuid()).pw_dir  # not $HOME: the S3 fixture points that elsewhere
    pyenv = os.environ.get("PYENV_ROOT") or os.path.join(home, ".pyenv")
    found = sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3.{minor}"))
    on_path = shutil.which(f"python3.{minor}")
    return found[-1] if found else on_path if on_path and "/shims/" not in on_path else None


# The wheel claims every CPython 3 from 3.9 (requires-python): the one running these tests is tried above, the
# others here where the machine has them (3.9 runs on the old system below too).
OTHERS = [m for m in range(9, 14) if m != sys.version_info.minor]


@pytest.mark.parametrize("minor", OTHERS, ids=[f"3.{m}" for m in OTHERS])
def test_each_cpython_the_wheel_claims_runs_it(minor, s3, tmp_path):
    python = _cpython(minor)
    if python is None:
        pytest.skip(f"no CPython 3.{minor} on this machine (pyenv's or on PATH)")
    env_root = _install(tmp_path / "venv", python)
    run = tmp_path / "run"
    run.mkdir()
    r = subprocess.run([str(env_root / "bin" / "python"), "-c", CHILD, "pytest"],
                       capture_output=True, text=True, timeout=300, env=_clean_env(env_root), cwd=run)
    _child_ran(r, env_root)
    r = subprocess.run([str(env_root / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=60, env=_clean_env(env_root))
    assert r.stdout.strip() == f"(3, {minor})", r.stdout


def test_no_file_in_the_wheel_needs_a_glibc_newer_than_its_tag(tmp_path):
    assert re.search(r"-py3-none-(manylinux_2_\d+_x86_64\.)*manylinux_2_28_x86_64\.whl$", WHEEL), WHEEL
    with zipfile.ZipFile(WHEEL) as z:
        z.extractall(tmp_path)
    elves = [p for p in tmp_path.rglob("*") if p.is_file() and p.open("rb").read(4) == b"\x7fELF"]
    assert len(elves) >= 18, elves  # the library, the command and the 16 bundled libraries
    for elf in elves:
        refs = subprocess.run(["objdump", "-p", str(elf)], capture_output=True, text=True, timeout=60)
        assert refs.returncode == 0, refs.stderr
        needs = refs.stdout.partition("Version References:")[2]
        assert "GLIBCXX" not in needs and "CXXABI" not in needs, f"{elf.name} needs libstdc++"
        for major, minor in re.findall(r"\bGLIBC_(\d+)\.(\d+)", needs):
            assert (int(major), int(minor)) <= GLIBC_MAX, f"{elf.name} needs GLIBC_{major}.{minor}"
    auditwheel = pytest.importorskip("auditwheel")  # tests/requirements.txt has it
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", WHEEL], capture_output=True, text=True,
                          timeout=120)
    tag = re.search(r'consistent with the following platform tag: "manylinux_2_(\d+)_x86_64"', " ".join(show.stdout.split()))
    assert tag and int(tag.group(1)) <= GLIBC_MAX[1], show.stdout + show.stderr  # 2_28, or an older one


def test_an_old_system_installs_and_runs_the_wheel(s3, tmp_path):
    """Debian 11's own pip installs it (offline: numpy's wheel for 3.9 is in the root), and its Python 3.9, glibc
    2.31 and loader run it; ldd run there finds every library in the wheel or the system's policy set."""
    if not OLDROOT:
        pytest.skip("SLUICE_WHEEL_ROOT is not set: scripts/oldroot.sh makes the Debian 11 root (as root; "
                    "`make test-python` runs it)")
    root = os.path.realpath(OLDROOT)
    here = f"/w/{uuid.uuid4().hex}"  # inside the root
    os.makedirs(root + here + "/run")
    try:
        shutil.copy(WHEEL, root + here)
        whl = f"{here}/{os.path.basename(WHEEL)}"
        chroot = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc", "chroot", root]
        env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        env.update(PATH="/usr/sbin:/usr/bin:/sbin:/bin", HOME="/root", SLUICE_CONFIG="", LC_ALL="C.UTF-8")
        script = (f"set -e; python3 -m venv {here}/venv; "
                  f"{here}/venv/bin/python -m pip install -q --disable-pip-version-check --no-index "
                  f"--find-links /wheels {whl}; cd {here}/run; exec {here}/venv/bin/python -c \"$CHILD\" pytest")
        r = subprocess.run([*chroot, "/bin/sh", "-c", script], capture_output=True, text=True, timeout=600,
                           env={**env, "CHILD": CHILD})
        got = _child_ran(r, f"{here}/venv")
        _only_from(f"{here}/venv", got["lib"], run=chroot)
        r = subprocess.run([*chroot, f"{here}/venv/bin/sluice", "version"], capture_output=True, text=True,
                           timeout=60, env=env)
        assert r.returncode == 0 and r.stdout.strip(), r.stdout + r.stderr
        r = subprocess.run([*chroot, "/bin/sh", "-c", "ldd --version | head -1; python3 -V"], capture_output=True,
                           text=True, timeout=60, env=env)
        assert "2.31" in r.stdout and "Python 3.9" in r.stdout, r.stdout  # the old system, not this one
    finally:
        shutil.rmtree(root + here, ignore_errors=True)
