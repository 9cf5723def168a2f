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
(or waits).  S3Server.fault_proxy(faults, every=...) makes more, with any of FAULTS (FaultProxy says what
each does): the fault suite (tests/python/test_faults.py) runs every read and write path through each.

Two things moto does not do as S3 does are mended here, since sluice's checks rely on them: a ranged GET reads
only its range (_Window), and a HEAD with x-amz-checksum-mode names the checksum's type (FULL_OBJECT or
COMPOSITE, with "-N" after a composite value) as S3's does.  moto computes CRC32C with the crc32c package
(tests/requirements.txt); without it, it would store a CRC32 under the CRC32C name.
"""
import http.client
import http.server
import itertools
import json
import os
import re
import socket
import struct
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


def _patch_head_checksum():
    """HEAD with x-amz-checksum-mode: ENABLED answers x-amz-checksum-type too, and a composite checksum's
    value with its part count, as S3 does (moto 5.2.5 gives the bare value alone)."""
    from moto.s3 import responses
    if getattr(responses.S3Response, "_sluice_head", False):
        return
    head = responses.S3Response.head_object

    def head_object(self, bucket_name, query, key_name, headers):
        status, hdrs, body = head(self, bucket_name, query, key_name, headers)
        if status == 200 and headers.get("x-amz-checksum-mode") == "ENABLED":
            try:
                key = self.backend.head_object(bucket_name, key_name, None)
            except Exception:
                key = None
            name = f"x-amz-checksum-{(key.checksum_algorithm or '').lower()}" if key else ""
            if key and key.checksum_type and name in hdrs:
                hdrs["x-amz-checksum-type"] = key.checksum_type
                if key.checksum_type == "COMPOSITE" and key.checksum_parts:
                    hdrs[name] = f"{key.checksum_value}-{key.checksum_parts}"
        return status, hdrs, body

    responses.S3Response.head_object = head_object
    responses.S3Response._sluice_head = True


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


# The faults a FaultProxy can put between a client and the server.  The first three break the request
# (any method); the others break a GET's answer (other requests pass): its connection reset or its body cut
# under a full Content-Length, another range than asked (Content-Range and body both), a Content-Range no
# client can read, one byte of the body flipped, the body trickled (a byte every stall_s seconds: a peer
# that never quite stops).
FAULTS = ("503", "429", "stall", "reset", "truncate", "shift", "garble", "flip", "trickle")
ANSWER_FAULTS = ("reset", "truncate", "shift", "garble", "flip", "trickle")


class FaultProxy(http.server.ThreadingHTTPServer):
    """Forwards S3 requests to upstream, breaking them with faults (FAULTS): the first attempt of every
    distinct request (method, path with its query, Range), the faults taken in turn, so that a client that
    tries again gets through; or with every=True each attempt, so that one that does not give up in the end
    would loop.  before_get (a callable, or None) is called with the path before each GET is passed on: a
    test replaces the object there.  The proxy forwards the client's Host header, so signatures still check.
    .counts and .headers record what passed, .faulted how many answers were broken."""
    daemon_threads = True

    def __init__(self, upstream, faults=("503", "truncate", "stall"), every=False, stall_s=2.0, before_get=None):
        self.upstream, self.turn, self.lock, self.seen = upstream, itertools.count(), threading.Lock(), set()
        self.faults, self.every, self.stall_s, self.before_get = tuple(faults), every, stall_s, before_get
        self.counts = {}  # (method, path without the query) -> requests seen
        self.headers = []  # (method, path, {header: value}) of each request, in order
        self.faulted = 0
        self.sent = 0  # body bytes of the answers to GETs
        super().__init__(("127.0.0.1", 0), FaultHandler)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self


def _reset(sock):
    """Closes sock with a TCP reset (SO_LINGER 0), as a crashed peer or a middlebox does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class FaultHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = (self.command, self.path, self.headers.get("Range"))
        with srv.lock:
            first = request not in srv.seen
            fault = srv.faults[next(srv.turn) % len(srv.faults)] if srv.faults and (first or srv.every) else None
            srv.seen.add(request)
            where = (self.command, self.path.split("?")[0])
            srv.counts[where] = srv.counts.get(where, 0) + 1
            srv.headers.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if fault in ANSWER_FAULTS and self.command != "GET":
            fault = "reset" if fault == "reset" else None
        if fault in ("503", "429"):
            err = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(int(fault))
            self.send_header("Content-Length", str(len(err)))
            self.end_headers()
            self.wfile.write(err)
            srv.faulted += 1
            return
        if fault == "reset" and self.command != "GET":
            # Before the server acts: a lost answer to a request it carried out is a case no client can clean up.
            srv.faulted += 1
            self.close_connection = True
            _reset(self.connection)
            return
        if fault == "stall":
            time.sleep(srv.stall_s)
        if self.command == "GET" and srv.before_get:
            srv.before_get(self.path)
        up = http.client.HTTPConnection(*srv.upstream, timeout=60)
        up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for k, v in self.headers.items():
            up.putheader(k, v)
        up.endheaders(body)
        r = up.getresponse()
        data = r.read()
        up.close()
        hdrs = [(k, v) for k, v in r.getheaders()
                if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server")]
        length = r.getheader("Content-Length") or str(len(data))
        if fault in ANSWER_FAULTS and (not data or r.status >= 300):
            fault = None  # nothing to break: an empty body or the server's own error
        cr = [v for k, v in hdrs if k.lower() == "content-range"]
        if fault in ("shift", "garble") and not (r.status == 206 and cr):
            fault = "flip"  # a whole object's answer has no range to bend: damage its bytes instead
        if fault == "shift":
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", cr[0])
            cut = max(1, min(4096, len(data) // 2))
            hdrs = [(k, v) for k, v in hdrs if k.lower() != "content-range"]
            hdrs.append(("Content-Range", f"bytes {int(m.group(1)) + cut}-{m.group(2)}/{m.group(3)}"))
            data, length = data[cut:], str(len(data) - cut)
        elif fault == "garble":
            hdrs = [(k, v) for k, v in hdrs if k.lower() != "content-range"]
            hdrs.append(("Content-Range", "bytes 0-x/?"))
        elif fault == "flip":
            i = len(data) // 2
            data = data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:]
        if fault:
            srv.faulted += 1
        if self.command == "GET":
            with srv.lock:
                srv.sent += len(data)
        self.send_response(r.status)
        for k, v in hdrs:
            self.send_header(k, v)
        self.send_header("Content-Length", length)
        if fault in ("reset", "truncate") and len(data) > 1:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            if fault == "reset":
                _reset(self.connection)
            return
        self.end_headers()
        if fault == "trickle":
            try:
                for i in range(len(data)):  # until the client gives up (a broken pipe) or it is all sent
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(srv.stall_s)
            except OSError:
                self.close_connection = True
            return
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = relay


# The name the earlier tests know it by.
FaultyProxy = FaultProxy


class S3Server:
    """The server, a user whose key may do anything in S3, and the faulty proxy in front; .env() gives the
    SLUICE_TEST_S3_* variables a test program reads."""

    def __enter__(self):
        if ThreadedMotoServer is None:
            raise RuntimeError(MOTO_MISSING)
        _patch_ranged_reads()
        _patch_head_checksum()
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
        self.upstream = ("127.0.0.1", port)
        self.proxies = []
        self.proxy = self.fault_proxy()
        self.counter = self.fault_proxy(faults=())
        self.faulty = self.proxy.endpoint
        # The same server, every request passed on and counted in self.counter.counts.
        self.counting = self.counter.endpoint
        return self

    def fault_proxy(self, faults=("503", "truncate", "stall"), **kw):
        """A FaultProxy in front of this server (its .endpoint), stopped with the server."""
        p = FaultProxy(self.upstream, faults=faults, **kw).start()
        self.proxies.append(p)
        return p

    def env(self):
        return dict(SLUICE_TEST_S3_ENDPOINT=self.endpoint, SLUICE_TEST_S3_ACCESS_KEY=self.access_key,
                    SLUICE_TEST_S3_SECRET_KEY=self.secret_key, SLUICE_TEST_S3_REGION="us-east-1",
                    SLUICE_TEST_S3_FAULTY_ENDPOINT=self.faulty)

    def __exit__(self, *exc):
        for p in self.proxies:
            p.shutdown()
        self.server.stop()
