"""Every Python that sluice starts, for each command that starts one (diagnose, journey, pack --from-parquet, and
the wheel's `sluice` entry point in front of them), runs with the current directory off its module path: a
json.py, numpy.py, tempfile.py, runpy.py, sitecustomize.py or sluice/ package in the folder the user stands in
never runs in sluice's place, also where PYTHONPATH holds '' or '.' (an empty entry is the current directory
to Python).  The Python a script of the user's runs in (sluice diagnose's child) keeps the user's PYTHONPATH.
What sluice's own Python starts (journey's children) is kept from the folder too.  The one way in is
cli/python.c's cli_python_exec: no other exec of a Python is left in cli/ or src/."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import sluice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.path.abspath(os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice")))
HOSTILE = ("json", "numpy", "tempfile", "runpy", "sitecustomize")
# Each records who imported it (its pid and sys.argv[0]: '-c' or a module of sluice's for a Python sluice started),
# then refuses to be the module it shadows.
MODULE = '''import os, sys
with open(os.environ["SLUICE_TEST_MARK"], "a") as f:
    f.write("%s %d %s\\n" % (__name__, os.getpid(), (getattr(sys, "argv", None) or ["?"])[0]))
raise SystemExit("the " + __name__ + " of the current directory ran")
'''


@pytest.fixture
def hostile(tmp_path):
    """A folder to run from whose modules would each shadow one that sluice's Python imports."""
    d = tmp_path / "here"
    d.mkdir()
    for name in HOSTILE:
        (d / f"{name}.py").write_text(MODULE)
    (d / "sluice").mkdir()
    (d / "sluice" / "__init__.py").write_text(MODULE)
    return d


def env_for(tmp_path, pythonpath):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLUICE_TEST_MARK")}
    env.update(SLUICE_PYTHON=sys.executable, SLUICE_TEST_MARK=str(tmp_path / "marks"), SLUICE_CONFIG="")
    if os.environ.get("SLUICE_LIB"):
        env["SLUICE_LIB"] = os.path.abspath(os.environ["SLUICE_LIB"])
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def marks(tmp_path):
    """(module, pid, argv[0]) of each hostile module that ran."""
    f = tmp_path / "marks"
    return [tuple(line.split(" ", 2)) for line in f.read_text().splitlines()] if f.exists() else []


# The PYTHONPATHs tried: none; empty entries and '.' around sluice's own (absolute) path; the current directory
# by its absolute name.  The last two put the folder on the path of any Python that reads them.
PATHS = [None, f":.:{os.path.join(ROOT, 'python')}:", "{here}"]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    d = tmp_path_factory.mktemp("started")
    (d / "rows.jsonl").write_text("".join(f'{{"a": {i}}}\n' for i in range(300)))
    sluice.pack(str(d / "ds"), jsonl=str(d / "rows.jsonl"), fields="a")
    (d / "train.py").write_text("import sys, sluice\nfor b in sluice.Loader(sluice.Dataset(sys.argv[1]), "
                                "batch_size=32):\n    pass\nprint('trained', flush=True)\n")
    return d


def check_diagnose(cmd, ds, hostile, tmp_path, pythonpath):
    pp = pythonpath.format(here=hostile) if pythonpath else pythonpath
    r = subprocess.run(cmd + ["diagnose", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
                              "--", sys.executable, str(ds / "train.py"), str(ds / "ds")],
                       cwd=hostile, env=env_for(tmp_path, pp), capture_output=True, text=True, timeout=300)
    train = str(ds / "train.py")
    # Only the user's own script may import them, where the user's own PYTHONPATH says so.
    assert all(argv0 == train for _, _, argv0 in marks(tmp_path)), (marks(tmp_path), r.stderr)
    if pythonpath is None:
        assert r.returncode == 0 and "trained" in r.stdout, r.stderr
        assert not marks(tmp_path) and (tmp_path / "r.json").exists()
    else:
        assert marks(tmp_path) and "before its report was written" in r.stderr, r.stderr  # the user's script's


@pytest.mark.parametrize("pythonpath", PATHS)
def test_diagnose(ds, hostile, tmp_path, pythonpath):
    check_diagnose([SLUICE], ds, hostile, tmp_path, pythonpath)


@pytest.mark.parametrize("pythonpath", PATHS)
def test_journey(hostile, tmp_path, pythonpath):
    pp = pythonpath.format(here=hostile) if pythonpath else pythonpath
    r = subprocess.run([SLUICE, "journey", "--quick", "--only", "5", "--dir", str(tmp_path / "d"), "--html",
                        str(tmp_path / "j.html"), "--json", str(tmp_path / "j.json")], cwd=hostile,
                       env=env_for(tmp_path, pp), capture_output=True, text=True, timeout=300)
    assert not marks(tmp_path) and r.returncode == 0, (marks(tmp_path), r.stderr)
    assert (tmp_path / "j.json").exists()


@pytest.mark.parametrize("pythonpath", PATHS)
def test_pack_from_parquet(hostile, tmp_path, pythonpath):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"a": list(range(50))}), hostile / "t.parquet")
    pp = pythonpath.format(here=hostile) if pythonpath else pythonpath
    r = subprocess.run([SLUICE, "pack", "--from-parquet", "t.parquet", "out"], cwd=hostile,
                       env=env_for(tmp_path, pp), capture_output=True, text=True, timeout=300)
    assert not marks(tmp_path) and r.returncode == 0, (marks(tmp_path), r.stderr)
    assert len(sluice.Dataset(str(hostile / "out"))) == 50


@pytest.fixture(scope="module")
def wheel_layout(tmp_path_factory):
    """The wheel's layout, made from this build: site/sluice_cmd.py (the entry point) beside site/sluice, the
    package, with its program in sluice/_bin."""
    site = tmp_path_factory.mktemp("site")
    shutil.copy(os.path.join(ROOT, "python", "sluice_cmd.py"), site)
    shutil.copytree(os.path.join(ROOT, "python", "sluice"), site / "sluice",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "sluice" / "_bin").mkdir()
    shutil.copy(SLUICE, site / "sluice" / "_bin" / "sluice")
    return site


@pytest.mark.parametrize("pythonpath", PATHS)
def test_the_wheels_entry_point_then_diagnose(ds, hostile, tmp_path, wheel_layout, pythonpath):
    """The wheel's `sluice` (the entry point, a Python of the user's, runs the program, which runs Python): the
    Python the program starts imports nothing from the current directory either.  The entry point's own Python
    is the user's: a sitecustomize.py where the user's PYTHONPATH points runs there whatever sluice does, so it
    is left out of those cases."""
    if pythonpath is not None:
        (hostile / "sitecustomize.py").unlink()
    check_diagnose([sys.executable, str(wheel_layout / "sluice_cmd.py")], ds, hostile, tmp_path, pythonpath)


def test_no_other_way_to_start_a_python():
    """exec and spawn calls in cli/ and src/: cli_python_exec's alone, and tune's posix_spawn of its own program."""
    calls = re.compile(r"\b(exec[lv]p?e?|fexecve|posix_spawnp?|popen|system)\s*\(")
    found = []
    for top in ("cli", "src"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".c", ".h")):
                    path = os.path.join(d, name)
                    with open(path) as f:
                        for n, line in enumerate(f, 1):
                            if calls.search(line) and not line.lstrip().startswith(("*", "/*", "//")):
                                found.append((os.path.relpath(path, ROOT), line.strip()))
    assert sorted(found) == [("cli/cmd_tune.c", "rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);"),
                             ("cli/python.c", "execvp(py, argv);")], found


def test_what_sluices_own_python_starts_is_kept_from_the_folder_too(hostile, tmp_path):
    """journey's children (its `sluice bench` runs here; DataLoader workers where torch is) get the PYTHONPATH
    without the folder and PYTHONSAFEPATH=1: multiprocessing's spawn and forkserver children start with -c, which
    would put the current directory first."""
    seen = tmp_path / "env"
    fake = tmp_path / "sluice"
    fake.write_text(f'#!/bin/sh\nenv > "{seen}"\nexec "{SLUICE}" "$@"\n')
    fake.chmod(0o755)
    env = dict(env_for(tmp_path, f":.:{hostile}"), SLUICE_BIN=str(fake))
    r = subprocess.run([SLUICE, "journey", "--quick", "--only", "2", "--dir", str(tmp_path / "d"), "--html",
                        str(tmp_path / "j.html")], cwd=hostile, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and not marks(tmp_path), r.stderr
    child = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert child.get("PYTHONSAFEPATH") == "1"
    assert all(e and os.path.isabs(e) and os.path.realpath(e) != str(hostile)
               for e in child.get("PYTHONPATH", "/").split(":")), child.get("PYTHONPATH")


def test_the_script_under_diagnose_keeps_the_users_pythonpath(ds, tmp_path):
    """The user's script is the user's: its PYTHONPATH is theirs, relative entries and '.' included, and no
    PYTHONSAFEPATH of sluice's (it would drop the script's own folder from its path)."""
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "mymod.py").write_text("X = 42\n")
    (tmp_path / "train.py").write_text("import json, os, sys, mymod\nassert mymod.X == 42\n"
                                       "json.dump(dict(os.environ), open(sys.argv[1], 'w'))\n")
    r = subprocess.run([SLUICE, "diagnose", "--html", "r.html", "--", sys.executable, "train.py", "env.json"],
                       cwd=tmp_path, env=env_for(tmp_path, "mylib:."), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    child = json.loads((tmp_path / "env.json").read_text())
    assert "PYTHONSAFEPATH" not in child and ":mylib:.:" in f":{child['PYTHONPATH']}:", child["PYTHONPATH"]
