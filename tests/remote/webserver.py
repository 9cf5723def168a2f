"""A real web server for the tests of the http store: Debian's nginx (package nginx-light, installed by
`scripts/deps.sh test`), serving a directory on a free port of 127.0.0.1, started and stopped by the test.
nginx answers byte ranges (206 with Content-Range), HEAD with Content-Length, a strong ETag ("mtime-size")
and Last-Modified, and honours If-Match (412 when the file changed), as the store relies on.  /go/NAME
redirects (302) to /NAME, for the redirect case.

NGINX is the binary's path, or None where nginx is absent (the tests then skip, saying so)."""
import email.utils
import http.server
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse

import s3server

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)

CONF = """
{user}
daemon off;
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format sent '$request_method $uri $status $body_bytes_sent';
    access_log {prefix}/access.log sent;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port}{tls};
        root {root};
        location /go/ {{ rewrite ^/go/(.*)$ /$1 redirect; }}
        location / {{ {listing} {dav} }}
    }}
}}
"""


class WebServer:
    """nginx serving root: .url(name) is a file's URL, .port the port; a context manager.  listing: directories
    listed (autoindex, an HTML page of links).  dav: WebDAV's PUT and DELETE taken (else 405: read-only).
    .sent() sums the body bytes of its GET answers so far (its access log)."""

    def __init__(self, root, prefix, workers=2, tls=False, listing=True, dav=False):
        self.root, self.prefix, self.workers, self.tls = str(root), str(prefix), workers, tls
        self.listing, self.dav = listing, dav

    def sent(self, path_prefix="/"):
        """Bytes of GET answers for paths under path_prefix (nginx writes its log as each request ends)."""
        try:
            with open(os.path.join(self.prefix, "access.log")) as f:
                rows = [line.split() for line in f]
        except FileNotFoundError:
            return 0
        return sum(int(r[3]) for r in rows if len(r) == 4 and r[0] == "GET" and r[1].startswith(path_prefix))

    def url(self, name):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/{name}"

    def __enter__(self):
        if NGINX is None:
            raise RuntimeError("nginx is absent (scripts/deps.sh test installs nginx-light)")
        os.makedirs(self.prefix, exist_ok=True)
        self.port = s3server.free_port()
        conf = os.path.join(self.prefix, "nginx.conf")
        tls = ""
        if self.tls:  # a certificate of its own for 127.0.0.1 (self.cert: what a client must trust)
            self.cert, key = os.path.join(self.prefix, "cert.pem"), os.path.join(self.prefix, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out",
                            self.cert], check=True, capture_output=True)
            tls = f" ssl; ssl_certificate {self.cert}; ssl_certificate_key {key}"
        with open(conf, "w") as f:
            # As root, nginx's workers would run as nobody, who cannot read the tests' private directories.
            f.write(CONF.format(user="user root;" if os.geteuid() == 0 else "", prefix=self.prefix, port=self.port,
                                root=self.root, workers=self.workers, tls=tls,
                                listing="autoindex on;" if self.listing else "",
                                dav="dav_methods PUT DELETE; create_full_put_path on; dav_access user:rw all:r;"
                                if self.dav else ""))
        self.proc = subprocess.Popen([NGINX, "-p", self.prefix, "-c", conf, "-e", os.path.join(self.prefix, "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("nginx did not start: " + self.proc.stderr.read().decode())
                time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError("nginx did not answer on port %d" % self.port)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class PlainServer(http.server.ThreadingHTTPServer):
    """A small web server in Python for what nginx will not do, and where nginx is absent: root's files by GET
    and HEAD, in HTTP/1.1 with keep-alive.  ranges: 206 with Content-Range for a Range (False: 200 and the
    whole file, as a server without range support answers).  validators: a strong ETag ("mtime-size", as
    nginx's) and Last-Modified (False: neither, as some servers and proxies send).  conditional: If-Match and
    If-Unmodified-Since honoured with 412 (False: ignored, as some servers do).  tls: https with a
    certificate of its own for 127.0.0.1 (.cert, what a client must trust).  A context manager; .url(name)
    is a file's URL and .gets counts the GETs."""
    daemon_threads = True

    def __init__(self, root, ranges=True, validators=True, conditional=True, tls=False):
        self.root, self.ranges, self.validators, self.conditional, self.tls = str(root), ranges, validators, \
            conditional, tls
        self.gets = 0
        super().__init__(("127.0.0.1", 0), _PlainHandler)

    def url(self, name):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.server_address[1]}/{name}"

    def __enter__(self):
        if self.tls:
            import ssl
            import tempfile
            d = tempfile.mkdtemp(prefix="sluice-plain-tls-")
            self.cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out",
                            self.cert], check=True, capture_output=True)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.cert, key)
            self.socket = ctx.wrap_socket(self.socket, server_side=True)
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class _PlainHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self):
        srv = self.server
        path = os.path.join(srv.root, urllib.parse.unquote(self.path.split("?")[0]).lstrip("/"))
        try:
            with open(path, "rb") as f:  # one open: the size, the validators and the bytes of one version
                st = os.fstat(f.fileno())
                data = f.read()
        except OSError:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag = '"%x-%x"' % (st.st_mtime_ns, st.st_size)
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        if self.command == "GET":
            srv.gets += 1
        if srv.conditional and srv.validators and (
                self.headers.get("If-Match", etag) != etag or
                self.headers.get("If-Unmodified-Since", modified) != modified):
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        status, body = 200, data
        if m and srv.ranges and self.command == "GET":
            a, b = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            if a >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status, body = 206, data[a:b + 1]
        self.send_response(status)
        if srv.ranges:
            self.send_header("Accept-Ranges", "bytes")
        if srv.validators:
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", modified)
        if status == 206:
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            try:
                self.wfile.write(body)
            except OSError:
                self.close_connection = True

    do_GET = do_HEAD = answer
