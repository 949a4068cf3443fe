"""The timeline of one model call, recorded as it happens.

Only timestamps and references are taken while the request runs; everything else (parsing,
spans, metrics) happens once, in :meth:`LlmCall.finish`, which runs exactly once whichever way
the call ends: end of body, early close, cancellation, error or garbage collection.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from otel_llm._log import log_once
from otel_llm.parse.content import CAPTURE_BYTES
from otel_llm.parse.formats import is_stream_content_type, stream_format
from otel_llm.parse.framing import BODY_LIMIT, StreamScanner

if TYPE_CHECKING:
    from otel_llm.build.telemetry import Telemetry
    from otel_llm.parse.request import RequestInfo
    from otel_llm.parse.routes import Route

perf_ns = time.perf_counter_ns

# Indices into LlmCall.marks (perf-counter nanoseconds; 0 = did not happen).
CONNECT_START, DNS_START, DNS_END, CONNECT_END, TLS_START, TLS_END = range(6)
UPLOAD_START, BODY_SENT, HEADERS = 6, 7, 8
POOL_START, POOL_END = 9, 10  # set only when the request really queued for a pooled connection
N_MARKS = 11

_EVENT_MARKS: dict[str, int] = {
    "connection.connect_tcp.started": CONNECT_START,
    "connection.connect_tcp.complete": CONNECT_END,
    "connection.connect_unix_socket.started": CONNECT_START,
    "connection.connect_unix_socket.complete": CONNECT_END,
    "connection.start_tls.started": TLS_START,
    "connection.start_tls.complete": TLS_END,
    "http11.send_request_headers.started": UPLOAD_START,
    "http2.send_request_headers.started": UPLOAD_START,
    "http11.send_request_body.complete": BODY_SENT,
    "http2.send_request_body.complete": BODY_SENT,
    "http11.receive_response_headers.complete": HEADERS,
    "http2.receive_response_headers.complete": HEADERS,
}

FOLD_BYTES = 64 * 1024

# How a call ended (llm.client.end_reason).
END_EOF = "eof"
END_CLOSED = "closed"
END_CANCELLED = "cancelled"
END_ERROR = "error"
END_GC = "garbage_collected"
END_EXIT = "process_exit"


def _peer_address(stream: Any) -> tuple[str, int] | None:
    """The connected address, read now: by the end of the call the socket may be closed."""
    try:
        address = stream.get_extra_info("server_addr")
        return (str(address[0]), int(address[1]))
    except Exception:
        return None


class LlmCall:
    """Everything recorded about one model call; finished exactly once."""

    __slots__ = (
        "telemetry", "route", "request_info", "url", "method", "runtime", "runtime_configured", "span",
        "admission",
        "t0", "epoch0", "t_end", "marks", "tls_stream", "peer", "http_version",
        "status", "response_headers", "content_type", "scanner", "times", "chunks", "pending",
        "body", "body_overflow", "captured", "end_reason", "exception", "_lock", "_done", "__weakref__",
    )

    def __init__(
        self, telemetry: Telemetry, route: Route, request_info: RequestInfo, url: Any,
        method: str, runtime: str | None,
    ) -> None:
        self.t0 = perf_ns()
        self.epoch0 = time.time_ns()
        self.telemetry = telemetry
        self.route = route
        self.request_info = request_info
        self.url = url
        self.method = method
        self.runtime = runtime
        self.runtime_configured = False  # the `runtimes` option named it: evidence does not override
        self.span: Any = None
        self.admission: Any = None
        self.t_end = 0
        self.marks = [0] * N_MARKS
        self.tls_stream: Any = None
        self.peer: tuple[str, int] | None = None
        self.http_version: str | None = None
        self.status = 0
        self.response_headers: dict[str, str] = {}
        self.content_type = ""
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

    # -- transport events (hot path: a timestamp and, rarely, a reference) -------------------
    def on_trace_event(self, name: str, info: dict[str, Any]) -> None:
        index = _EVENT_MARKS.get(name)
        if index is None:
            return
        self.marks[index] = perf_ns()
        if index == CONNECT_END:
            self.peer = _peer_address(info.get("return_value"))
        elif index == TLS_END:
            self.tls_stream = info.get("return_value")
        elif index == HEADERS:
            value = info.get("return_value")
            if isinstance(value, tuple) and value and isinstance(value[0], bytes):
                self.http_version = value[0].decode("ascii", "replace")

    def on_pool_wait(self, start_ns: int, end_ns: int) -> None:
        if not self.marks[POOL_START]:
            self.marks[POOL_START] = start_ns
        self.marks[POOL_END] = end_ns

    def on_dns(self, start_ns: int, end_ns: int) -> None:
        self.marks[DNS_START] = start_ns
        self.marks[DNS_END] = end_ns

    def on_chunk(self, chunk: bytes) -> None:
        """A chunk of the response body arrived (for clients other than httpx, whose stream
        wrappers inline this)."""
        self.times.append(perf_ns())
        self.chunks.append(chunk)
        self.pending += len(chunk)
        if self.pending > FOLD_BYTES:
            self.fold()

    def to_epoch(self, t_ns: int) -> int:
        return self.epoch0 + (t_ns - self.t0)

    # -- response ----------------------------------------------------------------------------
    def on_response(self, status: int, headers: Any) -> None:
        """Response headers are in: pick stream scanning or whole-body parsing."""
        if not self.marks[HEADERS]:
            self.marks[HEADERS] = perf_ns()
        self.status = status
        self.response_headers = {k.lower(): v for k, v in headers.items()}
        self.content_type = self.response_headers.get("content-type", "").lower()
        if is_stream_content_type(self.content_type):
            self.scanner = StreamScanner(stream_format(self.route.api, self.content_type))
            if self.telemetry.settings.capture_content:
                self.captured = bytearray()

    def fold(self) -> None:
        """Move the recorded chunks into the scanner (or the bounded body buffer)."""
        try:
            if self.scanner is not None:
                self.scanner.fold(self.times, self.chunks)
                if self.captured is not None and len(self.captured) < CAPTURE_BYTES:
                    self.captured += b"".join(self.chunks)[: CAPTURE_BYTES - len(self.captured)]
            elif not self.body_overflow:
                self.body.extend(self.chunks)
                if sum(map(len, self.body)) > BODY_LIMIT:
                    self.body_overflow = True
                    self.body.clear()
        except Exception:  # never let a scanning bug reach the application
            log_once("scanning a response stream failed")
        self.times.clear()
        self.chunks.clear()
        self.pending = 0

    # -- end ---------------------------------------------------------------------------------
    def finish(self, reason: str, exc: BaseException | None = None, at_ns: int = 0) -> None:
        """End the call once (at ``at_ns`` if given, else now): fold what is left, then build
        spans and metrics."""
        if self._done or not self._lock.acquire(blocking=False):
            return
        try:
            if self._done:
                return
            self._done = True
            self.t_end = at_ns or perf_ns()
            self.end_reason = reason
            self.exception = exc
            if self.chunks:
                self.fold()
            self.telemetry.live.pop(id(self), None)
            self.telemetry.release(self)
            self.telemetry.emit(self)
        except Exception:
            log_once("finishing a model call failed")
        finally:
            # The exception's traceback reaches the response stream, whose weakref.finalize (a GC
            # root) holds this call: keeping it would keep the call, its request, response and
            # connection alive forever.
            self.exception = None
            self._lock.release()

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
