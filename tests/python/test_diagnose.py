"""sluice diagnose: an unchanged script run under the hook, its report (HTML, JSON, trace), the worker sweep, and
what it must leave alone (the script's exit status, a sitecustomize of the user's); one report a run however many
Pythons the script starts, in the Python the command names.  DataLoader situations need torch and run where it is
installed (the GPU machine; /work/venv-torch); each has a torch-free counterpart where one can show the same.  The
modules of the current directory: test_started_pythons.py."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sluice

SLUICE = os.path.abspath(os.environ.get("SLUICE_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "sluice")))

TRAIN = r"""
import hashlib, sys, time
import sluice
ld = sluice.Loader(sluice.Dataset(sys.argv[1]), batch_size=32)
for epoch in range(2):
    ld.set_epoch(epoch)
    for b in ld:
        t = time.thread_time()
        while time.thread_time() - t < 0.001:   # a step: some CPU, then the GPU's time (a wait)
            hashlib.sha256(b"x" * 4096).digest()
        time.sleep(0.01)
if len(sys.argv) > 2:
    raise RuntimeError("the script fails after training")
print("trained", flush=True)
"""


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    d = tmp_path_factory.mktemp("diag")
    rows = d / "rows.jsonl"
    rows.write_text("".join(f'{{"a": {i}}}\n' for i in range(2000)))
    sluice.pack(str(d / "ds"), jsonl=str(rows), fields="a")
    (d / "train.py").write_text(TRAIN)
    return d


def diagnose(args, cwd, env=None, timeout=300):
    return subprocess.run([SLUICE, "diagnose"] + args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "SLUICE_PYTHON": sys.executable, **(env or {})})


def test_an_unchanged_script_gets_a_report(ds, tmp_path):
    r = diagnose(["--json", "r.json", "--trace", "t.json", "--html", "r.html", "--", sys.executable,
                  str(ds / "train.py"), str(ds / "ds")], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    (ld,) = rep["loaders"]
    assert ld["label"] == "sluice.Loader #1" and ld["batches"] == 2 * (2000 // 32 + 1) and ld["epochs"] == 2
    # An 11 ms step keeps ahead of this loader on an idle machine, not always on a crowded one: compute-bound
    # unless a wait was measured (the rule itself is test_profile's, on figures given).
    assert ld["verdict"] in r.stderr and ld["loader"]["batches"] == ld["batches"]
    waited = max(ld["wait_share"], ld["loader"]["gpu_wait_share"]) >= 0.05
    assert ld["verdict"] == "compute-bound" or waited, ld["evidence"]
    assert len(ld["timeline"]["batches"]) == ld["batches"] and ld["timeline"]["samples"]
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sum(e["name"] == "waiting for a batch" for e in trace) == ld["batches"]
    page = (tmp_path / "r.html").read_text()
    gpu = any(x["gpu_util"] for x in ld["timeline"]["samples"])  # a GPU utilisation chart where NVML answers
    assert page.startswith("<!doctype html>") and page.count("<svg") == 3 + gpu and "compute-bound" in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched to view it


def test_the_scripts_failure_is_its_exit_status_and_the_report_still_comes(ds, tmp_path):
    r = diagnose(["--json", "r.json", "--", sys.executable, str(ds / "train.py"), str(ds / "ds"), "fail"], tmp_path)
    assert r.returncode == 1 and "the script fails after training" in r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["returncode"] == 1 and rep["loaders"][0]["batches"] > 0


def test_the_users_own_sitecustomize_still_runs(ds, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nopen(os.environ['MARK'], 'w').write('ran')\n")
    r = diagnose(["--json", "r.json", "--", sys.executable, str(ds / "train.py"), str(ds / "ds")], tmp_path,
                 env={"PYTHONPATH": f"{mine}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                      "MARK": str(tmp_path / "mark")})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mark").read_text() == "ran"
    assert json.loads((tmp_path / "r.json").read_text())["loaders"][0]["batches"] > 0


def test_a_sweep_without_a_dataloader_says_nothing_was_applied(ds, tmp_path):
    """A script of sluice.Loader alone has no DataLoader worker count to sweep: each run stops after --steps, and
    the sweep says it applied nothing rather than measuring the same thing three times (found by a stranger)."""
    r = diagnose(["--json", "r.json", "--sweep-workers", "0,2", "--steps", "20", "--", sys.executable,
                  str(ds / "train.py"), str(ds / "ds")], tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [s["workers"] for s in rep["sweep"]] == [0, 2] and rep["sweep_steps"] == 20
    for s in rep["sweep"]:
        assert s["returncode"] == 0 and s["applied"] is False and s["batches_s"] is None
    assert "not applied (the script made no torch DataLoader)" in r.stderr


def test_outputs_are_checked_before_the_script_runs(ds, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    (tmp_path / "adir").mkdir()
    for args, word in ((["--html", str(script)], "overwrite it"), (["--json", "adir"], "not a regular file"),
                       (["--html", "x.json", "--json", "x.json"], "named for two"),
                       (["--trace", "/nonexistent/t.json"], "not there or not writable")):
        r = diagnose(args + ["--", sys.executable, str(script), str(ds / "ds")], tmp_path)
        assert r.returncode == 2 and word in r.stderr and "trained" not in r.stdout, (args, r.stderr)
    assert script.read_text() == TRAIN


def test_a_script_that_ends_without_its_report_is_said_so(tmp_path):
    (tmp_path / "quits.py").write_text("import os\nos._exit(3)\n")
    r = diagnose(["--", sys.executable, str(tmp_path / "quits.py")], tmp_path)
    assert r.returncode == 3 and "before its report was written" in r.stderr
    r = diagnose(["--", str(tmp_path / "no-such-python")], tmp_path)
    assert r.returncode != 0 and "cannot run" in r.stderr and "Traceback" not in r.stderr


def test_help_needs_no_python(tmp_path):
    r = diagnose(["--help"], tmp_path, env={"SLUICE_PYTHON": "/nonexistent/python"})
    assert r.returncode == 0 and "usage: sluice diagnose" in r.stdout and "--sweep-workers" in r.stdout


def test_bad_arguments_are_named(tmp_path):
    r = diagnose(["python3", "x.py"], tmp_path)
    assert r.returncode == 2 and "usage: sluice diagnose" in r.stderr
    r = diagnose(["--sweep-workers", "4,x", "--", sys.executable, "x.py"], tmp_path)
    assert r.returncode == 2 and "--sweep-workers '4,x'" in r.stderr
    r = diagnose(["--"], tmp_path)
    assert r.returncode == 2 and "no command after --" in r.stderr


def test_the_report_in_a_browser(ds, tmp_path):
    """The report opened in a real headless browser (Debian's chromium): its line charts are drawn."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("no chromium (scripts/deps.sh test installs it)")
    Image = pytest.importorskip("PIL.Image")
    r = diagnose(["--", sys.executable, str(ds / "train.py"), str(ds / "ds")], tmp_path)
    assert r.returncode == 0, r.stderr
    shot = tmp_path / "shot.png"
    b = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1000,1600",
                        (tmp_path / "sluice-diagnose.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.exists(), b.stderr
    px = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)

    def count(r, g, b):
        return int((np.abs(px - np.array([r, g, b])) < 12).all(axis=2).sum())
    assert count(0xe0, 0x7b, 0x39) > 500 and count(0x2b, 0x7b, 0xb9) > 500  # the orange and blue lines


FAKE_PYTHON = """#!/bin/sh
echo "the first python3 on PATH ran: $*" >&2
exit 97
"""


def test_the_driver_runs_in_the_python_the_command_names(ds, tmp_path):
    """`-- /path/to/venv/bin/python train.py`, and a launcher whose #! line names that Python (torchrun's shape),
    where the first python3 on PATH and SLUICE_PYTHON are another Python (one without numpy: it failed with "No
    module named 'numpy'")."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(FAKE_PYTHON)
    (bin_ / "python3").chmod(0o755)
    launch = tmp_path / "launch"
    launch.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv = sys.argv[1:]\n"
                      "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    launch.chmod(0o755)
    env = {"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "SLUICE_PYTHON": str(bin_ / "python3")}
    for cmd in ([sys.executable], [str(launch)]):
        r = diagnose(["--json", "r.json", "--"] + cmd + [str(ds / "train.py"), str(ds / "ds")], tmp_path, env=env)
        assert r.returncode == 0 and "first python3" not in r.stderr, (cmd, r.stderr)
        assert json.loads((tmp_path / "r.json").read_text())["loaders"][0]["batches"] > 0
    # A command that names no Python: SLUICE_PYTHON's, as before.
    r = diagnose(["--", "sh", "-c", "true"], tmp_path, env=env)
    assert r.returncode == 97 and "the first python3 on PATH ran" in r.stderr


def test_the_commands_first_line_is_read_only_from_a_regular_file(tmp_path):
    """The #! line of the command is read to find its Python: a FIFO named there is not opened to wait on (it would
    block), a first line longer than 255 bytes is not read on; each is then said not to run."""
    os.mkfifo(tmp_path / "fifo")
    os.chmod(tmp_path / "fifo", 0o755)
    (tmp_path / "long").write_text("#!" + "x" * 300 + "\n")
    (tmp_path / "long").chmod(0o755)
    for cmd in ("fifo", "long"):
        r = diagnose(["--html", "r.html", "--", str(tmp_path / cmd)], tmp_path, timeout=60)
        assert r.returncode != 0 and f"cannot run {tmp_path / cmd}" in r.stderr, r.stderr


LAUNCHED = r"""
import multiprocessing as mp, os, sys
import sluice

def work(x):
    return x * 2

if __name__ == "__main__":
    pool = mp.get_context("spawn").Pool(2)        # Pythons of the trainer's: they load the hook too
    assert pool.map(work, range(4)) == [0, 2, 4, 6]
    pool.close()
    pool.join()
    for b in sluice.Loader(sluice.Dataset(sys.argv[1]), batch_size=32):
        pass
    if os.fork() == 0:                              # a forked copy, its atexit (the hook's) inherited
        sys.exit(0)
    os.wait()
    print("trained", os.getpid(), flush=True)
"""


def test_one_report_a_run_the_training_processs(ds, tmp_path):
    """A launcher (any Python that runs the trainer: torchrun's shape) whose trainer starts Pythons of its own (a
    spawn Pool) and forks: one report, the trainer's; every Python of the run listed by kind (each wrote the one
    report at its exit and the last won: the launcher's, with no loaders)."""
    (tmp_path / "train.py").write_text(LAUNCHED)
    (tmp_path / "launcher.py").write_text("import subprocess, sys\n"
                                          "sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))\n")
    r = diagnose(["--json", "r.json", "--", sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "train.py"),
                  str(ds / "ds")], tmp_path)
    assert r.returncode == 0, r.stderr
    trainer = int(r.stdout.split()[-1])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["pid"] == trainer and rep["argv"][0] == str(tmp_path / "train.py")
    (ld,) = rep["loaders"]
    assert ld["batches"] == 2000 // 32 + 1
    kinds = sorted((p["kind"], p["training"]) for p in rep["pythons"])
    # The launcher, the trainer, the pool's two; perhaps multiprocessing's resource tracker; never the fork.
    assert [k for k in kinds if k != ("python", False)] == [("multiprocessing", False)] * 2 + [("python", True)]
    assert sum(p["argv"][0] == str(tmp_path / "launcher.py") for p in rep["pythons"]) == 1
    assert len(rep["pythons"]) <= 5 and "2 multiprocessing children" in r.stderr


RANKS = r"""
import os, subprocess, sys
# torchrun's shape: one launcher, a trainer a rank, each with its RANK; rank 1 takes more batches, and ends last.
procs = [subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2], str(n)], env=dict(os.environ, RANK=str(r)))
         for r, n in ((0, 16), (1, 48))]
procs[0].wait()
sys.exit(procs[1].wait())
"""
RANK = ("import sys, sluice\nfor b in sluice.Loader(sluice.Dataset(sys.argv[1]), batch_size=int(sys.argv[2]), rank=0, "
        "world_size=1):\n    pass\n")  # each rank the whole dataset: its batches say which rank it was


def test_torchruns_ranks_report_rank_0(ds, tmp_path):
    (tmp_path / "launch.py").write_text(RANKS)
    (tmp_path / "rank.py").write_text(RANK)
    r = diagnose(["--json", "r.json", "--", sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "rank.py"),
                  str(ds / "ds")], tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["argv"][-1] == "16" and rep["loaders"][0]["batches"] == 2000 // 16
    assert sorted(p["batches"] for p in rep["pythons"]) == [0, 2000 // 48 + 1, 2000 // 16]


DL_TRAIN = r"""
import hashlib, sys, time
import numpy as np, torch

class Decoded(torch.utils.data.Dataset):        # a decode's worth of CPU an item
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        t = time.thread_time()
        while time.thread_time() - t < 0.002:
            hashlib.sha256(b"x" * 4096).digest()
        return torch.full((64,), i, dtype=torch.float32)

dl = torch.utils.data.DataLoader(Decoded(), batch_size=16, num_workers=int(sys.argv[1]))
for b in dl:
    time.sleep(0.002)
"""


def test_a_dataloader_with_no_workers_and_a_heavy_decode(tmp_path):
    """A torch DataLoader found without edits: with no workers and 32 ms of CPU a batch it is cpu-bound, and the
    sweep's measured rate with 2 workers is beside the first run's prediction."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(DL_TRAIN)
    r = diagnose(["--json", "r.json", "--sweep-workers", "0,2", "--steps", "60", "--", sys.executable,
                  str(tmp_path / "train.py"), "0"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    (ld,) = rep["loaders"]
    assert ld["label"] == "DataLoader #1" and ld["verdict"] == "cpu-bound", ld["evidence"]
    assert [s["workers"] for s in rep["sweep"]] == [0, 2] and all(s["batches_s"] > 0 for s in rep["sweep"])
    assert all(s["predicted_batches_s"] for s in rep["sweep"])


DL_SPAWN = r"""
import multiprocessing, os, sys, time
import torch

class Fetch(torch.utils.data.Dataset):           # a fetch a sample: the worker waits, its CPU idle
    def __len__(self):
        return 128
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.full((8,), i)

def spin(stop):                                   # a child of the script's, busy for another reason
    while not stop.is_set():
        pass

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    busy = ctx.Process(target=spin, args=(stop,), daemon=True)
    busy.start()
    dl = torch.utils.data.DataLoader(Fetch(), batch_size=8, num_workers=2, multiprocessing_context="spawn",
                                     persistent_workers=True)
    for epoch in range(2):
        for b in dl:
            pass
    stop.set()
    busy.join()
    print("trained", os.getpid(), busy.pid, flush=True)
"""


def test_spawned_dataloader_workers_that_wait_on_a_fetch(tmp_path):
    """torch DataLoader workers started with spawn (as CUDA users do), each waiting 50 ms a sample, beside a busy
    child of the script's: one report, the training process's; its two workers counted as the loading's (as
    DataLoader workers among the run's Pythons, and by pid in the profile) however idle; the busy child not
    among them; latency-bound, more workers advised.  Before: a worker's empty report could replace the
    trainer's, the idle workers were "(no workers)" and ipc-bound, the busy child a loading worker."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(DL_SPAWN)
    r = diagnose(["--json", "r.json", "--", sys.executable, str(tmp_path / "train.py")], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    trainer, spinner = (int(x) for x in r.stdout.split()[-2:])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["pid"] == trainer
    (ld,) = rep["loaders"]
    assert ld["label"] == "DataLoader #1" and ld["batches"] == 2 * 128 // 8 and ld["epochs"] == 2
    spawned = {p["pid"] for p in rep["pythons"] if p["kind"] == "dataloader-worker"}
    roles = {x["pid"]: x["role"] for x in ld["processes"]}
    assert len(spawned) == 2 and {pid for pid, role in roles.items() if role == "worker"} == spawned, (spawned, roles)
    assert roles.get(spinner) == "other"
    assert ld["verdict"] == "latency-bound", ld["evidence"]
    assert "2 worker processes busy" in ld["evidence"][1] and "more workers" in ld["fix"]
    assert ld["expected"]["workers"] > 2 and "persistent_workers" not in ld["fix"]


# A script that runs until a signal ends it: it writes its pid, and SIGTERM (where it handles it) ends it with 7.
FOREVER = r"""
import os, signal, sys, time
if sys.argv[2] == "handles":
    signal.signal(signal.SIGTERM, lambda *_: (print("terminated", flush=True), sys.exit(7)))
if sys.argv[2] == "counts":
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
t = time.monotonic()
while time.monotonic() - t < 120 and not (sys.argv[2] == "counts" and got):
    time.sleep(0.05)
if sys.argv[2] == "counts":
    time.sleep(1)  # a second SIGINT, were one sent, comes meanwhile
    print("sigints", len(got), flush=True)
"""


def _started(pidfile, proc):
    """The script's pid once it runs (its pid file written), its process checked to be the script's."""
    for _ in range(1200):
        if pidfile.exists():
            return int(pidfile.read_text())
        assert proc.poll() is None, proc.communicate()
        import time
        time.sleep(0.05)
    raise AssertionError("the script never started")


def _reap(pid):
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _run_forever(tmp_path, how, **kw):
    (tmp_path / "forever.py").write_text(FOREVER)
    pidfile = tmp_path / "pid"
    p = subprocess.Popen([SLUICE, "diagnose", "--json", "r.json", "--", sys.executable, "forever.py", str(pidfile),
                          how], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "SLUICE_PYTHON": sys.executable}, **kw)
    return p, _started(pidfile, p)


@pytest.mark.parametrize("how", ["handles", "dies"])
def test_a_signal_to_sluice_reaches_the_script(tmp_path, how):
    """SIGTERM to sluice (a scheduler's, timeout's, kill's) is the script's, as without sluice: one that handles it
    ends as it chooses and its report comes; one that does not dies of it, and so does sluice (the shell sees the
    script's signal).  Before, the driver died of it and left the script running, orphaned."""
    p, script = _run_forever(tmp_path, how)
    try:
        os.kill(p.pid, 15)
        out, err = p.communicate(timeout=60)
    finally:
        _reap(script)
        p.kill()
    if how == "handles":
        assert p.returncode == 7 and "terminated" in out, err
        assert json.loads((tmp_path / "r.json").read_text())["returncode"] == 7
    else:
        assert p.returncode == -15, err
    with pytest.raises(ProcessLookupError):
        os.kill(script, 0)


def test_a_sigint_sent_to_sluice_alone_interrupts_the_script(tmp_path):
    """kill -INT of sluice's pid (not the terminal's Ctrl-C, which reaches the whole group) is the script's
    KeyboardInterrupt, and sluice ends of SIGINT as the script does.  Before, the driver took the interrupt and
    waited on a script that never got it."""
    p, script = _run_forever(tmp_path, "dies")
    try:
        os.kill(p.pid, 2)
        out, err = p.communicate(timeout=60)
    finally:
        _reap(script)
        p.kill()
    assert p.returncode == -2 and "KeyboardInterrupt" in err, err


def test_ctrl_c_at_a_terminal_reaches_the_script_once(tmp_path):
    """The terminal's Ctrl-C goes to the foreground group, the script and sluice both: sluice does not send it
    again (a script that handles SIGINT sees one)."""
    import pty
    import select
    (tmp_path / "forever.py").write_text(FOREVER)
    pidfile = tmp_path / "pid"
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(tmp_path)
        os.environ["SLUICE_PYTHON"] = sys.executable
        os.execv(SLUICE, [SLUICE, "diagnose", "--html", "r.html", "--", sys.executable, "forever.py", str(pidfile),
                          "counts"])
    out = b""
    try:
        for _ in range(1200):
            if pidfile.exists():
                break
            import time
            time.sleep(0.05)
        os.write(fd, b"\x03")
        while b"sigints" not in out or not out.endswith(b"\n"):
            r, _, _ = select.select([fd], [], [], 60)
            if not r:
                break
            try:
                got = os.read(fd, 4096)
            except OSError:
                break
            if not got:
                break
            out += got
    finally:
        if pidfile.exists():
            _reap(int(pidfile.read_text()))
        os.waitpid(pid, 0)
        os.close(fd)
    assert b"sigints 1" in out, out


def test_a_report_that_cannot_be_written_leaves_the_scripts_status(tmp_path):
    """The script removes the report's folder as it runs: the report is said not written and the command's status
    is still the script's (it was a traceback and status 1)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "rm.py").write_text("import shutil, sys\nshutil.rmtree('out')\nsys.exit(3)\n")
    r = diagnose(["--html", "out/r.html", "--json", "r.json", "--", sys.executable, "rm.py"], tmp_path)
    assert r.returncode == 3 and "out/r.html was not written" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["returncode"] == 3


def test_a_report_named_by_a_link_is_written_into_its_target(tmp_path):
    """--json latest.json, a symbolic link to runs/1.json: the figures go where the link leads (as `> latest.json`
    would write them); the link stays (it was replaced by a regular file, the target left as it was)."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "1.json").write_text("{}")
    os.symlink("runs/1.json", tmp_path / "latest.json")
    (tmp_path / "ok.py").write_text("pass\n")
    r = diagnose(["--json", "latest.json", "--", sys.executable, "ok.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert os.path.islink(tmp_path / "latest.json")
    assert json.loads((tmp_path / "runs" / "1.json").read_text())["returncode"] == 0


def test_a_python_without_numpy_is_said_in_one_sentence(tmp_path):
    """`-- venv/bin/python train.py` with a venv that lacks numpy: one sentence naming that Python and what it
    lacks (it was a traceback from sluice's import)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bare = str(tmp_path / "bare" / "bin" / "python")
    if subprocess.run([bare, "-c", "import numpy"], capture_output=True).returncode == 0:
        pytest.skip("the bare venv sees a numpy (system site packages)")
    (tmp_path / "ok.py").write_text("print('ran')\n")
    r = diagnose(["--", bare, "ok.py"], tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "ran" not in r.stdout, r.stderr
    assert f"{bare} has no module named 'numpy'" in r.stderr and "needs sluice and numpy" in r.stderr, r.stderr


SHADOWED = ("random", "json", "tempfile", "statistics", "inspect", "weakref", "queue")


def test_the_scripts_own_modules_named_like_the_standard_librarys_are_its_own(tmp_path):
    """A random.py, json.py or queue.py beside the script is what the script imports, under sluice as under plain
    python (it got the standard library's: the hook had imported them first); the hook's report still comes."""
    for name in SHADOWED:
        (tmp_path / f"{name}.py").write_text(f"MINE = {name!r}\n")
    (tmp_path / "mods.py").write_text("import " + ", ".join(SHADOWED) + "\nprint(sorted(getattr(m, 'MINE', "
                                      "m.__name__ + ' of the standard library') for m in (" + ", ".join(SHADOWED)
                                      + ")))\n")
    plain = subprocess.run([sys.executable, "mods.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # What plain python gives is the rule: its own start-up imports some (Python 3.12 in a venv: inspect, random,
    # tempfile, weakref), and those are the standard library's under plain python too.
    assert plain.returncode == 0 and plain.stdout.count("of the standard library") < len(SHADOWED), plain.stdout
    out = tmp_path / "out"
    out.mkdir()
    r = diagnose(["--json", str(out / "r.json"), "--html", str(out / "r.html"), "--", sys.executable,
                  str(tmp_path / "mods.py")], out)
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    assert json.loads((out / "r.json").read_text())["reported"] is True
