"""The harness every benchmark script shares (they run as `python3 bench/NAME.py`, so this imports as
benchlib): caches dropped or warmed, peers' passes interleaved with sluice's so drift of the disk or the
machine hits all alike, medians, CPU time per GB, and results written as JSON after every step.
"""
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time

GB = 1e9


def free_port():
    """A free TCP port on 127.0.0.1, for a server a benchmark starts."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_size(s):
    """A size with an optional K, M or G suffix (powers of 1024), as the benchmarks' options take it."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def pack_tokens(sluice_bin, d, nbytes, packs):
    """Zipf-distributed uint32 tokens (a vocabulary of 50,257; documents of 512-4,096 tokens), nbytes of them,
    packed by `sluice pack --from-tokens` into d/NAME for each NAME: extra options of packs (shards of 256
    MiB); made once and reused."""
    import numpy as np
    if all(os.path.exists(os.path.join(d, name, "index.sli")) for name in packs):
        return
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    ntok = nbytes // 4
    np.save(os.path.join(d, "tokens.npy"), (rng.zipf(1.3, ntok) % 50257).astype(np.uint32))
    lens, left = [], ntok
    while left:
        n = min(left, int(rng.integers(512, 4097)))
        lens.append(n)
        left -= n
    np.save(os.path.join(d, "lengths.npy"), np.array(lens, np.int64))
    for name, extra in packs.items():
        subprocess.run([sluice_bin, "pack", "--from-tokens", os.path.join(d, "tokens.npy"), "--doc-lengths",
                        os.path.join(d, "lengths.npy"), "--shard-size", "256M", "--quiet", *extra,
                        os.path.join(d, name)], check=True)


def drop_caches():
    """Cold: writes back dirty pages and drops the page cache (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def warm(path):
    """Warm: reads path (a file, or every file under a directory) through the page cache."""
    files = [path] if os.path.isfile(path) else [os.path.join(r, x) for r, _, fs in os.walk(path) for x in fs]
    buf = bytearray(64 << 20)
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def cpu_now(children=False):
    """CPU seconds (user + system) of this process, and of its waited-for children with children=True."""
    who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if children else [])
    return sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime for w in who)


def machine_cpu():
    """(busy, all) jiffies of every CPU of the machine so far, from /proc/stat; (0, 0) where there is none."""
    try:
        with open("/proc/stat") as f:
            t = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(t) - t[3] - t[4], sum(t)  # idle and iowait are the 4th and 5th


def make_file(path, size):
    """A file of size bytes of random data (each 256 MiB block differs), made once and reused."""
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    block = os.urandom(256 << 20)
    with open(path + ".tmp", "wb") as f:
        left, i = size, 0
        while left:
            n = min(left, len(block))
            # Vary each block so no two are alike (defeats dedup/compression).
            f.write((i.to_bytes(8, "little") + block[8:])[:n])
            left, i = left - n, i + 1
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def timed(fn, nbytes=None, children=False):
    """One pass of fn(): {"seconds", "cpu_s", "machine_busy"} plus "gb_s" and "cpu_s_per_gb" when nbytes is
    given; a dict that fn returns is merged in (its own figures win).  machine_busy: the share of all the
    machine's CPUs busy meanwhile (other processes too, a server on the loopback included)."""
    m0, c0, t0 = machine_cpu(), cpu_now(children), time.perf_counter()
    got = fn()
    r = {"seconds": time.perf_counter() - t0, "cpu_s": cpu_now(children) - c0}
    m1 = machine_cpu()
    if m1[1] > m0[1]:
        r["machine_busy"] = (m1[0] - m0[0]) / (m1[1] - m0[1])
    if nbytes:
        r["gb_s"] = nbytes / r["seconds"] / GB
        r["cpu_s_per_gb"] = r["cpu_s"] / (nbytes / GB)
    if isinstance(got, dict):
        r.update(got)
    return r


def median_of(passes):
    """Per key, the median of the passes' numbers; other values from the first pass."""
    out = {}
    for k, v in passes[0].items():
        nums = [p[k] for p in passes if isinstance(p.get(k), (int, float)) and not isinstance(p.get(k), bool)]
        out[k] = statistics.median(nums) if len(nums) == len(passes) else v
    return out


def side_by_side(contenders, reps, before=None, key="gb_s"):
    """Runs each contender's pass reps times, interleaved (a b c a b c ...), calling before() ahead of
    every pass (drop_caches for cold, or a warm-up).  contenders maps a name to a function that runs one
    pass and returns a number (taken as `key`) or a dict of numbers.  A contender whose pass raises is
    dropped with its error.  Returns {name: median figures + "passes": [key of each pass]}."""
    got = {name: [] for name in contenders}
    failed = {}
    for _ in range(reps):
        for name, fn in contenders.items():
            if name in failed:
                continue
            if before:
                before()
            try:
                r = fn()
            except Exception as e:  # a peer that cannot run is reported, not fatal
                failed[name] = f"{type(e).__name__}: {e}"
                continue
            got[name].append(r if isinstance(r, dict) else {key: r})
    out = {}
    for name, passes in got.items():
        if name in failed:
            out[name] = {"error": failed[name]}
        else:
            out[name] = dict(median_of(passes), passes=[p.get(key) for p in passes])
    return out


def ratio(a, b, key="gb_s"):
    """a[key] / b[key] of two side_by_side entries, None where either is missing."""
    x, y = (a or {}).get(key), (b or {}).get(key)
    return x / y if x and y else None


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.strip() or "none"
    except OSError:
        return "none"


class Results(dict):
    """The run's results: a dict saved as JSON to path after every assignment, so a run cut short by its
    time limit still leaves what it measured."""

    def __init__(self, path, **meta):
        super().__init__(date=datetime.date.today().isoformat(), gpu=gpu_name(), **meta)
        self.path = path
        self.save()

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        self.save()

    def save(self):
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self, f, indent=1)


def sluice_json(sluice, args, env=None):
    """Runs `sluice ARGS --json` and returns its JSON output; the error names the command."""
    e = dict(os.environ, **(env or {}))
    out = subprocess.run([sluice] + args + ["--json"], capture_output=True, text=True, env=e)
    if out.returncode:
        raise RuntimeError(f"sluice {' '.join(args)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def child_json(code, *args, env=None):
    """Runs `python -c code args` in a fresh process and returns the JSON of its last output line; a failure is a
    RuntimeError carrying the child's last line of stderr."""
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])
