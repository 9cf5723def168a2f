"""What users read says what the code does: the reference is the one generated from the header, each command's
--help and the Python package's docstrings (scripts/gen_reference.py); every example in the README and the guides
runs (Python, shell and C, and the programs in examples/); and no issue numbers (the project's own bookkeeping)
appear in them.

An example that needs a GPU or PyTorch says so in the line before its fence, `<!-- needs: gpu -->` or
`<!-- needs: torch -->`, and is skipped (reported as skipped) where there is none; everything else runs
everywhere. The set-up commands, run in a checkout (`<!-- needs: checkout -->`), are what `make test` and CI are
already running: there each `make TARGET` is dry-run (the target exists and its recipe expands) and each
`pip install WHEEL` resolves the wheel without installing it (test_wheel installs and runs it)."""
import functools
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


def _examples(lang):
    """(document, block, needs) of every ```lang block, in document order (the generated reference's blocks are
    declarations, not examples)."""
    for path in READ:
        if os.sep + "reference" + os.sep in path:
            continue
        fence = re.compile(r"(?:<!-- needs: (\w+) -->\n)?```" + lang + r"\n(.*?)```", re.S)
        for i, m in enumerate(fence.finditer(open(path).read())):
            yield pytest.param(path, m.group(2), m.group(1), id=f"{os.path.relpath(path, ROOT)}:{lang}{i}")


@functools.lru_cache(None)
def _have_gpu():
    import sluice
    if sluice.gpu_count() == 0:
        return False
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _needs(needs):
    assert needs in (None, "gpu", "torch", "checkout"), f"unknown need {needs!r}"
    if needs == "gpu" and not _have_gpu():
        pytest.skip("the example needs a GPU (and torch with CUDA)")
    if needs == "torch":
        pytest.importorskip("torch", reason="the example needs PyTorch")


@pytest.fixture(scope="session")
def env(s3, tmp_path_factory):
    """The environment examples run in: the S3 test server's AWS_* variables (s3) and its bucket my-bucket; the
    sluice these tests run (the source tree's, or an installed wheel's) as `sluice`, and this interpreter as
    `python3`, first on PATH; no settings file."""
    s3.create_bucket(Bucket="my-bucket")
    import sluice
    bin_dir = tmp_path_factory.mktemp("doc-bin")
    for name, target in (("sluice", os.path.abspath(SLUICE)), ("python3", sys.executable), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    path = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(sluice.__file__))),
                            os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, SLUICE_CONFIG="", PYTHONPATH=path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               SLUICE_BIN=os.path.abspath(SLUICE))
    if env.get("SLUICE_LIB"):
        env["SLUICE_LIB"] = os.path.abspath(env["SLUICE_LIB"])
    return env


# In a checkout: `make` dry-runs, `pip install` resolves its wheel without installing (77: it is not built).
CHECKOUT = f"""
make() {{ command make -n -C "{ROOT}" "$@" > /dev/null; }}
pip() {{
    [ "$1" = install ] || {{ echo "pip $1: not a set-up command" >&2; return 1; }}
    shift
    for w in "$@"; do [ -e "$w" ] || exit 77; done
    python3 -m pip install --dry-run --no-deps --no-index --quiet "$@"
}}
"""


_folders = {}


def _folder(doc, tmp_path_factory):
    """One folder a document: its shell examples run in order in it, so a later one may use what an earlier one
    made, as a reader following the page would."""
    if doc not in _folders:
        _folders[doc] = tmp_path_factory.mktemp(os.path.basename(doc).replace(".md", ""))
    return _folders[doc]


@pytest.mark.parametrize("doc,code,needs", list(_examples("python")))
def test_each_python_example_runs(doc, code, needs, tmp_path, env):
    """In a folder of its own."""
    _needs(needs)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("doc,code,needs", list(_examples("sh")))
def test_each_shell_example_runs(doc, code, needs, env, tmp_path_factory):
    """Under bash -e -o pipefail: every command must succeed."""
    _needs(needs)
    cwd = _folder(doc, tmp_path_factory)
    if needs == "checkout":
        code, cwd = CHECKOUT + code, ROOT
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=cwd, env=env)
    if r.returncode == 77 and needs == "checkout":
        pytest.skip("the wheel is not built (make wheel)")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])


@pytest.mark.parametrize("doc,code,needs", list(_examples("c")))
def test_each_c_example_compiles_and_runs(doc, code, needs, tmp_path, env):
    """Built with the machine's C compiler against include/sluice.h and the library these tests run."""
    _needs(needs)
    import shutil
    import sluice
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = os.path.dirname(os.path.abspath(sluice._lib.lib._name))
    (tmp_path / "example.c").write_text(code)
    b = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"), "example.c",
                        "-o", "example", "-L", lib, "-lsluice", f"-Wl,-rpath,{lib}"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert b.returncode == 0, b.stderr[-3000:]
    r = subprocess.run(["./example"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])


@pytest.mark.parametrize("program", sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))),
                         ids=os.path.basename)
def test_each_example_program_runs(program, tmp_path, env):
    """The training programs in examples/ (they train on the GPU)."""
    _needs("gpu")
    r = subprocess.run([sys.executable, program, "--sluice", os.path.abspath(SLUICE)], capture_output=True,
                       text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]


def test_no_issue_numbers_in_what_users_read():
    found = [f"{os.path.relpath(p, ROOT)}: {m}" for p in READ for m in re.findall(r"issues? #\d+", open(p).read())]
    assert not found, found
