"""The gateway as an ASGI application: authenticate, authorize, admit, then relay.

Order of one request (any step may answer instead, and then nothing reaches the runtime)::

    SERVER span ─ gateway.auth (key, route) ─ body (size-capped) ─ model check ─ key limits
      ─ gateway.queue (bounded, timed) ─ upstream call (``upstream.Upstream``, traced by the core)
      ─ relay chunks

As ``otel-llm proxy`` without keys (``config.authenticates`` false) only the edge limits, the
head size and the body apply: no authentication, key limits or queue, so the span tree under
the SERVER span is the upstream call alone, as an instrumented application would record it.

A task watches for the client going away the whole time after the body is read: if it does,
the request leaves the queue or the upstream request is closed, so an abandoned call does not
keep the runtime generating.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_llm.tools._log import log_once
from otel_llm.capture.call import CallSink
from otel_llm.tools.gateway.auth import Denied, KeyStore, check_model, check_path, check_route, credentials
from otel_llm.tools.gateway.settings import PROXY, GatewayConfig, KeyPolicy
from otel_llm.tools.gateway.limits import Admission, KeyLimits, Rejected
from otel_llm.tools.gateway.header_rules import request_headers, response_headers
from otel_llm.tools.gateway.refusals import REFUSED_OUTCOMES, RefusalLimiter
from otel_llm.tools.gateway.rewrite import with_stream_usage
from otel_llm.tools.gateway.server_telemetry import Exchange, GatewayTelemetry
from otel_llm.tools.gateway.backlog import Backlog, DeferredSink
from otel_llm.tools.gateway.upstream import Response, Upstream, session_sink

__all__ = ["Gateway", "HEALTH_PATH"]

HEALTH_PATH = "/-/health"
MAX_HEADER_BYTES = 32 * 1024  # request head (names + values); larger ones are never forwarded
MAX_WRITES = 4096  # relayed pieces whose write times the proxy keeps, to find the first token's
_GONE_GRACE = 5.0  # seconds for the disconnect watcher to cancel a relay whose caller left
_perf_ns = time.perf_counter_ns
_log = logging.getLogger("otel_llm.gateway")


class _ClientGone(Exception):
    """The client disconnected before the request finished."""


class Gateway:
    """ASGI app: ``Gateway(config, telemetry)``; the upstream client lives from startup to shutdown."""

    def __init__(self, config: GatewayConfig, telemetry: GatewayTelemetry, upstream_key: str | None = None,
                 on_shutdown: Sequence[Callable[[], None]] = (),
                 call_sink: Callable[[], CallSink | None] | None = None) -> None:
        self.config = config
        self._call_sink = call_sink or session_sink  # where the upstream's model calls are recorded
        self._deferred: DeferredSink | None = None
        self.backlog = Backlog()  # each request's records, built after the answers in flight
        self.on_shutdown = list(on_shutdown)
        self.telemetry = telemetry
        self.keys = KeyStore(config.keys)
        self.admission = Admission(config.max_concurrency, config.max_queue, config.max_queue_wait)
        self._limits = {p.key_id: KeyLimits(p.rate, p.burst, p.max_concurrency) for p in config.keys}
        self.refusals = RefusalLimiter(config.refusal_rate, config.refusal_burst)
        self.authenticates = config.authenticates
        self._times_writes = config.role == PROXY  # the caller's side of the relay (not the gateway's cost)
        self._upstream_key = upstream_key
        self._client: Upstream | None = None

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._client = self._new_client()
                self.backlog.start(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                self.backlog.flush()  # the records of the last requests, before the providers flush
                # Here, not after the server returns: uvicorn re-raises SIGTERM once it has
                # drained, which ends the process before any code after it runs.
                for callback in self.on_shutdown:
                    try:
                        callback()
                    except Exception:
                        log_once("a gateway shutdown step failed")
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _new_client(self) -> Upstream:
        # Not httpx: its transport and httpcore's pool cost a few hundred microseconds of TTFB per
        # request. Having no cookie jar also means a Set-Cookie answered to one caller can never
        # ride along with the next caller's requests.
        config = self.config
        return Upstream(config.upstream.rstrip("/"), max_idle=config.max_concurrency, connect_timeout=10.0,
                        read_timeout=config.upstream_timeout, get_sink=self._deferred_sink)

    def _deferred_sink(self) -> CallSink | None:
        """The call sink, its finished calls recorded through the backlog."""
        sink = self._call_sink()
        if sink is None:
            return None
        deferred = self._deferred
        if deferred is None or deferred.wrapped is not sink:
            deferred = self._deferred = DeferredSink(sink, self.backlog)
        return deferred

    async def aclose(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- one request ---------------------------------------------------------------------------
    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        if path == HEALTH_PATH and scope["method"] in ("GET", "HEAD"):
            await _answer(send, 200, {"status": "ok"})
            return
        headers = {}
        for name, value in scope["headers"]:
            headers[name.decode("latin-1")] = value.decode("latin-1")
        exchange = Exchange(scope["method"], path, scope.get("client"))
        span = self.telemetry.start(exchange, headers, scope)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            await self._guarded(exchange, scope, receive, send, span)
        finally:
            exchange.end = _perf_ns()
            try:
                self.telemetry.log_access(exchange, span)
            except Exception:
                log_once("writing a gateway access line failed")
            self.backlog.submit(self._finish, exchange, span)  # after its model call's record
            otel_context.detach(token)

    def _finish(self, exchange: Exchange, span: trace.Span) -> None:
        try:
            self.telemetry.finish(exchange, span)
        except Exception:
            log_once("recording a gateway request failed")

    async def _guarded(self, exchange: Exchange, scope: dict[str, Any], receive: Any, send: Any,
                       span: trace.Span) -> None:
        try:
            if not self.authenticates:
                _check_head_size(scope)
                body = await _read_body(scope, receive, self.config.max_body_bytes, self.config.body_timeout)
                await self._admit_and_relay(exchange, scope, receive, send, body)
                return
            policy = self._check_head(exchange, scope)
            limits = self._limits[policy.key_id]
            limits.enter()  # before the body: a stalled upload holds one of the key's requests
            try:
                body = await self._check_body(exchange, scope, receive, policy)
                await self._admit_and_relay(exchange, scope, receive, send, body)
            finally:
                limits.leave()
        except Denied as denied:
            if denied.outcome in REFUSED_OUTCOMES:
                wait = self.refusals.allow(exchange.client[0] if exchange.client else None)
                if wait > 0:
                    exchange.recorded = False
                    await self._deny(exchange, send, 429, "address_limited",
                                     "too many refused requests from this address",
                                     [("retry-after", str(max(1, math.ceil(wait)))), ("connection", "close")])
                    return
            await self._deny(exchange, send, denied.status, denied.outcome, denied.message, denied.headers)
        except Rejected as rejected:
            status = 503 if rejected.reason == "overloaded" else 429
            message = ("the gateway's queue is full" if status == 503 else "rate limit exceeded for this key")
            await self._deny(exchange, send, status, rejected.reason, message,
                             [("retry-after", str(rejected.retry_after))])
        except _ClientGone:
            exchange.outcome = "client_closed"
            if exchange.head_sent is None:
                exchange.status = 499  # nginx's code for it; only in logs and telemetry

    def _check_head(self, exchange: Exchange, scope: dict[str, Any]) -> KeyPolicy:
        """Authenticate and authorize the route."""
        started = _perf_ns()
        try:
            _check_head_size(scope)
            secret = credentials(scope["headers"])
            policy = self.keys.authenticate(secret)
            exchange.key_id = policy.key_id
            check_path(exchange.path, scope.get("raw_path"))
            check_route(policy, exchange.path, exchange.method)
            return policy
        finally:
            exchange.auth = (started, _perf_ns())

    async def _check_body(self, exchange: Exchange, scope: dict[str, Any], receive: Any, policy: KeyPolicy) -> bytes:
        """Read the body (size- and time-capped) and authorize the model."""
        try:
            body = await _read_body(scope, receive, self.config.max_body_bytes, self.config.body_timeout)
            exchange.model = check_model(policy, body, exchange.method)
            return body
        finally:
            if exchange.auth is not None:  # the span covers the checks and the body
                exchange.auth = (exchange.auth[0], _perf_ns())

    async def _admit_and_relay(self, exchange: Exchange, scope: dict[str, Any], receive: Any, send: Any,
                               body: bytes) -> None:
        # The relay runs in this task (no extra task and loop turn before the upstream call);
        # a watcher task cancels it if the client disconnects.
        task = asyncio.current_task()
        assert task is not None
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task, gone, exchange))
        try:
            if self.authenticates:
                await self._queue_and_relay(exchange, scope, send, body)
            else:
                await self._relay(exchange, scope, send, body)
        except asyncio.CancelledError:
            if not gone.is_set():
                raise  # the server is shutting down, not a client leaving
            if hasattr(task, "uncancel"):
                task.uncancel()
            raise _ClientGone() from None
        finally:
            watcher.cancel()

    async def _queue_and_relay(self, exchange: Exchange, scope: dict[str, Any], send: Any, body: bytes) -> None:
        admission = self.admission
        exchange.queue_depth = admission.depth
        started = _perf_ns()
        try:
            await admission.acquire()
        finally:
            exchange.queue = (started, _perf_ns())
        try:
            await self._relay(exchange, scope, send, body)
        finally:
            admission.release((_perf_ns() - exchange.queue[1]) / 1e9)

    async def _relay(self, exchange: Exchange, scope: dict[str, Any], send: Any, body: bytes) -> None:
        assert self._client is not None, "the gateway's lifespan has not started"
        query = scope.get("query_string") or b""
        raw_path = scope.get("raw_path") or exchange.path.encode("ascii", "ignore")
        target = raw_path + b"?" + query if query else raw_path
        headers = request_headers(scope["headers"], exchange.client, scope.get("scheme", "http"), self._upstream_key,
                                  self.authenticates)
        if self.config.stream_usage:
            body = with_stream_usage(exchange.method, exchange.path, body) or body
        exchange.upstream_start = _perf_ns()
        try:
            # A kept-alive connection the runtime had just closed (llama-server does this) is
            # retried once on a fresh one inside: nothing was answered.
            response = await self._client.request(exchange.method, target, headers, body)
        except httpx.TimeoutException:
            raise Denied(504, "upstream_error", "the model server did not answer in time") from None
        except httpx.HTTPError as exc:
            exchange.error = type(exc).__name__
            raise Denied(502, "upstream_error", "the model server is unreachable") from None
        exchange.first_byte = _perf_ns()
        try:
            await self._stream_back(exchange, response, send)
        finally:
            response.close()
            if exchange.writes:
                exchange.first_token_written = _written_at(exchange.writes, response.first_token_ns())

    async def _stream_back(self, exchange: Exchange, response: Response, send: Any) -> None:
        exchange.status = response.status_code
        if response.status_code >= 500:
            exchange.outcome = "upstream_error"
        headers = response_headers(response.headers, exchange.server_timing())
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        exchange.head_sent = _perf_ns()
        exchange.caller_timed = self._times_writes
        cycle = _chunked_cycle(send)
        try:
            if cycle is not None:
                await self._relay_direct(exchange, response, cycle)
            else:
                await self._relay_messages(exchange, response, send)
        except httpx.HTTPError as exc:
            # Too late for an error status: the server drops the connection, so the caller sees
            # a truncated response rather than a complete-looking one.
            exchange.outcome, exchange.error = "upstream_error", type(exc).__name__
            raise
        exchange.complete = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_messages(self, exchange: Exchange, response: Response, send: Any) -> None:
        """The body as ASGI messages, one per piece (any server but uvicorn's chunked response)."""
        # the proxy notes when each piece was written to the caller, and how long writing waited
        # for it (the server's ``send`` waits while the caller is not reading)
        writes = exchange.writes = [] if self._times_writes else None
        async for chunk in response:
            exchange.bytes_out += len(chunk)
            if writes is None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            arrived = _perf_ns()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            written = _perf_ns()
            exchange.write_wait += written - arrived
            if len(writes) < MAX_WRITES:
                writes.append((arrived, written))

    async def _relay_direct(self, exchange: Exchange, response: Response, cycle: Any) -> None:
        """The body straight from the upstream connection's callback into the caller's transport,
        framed as uvicorn frames a chunked body: no ASGI message, await or task switch per piece.
        Each piece is written as it arrives, so it is written when the trace says it arrived;
        what the caller's slowness cost is the time reading waited for its side to drain."""
        transport, flow = cycle.transport, cycle.flow

        def write(piece: bytes) -> bool:
            if cycle.disconnected:
                return False
            exchange.bytes_out += len(piece)
            transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            return not flow.write_paused

        async def drained() -> None:
            if cycle.disconnected:  # the disconnect watcher cancels this task
                await asyncio.sleep(_GONE_GRACE)
                raise _ClientGone()
            await flow.drain()

        try:
            exchange.write_wait += await response.relay(write, drained)
        finally:
            if self._times_writes:
                exchange.first_token_written = response.first_token_ns() or None

    async def _deny(self, exchange: Exchange, send: Any, status: int, outcome: str, message: str,
                    headers: Any = ()) -> None:
        exchange.status, exchange.outcome = status, outcome
        extra = list(headers) + [("server-timing", exchange.server_timing())]
        if status in (408, 413):
            extra.append(("connection", "close"))  # the unread body must not be parsed as a request
        await _answer(send, status, {"error": {"message": message, "type": outcome, "code": status}}, extra)


def _chunked_cycle(send: Any) -> Any:
    """uvicorn's response cycle behind ``send`` once it sent a chunked head (a streamed answer's:
    the upstream's Transfer-Encoding does not pass, and a stream has no Content-Length), whose
    transport and flow control ``_relay_direct`` writes through; None under another server, or
    for an answer with a Content-Length or to HEAD, which are relayed message by message."""
    cycle = getattr(send, "__self__", None)
    if getattr(cycle, "chunked_encoding", None) is not True or getattr(cycle, "response_complete", True):
        return None
    if not all(hasattr(cycle, name) for name in ("transport", "flow", "disconnected")):
        return None
    flow = getattr(cycle, "flow", None)
    if not hasattr(flow, "write_paused") or not hasattr(flow, "drain"):
        return None
    return cycle


def _written_at(writes: list[tuple[int, int]], arrived_ns: int) -> int | None:
    """When the piece that arrived at ``arrived_ns`` (the trace's clock, read just before ours)
    was written: the first piece noted at or after it."""
    if not arrived_ns:
        return None
    for arrived, written in writes:
        if arrived >= arrived_ns:
            return written
    return None


def _check_head_size(scope: dict[str, Any]) -> None:
    if sum(len(n) + len(v) for n, v in scope["headers"]) > MAX_HEADER_BYTES:
        raise Denied(431, "bad_request", f"request headers over {MAX_HEADER_BYTES} bytes")


async def _answer(send: Any, status: int, payload: dict[str, Any], headers: Any = ()) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _read_body(scope: dict[str, Any], receive: Any, limit: int, timeout: float) -> bytes:
    """The whole request body, refusing it as soon as it is known to exceed ``limit`` (413) or
    when it has not all arrived ``timeout`` seconds after the head (408)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise Denied(400, "bad_request", "invalid Content-Length") from None
            if declared > limit:
                raise Denied(413, "bad_request", f"request body over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + timeout
    while True:
        try:
            message = await _within(receive(), deadline - time.monotonic())
        except asyncio.TimeoutError:
            raise Denied(408, "bad_request", f"request body not received within {timeout:g} s") from None
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Denied(413, "bad_request", f"request body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _within(awaitable: Any, seconds: float) -> Any:
    """``awaitable`` or TimeoutError after ``seconds``; on 3.11+ without wait_for's extra task (a
    loop turn per body message)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(max(0.0, seconds)):
            return await awaitable
    return await asyncio.wait_for(awaitable, max(0.0, seconds))  # pragma: no cover - 3.10


async def _cancel_on_disconnect(receive: Any, task: asyncio.Task[Any], gone: asyncio.Event,
                                exchange: Exchange) -> None:
    """Cancel ``task`` when the client disconnects (after the body was read, nothing else arrives).

    uvicorn also answers ``http.disconnect`` once the response is complete: that is no departure."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.complete:
                gone.set()
                task.cancel()
            return
