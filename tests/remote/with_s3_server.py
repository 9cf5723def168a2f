"""Runs a test program against the S3 test server (s3server.py beside this file):

    python with_s3_server.py PROGRAM [ARGS...]
    python with_s3_server.py --alocals3 BINARY PROGRAM [ARGS...]

The program gets the SLUICE_TEST_S3_* variables and none of the caller's AWS_* ones.  Exit status: the
program's; 77 (skip) when moto is not installed.

--alocals3 BINARY runs the program against alocals3-server instead (a Rust S3-compatible subset: ranged GETs,
single PUTs, no multipart uploads, and no signature checks, so for benchmarks only: a server fast enough that
the clients, not the server, are what a read measures; moto, in Python, is the limit of every client).
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3server  # noqa: E402


class Alocals3:
    """alocals3-server on a free loopback port, its metadata and objects in a temporary folder."""

    def __init__(self, binary):
        self.binary, self.proc, self.tmp = binary, None, None

    def __enter__(self):
        self.tmp = tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_S3_DIR", "/var/tmp"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        log = open(os.path.join(self.tmp.name, "server.log"), "w")
        self.proc = subprocess.Popen([self.binary, "--host", "127.0.0.1", "--port", str(self.port),
                                      "--database-url", f"sqlite:///{self.tmp.name}/meta.sqlite",  # four slashes: absolute
                                      "--storage-root", f"{self.tmp.name}/data", "--disable-gc",
                                      "--log-level", "warn"], stdout=log, stderr=log)
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.binary} exited: {open(log.name).read()[-2000:]}")
                time.sleep(0.1)
        # Its bucket answers are JSON, which S3 clients cannot parse: the bench's bucket is made here.
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{self.port}/s3/bench", method="PUT")).read()
        self.version = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        return self

    def env(self):
        return {"SLUICE_TEST_S3_ENDPOINT": f"http://127.0.0.1:{self.port}/s3", "SLUICE_TEST_S3_ACCESS_KEY": "bench",
                "SLUICE_TEST_S3_SECRET_KEY": "bench-secret", "SLUICE_TEST_S3_REGION": "us-east-1",
                "SLUICE_TEST_S3_SERVER": f"{self.version} (Rust; signatures not checked, no multipart uploads)",
                "SLUICE_TEST_S3_BUCKETS": "bench"}

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
        self.tmp.cleanup()


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--alocals3"]:
        srv = Alocals3(argv[1])
        argv = argv[2:]
    elif s3server.ThreadedMotoServer is None:
        print(f"skip: {s3server.MOTO_MISSING}")
        return 77
    else:
        srv = s3server.S3Server()
    with srv:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(srv.env())
        return subprocess.run(argv, env=env, timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
