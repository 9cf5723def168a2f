"""sluice diagnose: runs an unchanged training script and says where its pipeline loses time.

    sluice diagnose [--html R.html] [--json R.json] [--trace T.json] [--sweep-workers 0,4,8 [--steps N]] -- python train.py ARGS

The script runs as it is, in a child process whose Python loads a hook first (a sitecustomize of sluice's, ahead
of the PYTHONPATH, which then runs the one it hides): every torch DataLoader and sluice.Loader the script
iterates is watched by sluice.profile, with NVTX ranges around each wait for a batch (for Nsight Systems).  Every
Python the script starts loads the hook too (DataLoader workers, a launcher's children, torchrun's ranks) and
writes its own figures at its exit, a file each; the report is the training process's (_gather).  `sluice
diagnose` (cli/cmd_diagnose.c) runs this module in the Python the command names.  At the script's end the report
is written: the verdict with its evidence and fix for each watched loader, charts of
its run (the wait for data against the loop's own work, batch by batch; CPU cores of the loop's process and of
each worker; disk reads and the page cache; GPU utilisation), its figures as JSON, and a Chrome trace of the
waits and steps (Perfetto, chrome://tracing).  --sweep-workers runs the script's first --steps batches again at
each DataLoader worker count and charts the batches a second each gave, beside what the first run predicted.
"""
import argparse
import atexit
import html
import importlib.machinery
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref

from .profiler import predict_rate

ENV_OUT, ENV_WORKERS, ENV_STEPS = "SLUICE_DIAGNOSE_OUT", "SLUICE_DIAGNOSE_WORKERS", "SLUICE_DIAGNOSE_STEPS"

# ---- the child: the hook its sitecustomize installs

_SITECUSTOMIZE = '''"""sluice diagnose's hook (sluice/diagnose.py), then the sitecustomize it hides, if any."""
import importlib.machinery, importlib.util, os, sys
try:
    _before = set(sys.modules)
    from sluice import diagnose as _d
    _d._install()
    _d._unshadow(_before)
except Exception as e:  # the script runs all the same
    print(f"sluice diagnose: the hook did not install: {type(e).__name__}: {e}", file=sys.stderr)
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec and _spec.loader:
    _m = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _m  # importable by its name, as without the hook
    _spec.loader.exec_module(_m)
'''

_watched = []  # (a weak reference to the loader, its profile), in the order first seen
_limit = {"steps": 0, "seen": 0, "workers_applied": False}
_shared = []  # the one sampler every watched loader's profile reads


def _profile_for(obj, label):
    from .profiler import _Sampler, profile
    for ref, p in _watched:
        if ref() is obj:
            return p
    if not _shared:
        _shared.append(_Sampler(0.2))
        _shared[0].start()
    p = profile(None, file=None, nvtx=True, sampler=_shared[0])
    p._stats_from = weakref.ref(obj)  # the loader's own stats, without keeping it alive
    p._start()
    _watched.append((weakref.ref(obj), p))
    p.label = label
    return p


def _watch(cls, label):
    """cls.__iter__ timed by the profile of each instance (started at its first iteration)."""
    orig = cls.__iter__
    if getattr(orig, "_sluice_diagnose", False):
        return

    def __iter__(self):
        p = _profile_for(self, f"{label} #{sum(1 for _, q in _watched if q.label.startswith(label)) + 1}")
        for b in p._wrap(lambda: orig(self)):
            yield b
            _limit["seen"] += 1
            if _limit["steps"] and _limit["seen"] >= _limit["steps"]:
                raise SystemExit(0)  # --steps: the script ends here, its atexit (the report) runs
    __iter__._sluice_diagnose = True
    cls.__iter__ = __iter__


def _patch_dataloader(mod):
    cls = mod.DataLoader
    _watch(cls, "DataLoader")
    workers = os.environ.get(ENV_WORKERS)
    if workers is None or getattr(cls.__init__, "_sluice_diagnose", False):
        return
    if not workers.isdigit() or int(workers) > 1024:
        print(f"sluice diagnose: {ENV_WORKERS}={workers!r} is not a worker count: left alone", file=sys.stderr)
        return
    orig_init, w = cls.__init__, int(workers)

    def __init__(self, *args, **kw):
        bound = inspect.signature(orig_init).bind(self, *args, **kw)
        bound.arguments["num_workers"] = w
        if w == 0:  # what a DataLoader refuses without workers
            bound.arguments.pop("prefetch_factor", None)
            bound.arguments["persistent_workers"] = False
        orig_init(*bound.args, **bound.kwargs)
        _limit["workers_applied"] = True
    __init__._sluice_diagnose = True
    cls.__init__ = __init__


class _Finder:
    """Patches torch.utils.data.dataloader once the script imports it (torch itself is never imported here)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.utils.data.dataloader":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch_dataloader(module)
        spec.loader.exec_module = exec_module
        return spec


def _install():
    # Everything the hook needs is imported now, at start-up, and held by this module's names: later, the script's
    # own directory leads sys.path, and a statistics.py or weakref.py beside the script would be taken for the
    # hook's (and _unshadow leaves such modules for the script to import).
    from . import loader, profiler  # noqa: F401
    steps = os.environ.get(ENV_STEPS) or "0"
    _limit["steps"] = int(steps) if steps.isdigit() else 0
    _limit["pid"] = os.getpid()
    sys.meta_path.insert(0, _Finder())
    if "torch.utils.data.dataloader" in sys.modules:
        _patch_dataloader(sys.modules["torch.utils.data.dataloader"])
    _watch(loader.Loader, "sluice.Loader")
    atexit.register(_write)


def _first_path():
    """The folder Python will put first on the module path as it starts the program, after site (so after this
    hook) has run: the script's own (its links resolved), the current directory for -c and -m, none under -P."""
    if getattr(sys.flags, "safe_path", False) or os.environ.get("PYTHONSAFEPATH"):
        return None
    a0 = sys.argv[0] if getattr(sys, "argv", None) else ""
    try:
        if a0 in ("", "-", "-c", "-m"):
            return os.getcwd()
        real = os.path.realpath(a0)
        if os.path.isdir(real):  # a folder (or a zip file) of a __main__.py is itself first
            return real
        if os.path.isfile(real):
            with open(real, "rb") as f:
                if f.read(2) == b"PK":
                    return real
        return os.path.dirname(real)
    except OSError:
        return None


def _unshadow(before):
    """The modules the hook imported (those not in before) that the script's own folder also holds (a random.py,
    json.py or queue.py beside it) are left out of sys.modules: the script imports its own, as under plain python,
    where before it got the hook's copy of the standard library's.  The hook keeps the ones it holds.  sluice
    itself stays (the hook's own modules import from it as they run)."""
    first = _first_path()
    if not first:
        return
    for name in [n for n in sys.modules if n not in before and "." not in n and n != "sluice"]:
        mine = getattr(sys.modules.get(name), "__file__", None) or ""
        if os.path.realpath(mine).startswith(os.path.join(first, "")):
            continue  # already the folder's (the user's PYTHONPATH names it): imported once, as without the hook
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, [first])
        except (ImportError, OSError, ValueError):
            continue
        if spec is not None and spec.has_location:  # a module or package there, not a namespace portion
            for n in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[n]


def _kind():
    """What this Python is in the run: a torch DataLoader's worker, a multiprocessing child, or another Python."""
    w = sys.modules.get("torch.utils.data._utils.worker")
    if w is not None and getattr(w, "_worker_info", None) is not None:
        return "dataloader-worker"
    mp = sys.modules.get("multiprocessing")
    try:
        if mp is not None and mp.parent_process() is not None:
            return "multiprocessing"
    except Exception:
        pass
    return "python"


def _write():
    """This Python's report, into a file of its own in the run's folder (every Python the script starts loads the
    hook: DataLoader workers, launchers, torchrun's ranks), written whole; the parent picks the training
    process's.  A forked copy of this process (its atexit inherited) writes nothing: its loaders are ours."""
    out = os.environ.get(ENV_OUT)
    if not out or os.getpid() != _limit.get("pid"):
        return
    reports = []
    for _, p in _watched:
        if p.report is None and p._t0 is not None:
            p._finish()
        if p.report is not None:
            p.report["label"], p.report["t0"] = p.label, p._t0
            reports.append(p.report)
    me = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "kind": _kind(), "rank": os.environ.get("RANK"),
          "loaders": reports, "workers_applied": _limit["workers_applied"]}
    path = os.path.join(out, f"{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(me, f, default=str)
        os.replace(path + ".tmp", path)
    except OSError as e:
        print(f"sluice diagnose: this Python's report ({path}) was not written: {e}", file=sys.stderr)


# ---- the parent: run, then report

def _run(cmd, env_extra, out, hook):
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in (ENV_OUT, ENV_WORKERS, ENV_STEPS)}
    env.update(env_extra)
    # The hook first; the user's own paths ahead of sluice's, which comes last (its package is found there only
    # where nothing of the user's provides it).
    env["PYTHONPATH"] = os.pathsep.join([hook] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []) + [pkg])
    os.mkdir(out)
    env[ENV_OUT] = out
    t = time.perf_counter()
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise SystemExit(f"sluice diagnose: cannot run {cmd[0]}: {e.strerror}") from None
    rc = _wait_forwarding(child)
    wall = time.perf_counter() - t
    rep = _gather(out, child.pid)
    rep["returncode"], rep["wall_s"] = (128 - rc if rc < 0 else rc), wall  # killed by a signal: the shell's status
    rep["signal"] = -rc if rc < 0 else None
    return rep


# What a signal sent to sluice means for the script: the same signal to it.  The terminal's Ctrl-C and Ctrl-\
# (SI_KERNEL) went to the whole foreground group, the script included, and are not sent again.
_FORWARDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                   if hasattr(signal, n))
_SI_KERNEL = 0x80


def _wait_forwarding(child):
    """The child's status as Popen gives it (-N: killed by signal N), each signal sent to this process passed on
    to it meanwhile: a SIGTERM to sluice (a scheduler's, timeout's, kill's) ends the script as it would end it
    under plain python, where before the driver died of it and left the script running.  The signals are blocked
    and taken with sigwaitinfo (SIGCHLD among them, so the child's end wakes it), which says who sent each."""
    waited = set(_FORWARDED) | {signal.SIGCHLD}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    try:
        while child.poll() is None:
            info = signal.sigwaitinfo(waited)
            if info.si_signo == signal.SIGCHLD:
                continue
            if info.si_signo in (signal.SIGINT, signal.SIGQUIT) and info.si_code == _SI_KERNEL:
                continue  # the terminal's: the script has it already
            try:
                child.send_signal(info.si_signo)
            except ProcessLookupError:
                pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return child.returncode


def _die_as(sig):
    """Ends this process by signal sig, as the script ended (a shell running sluice sees the script's signal:
    a Ctrl-C'd script stops the shell's loop as under plain python), without a core file of sluice's own."""
    import resource
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    if sig != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)


def _gather(out, root):
    """The run's one report from the reports of its Pythons (a file each, by pid): the training process's, the
    one nearest the command that iterated a loader (rank 0 of torchrun's ranks, else the one with the most
    batches); beside it, every Python of the run and what it was (DataLoader workers among them)."""
    reps = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(out, name)) as f:
                    r = json.load(f)
                if isinstance(r, dict) and isinstance(r.get("pid"), int) and isinstance(r.get("loaders"), list):
                    reps.append(r)
            except (OSError, ValueError):
                pass
    by_pid = {r["pid"]: r for r in reps}

    def depth(r):  # Pythons between it and the command
        n, p = 0, r.get("ppid")
        while p in by_pid and p != root and n < len(by_pid):
            n, p = n + 1, by_pid[p].get("ppid")
        return n if r["pid"] != root else -1

    def batches(r):
        return max((x.get("batches", 0) for x in r["loaders"]), default=0)
    training = [r for r in reps if batches(r) > 0] or [r for r in reps if r["loaders"]]
    chosen = min(training, key=lambda r: (depth(r), r.get("rank") not in (None, "0"), -batches(r)), default=None)
    if chosen is None:
        chosen = by_pid.get(root) or (reps[0] if reps else None)
    # The training process's loaders name their workers: DataLoader workers, whether or not they wrote (persistent
    # ones alive at its exit are terminated by multiprocessing, their atexit never runs).
    named = {pid for x in (chosen or {}).get("loaders", []) for pid in x.get("worker_pids") or []}
    pythons = [{"pid": r["pid"], "ppid": r.get("ppid"), "argv": r.get("argv"),
                "kind": "dataloader-worker" if r["pid"] in named else r.get("kind", "python"),
                "loaders": len(r["loaders"]), "batches": batches(r), "training": r is chosen} for r in reps]
    pythons += [{"pid": pid, "ppid": chosen["pid"], "argv": None, "kind": "dataloader-worker", "loaders": 0,
                 "batches": 0, "training": False} for pid in sorted(named - set(by_pid))]
    if chosen is None:
        return {"loaders": [], "reported": False, "pythons": [], "workers_applied": False}
    return {"argv": chosen.get("argv"), "pid": chosen["pid"], "loaders": chosen["loaders"], "reported": True,
            "pythons": pythons, "workers_applied": any(r.get("workers_applied") for r in reps)}


def _pythons_line(rep):
    """The run's Pythons in a sentence: the training process, its DataLoader workers, the others."""
    ps = rep.get("pythons") or []
    if len(ps) < 2:
        return None
    workers = sum(p["kind"] == "dataloader-worker" for p in ps)
    mp = sum(p["kind"] == "multiprocessing" for p in ps)
    others = len(ps) - 1 - workers - mp
    rest = [f"{workers} DataLoader worker{'s' * (workers != 1)}"] if workers else []
    rest += [f"{mp} multiprocessing child{'ren' * (mp != 1)}"] if mp else []
    rest += [f"{others} other Python{'s' * (others != 1)}"] if others > 0 else []
    return (f"{len(ps)} Pythons ran: the report is the training process's (pid {rep.get('pid')}); "
            + ", ".join(rest) + " beside it")


def _main_loader(rep):
    return max(rep["loaders"], key=lambda r: r["batches"], default=None)


def _rate(r, skip=5):
    """Batches a second of a run's main loader in its steady state: each batch's wait and the loop's work after
    it, the first `skip` batches of each epoch (workers starting, the pipeline filling) left out."""
    b, kept, since = r["timeline"]["batches"], [], skip
    for x in b:
        since = 0 if x.get("epoch_start") else since + 1
        if since >= skip and x["step_ms"]:
            kept.append(x["wait_ms"] + x["step_ms"])
    if not kept:
        return r["batches"] / r["seconds"] if r["seconds"] else 0.0
    return len(kept) / (sum(kept) / 1e3)


def _sweep(cmd, workers, steps, tmp, hook):
    out = []
    for w in workers:
        rep = _run(cmd, {ENV_WORKERS: str(w), ENV_STEPS: str(steps)}, os.path.join(tmp, f"sweep-{w}"), hook)
        m = _main_loader(rep)
        if not rep.get("workers_applied"):  # no DataLoader took the count: nothing was swept
            out.append({"workers": w, "batches_s": None, "returncode": rep["returncode"], "verdict": None,
                        "applied": False})
            print(f"sluice diagnose: {w} workers: not applied (the script made no torch DataLoader)",
                  file=sys.stderr, flush=True)
            continue
        # The batches made while the workers started come in a burst (each worker makes prefetch_factor, 2 by
        # default, ahead): left out of each epoch too.
        out.append({"workers": w, "batches_s": _rate(m, max(5, 2 * w)) if m else None, "returncode": rep["returncode"],
                    "verdict": m["verdict"] if m else None, "applied": True})
        print(f"sluice diagnose: {w} workers: {out[-1]['batches_s'] or 0:.2f} batches/s ({out[-1]['verdict']})",
              file=sys.stderr, flush=True)
    return out


def trace_events(rep):
    """A Chrome trace (Perfetto, chrome://tracing) of each watched loader's waits and steps."""
    ev = []
    origin = min((r.get("t0", 0) for r in rep["loaders"]), default=0)
    for i, r in enumerate(rep["loaders"]):
        shift = 1e6 * (r.get("t0", origin) - origin)  # every loader on the run's one clock
        ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": r.get("label", f"loader {i}")}})
        for k, b in enumerate(r["timeline"]["batches"]):
            ts = shift + 1e6 * b["t"]
            ev.append({"ph": "X", "name": "waiting for a batch", "cat": "data", "pid": 1, "tid": i, "ts": ts,
                       "dur": 1e3 * b["wait_ms"], "args": {"batch": k}})
            if b["step_ms"]:
                ev.append({"ph": "X", "name": "the loop's work", "cat": "step", "pid": 1, "tid": i,
                           "ts": ts + 1e3 * b["wait_ms"], "dur": 1e3 * b["step_ms"], "args": {"batch": k}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


_COLOURS = ("#e07b39", "#2b7bb9", "#3a9a5b", "#8e5cc2", "#c2455c", "#7a7a7a", "#c7a42e", "#2aa1a1")


def _lines(title, unit, series, w=860, h=240):
    """An SVG line chart: series is [(label, [(x, y), ...]), ...]."""
    pts = [p for _, s in series for p in s]
    if not pts:
        return f"<p>{html.escape(title)}: nothing sampled.</p>"
    x1 = max(x for x, _ in pts) or 1
    y1 = max(y for _, y in pts) or 1
    left, top, bottom = 60, 20, 40
    sx = (w - left - 20) / x1
    sy = (h - top - bottom) / y1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h + 18 * len(series)}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{left}" y="14" font-size="13">{html.escape(title)}</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - 20}" y2="{h - bottom}" stroke="#999"/>',
           f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" font-size="11">{y1:,.3g}</text>',
           f'<text x="{left - 6}" y="{h - bottom}" text-anchor="end" font-size="11">0</text>',
           f'<text x="{w - 20}" y="{h - bottom + 14}" text-anchor="end" font-size="11">{x1:,.3g} s</text>',
           f'<text x="{left}" y="{h - bottom + 14}" font-size="11" fill="#555">{html.escape(unit)}</text>']
    for i, (label, s) in enumerate(series):
        c = _COLOURS[i % len(_COLOURS)]
        path = " ".join(f"{left + x * sx:.1f},{h - bottom - y * sy:.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{path}"/>')
        out.append(f'<rect x="{left}" y="{h + 18 * i - 4}" width="12" height="12" fill="{c}"/>'
                   f'<text x="{left + 18}" y="{h + 18 * i + 6}" font-size="12">{html.escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def bars_svg(title, rows, unit="", w=860, bar=22, gap=10, left=260):
    """A horizontal bar chart of rows [(label, value), ...] as inline SVG, bars orange and blue in turn (the
    journey's report draws its charts with it too)."""
    top = max((v for _, v in rows), default=0) or 1
    h = len(rows) * (bar + gap) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" role="img" '
           f'aria-label="{html.escape(title)}">']
    for i, (label, v) in enumerate(rows):
        y = 10 + i * (bar + gap)
        bw = max(2, (w - left - 90) * v / top)
        out.append(f'<text x="{left - 8}" y="{y + bar * 0.7:.0f}" text-anchor="end" font-size="13">{html.escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{bw:.1f}" height="{bar}" fill="{_COLOURS[1] if i % 2 else _COLOURS[0]}"/>')
        out.append(f'<text x="{left + bw + 6:.1f}" y="{y + bar * 0.7:.0f}" font-size="13">{v:,.2f}</text>')
    out.append(f'<text x="{left}" y="{h - 4}" font-size="11" fill="#555">{html.escape(unit)}</text></svg>')
    return "".join(out)


def report_html(rep):
    cmd = " ".join(rep.get("command", []))
    parts = [f"""<!doctype html><html><head><meta charset="utf-8"><title>sluice diagnose</title>
<style>body{{font-family:sans-serif;max-width:920px;margin:2em auto;color:#222}} th,td{{text-align:left;padding-right:1em}}
.verdict{{font-weight:bold;font-size:1.1em}} section{{margin:2em 0;border-top:1px solid #ccc}}</style></head><body>
<h1>Where the pipeline loses time</h1>
<p><code>{html.escape(cmd)}</code>: {rep['wall_s']:.1f} s, exit status {rep['returncode']},
{time.strftime('%Y-%m-%d %H:%M')}.</p>"""]
    if _pythons_line(rep):
        parts.append(f"<p>{html.escape(_pythons_line(rep))}.</p>")
    if not rep["loaders"]:
        parts.append("<p class=\"verdict\">No DataLoader or sluice.Loader was iterated: nothing to say.</p>")
    for r in rep["loaders"]:
        tl = r["timeline"]
        parts.append(f'<section><h2>{html.escape(r.get("label", "loader"))}: {r["batches"]} batches</h2>'
                     f'<p class="verdict">{html.escape(r["verdict"])}</p><ul>'
                     + "".join(f"<li>{html.escape(e)}</li>" for e in r["evidence"])
                     + f'</ul><p><b>Fix:</b> {html.escape(r["fix"])}</p>')
        b = tl["batches"]
        parts.append(_lines("Each batch: the wait for it, and the loop's own work after it", "ms a batch, over the run",
                            [("waiting for the batch", [(x["t"], x["wait_ms"]) for x in b]),
                             ("the loop's work (the step)", [(x["t"], x["step_ms"]) for x in b])]))
        names, samples = tl["process_names"], tl["samples"]
        pids = sorted({pid for s in samples for pid in s["procs"]},
                      key=lambda pid: -sum(s["procs"].get(pid, 0) for s in samples))[:8]
        parts.append(_lines("CPU cores busy: the machine, the loop's process and each worker", "cores",
                            [("the machine", [(s["t"], s["busy_cores"]) for s in samples])] +
                            [(f"{names.get(pid, pid)} ({pid})", [(s["t"], s["procs"].get(pid, 0)) for s in samples])
                             for pid in pids]))
        parts.append(_lines("Storage: disk reads and the page cache", "MB/s read from the disks; GB in the page cache",
                            [("disk reads, MB/s", [(s["t"], s["disk_read_mb_s"]) for s in samples]),
                             ("page cache, GB", [(s["t"], s["page_cache_gb"]) for s in samples])]))
        if any(s["gpu_util"] for s in samples):
            parts.append(_lines("GPU utilisation (NVML)", "%", [(f"GPU {g}", [(s["t"], s["gpu_util"][g]) for s in samples
                                                                              if len(s["gpu_util"]) > g])
                                                               for g in range(max(len(s["gpu_util"]) for s in samples))]))
        figs = {k: r.get(k) for k in ("wait_share", "wait_ms_p50", "wait_ms_p90", "step_ms_p50", "batch_bytes",
                                      "first_batch_wait_s", "epochs")}
        figs["steady_wait_share"] = (r.get("steady") or {}).get("wait_share")
        parts.append("<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{v:,.4g}</td></tr>" if
                                         isinstance(v, float) else
                                         f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                                         for k, v in figs.items()) + "</table></section>")
    if rep.get("sweep"):
        rows = [(f"{s['workers']} workers, measured", s["batches_s"] or 0.0) for s in rep["sweep"]]
        rows += [(f"{s['workers']} workers, predicted", s["predicted_batches_s"]) for s in rep["sweep"]
                 if s.get("predicted_batches_s")]
        parts.append('<section><h2>Worker counts, tried</h2>' + bars_svg("batches a second", rows, "batches a second") +
                     f"<p>The script's first {rep['sweep_steps']} batches at each count (the first 5 of each epoch, or "
                     "twice the workers where more, left out of the rate).</p></section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: sluice diagnose [--html R.html] [--json R.json] [--trace T.json] [--sweep-workers 0,4,8 "
              "[--steps N]] -- python train.py ARGS", file=sys.stderr)
        return 2
    k = argv.index("--")
    ap = argparse.ArgumentParser(prog="sluice diagnose", description=__doc__.split("\n\n")[0])
    ap.add_argument("--html", default="sluice-diagnose.html", help="the report (default ./sluice-diagnose.html)")
    ap.add_argument("--json", help="the figures as JSON too")
    ap.add_argument("--trace", help="a Chrome trace of each loader's waits and steps")
    ap.add_argument("--sweep-workers", help="DataLoader worker counts to try, as 0,4,8,16")
    ap.add_argument("--steps", type=int, default=50, help="batches each --sweep-workers run takes (default 50)")
    a = ap.parse_args(argv[:k])
    cmd = argv[k + 1:]
    if not cmd:
        ap.error("no command after --")
    workers = []
    if a.sweep_workers:
        try:
            workers = [int(x) for x in a.sweep_workers.split(",")]
            if any(w < 0 or w > 1024 for w in workers):
                raise ValueError
        except ValueError:
            ap.error(f"--sweep-workers '{a.sweep_workers}': worker counts from 0 to 1024, as 0,4,8")
    if a.steps < 6:
        ap.error("--steps: at least 6 (the first 5 are left out of the rate)")
    why = _outputs_bad([x for x in (a.html, a.json, a.trace) if x], cmd)
    if why:
        ap.error(why)
    tmp = tempfile.mkdtemp(prefix="sluice-diagnose-")
    try:
        hook = os.path.join(tmp, "hook")
        os.mkdir(hook)
        with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
            f.write(_SITECUSTOMIZE)
        rc, sig = _main(a, cmd, workers, tmp, hook)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if sig:
        _die_as(sig)  # returns where sig does not end a process
    return rc


def _outputs_bad(paths, cmd):
    """Why the report's files cannot be written as asked, checked before the script runs (or None)."""
    script = {os.path.realpath(x) for x in cmd if os.path.isfile(x)}
    seen = set()
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            return f"{p}: named for two of --html, --json and --trace"
        seen.add(real)
        if real in script:
            return f"{p}: that is a file the command runs; the report would overwrite it"
        if os.path.exists(p) and not os.path.isfile(p):
            return f"{p}: not a regular file (a directory, a FIFO or a device)"
        d = os.path.dirname(real)  # where it is written: a link's target's folder
        if not os.path.isdir(d) or not os.access(d, os.W_OK | os.X_OK):
            return f"{p}: its directory {d} is not there or not writable"
        if os.path.exists(p) and not os.access(p, os.W_OK):
            return f"{p}: not writable"
    return None


def _main(a, cmd, workers, tmp, hook):
    rep = _run(cmd, {}, os.path.join(tmp, "run"), hook)
    rep["command"] = cmd
    main_r = _main_loader(rep)
    if workers:
        rep["sweep"], rep["sweep_steps"] = _sweep(cmd, workers, a.steps, tmp, hook), a.steps
        for s in rep["sweep"]:
            # A worker count's effect is predicted where the loading's CPU, or its waits, were the limit.
            counts = main_r is not None and main_r["verdict"] in ("cpu-bound", "latency-bound")
            s["predicted_batches_s"] = predict_rate(main_r, s["workers"]) if counts else None
    written = [p for p, make in ((a.html, lambda: report_html(rep)),
                                 (a.json, lambda: json.dumps(rep, indent=1, default=str)),
                                 (a.trace, lambda: json.dumps(trace_events(rep)))) if p and _written(p, make)]
    for r in rep["loaders"]:
        print(f"sluice diagnose: {r.get('label')}: {r['batches']} batches, waited {100 * r['wait_share']:.1f}% of the "
              f"time: {r['verdict']}. {r['fix']}", file=sys.stderr)
    if _pythons_line(rep):
        print(f"sluice diagnose: {_pythons_line(rep)}", file=sys.stderr)
    if not rep["reported"]:
        print(f"sluice diagnose: the script ended (status {rep['returncode']}) before its report was written: "
              "os._exit, a signal, or a Python started with -I or -S (which skips the hook)", file=sys.stderr)
    elif not rep["loaders"]:
        print("sluice diagnose: the script iterated no DataLoader or sluice.Loader", file=sys.stderr)
    if a.html in written:
        print(f"sluice diagnose: report {a.html}", file=sys.stderr)
    return rep["returncode"], rep["signal"]


def _written(path, make):
    """Whether the report's file at path (the text make() gives) was written: whole or not at all (a kill
    mid-write leaves the last report, not half of this one), into a link's target where path is a symbolic link
    (as `> path` would write it).  A failure is said and the run goes on: the script has run, and its exit status
    stays the command's (a folder the script removed was a traceback and status 1)."""
    from .checkpoint import _write_whole
    try:
        _write_whole(os.path.realpath(path), make().encode())
        return True
    except OSError as e:
        print(f"sluice diagnose: {path} was not written: {e.strerror or e}", file=sys.stderr)
        return False


if __name__ == "__main__":
    sys.exit(main())
