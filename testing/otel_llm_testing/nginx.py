"""Debian's nginx on loopback, running the shipped ``deploy/nginx/otel-llm-gateway.conf``.

``NginxProxy`` renders that file with a test's own listening port, certificate and upstream
address (nothing else changes, unless ``edit`` says so: a test of a misconfigured proxy) and runs
it with ``NginxServer``: any site configuration, wrapped in a minimal main configuration in a
temporary directory, under ``nginx -g 'daemon off;'`` (``benchmarks/gateway.py`` runs its plain
``proxy_pass`` that way). ``ensure_nginx()`` installs the ``nginx-light`` package when nginx is
missing (as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from otel_llm.tools.process import terminate
from otel_llm_testing.net import free_port
from otel_llm_testing.markers import need

__all__ = ["NGINX", "SHIPPED_CONF", "NginxError", "NginxProxy", "NginxServer", "ensure_nginx", "render"]

NGINX = "/usr/sbin/nginx"
SHIPPED_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "otel-llm-gateway.conf"
_MAIN = """worker_processes 1;
worker_rlimit_nofile {files};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/site.conf;
}}
"""


class NginxError(RuntimeError):
    """nginx could not be installed or started; the message quotes its output."""


def ensure_nginx() -> str:
    """The nginx binary, installed with apt-get when missing."""
    if os.path.exists(NGINX):
        return NGINX
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "nginx-light"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, check=False)
        if done.returncode != 0:
            raise NginxError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    if not os.path.exists(NGINX):
        raise NginxError(f"nginx-light is installed but {NGINX} is missing ({shutil.which('nginx')})")
    return NGINX


def render(text: str, port: int, upstream: str, cert: str, key: str) -> str:
    """The shipped configuration with this port, upstream (host:port), certificate and key."""
    replacements = {
        "    server 127.0.0.1:8080;": f"    server {upstream};",
        "    listen 443 ssl;": f"    listen 127.0.0.1:{port} ssl;",
        "    ssl_certificate     /etc/ssl/certs/llm.example.com.pem;": f"    ssl_certificate     {cert};",
        "    ssl_certificate_key /etc/ssl/private/llm.example.com.key;": f"    ssl_certificate_key {key};",
    }
    for old, new in replacements.items():
        if old not in text:
            raise NginxError(f"the nginx configuration no longer has the line {old.strip()!r}")
        text = text.replace(old, new)
    return text


class NginxServer:
    """nginx serving ``site`` (what goes in the ``http`` block) and listening on ``port``, in a
    temporary prefix; a context manager. ``start()`` returns once the port accepts connections.
    ``worker_connections`` counts both sides of a relayed request (the caller's and the upstream's)."""

    def __init__(self, site: str, port: int, binary: str = NGINX, worker_connections: int = 512) -> None:
        self.site, self.port, self.binary = site, port, binary
        self.worker_connections = worker_connections
        self.dir = Path(tempfile.mkdtemp(prefix="otel-llm-nginx-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The master process's."""
        assert self._proc is not None
        return self._proc.pid

    def start(self) -> NginxServer:
        (self.dir / "site.conf").write_text(self.site)
        (self.dir / "nginx.conf").write_text(_MAIN.format(dir=self.dir, connections=self.worker_connections,
                                                            files=2 * self.worker_connections + 64))
        log = open(self.dir / "stderr.log", "wb")
        self._proc = subprocess.Popen([self.binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                                       "-g", "daemon off;"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise NginxError(f"nginx exited {self._proc.returncode}:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NginxError(f"nginx did not listen on {self.port}:\n{self.log()}")

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in (self.dir / "stderr.log", self.dir / "error.log")
                         if p.exists())

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, 10.0)

    def __enter__(self) -> NginxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NginxProxy:
    """nginx with TLS on ``127.0.0.1:port`` in front of ``upstream`` (host:port); a context manager.
    ``edit`` rewrites the rendered configuration (a proxy configured otherwise)."""

    def __init__(self, upstream: str, cert: str, key: str, edit: Callable[[str], str] | None = None,
                 conf: Path = SHIPPED_CONF) -> None:
        self.upstream, self.cert, self.key, self.edit, self.conf = upstream, cert, key, edit, conf
        self.port = 0
        self._server: NginxServer | None = None

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    @property
    def site(self) -> str:
        assert self._server is not None
        return self._server.site

    def start(self) -> NginxProxy:
        need("backend", "nginx")
        binary = ensure_nginx()
        self.port = free_port()
        site = render(self.conf.read_text(), self.port, self.upstream, self.cert, self.key)
        self._server = NginxServer(self.edit(site) if self.edit else site, self.port, binary).start()
        return self

    def log(self) -> str:
        return self._server.log() if self._server is not None else ""

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> NginxProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
