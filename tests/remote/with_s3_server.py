"""Runs a test program against the S3 test server (s3server.py beside this file):

    python with_s3_server.py PROGRAM [ARGS...]

The program gets the SLUICE_TEST_S3_* variables and none of the caller's AWS_* ones.  Exit status: the
program's; 77 (skip) when moto is not installed.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3server  # noqa: E402


def main():
    if s3server.ThreadedMotoServer is None:
        print(f"skip: {s3server.MOTO_MISSING}")
        return 77
    with s3server.S3Server() as srv:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(srv.env())
        return subprocess.run(sys.argv[1:], env=env, timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
