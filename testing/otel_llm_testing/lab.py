"""Loopback lab servers for the diagnose tests: a latency-adding TCP proxy and a tiny authenticating HTTP gateway.

Both listen on 127.0.0.1 only, run in daemon threads and are context managers::

    with SimProcess(runtime="llama.cpp") as sim, DelayingProxy("127.0.0.1", sim.port, 0.1) as far:
        ...  # far.url behaves like sim.base_url seen across a 200 ms round trip

    with AuthGateway(sim.base_url, keys={"ops": "s3cret"}) as gw:
        ...  # gw.url answers 401/403/429 like a gateway that enforces auth, routes and concurrency
"""

from __future__ import annotations

import hmac
import queue as queue_mod
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = ["AuthGateway", "DelayingProxy"]

_HOST = "127.0.0.1"
_CHUNK = 65536
_IDLE_S = 120.0  # a silent connection is closed after this long
_MAX_CONNECTIONS = 256


class DelayingProxy:
    """Threaded TCP proxy on 127.0.0.1 adding ``delay_s`` of one-way latency to every chunk, both ways.

    Each chunk is forwarded ``delay_s`` after it arrived (order kept, never batched), so a request/answer
    round trip costs ``2 * delay_s`` more while the spacing of streamed chunks is preserved.
    """

    def __init__(self, target_host: str, target_port: int, delay_s: float, listen_port: int = 0) -> None:
        if delay_s < 0:
            raise ValueError("delay_s must be >= 0")
        self.target = (target_host, int(target_port))
        self.delay_s = float(delay_s)
        self._listen_port = listen_port
        self._sock: socket.socket | None = None
        self._port: int | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0

    @property
    def port(self) -> int:
        assert self._port is not None, "proxy not started"
        return self._port

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def start(self) -> DelayingProxy:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((_HOST, self._listen_port))
        sock.listen(64)
        sock.settimeout(0.2)
        self._sock = sock
        self._port = sock.getsockname()[1]
        thread = threading.Thread(target=self._accept_loop, name="delaying-proxy-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            _close(conn)
        if self._sock is not None:
            _close(self._sock)
        for thread in self._threads:
            thread.join(timeout=2.0)

    def __enter__(self) -> DelayingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():  # ends with stop(); each iteration waits at most 0.2 s
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.connections >= _MAX_CONNECTIONS:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10.0)
            except OSError:
                _close(client)
                continue
            self.connections += 1
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(_IDLE_S)
            with self._lock:
                self._conns += [client, upstream]
            self._pipe(client, upstream)
            self._pipe(upstream, client)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        chunks: queue_mod.Queue[tuple[float, bytes]] = queue_mod.Queue()

        def read() -> None:
            while not self._stop.is_set():  # ends at EOF, error, idle timeout or stop()
                try:
                    data = src.recv(_CHUNK)
                except OSError:
                    data = b""
                chunks.put((time.monotonic() + self.delay_s, data))
                if not data:
                    return

        def write() -> None:
            while not self._stop.is_set():
                try:
                    due, data = chunks.get(timeout=_IDLE_S)
                except queue_mod.Empty:
                    break
                wait = due - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    break
                if not data:
                    break
                try:
                    dst.sendall(data)
                except OSError:
                    break
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        for target, name in ((read, "read"), (write, "write")):
            thread = threading.Thread(target=target, name=f"delaying-proxy-{name}", daemon=True)
            thread.start()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length"}
_CREDENTIAL_HEADERS = ("authorization", "x-api-key")


class AuthGateway:
    """A tiny loopback HTTP reverse proxy that authenticates, authorizes routes and limits concurrency.

    With ``enforce=True`` (default): missing/unknown credentials (``Authorization: Bearer <secret>`` or
    ``x-api-key: <secret>``) -> 401, a route outside ``allowed_routes`` -> 403, both before any upstream
    request; more than ``max_concurrent`` generations in flight plus ``queue`` waiting -> 429 with
    ``Retry-After``; a queued request waiting longer than ``queue_timeout`` -> 503 with ``Retry-After``.
    With ``enforce=False`` everything is forwarded (a gateway that does NOT enforce anything).
    Credentials are stripped before forwarding and never logged. ``upstream_requests`` counts forwards.
    """

    def __init__(self, upstream_url: str, keys: Mapping[str, str] | None = None,
                 allowed_routes: Iterable[str] = ("/v1/chat/completions",), max_concurrent: int = 1,
                 queue: int = 0, *, enforce: bool = True, listen_port: int = 0, retry_after: int = 1,
                 queue_timeout: float = 30.0, upstream_timeout: float = 120.0) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.keys = dict({"key-id": "secret"} if keys is None else keys)
        self.allowed_routes = tuple(allowed_routes)
        self.max_concurrent = max(1, int(max_concurrent))
        self.queue = max(0, int(queue))
        self.enforce = enforce
        self.retry_after = retry_after
        self.queue_timeout = queue_timeout
        self._listen_port = listen_port
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.max_concurrent)
        self._admitted = 0  # in flight + waiting for a slot
        self.upstream_requests = 0
        self.rejections: dict[int, int] = {}
        self._client = httpx.Client(timeout=httpx.Timeout(upstream_timeout, connect=10.0))
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "gateway not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def start(self) -> AuthGateway:
        gateway = self

        class Handler(_GatewayHandler):
            gw = gateway

        server = ThreadingHTTPServer((_HOST, self._listen_port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="auth-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._client.close()

    def __enter__(self) -> AuthGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- decisions -------------------------------------------------------------------------------------
    def authorized(self, headers: Mapping[str, str]) -> bool:
        auth = headers.get("authorization") or ""
        presented = auth[7:].strip() if auth[:7].lower() == "bearer " else (headers.get("x-api-key") or "")
        if not presented:
            return False
        ok = False
        for secret in self.keys.values():  # constant-time comparison against every key
            ok |= hmac.compare_digest(presented.encode(), str(secret).encode())
        return ok

    def _count(self, status: int) -> None:
        with self._lock:
            self.rejections[status] = self.rejections.get(status, 0) + 1

    def _admit(self) -> bool:
        with self._lock:
            if self._admitted >= self.max_concurrent + self.queue:
                return False
            self._admitted += 1
            return True

    def _release_admission(self) -> None:
        with self._lock:
            self._admitted -= 1


class _GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    gw: AuthGateway

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - never log (no secrets in logs)
        return

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def _body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if 0 < length <= 16 * 1024 * 1024 else b""

    def _reply(self, status: int, message: str, extra: Mapping[str, str] | None = None) -> None:
        self.gw._count(status)
        payload = ('{"error": {"message": "%s", "code": %d}}' % (message, status)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _handle(self) -> None:
        gw = self.gw
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        if not gw.enforce:
            self._forward(body, headers)
            return
        if not gw.authorized(headers):
            self._reply(401, "missing or invalid credentials", {"WWW-Authenticate": "Bearer"})
            return
        if path not in gw.allowed_routes:
            self._reply(403, "route not allowed")
            return
        if not gw._admit():
            self._reply(429, "too many concurrent requests", {"Retry-After": str(gw.retry_after)})
            return
        try:
            if not gw._slots.acquire(timeout=gw.queue_timeout):
                self._reply(503, "queue wait exceeded", {"Retry-After": str(gw.retry_after)})
                return
            try:
                self._forward(body, headers)
            finally:
                gw._slots.release()
        finally:
            gw._release_admission()

    def _forward(self, body: bytes, headers: Mapping[str, str]) -> None:
        gw = self.gw
        out = {k: v for k, v in headers.items() if k not in _HOP and k not in _CREDENTIAL_HEADERS}
        with gw._lock:
            gw.upstream_requests += 1
        try:
            request = gw._client.build_request(self.command, gw.upstream_url + self.path, headers=out,
                                               content=body or None)
            response = gw._client.send(request, stream=True)
        except httpx.HTTPError:
            self._reply(502, "upstream unreachable")
            return
        try:
            self.send_response(response.status_code)
            for key, value in response.headers.items():
                if key.lower() not in _HOP and key.lower() != "content-encoding":
                    self.send_header(key, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if self.command != "HEAD":
                try:
                    for chunk in response.iter_raw():  # bounded by the upstream answer and its timeout
                        if chunk:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except httpx.HTTPError:
                    self.close_connection = True
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            response.close()
