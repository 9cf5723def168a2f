"""Operating sluice: the settings file, `sluice top` (disks, GPUs, loaders) and the Prometheus metrics."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

import sluice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


def run(args, env=None, **kw):
    return subprocess.run([SLUICE] + args, capture_output=True, text=True, env=dict(os.environ, **(env or {})), **kw)


# ---- the settings file

def test_settings_file_under_the_environment(tmp_path):
    conf = tmp_path / "sluice.conf"
    conf.write_text("# measured by sluice tune\n[sluice]\nthreads = 3\nqueue_depth = 5\nmax_transfer_size = 2M\n")
    info = json.loads(run(["info", "--json"], {"SLUICE_CONFIG": str(conf)}).stdout)
    assert (info["threads"], info["queue_depth"], info["max_transfer_size"]) == (3, 5, 2 << 20)
    info = json.loads(run(["info", "--json"], {"SLUICE_CONFIG": str(conf), "SLUICE_THREADS": "2"}).stdout)
    assert (info["threads"], info["queue_depth"]) == (2, 5)  # the environment wins
    # The default place: $XDG_CONFIG_HOME/sluice/sluice.conf.
    (tmp_path / "xdg/sluice").mkdir(parents=True)
    (tmp_path / "xdg/sluice/sluice.conf").write_text("[sluice]\nthreads = 6\n")
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_CONFIG"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    r = subprocess.run([SLUICE, "info", "--json"], capture_output=True, text=True, env=env)
    assert json.loads(r.stdout)["threads"] == 6
    env["SLUICE_CONFIG"] = ""  # none at all
    r = subprocess.run([SLUICE, "info", "--json"], capture_output=True, text=True, env=env)
    assert json.loads(r.stdout)["threads"] != 6


@pytest.mark.parametrize("text,says", [
    ("[sluice]\nthreadz = 3\n", "'threadz' is not a setting"),
    ("[engine]\nthreads = 3\n", "section [engine]"),
    ("[sluice]\nthreads = lots\n", 'SLUICE_THREADS="lots" ({conf}): want a whole number in decimal, 1 to 256'),
    ("[sluice]\nsysroot = /x\n", "'sysroot' is not a setting of the file"),
    ("[sluice]\nhttp_retries = 99\n", 'SLUICE_HTTP_RETRIES="99" ({conf}): want a whole number in decimal, 0 to 20'),
    ("threads = 3\n", ":1: a setting before any [section]"),
    ("[sluice]\nthreads\n", ":2: the line is neither"),
    # Numbers are decimal, as each setting's type says: strtod took 0x10 as 16 seconds.
    ("[sluice]\nstats = 0x10\n", 'SLUICE_STATS="0x10" ({conf}): want decimal seconds such as 5 or 0.5'),
    ("[sluice]\nstats = 1e3\n", 'SLUICE_STATS="1e3" ({conf}): want decimal seconds'),
    ("[sluice]\nthreads = 0x8\n", 'SLUICE_THREADS="0x8" ({conf}): want a whole number in decimal'),
])
def test_settings_file_errors_name_the_file(tmp_path, text, says):
    conf = tmp_path / "bad.conf"
    conf.write_text(text)
    r = run(["info"], {"SLUICE_CONFIG": str(conf)})
    assert r.returncode != 0
    assert str(conf) in r.stderr and says.format(conf=conf) in r.stderr, r.stderr


@pytest.mark.parametrize("data,says", [
    # Bytes that are not UTF-8, named with the file, the line and the column.
    (b"[sluice]\n# caf\xe9 (Latin-1)\nthreads = 3\n", ":2: byte 0xe9 at column 6 is not UTF-8"),
    (b"[sluice]\nthreads = 3\xff\n", ":2: byte 0xff at column 12 is not UTF-8"),
    ("[sluice]\nthreads = 3\n".encode("utf-16"), ":1: the file is UTF-16"),  # Windows' "Unicode"
    (b"\xef\xbb[sluice]\nthreads = 3\n", ":1: byte 0xef at column 1"),  # a byte-order mark cut short
])
def test_settings_file_bytes_that_are_not_utf8_are_named(tmp_path, data, says):
    conf = tmp_path / "bad.conf"
    conf.write_bytes(data)
    r = run(["info"], {"SLUICE_CONFIG": str(conf)})
    assert r.returncode != 0 and str(conf) + says in r.stderr, r.stderr


def test_settings_file_with_a_byte_order_mark_is_read(tmp_path):
    """A UTF-8 byte-order mark (Notepad, some editors) is skipped, as Python's utf-8-sig reads it; sluice tune's
    update keeps it and replaces the value in its section (no second [sluice])."""
    conf = tmp_path / "sluice.conf"
    conf.write_bytes(b"\xef\xbb\xbf[sluice]\nthreads = 3\n")
    import configparser
    peer = configparser.ConfigParser()
    peer.read(conf, encoding="utf-8-sig")
    assert peer["sluice"]["threads"] == "3"
    r = run(["info", "--json"], {"SLUICE_CONFIG": str(conf)})
    assert r.returncode == 0 and json.loads(r.stdout)["threads"] == 3, r.stderr
    r = run(["info", "--settings", "--json"], {"SLUICE_CONFIG": str(conf)})
    assert [s["from"] for s in json.loads(r.stdout) if s["name"] == "SLUICE_THREADS"] == [str(conf)]


def test_info_settings_lists_the_registry_and_where_each_value_came_from(tmp_path):
    conf = tmp_path / "sluice.conf"
    conf.write_text("[sluice]\nqueue_depth = 6\nhttp_retries = 2\n")
    r = run(["info", "--settings", "--json"], {"SLUICE_CONFIG": str(conf), "SLUICE_THREADS": "3"})
    rows = {s["name"]: s for s in json.loads(r.stdout)}
    assert (rows["SLUICE_THREADS"]["value"], rows["SLUICE_THREADS"]["from"]) == ("3", "the environment")
    assert (rows["SLUICE_QUEUE_DEPTH"]["value"], rows["SLUICE_QUEUE_DEPTH"]["from"]) == ("6", str(conf))
    assert (rows["SLUICE_HTTP_RETRIES"]["value"], rows["SLUICE_HTTP_RETRIES"]["from"]) == ("2", str(conf))
    assert (rows["SLUICE_S3_RETRIES"]["value"], rows["SLUICE_S3_RETRIES"]["from"]) == ("4", "default")
    assert rows["SLUICE_BACKEND"]["scope"] == "engine" and rows["SLUICE_BACKEND"]["words"] == "auto|uring|psync|gds"
    r = run(["info", "--settings"], {"SLUICE_CONFIG": str(conf), "SLUICE_STATS": "never"})
    assert r.returncode != 0 and 'SLUICE_STATS="never" (the environment)' in r.stderr


def test_the_configuration_guide_lists_every_setting_of_the_registry():
    """The configuration guide's list of the settings names exactly the settings the registry holds."""
    text = open(os.path.join(ROOT, "docs", "guides", "configuration.md")).read()
    section = text[text.index("## The settings"):]
    named = set(re.findall(r"`(SLUICE_[A-Z0-9_]+)`", section))
    rows = {s["name"] for s in json.loads(run(["info", "--settings", "--json"]).stdout)}
    assert named == rows, (sorted(rows - named), sorted(named - rows))


# ---- sluice top

def diskstats(rd, rsec, wr, wsec, io_ms):
    line = "{} {} {} {} 0 {} 10 {} 0 {} 20 0 {} 30 0 0 0 0\n"
    return (line.format(259, 0, "nvme0n1", rd, rsec, wr, wsec, io_ms) +
            line.format(259, 1, "nvme0n1p1", rd, rsec, wr, wsec, io_ms) +  # a partition: left out
            line.format(7, 0, "loop0", 5, 5, 5, 5, 5))                     # a loop device: left out


def test_top_disk_rates_from_diskstats(tmp_path):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "sys/block/nvme0n1").mkdir(parents=True)
    (root / "sys/block/loop0").mkdir(parents=True)
    stats = root / "proc/diskstats"
    before, after = (1000, 80000, 50, 4000, 100), (1000 + 3000, 80000 + 786432, 50 + 120, 4000 + 20480, 100 + 150)
    stats.write_text(diskstats(*before))
    # Two samples a second apart: the first shows no change; once it is printed, the counters move, and the
    # second sample (read a second later) shows the rates of that move.
    p = subprocess.Popen([SLUICE, "top", "--json", "--count", "2", "--interval", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, SLUICE_SYSROOT=str(root), SLUICE_RUN_DIR=str(tmp_path)))
    first = json.loads(p.stdout.readline())
    stats.write_text(diskstats(*after))
    s = json.loads(p.stdout.readline())
    assert p.wait(timeout=60) == 0, p.stderr.read()
    assert [d["read_bytes_per_s"] for d in first["disks"]] == [0.0]
    dt = s["interval_s"]
    assert 0.9 < dt < 5
    assert [d["name"] for d in s["disks"]] == ["nvme0n1"]
    d = s["disks"][0]
    assert d["read_bytes_per_s"] == pytest.approx(786432 * 512 / dt, rel=1e-3)
    assert d["write_bytes_per_s"] == pytest.approx(20480 * 512 / dt, rel=1e-3)
    assert d["read_iops"] == pytest.approx(3000 / dt, rel=1e-3)
    assert d["write_iops"] == pytest.approx(120 / dt, rel=1e-3)
    assert d["util_pct"] == pytest.approx(min(100, 150 / (dt * 10)), abs=0.051)  # printed to 0.1
    assert s["loaders"] == []
    if not s["gpus"]:
        assert "libnvidia-ml" in s["gpu_error"] or "nvml" in s["gpu_error"].lower()


def test_top_cpu_memory_and_network_from_proc(tmp_path):
    """The CPUs' busy and iowait shares (all and each), memory and the page cache, and each interface's rates but
    the loopback's, from a faked /proc whose counters move between two samples."""
    root = tmp_path / "root"
    (root / "proc/net").mkdir(parents=True)
    stat, net = root / "proc/stat", root / "proc/net/dev"
    (root / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 600 kB\nCached: 300 kB\nDirty: 2 kB\n"
                                       "Mlocked: 1 kB\n")

    def counters(busy0, busy1, io, rx):  # each CPU 1000 ticks more than the last time, busy0 + io of them not idle
        idle0, idle1 = 1000 - busy0 - io + (1000 if rx > 1000 else 0), 1000 - busy1 + (1000 if rx > 1000 else 0)
        stat.write_text(f"cpu  {busy0 + busy1} 0 0 {idle0 + idle1} {io} 0 0 0\n"
                        f"cpu0 {busy0} 0 0 {idle0} {io} 0 0 0\ncpu1 {busy1} 0 0 {idle1} 0 0 0 0\n")
        net.write_text("h1\nh2\n    lo: 5 0 0 0 0 0 0 0 5 0 0 0 0 0 0 0\n"
                       f"  eth0: {rx} 0 0 0 0 0 0 0 {2 * rx} 0 0 0 0 0 0 0\n")
    counters(0, 0, 0, 1000)
    p = subprocess.Popen([SLUICE, "top", "--json", "--count", "2", "--interval", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, SLUICE_SYSROOT=str(root), SLUICE_RUN_DIR=str(tmp_path)))
    json.loads(p.stdout.readline())
    counters(500, 100, 100, 1000 + 4_000_000)  # cpu0: 500 busy and 100 iowait of 1000 more ticks; cpu1: 100 busy
    s = json.loads(p.stdout.readline())
    assert p.wait(timeout=60) == 0, p.stderr.read()
    c = s["cpu"]
    assert c["cpus"] == 2 and c["per_cpu_busy_pct"] == [50.0, 10.0]
    assert c["busy_pct"] == pytest.approx(30.0) and c["iowait_pct"] == pytest.approx(5.0)
    assert s["memory"] == {"total": 1000 << 10, "available": 600 << 10, "page_cache": 300 << 10, "dirty": 2 << 10,
                           "mlocked": 1 << 10}
    dt = s["interval_s"]
    assert [n["name"] for n in s["nics"]] == ["eth0"]
    assert s["nics"][0]["rx_bytes_per_s"] == pytest.approx(4_000_000 / dt, rel=1e-3)
    assert s["nics"][0]["tx_bytes_per_s"] == pytest.approx(8_000_000 / dt, rel=1e-3)


LOADER_SCRIPT = r"""
import sys, sluice
ds = sluice.Dataset(sys.argv[1])
ld = sluice.Loader(ds, batch_size=16, shuffle=False)
it = iter(ld)
for _ in range(int(sys.argv[2])):
    next(it)
print("ready", flush=True)
sys.stdin.read()
"""


def start_loader(ds_path, batches, run_dir, extra_env=None):
    env = dict(os.environ, SLUICE_RUN_DIR=str(run_dir), **(extra_env or {}))
    p = subprocess.Popen([sys.executable, "-c", LOADER_SCRIPT, ds_path, str(batches)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return p


def test_top_shows_running_loaders(tmp_path, ds_path):
    a = start_loader(ds_path, 7, tmp_path)
    b = start_loader(ds_path, 12, tmp_path)
    try:
        r = run(["top", "--json", "--count", "1", "--interval", "0.1"], {"SLUICE_RUN_DIR": str(tmp_path)}, timeout=60)
        assert r.returncode == 0, r.stderr
        lds = {ld["pid"]: ld for ld in json.loads(r.stdout)["loaders"]}
        assert set(lds) == {a.pid, b.pid}
        for p, n in ((a, 7), (b, 12)):
            ld = lds[p.pid]
            assert (ld["batches"], ld["records"]) == (n, 16 * n)
            assert ld["dataset"] == ds_path and ld["id"] >= 1
            assert ld["batches_per_s"] == 0  # idle between the two samples
            assert ld["bytes"] > 0 and ld["read_bytes"] > 0 and ld["stage_seconds"]["read"] > 0
            assert ld["verdict"] in ("compute-bound", "loader-bound", "transfer-bound")
        text = run(["top", "--count", "1", "--interval", "0.1"], {"SLUICE_RUN_DIR": str(tmp_path)}, timeout=60).stdout
        assert f"{a.pid}." in text and f"{b.pid}." in text
    finally:
        a.stdin.close()
        a.wait(timeout=30)
    # A loader closed removes its file; a process killed leaves one, which the next reader drops.
    assert [f for f in os.listdir(tmp_path) if f.startswith(f"sluice-loader.{a.pid}.")] == []
    os.kill(b.pid, signal.SIGKILL)
    b.wait(timeout=30)
    assert any(f.startswith(f"sluice-loader.{b.pid}.") for f in os.listdir(tmp_path))
    r = run(["top", "--json", "--count", "1", "--interval", "0.05"], {"SLUICE_RUN_DIR": str(tmp_path)}, timeout=60)
    assert json.loads(r.stdout)["loaders"] == []
    assert not any(f.startswith("sluice-loader.") for f in os.listdir(tmp_path))


def test_top_passes_over_a_fifo_in_the_run_directory(tmp_path):
    """The run directory is shared (/dev/shm): a FIFO named as a live process's loader must not hold top."""
    os.mkfifo(tmp_path / f"sluice-loader.{os.getpid()}.1")
    r = run(["top", "--json", "--count", "1", "--interval", "0.05"], {"SLUICE_RUN_DIR": str(tmp_path)}, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["loaders"] == []


def test_a_loaders_reads_through_the_page_cache_are_counted(ds_path):
    """A dataset whose pages are in the page cache is read through it (the engine's mincore sample), and counted
    as such; with O_DIRECT forced none of it is."""
    code = ("import json, sys, sluice\n"
            "ld = sluice.Loader(sluice.Dataset(sys.argv[1]), batch_size=16)\n"
            "sum(1 for _ in ld)\n"
            "st = ld.stats()\n"
            "print(json.dumps([st['read_bytes'], st['read_bytes_cached']]))\n")
    for f in os.listdir(ds_path):  # its pages in the page cache
        with open(os.path.join(ds_path, f), "rb") as fh:
            fh.read()
    got = {}
    for direct in ("auto", "always"):
        r = subprocess.run([sys.executable, "-c", code, ds_path], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, SLUICE_DIRECT=direct))
        assert r.returncode == 0, r.stderr
        got[direct] = json.loads(r.stdout)
    assert got["auto"][0] > 0 and got["auto"][1] == got["auto"][0]
    assert got["always"][0] > 0 and got["always"][1] == 0


def test_top_rejects_bad_options():
    assert run(["top", "--interval", "0"]).returncode == 2
    assert run(["top", "--count", "x"]).returncode == 2
    assert "unknown option" in run(["top", "--bogus"]).stderr


# ---- Prometheus metrics

def parse_metrics(text):
    """{(name, labels): value}, checking the exposition's shape on the way."""
    out, typed = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            typed[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r'([a-z_]+)(\{[^}]*\})? (\S+)', line)
        assert m, line
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        base = re.sub(r"_(sum|count)$", "", name)
        assert name in typed or base in typed, f"{name} has no # TYPE"
        if typed.get(name) == "counter":
            assert name.endswith("_total"), name
        out[(name, labels)] = value
    return out


def scrape(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse_metrics(r.read().decode())


def test_metrics_count_what_the_engine_moved(tmp_path, ds_path):
    port = sluice.serve_metrics(0)
    assert port > 0 and sluice.serve_metrics(0) == port  # once per process
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(3 << 20))
    m0 = scrape(port)
    a = np.empty(3 << 20, np.uint8)
    sluice.read(str(f), a)
    sluice.read(str(f), a[:1 << 20], offset=1 << 20)
    sluice.write(str(tmp_path / "out"), a[:12345])
    m1 = scrape(port)

    def d(name, labels):
        return m1[(name, labels)] - m0.get((name, labels), 0)
    assert d("sluice_io_bytes_total", '{op="read"}') == (4 << 20)
    assert d("sluice_io_calls_total", '{op="read"}') == 2
    assert d("sluice_io_bytes_total", '{op="write"}') == 12345
    assert d("sluice_io_calls_total", '{op="write"}') == 1
    assert d("sluice_io_errors_total", '{op="read"}') == 0
    assert d("sluice_io_segments_total", '{op="read"}') >= 2
    assert d("sluice_io_segment_seconds_count", "") >= 3
    assert d("sluice_io_call_seconds_total", '{op="read"}') > 0
    with pytest.raises(sluice.SluiceError):
        sluice.read(str(tmp_path / "missing"), a)
    assert scrape(port)[("sluice_io_errors_total", '{op="read"}')] == m1[("sluice_io_errors_total", '{op="read"}')]  # refused at open: no call ran
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(port, "/other")
    assert e.value.code == 404

    # A loader's figures, labelled by process.loader and dataset, while it is open.
    ld = sluice.Loader(sluice.Dataset(ds_path), batch_size=10, shuffle=False)
    it = iter(ld)
    for _ in range(5):
        next(it)
    m = scrape(port)
    mine = {k: v for k, v in m.items() if k[0].startswith("sluice_loader_") and f'dataset="{ds_path}"' in k[1]
            and f'loader="{os.getpid()}.' in k[1]}
    assert [v for k, v in mine.items() if k[0] == "sluice_loader_batches_total"] == [5]
    assert [v for k, v in mine.items() if k[0] == "sluice_loader_records_total"] == [50]
    stages = {re.search(r'stage="(\w+)"', k[1]).group(1) for k in mine if k[0] == "sluice_loader_stage_seconds_total"}
    assert stages == {"read", "decompress", "storage_wait", "collate", "h2d", "consumer_wait"}
    del it, ld
    import gc
    gc.collect()
    assert sluice.metrics_text().count(f'dataset="{ds_path}"') <= len(mine)  # text and HTTP agree on the families


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_metrics_port_setting_starts_the_exporter(tmp_path, ds_path):
    port = free_port()
    p = start_loader(ds_path, 3, tmp_path, {"SLUICE_METRICS_PORT": str(port)})
    try:
        m = scrape(port)
        assert m[("sluice_info", '{version="%s"}' % run(["version"]).stdout.split()[1])] == 1
        assert [v for k, v in m.items() if k[0] == "sluice_loader_batches_total" and f'loader="{p.pid}.' in k[1]] == [3]
        # The port taken: a second process says so, naming the port.
        r = run(["info"], {"SLUICE_METRICS_PORT": str(port)})
        assert r.returncode != 0 and f"metrics on port {port}: cannot listen" in r.stderr
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    r = run(["info"], {"SLUICE_METRICS_PORT": "http"})
    assert r.returncode != 0 and 'SLUICE_METRICS_PORT="http"' in r.stderr


# ---- sluice tune

def test_tune_a_file_writes_its_pick(tmp_path):
    f = tmp_path / "data"
    f.write_bytes(os.urandom(24 << 20))
    conf = tmp_path / "cfg" / "sluice.conf"
    conf.parent.mkdir()
    conf.write_text("[sluice]\n# mine, kept\ncache_limit = 10G\nthreads = 99\n")
    r = run(["tune", "--json", str(f)], {"SLUICE_CONFIG": str(conf)}, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    d, c, p = out["defaults"], out["candidate"], out["picked"]
    assert out["kind"] == "file" and out["bytes"] == 24 << 20 and out["written"] is True
    assert out["settings_file"] == str(conf)
    # The defaults are sluice's own, not the file's threads = 99.
    info = json.loads(run(["info", "--json"], {"SLUICE_CONFIG": ""}).stdout)
    assert (d["threads"], d["queue_depth"], d["max_transfer_size"]) == (info["threads"], info["queue_depth"],
                                                                      info["max_transfer_size"])
    # Every trial is reported; the candidate is the best of them, picked only if it beat the defaults cold
    # side by side; the gains are the measured ratios (1 when the defaults stay).
    knobs = lambda x: (x["threads"], x["queue_depth"], x["max_transfer_size"])  # noqa: E731
    tried = {knobs(t) for t in out["trials"]}
    assert knobs(c) in tried and knobs(d) in tried
    assert len(out["trials"]) >= 15 and all(t["gb_s"] > 0 for t in out["trials"])
    assert knobs(p) == (knobs(c) if c["cold_gb_s"] >= d["cold_gb_s"] else knobs(d))
    assert out["unchanged"] == (knobs(p) == knobs(d))
    want = (c["cold_gb_s"] / d["cold_gb_s"], c["warm_gb_s"] / d["warm_gb_s"]) if knobs(p) == knobs(c) else (1, 1)
    assert (out["gain_cold"], out["gain_warm"]) == pytest.approx(want, rel=1e-3)
    # The file now holds the pick, which sluice reads, and the lines it had.
    text = conf.read_text()
    assert "# mine, kept" in text and "cache_limit = 10G" in text and "threads = 99" not in text
    assert text.count("[sluice]") == 1 and "# sluice tune " in text
    info = json.loads(run(["info", "--json"], {"SLUICE_CONFIG": str(conf)}).stdout)
    assert (info["threads"], info["queue_depth"], info["max_transfer_size"]) == (p["threads"], p["queue_depth"],
                                                                                p["max_transfer_size"])
    # Again: one comment and one line per key, not two.
    r = run(["tune", "--size", "8M", str(f)], {"SLUICE_CONFIG": str(conf)}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "written to " + str(conf) in r.stdout and "cold GB/s (median 3x3)" in r.stdout
    text = conf.read_text()
    assert text.count("# sluice tune ") == 1 and text.count("\nthreads = ") == 1


def test_tune_dry_run_and_a_directory(tmp_path):
    conf = tmp_path / "sluice.conf"
    # A killed tune's scratch file (its process gone) is removed by the next tune of the directory.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".sluice-tune.{dead.pid}").write_bytes(b"x" * 4096)
    r = run(["tune", "--json", "--dry-run", "--size", "8M", str(tmp_path)], {"SLUICE_CONFIG": str(conf)}, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["written"] is False and out["bytes"] == 8 << 20
    assert not conf.exists()
    assert os.listdir(tmp_path) == []  # the scratch file is gone


def test_tune_refusals(tmp_path):
    r = run(["tune", str(tmp_path / "missing")])
    assert r.returncode == 2 and "missing" in r.stderr
    assert run(["tune"]).returncode == 2
    assert "unknown option" in run(["tune", "--fast", str(tmp_path)]).stderr


def test_top_and_doctor_see_the_gpus():
    """On a GPU machine: NVML through sluice top, and the doctor's PCI scan, find the GPUs torch finds."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    s = json.loads(run(["top", "--json", "--count", "1", "--interval", "0.2"]).stdout)
    assert s["gpu_error"] == "" and len(s["gpus"]) == torch.cuda.device_count()
    g = s["gpus"][0]
    assert g["name"] == torch.cuda.get_device_name(0)
    assert g["mem_total"] == pytest.approx(torch.cuda.get_device_properties(0).total_memory, rel=0.02)
    assert 0 <= g["util_pct"] <= 100 and g["pcie_rx_mb_s"] >= 0
    r = run(["doctor", "--json"], {"SLUICE_SYSROOT": "/"})
    gpu = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "gpu")
    assert gpu["verdict"] == "ok" and gpu["value"].startswith(f"{torch.cuda.device_count()} NVIDIA GPU")
    # The engine's workers sit on the NUMA node sysfs gives GPU 0 (-1: none reported, as in these VMs).
    import re as _re
    pci = _re.search(r"\((\S+?)[ )]", gpu["value"]).group(1)
    with open(f"/sys/bus/pci/devices/{pci}/numa_node") as f:
        want = int(f.read())
    info = json.loads(run(["info", "--json"], {"SLUICE_DEVICE_IDS": "0"}).stdout)
    assert info["numa_node"] == (want if want >= 0 else -1)


# ---- --json: every command's output, its failures included, is JSON on stdout

def _commands():
    """The commands `sluice help` lists (and version)."""
    r = run(["help"])
    assert r.returncode == 0
    names = [ln.split()[0] for ln in r.stdout.split("commands:")[1].splitlines() if ln.startswith("  ")]
    assert "version" in names and len(names) >= 14, names
    return names


# Each command that prints JSON on stdout, with --json and arguments it fails on: usage errors (exit 2) and errors
# of the library (exit 1), and where the command prints its object in pieces, a failure inside it.
# journey and diagnose take --json FILE (a report), not stdout's.
FAILING = [
    ["bench", "--json", "/nonexistent/x"],
    ["bench", "--json", "--rw", "sideways", "{f}"],
    ["bench", "--json", "{empty}"],
    ["checkpoint", "--json", "0"],
    ["checkpoint", "--json", "{pid}"],
    ["cp", "--json", "/nonexistent/a", "{tmp}/b"],
    ["cp", "--json", "http://nonexistent.invalid/a", "{tmp}/b"],
    ["cp", "--json"],
    ["doctor", "--json", "--bogus"],
    ["doctor", "--json", "{f}", "{f}"],
    ["info", "--json", "--bogus"],
    ["inspect", "--json", "/nonexistent"],
    ["inspect", "--json", "--record", "999", "{ds}"],
    ["inspect", "--json", "--record", "x", "{ds}"],
    ["load", "--json", "/nonexistent.safetensors"],
    ["load", "--json", "--reps", "3", "{st}"],
    ["pack", "--json", "--from-jsonl", "/nonexistent.jsonl", "--fields", "a", "{tmp}/o1"],
    ["pack", "--json", "--from-dir", "{tmp}"],
    ["pack", "--json", "--from-parquet", "/nonexistent.parquet", "{tmp}/o2"],
    ["top", "--json", "--count", "0"],
    ["tune", "--json", "/nonexistent"],
    ["tune", "--json", "--dry-run", "/dev/null"],
    ["verify", "--json", "/nonexistent"],
    ["version", "--json", "--bogus"],
    ["bogus", "--json"],
]
# Failures inside an object printed in pieces: a wrong setting stops the checks after the object is open.
FAILING_ENV = [
    (["doctor", "--json", "."], {"SLUICE_THREADS": "lots"}, "checks"),
    (["info", "--json"], {"SLUICE_THREADS": "lots"}, None),
    (["info", "--settings", "--json"], {"SLUICE_STATS": "0x10"}, "settings"),
]


@pytest.fixture
def json_inputs(tmp_path, ds_path):
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(1 << 20))
    (tmp_path / "empty.bin").write_bytes(b"")
    # A safetensors checkpoint of one tensor, by hand: an 8-byte header length, the header, the bytes.
    head = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    head += b" " * (-len(head) % 8)
    (tmp_path / "m.safetensors").write_bytes(len(head).to_bytes(8, "little") + head + bytes(16))
    dead = subprocess.Popen(["true"])  # a process that is gone: nothing to checkpoint, on any machine
    dead.wait()
    return {"f": str(f), "empty": str(tmp_path / "empty.bin"), "tmp": str(tmp_path), "ds": ds_path,
            "st": str(tmp_path / "m.safetensors"), "pid": str(dead.pid)}


def _one_json_error(r, argv):
    assert r.returncode != 0, (argv, r.stdout, r.stderr)
    try:
        out = json.loads(r.stdout)  # one document, nothing else on stdout
    except ValueError:
        pytest.fail(f"{argv}: stdout is not one JSON document: {r.stdout!r} (stderr {r.stderr!r})")
    assert isinstance(out, dict) and isinstance(out.get("error"), dict), (argv, out)
    e = out["error"]
    assert set(e) >= {"command", "status", "code", "name", "message", "detail", "text"}, (argv, e)
    assert e["status"] == r.returncode and isinstance(e["code"], int) and e["code"] < 0, (argv, e)
    assert e["message"] and e["text"].startswith("sluice") and e["text"] in r.stderr, (argv, e, r.stderr)
    return out


def test_every_command_that_takes_json_fails_in_json(json_inputs):
    covered = {a[0] for a in FAILING}
    assert covered >= set(_commands()) - {"journey", "diagnose"}, covered
    for argv in FAILING:
        argv = [a.format(**json_inputs) for a in argv]
        r = run(argv, {"SLUICE_CONFIG": "", "SLUICE_HTTP_RETRIES": "0", "SLUICE_PYTHON": sys.executable},
                timeout=300)
        out = _one_json_error(r, argv)
        assert out["error"]["command"] == (argv[0] if argv[0] != "bogus" else ""), out
    # The names machines tell errors apart by.
    r = run(["cp", "--json", "/nonexistent/a", json_inputs["tmp"] + "/b"])
    assert json.loads(r.stdout)["error"]["name"] == "ENOENT"
    r = run(["inspect", "--json", "--record", "999", json_inputs["ds"]])
    assert json.loads(r.stdout)["error"]["name"] == "SLUICE_ERANGE"
    r = run(["cp", "--json", "http://nonexistent.invalid/a", json_inputs["tmp"] + "/b"], {"SLUICE_HTTP_RETRIES": "0"})
    e = json.loads(r.stdout)["error"]
    assert e["name"] == "SLUICE_ERESOLVE" and "CURLE_COULDNT_RESOLVE_HOST" in e["detail"], e


@pytest.mark.parametrize("argv,env,inside", FAILING_ENV)
def test_a_failure_inside_a_json_object_is_its_error(argv, env, inside):
    r = run(argv, dict(env, SLUICE_CONFIG=""))
    out = _one_json_error(r, argv)
    assert out["error"]["name"] == "SLUICE_EINVAL_CONFIG" and list(env)[0] in out["error"]["detail"], out
    if inside:
        assert isinstance(out[inside], list), out  # what was printed before the error stays, closed


def test_every_json_output_parses(json_inputs, tmp_path):
    """Each command's --json on success: one JSON document on stdout (top: one a sample)."""
    i = json_inputs
    env = {"SLUICE_CONFIG": "", "SLUICE_PYTHON": sys.executable}
    cases = [
        ["version", "--json"], ["info", "--json"], ["info", "--settings", "--json"],
        ["inspect", "--json", i["ds"]], ["inspect", "--json", "--record", "3", i["ds"]], ["verify", "--json", i["ds"]],
        ["cp", "--json", i["f"], str(tmp_path / "copy.bin")],
        ["bench", "--json", "--target", "host", "--io-size", "256K", i["f"]],
        ["load", "--json", "--host", "--list", i["st"]],
        ["pack", "--json", "--quiet", "--from", i["ds"], str(tmp_path / "repacked")],
    ]
    for argv in cases:
        r = run(argv, env, timeout=300)
        assert r.returncode == 0, (argv, r.stderr)
        json.loads(r.stdout)
    r = run(["doctor", "--json", "."], env)
    assert r.returncode in (0, 1) and "error" not in json.loads(r.stdout)
    r = run(["top", "--json", "--count", "2", "--interval", "0.05"], env)
    assert r.returncode == 0 and [json.loads(ln)["interval_s"] > 0 for ln in r.stdout.splitlines()] == [True] * 2
    rec = json.loads(run(["inspect", "--json", "--record", "3", i["ds"]]).stdout)
    assert rec["record"] == 3 and [f["name"] for f in rec["fields"]] == ["text", "n"] and rec["fields"][1]["value"] == 3
    v = json.loads(run(["version", "--json"]).stdout)
    assert re.fullmatch(r"\d+\.\d+\.\d+", v["version"]) and run(["version"]).stdout == f"sluice {v['version']}\n"


def test_every_command_help_exits_0():
    for name in _commands() + ["help"]:
        r = run([name, "--help"], {"SLUICE_PYTHON": sys.executable})
        assert r.returncode == 0 and "usage: sluice" in r.stdout, (name, r.returncode, r.stdout[:200], r.stderr[-400:])


def test_info_without_a_gpu_serves_none():
    info = json.loads(run(["info", "--json"], {"SLUICE_GPU": "0", "SLUICE_CONFIG": ""}).stdout)
    assert info["gpu"] == -1 and info["ngpus"] == 0, info
    text = run(["info"], {"SLUICE_GPU": "0", "SLUICE_CONFIG": ""}).stdout
    assert [ln for ln in text.splitlines() if ln.startswith("gpu")] == ["gpu: none (CUDA not loaded (SLUICE_GPU=0))"]


# ---- torchrun's environment, read by name

DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "LOCAL_RANK", "SLUICE_DEVICE_IDS")


@pytest.mark.parametrize("env,says", [
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is out of range (1 to 4294967295: a world has at least one rank)"),
    ({"WORLD_SIZE": "-2"}, "WORLD_SIZE=-2 is out of range"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 is out of range (0 to 1: a rank is below WORLD_SIZE=2)"),
    ({"RANK": "3"}, "RANK=3 is out of range (0 to 0: WORLD_SIZE is not set, a world of one rank)"),
    ({"WORLD_SIZE": "2", "RANK": "-1"}, "RANK=-1 is out of range"),
    ({"WORLD_SIZE": "2", "RANK": "1.0"}, "RANK='1.0' is not a whole number"),
    ({"WORLD_SIZE": "4", "RANK": "1", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 is out of range"),
    ({"WORLD_SIZE": "4", "RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "one"}, "GROUP_RANK='one' is not"),
])
def test_rank_and_world_size_from_the_environment_are_checked_by_name(ds_path, monkeypatch, env, says):
    for k in DIST_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as e:
        sluice.Loader(sluice.Dataset(ds_path), 4)
    assert says in str(e.value)


def test_rank_and_world_size_that_hold(ds_path, monkeypatch):
    for k in DIST_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert (lambda o: (o.rank, o.world_size))(sluice.Loader(sluice.Dataset(ds_path), 4)._opt) == (1, 2)
    # Given ones win, and only what is not given is read: a bad RANK is not read where rank= is given.
    monkeypatch.setenv("RANK", "x")
    assert sluice.Loader(sluice.Dataset(ds_path), 4, rank=0)._opt.world_size == 2
    with pytest.raises(ValueError, match="world_size=0 is out of range"):  # as DistributedSampler refuses it
        sluice.Loader(sluice.Dataset(ds_path), 4, rank=0, world_size=0)
    monkeypatch.setenv("SLUICE_DEVICE_IDS", "0,x")  # checked before any GPU is asked for
    with pytest.raises(ValueError, match="SLUICE_DEVICE_IDS='0,x' is not a list of GPU ordinals"):
        sluice.Loader(sluice.Dataset(ds_path), 4, rank=0, world_size=1, device="cuda")


def test_local_rank_is_read_by_name():
    code = "import numpy as np, sluice; sluice.read('/dev/null', np.zeros(0, np.uint8))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, LOCAL_RANK="first", SLUICE_CONFIG=""))
    assert r.returncode != 0 and "LOCAL_RANK='first' is not a whole number" in r.stderr, r.stderr[-600:]


def test_the_worlds_sluice_refuses_torch_refuses(ds_path, monkeypatch):
    """torch.distributed's env:// rendezvous and DistributedSampler refuse what the Loader refuses."""
    pytest.importorskip("torch")
    code = ("import datetime, torch.distributed as d\n"
            "try:\n"
            "    d.init_process_group('gloo', init_method='env://', timeout=datetime.timedelta(seconds=20))\n"
            "except Exception as e:\n"
            "    print('refused', type(e).__name__, e)\n"
            "else:\n"
            "    print('accepted')\n")
    for ws in ("0", "-1", "two"):
        env = dict(os.environ, WORLD_SIZE=ws, RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert r.stdout.startswith("refused"), (ws, r.stdout, r.stderr[-600:])
        for k in DIST_VARS:
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("WORLD_SIZE", ws)
        with pytest.raises(ValueError, match="WORLD_SIZE="):
            sluice.Loader(sluice.Dataset(ds_path), 4)
    from torch.utils.data import DistributedSampler
    for rank, world in ((2, 2), (0, 0), (-1, 2)):
        with pytest.raises(ValueError):
            DistributedSampler(range(10), num_replicas=world, rank=rank)
        with pytest.raises((ValueError, sluice.SluiceError)):
            sluice.Loader(sluice.Dataset(ds_path), 4, rank=rank, world_size=world)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
