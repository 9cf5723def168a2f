#!/usr/bin/env python3
"""Issue #2 benchmark: file <-> GPU, sluice side by side with its peers.

One command on a GPU machine (root, so the page cache can be dropped):

    python3 bench/engine_bench.py --sluice build/sluice --fio path/to/fio

It creates an 8 GiB file of random bytes and measures, in one run:
  - the pinned host->device copy ceiling (1 GiB, torch);
  - fio, io_uring + O_DIRECT, best over block size 1-16 MiB and iodepth 8-64
    (the raw storage reference), and fio's O_DIRECT write (with end_fsync);
  - what users do today: np.fromfile -> .cuda(), np.memmap -> .cuda();
  - KvikIO (compat mode: no GDS here), best of 1/8/16 threads;
  - sluice bench read (cold and warm) and durable write, default settings.
"cold" = page cache dropped before every pass (and O_DIRECT where the tool
uses it). Every figure is the median of --reps passes. CPU seconds per GB
come from the process's rusage (fio: its usr+sys percentages x runtime).
Prints a table and writes everything as JSON to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import GB, Results, drop_caches, make_file, side_by_side, sluice_json, timed, warm

def run_fio(fio, args, runtime):
    cmd = [fio, "--output-format=json", "--ioengine=io_uring", "--direct=1", "--fixedbufs",
           "--registerfiles", "--group_reporting", f"--runtime={runtime}"] + args
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if j["read"]["io_bytes"] else j["write"]
    secs = side["runtime"] / 1000.0
    gbs = side["io_bytes"] / secs / GB if secs else 0.0
    cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * secs / (side["io_bytes"] / GB)
    return gbs, cpu


def fio_best(fio, path, write, size, grid=None):
    """Best fio setting from short trials: reads 3 s each over the sweep, writes a whole pass each."""
    sweep = {}
    grid = grid or ([(bs, qd) for bs in ("4M", "16M") for qd in (8, 32)] if write else
                    [(bs, qd) for bs in ("1M", "4M", "16M") for qd in (8, 16, 32, 64)])
    for bs, qd in grid:
        if write:
            gbs, _ = run_fio(fio, ["--name=w", f"--filename={path}", "--rw=write", f"--bs={bs}",
                                   f"--iodepth={qd}", f"--size={size}", "--end_fsync=1"], 60)
            os.unlink(path)
        else:
            drop_caches()
            gbs, _ = run_fio(fio, ["--name=r", f"--filename={path}", "--rw=read", f"--bs={bs}",
                                   f"--iodepth={qd}", "--time_based"], 3)
        sweep[f"bs={bs},iodepth={qd}"] = gbs
    best = max(sweep, key=sweep.get)
    bs, qd = best.replace("bs=", "").replace("iodepth=", "").split(",")
    return best, sweep, bs, qd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--fio", default="fio")
    ap.add_argument("--file", default="/var/tmp/sluice-bench-8g.bin")
    ap.add_argument("--size", type=int, default=8 << 30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/engine_bench.json")
    ap.add_argument("--skip", default="", help="comma list of: fio,write,numpy,kvikio,sweep")
    ap.add_argument("--fio-read-grid", default="",
                    help="fio read settings to try, e.g. 16M:16,1M:32 (default: bs 1M/4M/16M x iodepth 8-64)")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))

    import numpy as np
    import torch

    size, path, reps = a.size, a.file, a.reps

    def sluice_bench(args):
        return sluice_json(a.sluice, ["bench"] + args)

    def passes(fn, cold):
        """fn's median GB/s and CPU s/GB over reps passes, cold (caches dropped) or warm."""
        return side_by_side({"x": lambda: timed(fn, size)}, reps, before=drop_caches if cold else lambda: warm(path))["x"]

    res = Results(a.out, size=size)  # saved after every figure, so a run cut off by its time limit keeps them
    say = print
    print(f"# {res['date']} {res['gpu']}, file {path} ({size / GB:.2f} GB), median of {reps}")
    make_file(path, size)

    # Pinned H2D ceiling: 1 GiB, one stream, median of 10 after warm-up.
    h = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    d = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    rates = []
    for i in range(12):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            rates.append((1 << 30) / (time.perf_counter() - t0) / GB)
    res["h2d_pinned_ceiling"] = {"gb_s": statistics.median(rates)}
    del h, d
    say(f"pinned H2D ceiling: {res['h2d_pinned_ceiling']['gb_s']:.2f} GB/s")

    wpath = path + ".w"
    if "fio" not in skip:
        # Cold read and durable write: fio's best setting and sluice's defaults, pass for pass.
        grid = [tuple(x.split(":")) for x in a.fio_read_grid.split(",")] if a.fio_read_grid else None
        best, sweep, bs, qd = fio_best(a.fio, path, False, size, grid)

        def fio_read():
            gbs, cpu = run_fio(a.fio, ["--name=r", f"--filename={path}", "--rw=read", f"--bs={bs}",
                                       f"--iodepth={qd}"], 60)
            return {"gb_s": gbs, "cpu_s_per_gb": cpu}

        def sl_read():
            r = sluice_bench([path, "--cold"])
            return {k: r[k] for k in ("gb_s", "cpu_s_per_gb", "path")}

        got = side_by_side({"fio": fio_read, "sluice": sl_read}, reps, before=drop_caches)
        res["fio_read_cold"] = dict(got["fio"], best=best, sweep=sweep)
        res["sluice_read_cold"] = got["sluice"]
        say(f"cold read: fio {res['fio_read_cold']['gb_s']:.2f} GB/s ({best}), "
              f"sluice {res['sluice_read_cold']['gb_s']:.2f} GB/s {res['sluice_read_cold']['path']}")

    if "fio" not in skip and "write" not in skip:
        best, sweep, bs, qd = fio_best(a.fio, wpath, True, size)

        def fio_write():
            gbs, cpu = run_fio(a.fio, ["--name=w", f"--filename={wpath}", "--rw=write", f"--bs={bs}",
                                       f"--iodepth={qd}", f"--size={size}", "--end_fsync=1"], 60)
            os.unlink(wpath)
            return {"gb_s": gbs, "cpu_s_per_gb": cpu}

        def sl_write():
            r = sluice_bench([wpath, "--rw", "write", "--size", str(size)])
            os.unlink(wpath)
            return {k: r[k] for k in ("gb_s", "cpu_s_per_gb", "path")}

        got = side_by_side({"fio": fio_write, "sluice": sl_write}, reps)
        res["fio_write"] = dict(got["fio"], best=best, sweep=sweep)
        res["sluice_write"] = got["sluice"]
        say(f"durable write: fio {res['fio_write']['gb_s']:.2f} GB/s ({best}), "
              f"sluice {res['sluice_write']['gb_s']:.2f} GB/s {res['sluice_write']['path']}")

    if "numpy" not in skip:
        def fromfile():
            t = torch.from_numpy(np.fromfile(path, dtype=np.uint8)).cuda()
            torch.cuda.synchronize()
            del t

        def memmap():
            m = np.memmap(path, dtype=np.uint8, mode="r")
            t = torch.from_numpy(np.asarray(m)).cuda()
            torch.cuda.synchronize()
            del t, m

        for name, fn in (("np_fromfile", fromfile), ("np_memmap", memmap)):
            for temp in ("cold", "warm"):
                res[f"{name}_{temp}"] = passes(fn, temp == "cold")
                say(f"{name} {temp}: {res[f'{name}_{temp}']['gb_s']:.2f} GB/s")

    if "kvikio" not in skip:
        try:
            import cupy
            import kvikio
            import kvikio.defaults

            buf = cupy.empty(size, dtype=cupy.uint8)
            res["kvikio_version"] = kvikio.__version__
            try:
                res["kvikio_compat_mode"] = str(kvikio.defaults.get("compat_mode"))
            except Exception as e:  # informational only
                res["kvikio_compat_mode"] = repr(e)
            for temp in ("cold", "warm"):
                best = None
                for nt in (1, 8, 16):
                    try:
                        kvikio.defaults.set("num_threads", nt)
                    except (AttributeError, TypeError):
                        kvikio.defaults.num_threads_reset(nt)

                    def kread():
                        with kvikio.CuFile(path, "r") as f:
                            f.pread(buf).get()
                        cupy.cuda.runtime.deviceSynchronize()

                    r = dict(passes(kread, temp == "cold"), threads=nt)
                    res[f"kvikio_{nt}t_{temp}"] = r
                    if best is None or r["gb_s"] > best["gb_s"]:
                        best = r
                res[f"kvikio_best_{temp}"] = best
                say(f"kvikio best {temp}: {best['gb_s']:.2f} GB/s ({best['threads']} threads)")
            del buf
        except Exception as e:  # report, never hide
            res["kvikio_error"] = repr(e)
            say(f"kvikio could not run: {e!r}")

    torch.cuda.empty_cache()
    warm(path)
    res["sluice_read_warm"] = sluice_bench([path, "--repeat", str(max(reps, 5))])
    say(f"sluice read warm: {res['sluice_read_warm']['gb_s']:.2f} GB/s {res['sluice_read_warm']['path']}")

    if "sweep" not in skip:
        # How the knobs move the warm path (informs the defaults).
        warm(path)
        sweep = {f"threads={t},io={chunk}": sluice_bench([path, "--threads", str(t), "--io-size", chunk,
                                                          "--repeat", "3"])["gb_s"]
                 for t in (8, 12, 16) for chunk in ("4M", "8M", "16M")}
        res["sluice_warm_sweep"] = sweep
        say("sluice warm sweep: " + ", ".join(f"{k}: {v:.1f}" for k, v in sweep.items()))
        # Cold: engine settings against fio's best read, pass for pass, over half the file; write: one
        # pass of each setting.
        half = str(size // 2)
        settings = ((8, "8M", 4), (8, "16M", 2), (8, "16M", 4), (16, "8M", 4), (8, "8M", 8))
        for kind, extra, reps_k in (("cold", ["--cold"], reps), ("write", ["--rw", "write"], 1)):
            target = path if kind == "cold" else path + ".sluice-w"
            runs = {f"threads={t},io={io},qd={qd}": (lambda t=t, io=io, qd=qd: sluice_bench(
                [target, "--size", half, "--threads", str(t), "--io-size", io, "--queue-depth", str(qd)] + extra))
                for t, io, qd in settings}
            if kind == "cold" and "fio_read_cold" in res:
                bs, qd = res["fio_read_cold"]["best"].replace("bs=", "").replace("iodepth=", "").split(",")
                runs["fio " + res["fio_read_cold"]["best"]] = lambda: run_fio(a.fio, [
                    "--name=r", f"--filename={path}", "--rw=read", f"--bs={bs}", f"--iodepth={qd}",
                    f"--size={half}"], 60)[0]
            sweep = side_by_side(runs, reps_k, before=drop_caches if kind == "cold" else None)
            if os.path.exists(path + ".sluice-w"):
                os.unlink(path + ".sluice-w")
            res[f"sluice_{kind}_sweep"] = {k: v.get("gb_s") for k, v in sweep.items()}
            say(f"sluice {kind} sweep: " + ", ".join(f"{k}: {v.get('gb_s', 0):.2f}" for k, v in sweep.items()))

    # Ratios against the targets of issue #2.
    ceil = res["h2d_pinned_ceiling"]["gb_s"]
    rat = {"warm_vs_h2d_ceiling": res["sluice_read_warm"]["gb_s"] / ceil}
    if "kvikio_best_warm" in res:
        rat["warm_vs_kvikio_best"] = res["sluice_read_warm"]["gb_s"] / res["kvikio_best_warm"]["gb_s"]
        if "sluice_read_cold" in res:
            rat["cold_vs_kvikio_best"] = res["sluice_read_cold"]["gb_s"] / res["kvikio_best_cold"]["gb_s"]
    if "fio_read_cold" in res:
        rat["cold_vs_fio"] = res["sluice_read_cold"]["gb_s"] / res["fio_read_cold"]["gb_s"]
    if "fio_write" in res:
        rat["write_vs_fio"] = res["sluice_write"]["gb_s"] / res["fio_write"]["gb_s"]
    res["ratios"] = rat

    print("\n| path | cold GB/s | warm GB/s | CPU s/GB (cold / warm) |")
    print("|---|---|---|---|")

    def row(name, c, w):
        cc, ww = res.get(c), res.get(w)
        f = lambda r: f"{r['gb_s']:.2f}" if r else "-"
        g = lambda r: f"{r['cpu_s_per_gb']:.3f}" if r else "-"
        print(f"| {name} | {f(cc)} | {f(ww)} | {g(cc)} / {g(ww)} |")

    print(f"| pinned H2D ceiling (1 GiB) | - | {ceil:.2f} | - |")
    row("fio io_uring O_DIRECT read (" + res.get("fio_read_cold", {}).get("best", "-") + ")", "fio_read_cold", None)
    row("np.fromfile -> .cuda()", "np_fromfile_cold", "np_fromfile_warm")
    row("np.memmap -> .cuda()", "np_memmap_cold", "np_memmap_warm")
    row("KvikIO best of 1/8/16 threads", "kvikio_best_cold", "kvikio_best_warm")
    row("sluice read (defaults)", "sluice_read_cold", "sluice_read_warm")
    row("fio O_DIRECT write + fsync (" + res.get("fio_write", {}).get("best", "-") + ")", "fio_write", None)
    row("sluice durable write (defaults)", "sluice_write", None)
    print("\nratios: " + ", ".join(f"{k} = {v:.3f}" for k, v in rat.items()))


if __name__ == "__main__":
    sys.exit(main())
