"""A real web server for the tests of the http store: Debian's nginx (package nginx-light, installed by
`scripts/deps.sh test`), serving a directory on a free port of 127.0.0.1, started and stopped by the test.
nginx answers byte ranges (206 with Content-Range), HEAD with Content-Length, a strong ETag ("mtime-size")
and Last-Modified, and honours If-Match (412 when the file changed), as the store relies on.  /go/NAME
redirects (302) to /NAME, for the redirect case.

NGINX is the binary's path, or None where nginx is absent (the tests then skip, saying so)."""
import os
import shutil
import socket
import subprocess
import time

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
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port}{tls};
        root {root};
        location /go/ {{ rewrite ^/go/(.*)$ /$1 redirect; }}
    }}
}}
"""


class WebServer:
    """nginx serving root: .url(name) is a file's URL, .port the port; a context manager."""

    def __init__(self, root, prefix, workers=2, tls=False):
        self.root, self.prefix, self.workers, self.tls = str(root), str(prefix), workers, tls

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
                                root=self.root, workers=self.workers, tls=tls))
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
