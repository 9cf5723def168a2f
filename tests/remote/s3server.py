"""A real S3-compatible server on the loopback address, signatures checked, for the tests: `S3Server()` as a
context manager (pytest fixtures), or `python with_s3_server.py PROGRAM [ARGS...]` around a test program.

The server is moto's (moto[server], from tests/requirements.txt), started in this process on a free port
of 127.0.0.1 with INITIAL_NO_AUTH_ACTION_COUNT=3: the three IAM calls below make a user, an access key and a
policy allowing s3:*, and from then on every request must carry a valid Signature V4 (a wrong secret gets
SignatureDoesNotMatch).  moto keeps that count per process: one server a process.  A test program gets
SLUICE_TEST_S3_ENDPOINT, SLUICE_TEST_S3_ACCESS_KEY, SLUICE_TEST_S3_SECRET_KEY and SLUICE_TEST_S3_REGION.
SLUICE_TEST_S3_FAULTY_ENDPOINT is a proxy in front of the same server that breaks the first attempt of
every distinct request (method, path with its query, Range), in turn: a 503 SlowDown; a GET's response cut
off halfway through its body (other requests: a 503); a 2-second stall before the answer.  A client that
tries again gets through on its next attempt, whatever else runs at the same time; one that does not, fails
(or waits).  The proxy forwards the client's Host header, so signatures still check.
"""
import http.client
import http.server
import itertools
import json
import os
import re
import socket
import threading
import time
import urllib.parse
import urllib.request

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"  # read by moto when it is imported
try:
    from moto.server import ThreadedMotoServer
except ImportError as e:
    ThreadedMotoServer = None
    MOTO_MISSING = f"moto is not installed ({e})"


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
        self.upstream, self.turn, self.lock, self.seen = upstream, itertools.count(), threading.Lock(), set()
        super().__init__(("127.0.0.1", 0), FaultyHandler)


class FaultyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = (self.command, self.path, self.headers.get("Range"))
        with self.server.lock:
            fault = None if request in self.server.seen else next(self.server.turn) % 3
            self.server.seen.add(request)
        if fault == 1 and self.command != "GET":
            fault = 0
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
        # Only a GET's body is cut: a request whose answer is lost after the server acted (a created upload
        # whose id never arrives) is a case no client can clean up (S3's lifecycle rules do).
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


class S3Server:
    """The server, a user whose key may do anything in S3, and the faulty proxy in front; .env() gives the
    SLUICE_TEST_S3_* variables a test program reads."""

    def __enter__(self):
        if ThreadedMotoServer is None:
            raise RuntimeError(MOTO_MISSING)
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        iam(self.endpoint, Action="CreateUser", UserName="sluice-test")
        key = iam(self.endpoint, Action="CreateAccessKey", UserName="sluice-test")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam(self.endpoint, Action="PutUserPolicy", UserName="sluice-test", PolicyName="s3",
            PolicyDocument=json.dumps(policy))
        self.access_key = re.search(r"<AccessKeyId>(.*?)</AccessKeyId>", key).group(1)
        self.secret_key = re.search(r"<SecretAccessKey>(.*?)</SecretAccessKey>", key).group(1)
        self.proxy = FaultyProxy(("127.0.0.1", port))
        threading.Thread(target=self.proxy.serve_forever, daemon=True).start()
        self.faulty = f"http://127.0.0.1:{self.proxy.server_address[1]}"
        return self

    def env(self):
        return dict(SLUICE_TEST_S3_ENDPOINT=self.endpoint, SLUICE_TEST_S3_ACCESS_KEY=self.access_key,
                    SLUICE_TEST_S3_SECRET_KEY=self.secret_key, SLUICE_TEST_S3_REGION="us-east-1",
                    SLUICE_TEST_S3_FAULTY_ENDPOINT=self.faulty)

    def __exit__(self, *exc):
        self.proxy.shutdown()
        self.server.stop()
