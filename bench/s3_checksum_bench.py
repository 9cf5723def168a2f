"""What checking S3 answers costs at full speed (issue: every byte sluice delivers is checked).

Run beside alocals3-server (tests/remote/with_s3_server.py --alocals3 BINARY), with nginx carried:
    python3 tests/remote/with_s3_server.py --alocals3 /tmp/alocals3-server python3 bench/s3_checksum_bench.py \
        --size 4G --reps 5 --old .old --nginx /tmp/nginx --out s3_checksum.json

alocals3 stores no object checksums, so nginx (Debian's, carried) stands in front of it twice: once passing
answers on as they are, once adding the object's CRC32C (x-amz-checksum-crc32c, FULL_OBJECT) to every answer,
as S3 does for an object uploaded with one.  The object (one PUT of random bytes) is read whole into GPU memory
(host memory without a GPU) by one process per pass, each timing --reads sluice.read calls after a warm-up (the
pass's figure: their median); the arms run in turn, in a rotating order, --reps times, and medians are reported:
  direct/old, direct/new     alocals3 itself, the code before the checks and after (range checks only: no sum)
  plain/new, sum/new         through nginx without and with the checksum: the cost of matching it
  sum/old                    through nginx with the checksum, the code before (which ignores it)
Also the CRC32C rate of one core (isa-l, sluice_crc32c) over 1 GiB in memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import free_port, parse_size  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READER = r"""
import json, os, sys, time
import sluice
size = int(sys.argv[1])
try:
    import torch
    buf = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
except Exception:
    import numpy as np
    buf = np.empty(size, dtype=np.uint8)
sluice.read("s3://bench/obj", buf[: 64 << 20])  # the engine and its connections started
rates, rep = [], {}
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    try:
        n = sluice.read("s3://bench/obj", buf, report=rep)
    except TypeError:  # the code before: read() takes no report
        n = sluice.read("s3://bench/obj", buf)
    rates.append(n / (time.perf_counter() - t0) / 1e9)
rates.sort()
print(json.dumps({"gbps": rates[len(rates) // 2], "all_gbps": rates, "bytes_verified": rep.get("bytes_verified", 0),
                  "path": rep.get("path", "")}))
"""
NGINX = """
worker_processes 16;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
    upstream s3 {{ server 127.0.0.1:{up}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{plain};
        location / {{ proxy_pass http://s3; proxy_http_version 1.1; proxy_set_header Connection "";
                     proxy_set_header Host $http_host; proxy_buffering off; proxy_request_buffering off;
                     proxy_buffer_size 1m; proxy_buffers 4 1m; proxy_busy_buffers_size 2m; }}
    }}
    server {{
        listen 127.0.0.1:{summed};
        location / {{ proxy_pass http://s3; proxy_http_version 1.1; proxy_set_header Connection "";
                     proxy_set_header Host $http_host; proxy_buffering off; proxy_request_buffering off;
                     proxy_buffer_size 1m; proxy_buffers 4 1m; proxy_busy_buffers_size 2m;
                     add_header x-amz-checksum-crc32c "{crc}" always;
                     add_header x-amz-checksum-type "FULL_OBJECT" always; }}
    }}
}}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4G")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--reads", type=int, default=3, help="timed reads in each process (its median is the pass's)")
    ap.add_argument("--old", required=True, help="a source tree of the code before, built in OLD/build")
    ap.add_argument("--nginx", required=True)
    ap.add_argument("--out", default="s3_checksum.json")
    a = ap.parse_args()
    size = parse_size(a.size)
    ep = os.environ["SLUICE_TEST_S3_ENDPOINT"]
    import base64
    import io
    import boto3
    import numpy as np
    from boto3.s3.transfer import TransferConfig
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import sluice
    import ctypes as C
    from sluice._lib import lib
    lib.sluice_crc32c.restype, lib.sluice_crc32c.argtypes = C.c_uint32, [C.c_uint32, C.c_void_p, C.c_size_t]
    data = np.frombuffer(os.urandom(size), np.uint8)
    t0 = time.perf_counter()
    crc = lib.sluice_crc32c(0, data.ctypes.data, size)
    crc_gbps = size / (time.perf_counter() - t0) / 1e9
    s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id="bench", aws_secret_access_key="bench-secret",
                      region_name="us-east-1")
    try:
        s3.upload_fileobj(io.BytesIO(data), "bench", "obj", Config=TransferConfig(multipart_threshold=5 << 30))
    except Exception:  # alocals3 answers a PUT with JSON once stored
        pass
    assert s3.head_object(Bucket="bench", Key="obj")["ContentLength"] == size
    del data
    d = tempfile.mkdtemp(prefix="sluice-nginx-")
    up = int(ep.split(":")[-1].split("/")[0])
    plain, summed = free_port(), free_port()
    b64 = base64.b64encode(crc.to_bytes(4, "big")).decode()
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(NGINX.format(d=d, up=up, plain=plain, summed=summed, crc=b64))
    subprocess.run([a.nginx, "-c", f"{d}/nginx.conf", "-p", d], check=True)
    path = ep.split("/", 3)[3] if ep.count("/") >= 3 else ""
    eps = {"direct": ep, "plain": f"http://127.0.0.1:{plain}/{path}", "sum": f"http://127.0.0.1:{summed}/{path}"}
    code = {"new": (os.path.join(ROOT, "build", "libsluice.so"), os.path.join(ROOT, "python")),
            "old": (os.path.join(a.old, "build", "libsluice.so"), os.path.join(a.old, "python"))}
    arms = [("direct", "old"), ("direct", "new"), ("plain", "new"), ("sum", "new"), ("sum", "old")]
    runs = {f"{e}/{c}": [] for e, c in arms}
    try:
        for rep in range(a.reps):
            for k in range(len(arms)):
                e, c = arms[(k + rep) % len(arms)]
                env = dict(os.environ, AWS_ENDPOINT_URL=eps[e], AWS_ACCESS_KEY_ID="bench",
                           AWS_SECRET_ACCESS_KEY="bench-secret", AWS_REGION="us-east-1", SLUICE_LIB=code[c][0],
                           PYTHONPATH=code[c][1] + os.pathsep + os.environ.get("PYTHONPATH", ""))
                r = subprocess.run([sys.executable, "-c", READER, str(size), str(a.reads)], env=env, capture_output=True,
                                   text=True, timeout=300)
                if r.returncode:
                    raise SystemExit(f"{e}/{c}: {r.stderr[-2000:]}")
                res = json.loads(r.stdout.strip().splitlines()[-1])
                runs[f"{e}/{c}"].append(res)
                print(f"[s3-checksum] pass {rep + 1} {e}/{c}: {res['gbps']:.2f} GB/s, verified {res['bytes_verified']}",
                      flush=True)
    finally:
        subprocess.run([a.nginx, "-c", f"{d}/nginx.conf", "-p", d, "-s", "stop"])
    med = {k: statistics.median(r["gbps"] for r in v) for k, v in runs.items()}
    out = {"size": size, "reps": a.reps, "crc32c_one_core_gbps": crc_gbps, "median_gbps": med,
           "ratios": {"direct new/old": med["direct/new"] / med["direct/old"],
                      "sum/new over plain/new (the checksum's cost)": med["sum/new"] / med["plain/new"],
                      "sum/new over sum/old": med["sum/new"] / med["sum/old"]},
           "verified": {k: [r["bytes_verified"] for r in v] for k, v in runs.items()}, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("crc32c_one_core_gbps", "median_gbps", "ratios")}, indent=1))


if __name__ == "__main__":
    main()
