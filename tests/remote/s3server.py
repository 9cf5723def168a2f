"""A real S3-compatible server on the loopback address, signatures checked, for the tests: `S3Server()` as a
context manager (pytest fixtures), or `python with_s3_server.py PROGRAM [ARGS...]` around a test program.

The server is moto's (moto[server], from tests/requirements.txt), started in this process on a free port
of 127.0.0.1 with INITIAL_NO_AUTH_ACTION_COUNT=3: the three IAM calls below make a user, an access key and a
policy allowing s3:*, and from then on every request must carry a valid Signature V4 (a wrong secret gets
SignatureDoesNotMatch).  moto keeps that count per process: one server a process.  A test program gets
SLUICE_TEST_S3_ENDPOINT, SLUICE_TEST_S3_ACCESS_KEY, SLUICE_TEST_S3_SECRET_KEY and SLUICE_TEST_S3_REGION.
S3Server.counting is a proxy that passes every request on and counts them (method and path) in
.counter.counts.  SLUICE_TEST_S3_FAULTY_ENDPOINT is a proxy in front of the same server that breaks the first attempt of
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


class _Window:
    """A ranged GET's body as moto's range code sees it: the object's length, with only the asked-for bytes
    ever read (moto 5.2.5 reads the whole object for every range: a 1 GiB object read in 8 MiB ranges would
    copy 128 GiB).  Bytes come by pread from the key's spooled file, so concurrent ranges do not share a
    file position."""

    def __init__(self, key):
        self.key = key

    def __len__(self):
        return self.key.size

    def __bool__(self):
        return self.key.size > 0

    def __getitem__(self, s):
        begin, end = s.start or 0, min(self.key.size, s.stop if s.stop is not None else self.key.size)
        buf = self.key._value_buffer
        if getattr(buf, "_rolled", True):
            return os.pread(buf.fileno(), max(0, end - begin), begin)
        with self.key.lock:
            buf.seek(begin)
            return buf.read(max(0, end - begin))


_ranged = threading.local()


def _patch_ranged_reads():
    """Serves single ranges of GET without reading the whole object (see _Window)."""
    from moto.s3 import models, responses
    if getattr(responses.S3Response, "_sluice_ranged", False):
        return
    value = models.FakeKey.value

    def get_value(self):
        return _Window(self) if getattr(_ranged, "on", False) else value.fget(self)

    models.FakeKey.value = property(get_value, value.fset)
    key_response = responses.S3Response.key_response

    def ranged_key_response(self, request, full_url, headers):
        _ranged.on = request.method == "GET" and re.fullmatch(r"bytes=\d+-\d+", request.headers.get("range", "")) \
            is not None and "partNumber" not in full_url
        try:
            status, hdrs, body = key_response(self, request, full_url, headers)
        finally:
            _ranged.on = False
        if isinstance(body, _Window):  # a range moto did not cut (past the end...): the whole object
            body = body[0:len(body)]
        return status, hdrs, body

    responses.S3Response.key_response = ranged_key_response
    responses.S3Response._sluice_ranged = True


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

    def __init__(self, upstream, faults=True):
        self.upstream, self.turn, self.lock, self.seen = upstream, itertools.count(), threading.Lock(), set()
        self.faults = faults
        self.counts = {}  # (method, path without the query) -> requests seen
        self.headers = []  # (method, path, {header: value}) of each request, in order
        super().__init__(("127.0.0.1", 0), FaultyHandler)


class FaultyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = (self.command, self.path, self.headers.get("Range"))
        with self.server.lock:
            fault = None if request in self.server.seen or not self.server.faults else next(self.server.turn) % 3
            self.server.seen.add(request)
            where = (self.command, self.path.split("?")[0])
            self.server.counts[where] = self.server.counts.get(where, 0) + 1
            self.server.headers.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
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
        _patch_ranged_reads()
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
        self.counter = FaultyProxy(("127.0.0.1", port), faults=False)
        for p in (self.proxy, self.counter):
            threading.Thread(target=p.serve_forever, daemon=True).start()
        self.faulty = f"http://127.0.0.1:{self.proxy.server_address[1]}"
        # The same server, every request passed on and counted in self.counter.counts.
        self.counting = f"http://127.0.0.1:{self.counter.server_address[1]}"
        return self

    def env(self):
        return dict(SLUICE_TEST_S3_ENDPOINT=self.endpoint, SLUICE_TEST_S3_ACCESS_KEY=self.access_key,
                    SLUICE_TEST_S3_SECRET_KEY=self.secret_key, SLUICE_TEST_S3_REGION="us-east-1",
                    SLUICE_TEST_S3_FAULTY_ENDPOINT=self.faulty)

    def __exit__(self, *exc):
        self.proxy.shutdown()
        self.counter.shutdown()
        self.server.stop()
