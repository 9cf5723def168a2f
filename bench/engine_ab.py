#!/usr/bin/env python3
"""The engine before and after a change, in one run (issue #23: the engine's speed unchanged by the stores).

Run on the GPU machine (root, so the page cache can be dropped), beside alocals3-server for the S3 arm and with
nginx for the http arm:
    python3 tests/remote/with_s3_server.py --alocals3 /tmp/alocals3-server python3 bench/engine_ab.py \
        --old .old/build/sluice --new build/sluice --nginx /tmp/bin/nginx --size 4G --reps 5 --out ab.json

Each pass runs every arm with both builds, in an order that rotates from pass to pass; each arm is one
`sluice bench --json` process into GPU memory (host memory without a GPU):
  cold     a sequential read of the file, page cache dropped and O_DIRECT (--cold)
  warm     the same from the page cache (read once beforehand), median of 3 passes in the process
  rand4k   4 KiB random reads of 256 MiB of it, cold
  s3       the file as one object of alocals3-server (uploaded by the new build's `sluice cp`), read whole
  http     the file served by nginx, read whole (the new build only: the old has no http store)
The s3 and http arms first read the object once, untimed: the cold arms drop the page cache, and the server's
file must be back in it, or the arm measures the server's disk instead of the client.
Medians over --reps passes; the ratio is new / old.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import free_port, make_file, parse_size  # noqa: E402

NGINX = """
worker_processes 8;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
    server {{ listen 127.0.0.1:{port}; root {root}; }}
}}
{user}
"""


def bench(binary, args, env=None):
    r = subprocess.run([binary, "bench", "--json"] + args, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    if r.returncode:
        raise SystemExit(f"{binary} bench {' '.join(args)}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="the sluice command of the code before")
    ap.add_argument("--new", required=True, help="the sluice command of the code after")
    ap.add_argument("--nginx", help="an nginx binary for the http arm (none: no http arm)")
    ap.add_argument("--dir", default="/var/tmp/sluice-ab")
    ap.add_argument("--size", default="4G")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--arms", default="cold,warm,rand4k,s3,http", help="which arms to run")
    ap.add_argument("--out", default="engine_ab.json")
    a = ap.parse_args()
    size = parse_size(a.size)
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "ab.bin")
    make_file(path, size)
    target = []
    arms = {"cold": ["--cold", path], "warm": ["--repeat", "3", path],
            "rand4k": ["--cold", "--rw", "randread", "--io-size", "4K", "--size", "256M", path]}
    env = {}
    ep = os.environ.get("SLUICE_TEST_S3_ENDPOINT")
    if ep:
        env = {"AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
               "AWS_REGION": "us-east-1"}
        # One PUT (alocals3 takes no multipart uploads): parts as large as S3 allows.
        r = subprocess.run([a.new, "cp", path, "s3://bench/ab.bin"], capture_output=True, text=True,
                           env=dict(os.environ, SLUICE_S3_PART_SIZE="5G", **env))
        if r.returncode:
            raise SystemExit(f"upload: {r.stderr[-2000:]}")
        arms["s3"] = ["s3://bench/ab.bin"]
    d = None
    if a.nginx:
        d, port = tempfile.mkdtemp(prefix="sluice-ab-nginx-"), free_port()
        with open(f"{d}/nginx.conf", "w") as f:
            f.write(NGINX.format(d=d, port=port, root=a.dir, user="user root;" if os.geteuid() == 0 else ""))
        subprocess.run([a.nginx, "-c", f"{d}/nginx.conf", "-p", d, "-e", f"{d}/error.log"], check=True)
        arms["http"] = [f"http://127.0.0.1:{port}/ab.bin"]
    arms = {k: v for k, v in arms.items() if k in a.arms.split(",")}
    runs = {f"{arm}/{c}": [] for arm in arms for c in ("old", "new") if not (arm == "http" and c == "old")}
    keys = list(runs)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL)  # warm for the warm arm; cold arms drop it
    try:
        for rep in range(a.reps):
            for k in range(len(keys)):
                key = keys[(k + rep) % len(keys)]
                arm, code = key.split("/")
                if arm == "warm":
                    subprocess.run(["cat", path], stdout=subprocess.DEVNULL)
                if arm in ("s3", "http"):
                    # The server's file back in the page cache (a cold arm dropped it): the arm measures the
                    # client, not the server's disk.  An untimed read by the new build, the same for both.
                    bench(a.new, target + arms[arm], env)
                res = bench(a.old if code == "old" else a.new, target + arms[arm], env)
                runs[key].append(res)
                print(f"[ab] pass {rep + 1} {key}: {res['gb_s']:.2f} GB/s, {res.get('iops', 0):.0f} IOPS, "
                      f"{res['path']}", flush=True)
    finally:
        if d:
            subprocess.run([a.nginx, "-c", f"{d}/nginx.conf", "-p", d, "-s", "stop"])
            shutil.rmtree(d, ignore_errors=True)
    med = {k: statistics.median(r["gb_s"] for r in v) for k, v in runs.items()}
    ratios = {arm: med[f"{arm}/new"] / med[f"{arm}/old"] for arm in arms if f"{arm}/old" in med}
    out = {"size": size, "reps": a.reps, "median_gb_s": med, "new_over_old": ratios,
           "spread": {k: [min(r["gb_s"] for r in v), max(r["gb_s"] for r in v)] for k, v in runs.items()},
           "runs": runs, "when": time.strftime("%Y-%m-%d %H:%M")}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for k in sorted(med):
        print(f"{k:12s} {med[k]:7.2f} GB/s (passes {out['spread'][k][0]:.2f}-{out['spread'][k][1]:.2f})")
    for arm, r in ratios.items():
        print(f"{arm:8s} new/old {r:.3f}")


if __name__ == "__main__":
    main()
