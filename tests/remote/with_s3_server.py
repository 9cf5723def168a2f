"""Runs a test program against a real S3-compatible server on the loopback address, signatures checked.

    python with_s3_server.py PROGRAM [ARGS...]

The server is moto's (moto[server], from tests/requirements.txt), started in this process on a free port
of 127.0.0.1 with INITIAL_NO_AUTH_ACTION_COUNT=3: the three IAM calls below make a user, an access key and a
policy allowing s3:*, and from then on every request must carry a valid Signature V4 (a wrong secret gets
SignatureDoesNotMatch).  The program gets SLUICE_TEST_S3_ENDPOINT, SLUICE_TEST_S3_ACCESS_KEY,
SLUICE_TEST_S3_SECRET_KEY and SLUICE_TEST_S3_REGION, and none of the AWS_* variables of the caller's
environment.  Exit status: the program's; 77 (skip) when moto is not installed.
"""
import json
import os
import re
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"  # read by moto when it is imported
try:
    from moto.server import ThreadedMotoServer
except ImportError as e:
    print(f"skip: moto is not installed ({e})")
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iam(endpoint, **params):
    """An IAM query call, before signatures are checked (the server counts them)."""
    body = urllib.parse.urlencode(dict(params, Version="2010-05-08")).encode()
    req = urllib.request.Request(endpoint + "/", data=body, headers={
        "Content-Type": "application/x-www-form-urlencoded",
        # The credential scope names the service; the signature itself is not checked yet.
        "Authorization": "AWS4-HMAC-SHA256 Credential=setup/20260101/us-east-1/iam/aws4_request, "
                         "SignedHeaders=host, Signature=0"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def main():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        iam(endpoint, Action="CreateUser", UserName="sluice-test")
        key = iam(endpoint, Action="CreateAccessKey", UserName="sluice-test")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam(endpoint, Action="PutUserPolicy", UserName="sluice-test", PolicyName="s3",
            PolicyDocument=json.dumps(policy))
        ak = re.search(r"<AccessKeyId>(.*?)</AccessKeyId>", key).group(1)
        sk = re.search(r"<SecretAccessKey>(.*?)</SecretAccessKey>", key).group(1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(SLUICE_TEST_S3_ENDPOINT=endpoint, SLUICE_TEST_S3_ACCESS_KEY=ak, SLUICE_TEST_S3_SECRET_KEY=sk,
                   SLUICE_TEST_S3_REGION="us-east-1")
        return subprocess.run(sys.argv[1:], env=env, timeout=600).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
