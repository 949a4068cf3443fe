"""The gateway's upstream client: HTTP/1.1 over asyncio, parsed by httptools, traced by the core.

Only what a relay needs: one origin, a bounded LIFO pool of kept-alive connections (TCP_NODELAY,
request head and body in one write), the response head, then the body piece by piece as it
arrives. The body is the message payload: chunked framing is removed (each chunk's data is its
own piece, so the caller's server can frame it again chunk for chunk), nothing is decoded.

Errors are httpx's exception classes, so callers map them, and spans name them, as they did
when httpx was the client: ``ConnectError``/``ConnectTimeout`` connecting, ``ReadTimeout`` after
``read_timeout`` seconds of silence, ``RemoteProtocolError`` for a malformed or cut-short
response, ``ReadError`` for a reset. A reused connection that the server closed before answering
(nothing received) is retried once on a new connection.

Tracing: the core's client adapters never see these requests, so this client feeds the capture
seam itself (:class:`~otel_llm.capture.call.LlmCall`'s named methods), as any adapter does.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import httptools
import httpx
from opentelemetry import propagate

from otel_llm.tools._log import log_once
from otel_llm.capture.call import END_CLOSED, END_EOF, CallRequest, CallSink, LlmCall
from otel_llm.capture.httpcore_dns import is_ip

__all__ = ["Response", "Upstream", "session_sink"]

HIGH_WATER = 256 * 1024  # buffered body bytes at which reading the upstream pauses
LOW_WATER = 64 * 1024  # ... and resumes
_perf_ns = time.perf_counter_ns
_UNSAFE_TARGET = re.compile(rb"[^\x21-\x7e]")  # never sent raw in a request line


class _Stale(Exception):
    """A reused connection ended before any byte of the answer: safe to send again."""


def _escape_target(target: bytes) -> bytes:
    # uvicorn's parser already refuses these; this only keeps the request line well formed.
    return _UNSAFE_TARGET.sub(lambda m: b"%%%02X" % m.group()[0], target)


class _Headers:
    """Request header pairs as the core sees them: ``get`` reads, ``[name] = value`` (trace
    context injection) replaces."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def get(self, name: str, default: Any = None) -> Any:
        for key, value in self.pairs:
            if key == name:
                return value
        return default

    def getall(self, name: str, default: Any = ()) -> Any:
        """Every value of ``name`` (a caller may send ``baggage`` on several lines)."""
        values = [value for key, value in self.pairs if key == name]
        return values or default

    def __setitem__(self, name: str, value: str) -> None:
        name = name.lower()
        self.pairs[:] = [pair for pair in self.pairs if pair[0] != name]
        self.pairs.append((name, value))


class _Connection(asyncio.Protocol):
    """One upstream connection and the response being read on it (httptools callbacks)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self.loop = loop
        self.read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.alive = True
        self.pool: list[_Connection] | None = None  # the idle list, while in it
        self._silence: asyncio.TimerHandle | None = None
        self._reset(head_only=False)

    def _reset(self, head_only: bool) -> None:
        self.active = False  # a request was written and its response is not fully read
        self.head_only = head_only  # a HEAD request: the answer has no body, whatever it declares
        self.received = False
        self.head_done = False
        self.done = False
        self.keep_alive = False
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        # While relayed (``Response.relay``): each body piece goes to ``forward`` from the parser's
        # callback, and the waiting task is woken only to end or when ``forward`` says the
        # caller is not keeping up (``congested``).
        self.forward: Callable[[bytes], bool] | None = None
        self.congested = False
        self.last_data = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.active:  # nothing asked: an idle connection the server is giving up on
            self.close()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed upstream response: {exc}"))
        if self.forward is not None:
            self.last_data = self.loop.time()
            if not (self.done or self.congested or self.error is not None):
                return  # relayed already: nothing for the task to do
        elif self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        if self.active and self.head_done and not self.done and self._close_delimited():
            self.done = True
        self._lost(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)
        self.transport = None

    def peer(self) -> tuple[str, int] | None:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None

    def tls_details(self) -> tuple[str | None, str | None, str | None]:
        ssl_object = self.transport.get_extra_info("ssl_object") if self.transport is not None else None
        if ssl_object is None:
            return None, None, None
        cipher = ssl_object.cipher()
        return ssl_object.version(), cipher[0] if cipher else None, ssl_object.selected_alpn_protocol()

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:  # not a chunked body's trailer
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.headers, self.reason = [], b""  # an interim answer: the real one follows
            return
        self.status = status
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive() and not self.head_only
        if self.head_only:
            self.done = True

    def on_body(self, body: bytes) -> None:
        if self.done:
            return
        if self.forward is None:
            self.chunks.append(body)
            self.buffered += len(body)
        else:
            self._pass(body)

    def _pass(self, body: bytes) -> None:
        assert self.forward is not None
        if not self.forward(body) and not self.congested:
            self.congested = True  # stop reading until the caller's side drained
            if self.transport is not None:
                self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.head_done:
            self.done = True

    # -- the task's side -------------------------------------------------------------------------
    def _close_delimited(self) -> bool:
        for name, value in self.headers:
            lowered = name.lower()
            if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
                return False
        return True

    def _lost(self, exc: Exception | None) -> None:
        self._unpool()
        if self.active and not self.done and self.error is None:
            if exc is not None:
                self.error = httpx.ReadError(str(exc) or type(exc).__name__)
            elif not self.received:
                self.error = httpx.RemoteProtocolError("Server disconnected without sending a response.")
            else:
                self.error = httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.keep_alive = False
        self.close()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until the next data or end arrives; ReadTimeout after ``read_timeout`` s of silence."""
        waiter = self.waiter = self.loop.create_future()
        timer = self.loop.call_later(self.read_timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    async def wait_relayed(self) -> None:
        """Until the relayed answer ends, fails or congests; ReadTimeout after ``read_timeout`` s
        with no data (one timer for the whole wait, re-armed from the last data, not one per piece)."""
        loop = self.loop
        waiter = self.waiter = loop.create_future()
        self.last_data = loop.time()
        self._silence = loop.call_later(self.read_timeout, self._check_silence, waiter)
        try:
            await waiter
        finally:
            if self._silence is not None:
                self._silence.cancel()
                self._silence = None
            self.waiter = None

    def _check_silence(self, waiter: asyncio.Future[None]) -> None:
        quiet = self.loop.time() - self.last_data
        if quiet >= self.read_timeout:
            _expire(waiter)
        elif not waiter.done():
            self._silence = self.loop.call_later(self.read_timeout - quiet, self._check_silence, waiter)

    def take(self) -> bytes | None:
        """The next buffered body piece, if any."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < LOW_WATER and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def _unpool(self) -> None:
        self.alive = False
        if self.pool is not None:
            self.pool.remove(self)
            self.pool = None

    def close(self) -> None:
        self._unpool()
        if self.transport is not None:
            self.transport.abort()  # now: an abandoned answer must stop the runtime's work


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("the upstream sent nothing for too long"))


class _ResponseHeaders(dict):  # type: ignore[type-arg]
    """Response headers for ``LlmCall.response_started``: lower-case names, repeats joined as httpx does."""

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        super().__init__()
        for raw_name, raw_value in pairs:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            self[name] = f"{self[name]}, {value}" if name in self else value


class Response:
    """Status and headers of an upstream answer; iterate for the body pieces, then ``close()``
    (always: an answer left unfinished ends there, connection and trace)."""

    __slots__ = ("status_code", "reason", "headers", "_conn", "_upstream", "_call")

    def __init__(self, conn: _Connection, upstream: Upstream, call: LlmCall | None) -> None:
        self.status_code = conn.status
        self.reason = conn.reason
        self.headers = conn.headers  # raw (name, value) pairs, repeats kept
        self._conn: _Connection | None = conn
        self._upstream = upstream
        self._call = call

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        try:
            while True:
                chunk = conn.take()
                if chunk is not None:
                    if self._call is not None:
                        self._call.chunk(chunk)
                    return chunk
                if conn.done:
                    break
                if conn.error is not None:
                    raise conn.error
                await conn.wait()
        except BaseException as exc:
            self._end(reuse=False)
            if self._call is not None:
                self._call.finish_from_exception(exc)
            raise
        self._end(reuse=True)
        if self._call is not None:
            self._call.finish(END_EOF)
        raise StopAsyncIteration

    async def relay(self, write: Callable[[bytes], bool], drained: Callable[[], Awaitable[None]]) -> int:
        """Relay the body without a task switch or a message per piece: each piece goes to
        ``write`` from the connection's callback as it arrives (the trace's timestamp first).
        ``write`` returns False when the caller's side is full: reading then pauses until
        ``drained()`` returns. Ends the answer, connection and trace as iterating it to the end
        would; returns the nanoseconds reading waited for the caller."""
        conn = self._conn
        if conn is None:
            return 0
        call = self._call
        if call is not None:
            record = call.chunk

            def forward(piece: bytes) -> bool:
                record(piece)
                return write(piece)
            conn.forward = forward
        else:
            conn.forward = write
        waited = 0
        try:
            while (piece := conn.take()) is not None:  # what arrived with the head
                conn._pass(piece)
            while not conn.done:
                if conn.error is not None:
                    raise conn.error
                if conn.congested:
                    started = _perf_ns()
                    await drained()
                    waited += _perf_ns() - started
                    conn.congested = False
                    if conn.transport is not None:
                        conn.transport.resume_reading()
                    continue
                await conn.wait_relayed()
        except BaseException as exc:
            self._stop_relaying(conn)
            self._end(reuse=False)
            if call is not None:
                call.finish_from_exception(exc)
            raise
        self._stop_relaying(conn)
        self._end(reuse=True)
        if call is not None:
            call.finish(END_EOF)
        return waited

    @staticmethod
    def _stop_relaying(conn: _Connection) -> None:
        conn.forward = None
        if conn.congested:  # ended with the caller's side still full: the connection reads again
            conn.congested = False
            if conn.transport is not None:
                conn.transport.resume_reading()

    def first_token_ns(self) -> int:
        """When the piece holding the first token arrived (``perf_counter_ns``), as the trace has
        it once the answer ended; 0 if none (not a stream, no token, or not traced)."""
        scanner = self._call.scanner if self._call is not None else None
        return scanner.first_token_ns if scanner is not None else 0

    def close(self) -> None:
        """Done with the answer: a connection not read to the end is closed, never reused."""
        self._end(reuse=False)
        if self._call is not None:
            self._call.finish(END_CLOSED)  # nothing if the body was read to its end

    def _end(self, reuse: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._upstream._release(conn, reuse)


class Upstream:
    """Client for one upstream origin (``base_url``'s scheme, host and port)."""

    def __init__(self, base_url: str, max_idle: int, connect_timeout: float, read_timeout: float,
                 get_sink: Callable[[], CallSink | None] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        url = httpx.URL(base_url)
        self.scheme = url.scheme
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._url_port = url.port  # None when the scheme's default, as in httpx.URL
        self._netloc = url.netloc.decode("ascii")
        self._origin = f"{url.scheme}://{self._netloc}"
        self._host_line = f"Host: {self._netloc}\r\n"
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = None
        if url.scheme == "https":  # verified as httpx verified it (certifi's CAs)
            self._ssl = ssl_context or httpx.create_ssl_context(trust_env=False)
            self._ssl.set_alpn_protocols(["http/1.1"])
        self._is_ip = is_ip(self.host)
        if get_sink is None:
            get_sink = session_sink
        self._get_sink: Callable[[], CallSink | None] = get_sink

    async def request(self, method: str, target: bytes, headers: list[tuple[str, str]], body: bytes) -> Response:
        """Send the request and return once the response head is in.

        ``target`` is the raw path and query; ``headers`` the end-to-end headers to send (Host and
        Content-Length are added). Raises httpx's exceptions (see the module docstring)."""
        if _UNSAFE_TARGET.search(target):
            target = _escape_target(target)
        call = self._start_call(method, target, headers, body)
        try:
            data = self._head(method, target, headers, body)
            if body:
                data += body
            conn, reused = await self._connect(call)
            try:
                return await self._exchange(conn, reused, data, call)
            except _Stale:
                conn, _ = await self._connect(call, fresh=True)
                return await self._exchange(conn, False, data, call)
        except BaseException as exc:
            if call is not None:
                call.finish_from_exception(exc)
            raise

    def close(self) -> None:
        """Close the idle connections (the ones in use close when their answer is closed)."""
        for conn in list(self._idle):
            conn.close()
        self._idle.clear()

    # -- steps -----------------------------------------------------------------------------------
    def _start_call(self, method: str, target: bytes, headers: list[tuple[str, str]], body: bytes) -> LlmCall | None:
        """The core's model-call record (it injects ``traceparent``), or None for other routes,
        which still get the caller's trace context."""
        carrier = _Headers(headers)
        sink = self._get_sink()
        if sink is not None:
            try:
                path = unquote(target.partition(b"?")[0].decode("ascii"))
                route = sink.route(path)
                if route is not None:
                    request = CallRequest(method, self.scheme, self.host, self._url_port, path,
                                          self._origin + target.decode("ascii"), carrier, body)
                    return LlmCall.open(sink, route, request)
            except Exception:
                log_once("starting a model-call trace failed")
        propagate.inject(carrier)
        return None

    def _head(self, method: str, target: bytes, headers: list[tuple[str, str]], body: bytes) -> bytes:
        fields = "".join([f"{name}: {value}\r\n" for name, value in headers])
        lines = len(headers)
        if fields.count("\n") != lines or fields.count("\r") != lines or "\x00" in fields:
            raise httpx.LocalProtocolError("a header value holds CR, LF or NUL")
        if body or method in ("POST", "PUT", "PATCH"):
            fields += f"Content-Length: {len(body)}\r\n"
        return (f"{method} {target.decode('ascii')} HTTP/1.1\r\n{self._host_line}{fields}\r\n").encode("latin-1")

    async def _connect(self, call: LlmCall | None, fresh: bool = False) -> tuple[_Connection, bool]:
        """A kept-alive connection (most recently used first), else a new one."""
        idle = self._idle
        while idle and not fresh:
            conn = idle.pop()
            conn.pool = None
            if conn.alive:
                return conn, True
        loop = asyncio.get_running_loop()
        if call is not None:
            call.connect_started()
        try:
            conn = await asyncio.wait_for(self._open(loop, call), self.connect_timeout)
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout("connecting to the upstream timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return conn, False

    async def _open(self, loop: asyncio.AbstractEventLoop, call: LlmCall | None) -> _Connection:
        addresses = [self.host]
        if not self._is_ip:
            if call is not None:
                call.dns_started()
            try:
                infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            except OSError:
                raise  # no end mark: the call ends inside the DNS phase
            if call is not None:
                call.dns_done()
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        error: OSError | None = None
        for address in addresses:
            try:
                _, conn = await loop.create_connection(lambda: _Connection(loop, self.read_timeout),
                                                       address, self.port)
                break
            except OSError as exc:
                error = exc
        else:
            raise error or OSError("no address to connect to")
        if call is not None:
            call.connected(conn.peer())
        if self._ssl is not None:
            if call is not None:
                call.tls_started()
            try:
                conn.transport = await loop.start_tls(conn.transport, conn, self._ssl,  # type: ignore[arg-type]
                                                      server_hostname=self.host)
            except BaseException:
                conn.close()
                raise
            if call is not None:
                call.tls_done(*conn.tls_details())
        return conn

    async def _exchange(self, conn: _Connection, reused: bool, data: bytes, call: LlmCall | None) -> Response:
        """Write the request, wait for the response head."""
        conn._reset(head_only=data.startswith(b"HEAD "))
        conn.active = True
        if call is not None:
            call.request_started()
        assert conn.transport is not None
        conn.transport.write(data)
        if call is not None:
            call.request_sent()
        try:
            while not conn.head_done:
                if conn.error is not None:
                    if reused and not conn.received:
                        raise _Stale()
                    raise conn.error
                await conn.wait()
        except BaseException:
            self._release(conn, reuse=False)
            raise
        response = Response(conn, self, call)
        if call is not None:
            call.headers_received(conn.parser.get_http_version())
            call.response_started(conn.status, _ResponseHeaders(conn.headers))
        return response

    def _release(self, conn: _Connection, reuse: bool) -> None:
        if reuse and conn.alive and conn.keep_alive and conn.done and not conn.chunks \
                and len(self._idle) < self.max_idle:
            conn.active = False
            conn.pool = self._idle
            self._idle.append(conn)
        else:
            conn.active = False
            conn.close()


def session_sink() -> CallSink | None:
    """The running session's sink (None: otel_llm is not instrumented)."""
    from otel_llm import current_session

    session = current_session()
    return session.sink() if session is not None else None
