"""The capture seam: one typed timeline per model call, fed by any HTTP stack.

An adapter (one module per HTTP stack in this package) asks the sink whether a request is a
model call (:meth:`CallSink.route`), opens an :class:`LlmCall` with a :class:`CallRequest`, then
reports what its stack does through plain named methods: ``connect_started()``,
``connected(peer)``, ``tls_done(version, cipher, alpn)``, ``request_sent()``,
``response_started(status, headers)``, ``chunk(data)``, ``finish(reason)``... Each of them only
takes a timestamp (and, rarely, keeps a small value); everything else (parsing, spans, metrics)
happens once, in the sink, when :meth:`LlmCall.finish` runs, exactly once whichever way the call
ends: end of body, early close, cancellation, error or garbage collection.

Dependencies point one way: this package knows the sink only through :class:`CallSink`, and
the sink reads the finished record without writing back into it. Capture owns its calls: the
ones still open are here (:func:`open_calls`), and :func:`end_open_calls` ends them at exit.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import TYPE_CHECKING, Mapping, Protocol

from otel_llm._log import log_once
from otel_llm.capture.record import (
    END_CANCELLED, END_CLOSED, END_EOF, END_ERROR, END_EXIT, END_GC, END_UNTRACED, CallRecord, CallRequest,
    HeaderCarrier, Timeline, TlsInfo,
)
from otel_llm.parse.content import CAPTURE_BYTES
from otel_llm.parse.encoding import Decoder, decoder_for
from otel_llm.parse.formats import is_stream_content_type, stream_format
from otel_llm.parse.framing import BODY_LIMIT, StreamScanner

if TYPE_CHECKING:
    from otel_llm.parse.routes import Route

__all__ = [
    "CURRENT_CALL", "CallRecord", "CallRequest", "CallSink", "HeaderCarrier", "LlmCall", "Timeline", "TlsInfo",
    "clock_anchor", "end_open_calls", "open_calls", "perf_ns",
    "END_CANCELLED", "END_CLOSED", "END_EOF", "END_ERROR", "END_EXIT", "END_GC", "END_UNTRACED",
]

perf_ns = time.perf_counter_ns
_ANCHOR_GAP_NS = 20_000  # a (perf, epoch) pair read further apart than this was preempted: read again


def clock_anchor() -> tuple[int, int]:
    """``(perf_counter_ns, time_ns)`` read together, so spans of two processes line up: a pair
    split by a preemption (milliseconds on a loaded machine) would shift every epoch time derived
    from it. Three tries at most; normally the first pair is a few hundred nanoseconds apart."""
    best = (0, 0)
    best_gap = None
    for _ in range(3):
        before = perf_ns()
        epoch = time.time_ns()
        after = perf_ns()
        gap = after - before
        if best_gap is None or gap < best_gap:
            best, best_gap = ((before + after) // 2, epoch), gap
        if gap <= _ANCHOR_GAP_NS:
            break
    return best

# Indices into LlmCall._marks: Timeline's marks in its order (otel_llm.capture.record.MARKS).
_CONNECT_START, _DNS_START, _DNS_END, _CONNECT_END, _TLS_START, _TLS_END = range(6)
_UPLOAD_START, _BODY_SENT, _HEADERS, _POOL_START, _POOL_END = range(6, 11)
_N_MARKS = 11

FOLD_BYTES = 64 * 1024

# The call an adapter is inside of on this thread / task, for hooks deeper in the same stack
# (DNS, pool waits) that see no request.
CURRENT_CALL: contextvars.ContextVar[LlmCall | None] = contextvars.ContextVar(
    "otel_llm_current_call", default=None
)


class CallSink(Protocol):
    """Where calls go: decides which requests are model calls and turns finished ones into
    telemetry (``otel_llm.telemetry.calls.Telemetry``)."""

    capture_content: bool

    def route(self, path: str) -> Route | None:
        """The model API a request to ``path`` speaks, or None: not a model call."""

    def call_started(self, call: LlmCall) -> object:
        """A call begins (trace context goes into ``call.request.headers``). Returns what the
        sink needs again at the end, handed back untouched to :meth:`call_finished`."""

    def call_finished(self, record: CallRecord, state: object) -> None:
        """The call ended: build its telemetry from the record and what ``call_started`` returned."""


# The calls started and not finished yet, by key. Capture's own: the session ends them at exit
# (``end_open_calls``), so that their spans are exported too. Plain dict operations, atomic
# under the GIL: a lock here would cost every call.
_open: dict[int, LlmCall] = {}


def open_calls() -> list[LlmCall]:
    """The calls started and not finished yet."""
    return list(_open.values())


def end_open_calls(reason: str = END_EXIT) -> int:
    """Finish every open call now (process exit); returns how many there were."""
    calls = open_calls()
    for call in calls:
        call.finish(reason)
    return len(calls)


class LlmCall:
    """Everything recorded about one model call; finished exactly once."""

    __slots__ = (
        "sink", "route", "request", "t0", "epoch0", "t_end", "_marks", "peer", "tls",
        "http_version", "status", "response_headers", "content_type", "decoder", "scanner", "times",
        "chunks", "pending", "body", "body_overflow", "captured", "end_reason", "exception", "_lock",
        "_done", "state", "__weakref__",
    )

    def __init__(self, sink: CallSink, route: Route, request: CallRequest) -> None:
        self.t0, self.epoch0 = clock_anchor()
        self.sink = sink
        self.route = route
        self.request = request
        self.t_end = 0
        self._marks = [0] * _N_MARKS
        self.peer: tuple[str, int] | None = None
        self.tls: TlsInfo | None = None
        self.http_version: str | None = None
        self.status = 0
        self.response_headers: dict[str, str] = {}
        self.content_type = ""
        self.decoder: Decoder | None = None  # the body arrives content-encoded (gzip...)
        self.scanner: StreamScanner | None = None
        self.times: list[int] = []
        self.chunks: list[bytes] = []
        self.pending = 0
        self.body: list[bytes] = []
        self.body_overflow = False
        self.captured: bytearray | None = None  # stream bytes kept for opt-in content capture
        self.end_reason = ""
        self.exception: BaseException | None = None
        self._lock = threading.Lock()
        self._done = False
        self.state: object = None  # the sink's, from call_started

    @classmethod
    def open(cls, sink: CallSink, route: Route, request: CallRequest) -> LlmCall:
        """Start recording a model call (``route`` from ``sink.route``)."""
        call = cls(sink, route, request)
        call.state = sink.call_started(call)
        _open[id(call)] = call
        return call

    @property
    def key(self) -> int:
        """Tells this call from the others in progress (:attr:`CallRecord.key`)."""
        return id(self)

    # -- the transport's events (hot path: a timestamp and, rarely, a small value) -----------
    def pool_wait(self, start_ns: int, end_ns: int) -> None:
        """The request queued for a pooled connection (all busy) from ``start_ns`` to ``end_ns``."""
        marks = self._marks
        if not marks[_POOL_START]:
            marks[_POOL_START] = start_ns
        marks[_POOL_END] = end_ns

    def dns_started(self) -> None:
        self._marks[_DNS_START] = perf_ns()

    def dns_done(self) -> None:
        self._marks[_DNS_END] = perf_ns()

    def connect_started(self) -> None:
        self._marks[_CONNECT_START] = perf_ns()

    def connected(self, peer: tuple[str, int] | None) -> None:
        """TCP (or Unix socket) connected; ``peer`` is the address read from the socket now."""
        self._marks[_CONNECT_END] = perf_ns()
        self.peer = peer

    def set_peer(self, peer: tuple[str, int] | None) -> None:
        """The connected address, for stacks that expose it only once the response starts."""
        if peer is not None:
            self.peer = peer

    def tls_info(self, version: str | None, cipher: str | None, alpn: str | None) -> None:
        """TLS details from a stack whose connect step includes the handshake (no TLS phase)."""
        if self.tls is None:
            self.tls = TlsInfo(version, cipher, alpn)

    def tls_started(self) -> None:
        self._marks[_TLS_START] = perf_ns()

    def tls_done(self, version: str | None, cipher: str | None, alpn: str | None) -> None:
        self._marks[_TLS_END] = perf_ns()
        self.tls = TlsInfo(version, cipher, alpn)

    def request_started(self) -> None:
        """The request head is about to be written (on a new or a reused connection)."""
        self._marks[_UPLOAD_START] = perf_ns()

    def request_sent(self) -> None:
        """The whole request (head and body) was handed to the network."""
        self._marks[_BODY_SENT] = perf_ns()

    def headers_received(self, http_version: str | None = None) -> None:
        """The response head arrived (stacks that report it before handing the response over)."""
        self._marks[_HEADERS] = perf_ns()
        if http_version:
            self.http_version = http_version

    def response_replaced(self) -> None:
        """The stack retried or followed a redirect: drop what the earlier answer left (its head,
        and the body read or drained before the next attempt), so the call records the answer
        the application gets. The request and the timeline stay (each mark is the last attempt's)."""
        self.status = 0
        self.response_headers = {}
        self.content_type = ""
        self.decoder = None
        self.scanner = None
        self.captured = None
        self.times.clear()
        self.chunks.clear()
        self.pending = 0
        self.body.clear()
        self.body_overflow = False

    def response_started(self, status: int, headers: Mapping[str, str], decoded: bool = False) -> None:
        """The response head is in: pick stream scanning or whole-body parsing. ``decoded``: the
        stack hands ``chunk`` the body with its ``Content-Encoding`` already removed."""
        if not self._marks[_HEADERS]:
            self._marks[_HEADERS] = perf_ns()
        self.status = status
        self.response_headers = {k.lower(): v for k, v in headers.items()}
        self.content_type = self.response_headers.get("content-type", "").lower()
        if not decoded:
            self.decoder = decoder_for(self.response_headers.get("content-encoding"))
        if is_stream_content_type(self.content_type):
            self.scanner = StreamScanner(stream_format(self.route.api, self.content_type))
            if self.sink.capture_content:
                self.captured = bytearray()

    def chunk(self, data: bytes) -> None:
        """A piece of the response body reached the application."""
        self.times.append(perf_ns())
        self.chunks.append(data)
        self.pending += len(data)
        if self.pending > FOLD_BYTES:
            self.fold()

    # -- off the hot path ------------------------------------------------------------------------
    def fold(self) -> None:
        """Move the recorded chunks into the scanner (or the bounded body buffer)."""
        try:
            times, chunks = self.times, self.chunks
            if self.decoder is not None:
                times, chunks = self.decoder.decode(times, chunks)
            if self.scanner is not None:
                self.scanner.fold(times, chunks)
                if self.captured is not None and len(self.captured) < CAPTURE_BYTES:
                    self.captured += b"".join(chunks)[: CAPTURE_BYTES - len(self.captured)]
            elif not self.body_overflow:
                self.body.extend(chunks)
                if sum(map(len, self.body)) > BODY_LIMIT:
                    self.body_overflow = True
                    self.body.clear()
        except Exception:  # never let a scanning bug reach the application
            log_once("scanning a response stream failed")
        self.times.clear()
        self.chunks.clear()
        self.pending = 0

    def finish(self, reason: str, exc: BaseException | None = None, at_ns: int = 0) -> None:
        """End the call once (at ``at_ns`` if given, else now): fold what is left, then hand the
        record to the sink."""
        if self._done or not self._lock.acquire(blocking=False):
            return
        try:
            if self._done:
                return
            self._done = True
            self.t_end = at_ns or perf_ns()
            self.end_reason = reason
            self.exception = exc
            _open.pop(id(self), None)
            if self.chunks:
                self.fold()
            state, self.state = self.state, None
            self.sink.call_finished(self.record(), state)
        except Exception:
            log_once("finishing a model call failed")
        finally:
            # The exception's traceback reaches the response stream, whose weakref.finalize (a GC
            # root) holds this call: keeping it would keep the call, its request, response and
            # connection alive forever.
            self.exception = None
            self._lock.release()

    def timeline(self) -> Timeline:
        """The steps recorded so far (``end`` is 0 until the call finished)."""
        return Timeline(self.t0, self.epoch0, self.t_end, *self._marks)

    def record(self) -> CallRecord:
        """The call as the sink receives it, made once when it finishes."""
        scanner = self.scanner
        body = None
        if scanner is None and not self.body_overflow:
            body = b"".join(self.body)
        return CallRecord(
            id(self), self.route, self.request, self.timeline(),
            self.peer, self.tls, self.http_version, self.status, self.response_headers,
            None if scanner is None else scanner.stats(), body,
            None if self.captured is None else bytes(self.captured), self.end_reason, self.exception,
        )

    def finish_from_exception(self, exc: BaseException) -> None:
        if isinstance(exc, GeneratorExit):
            self.finish(END_CLOSED)
        elif type(exc).__name__ == "CancelledError":
            self.finish(END_CANCELLED, exc)
        else:
            self.finish(END_ERROR, exc)

    @property
    def finished(self) -> bool:
        return self._done

    @property
    def streaming(self) -> bool:
        return self.scanner is not None
