"""Runs a test program against a real S3-compatible server on the loopback address, signatures checked.

    python with_s3_server.py PROGRAM [ARGS...]

The server is moto's (moto[server], from tests/requirements.txt), started in this process on a free port
of 127.0.0.1 with INITIAL_NO_AUTH_ACTION_COUNT=3: the three IAM calls below make a user, an access key and a
policy allowing s3:*, and from then on every request must carry a valid Signature V4 (a wrong secret gets
SignatureDoesNotMatch).  The program gets SLUICE_TEST_S3_ENDPOINT, SLUICE_TEST_S3_ACCESS_KEY,
SLUICE_TEST_S3_SECRET_KEY and SLUICE_TEST_S3_REGION, and none of the AWS_* variables of the caller's
environment.  SLUICE_TEST_S3_FAULTY_ENDPOINT is a proxy in front of the same server that breaks requests on
purpose, in turn: a 503 SlowDown, a response cut off halfway through its body, a 2-second stall before the
answer, then one request passed through untouched (the proxy forwards the client's Host header, so
signatures still check).  Exit status: the program's; 77 (skip) when moto is not installed.
"""
import http.client
import http.server
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
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


class FaultyProxy(http.server.ThreadingHTTPServer):
    """Forwards S3 requests to upstream, breaking them in turn (see the module's text)."""
    daemon_threads = True

    def __init__(self, upstream):
        self.upstream, self.turn, self.lock = upstream, itertools.count(), threading.Lock()
        super().__init__(("127.0.0.1", 0), FaultyHandler)


class FaultyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            fault = next(self.server.turn) % 4
        if fault == 0:
            err = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(err)))
            self.end_headers()
            self.wfile.write(err)
            return
        if fault == 2:
            time.sleep(2)
        up = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for k, v in self.headers.items():
            up.putheader(k, v)
        up.endheaders(body)
        r = up.getresponse()
        data = r.read()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", r.getheader("Content-Length") or str(len(data)))
        if fault == 1 and len(data) > 1:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])  # and the connection closes: a body cut short
            self.close_connection = True
            return
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        up.close()

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = relay


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
        proxy = FaultyProxy(("127.0.0.1", port))
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        env.update(SLUICE_TEST_S3_ENDPOINT=endpoint, SLUICE_TEST_S3_ACCESS_KEY=ak, SLUICE_TEST_S3_SECRET_KEY=sk,
                   SLUICE_TEST_S3_REGION="us-east-1",
                   SLUICE_TEST_S3_FAULTY_ENDPOINT=f"http://127.0.0.1:{proxy.server_address[1]}")
        try:
            return subprocess.run(sys.argv[1:], env=env, timeout=600).returncode
        finally:
            proxy.shutdown()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
