"""The gateway's own telemetry: the SERVER span and its ``gateway.auth`` / ``gateway.queue``
children, request metrics, the ``Server-Timing`` header and one JSON access-log line per request.

The upstream call is not traced here: the core instrumentation traces it (phases, native
counters) as a child of the SERVER span, which is the current span while it runs.

With the SDK's own tracer the span tree is built by the core's ``SdkSpanSink``, as a call's is: at the start
only the SERVER span's context (sampler consulted, ids drawn), at the end finished
``ReadableSpan`` objects handed to the tracer's processors (which see ``on_end`` only). That
skips the SDK's per-span bookkeeping, which the gateway pays per request in latency.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode, TracerProvider

from otel_llm import semconv as sc
from otel_llm.capture.call import clock_anchor
from otel_llm.telemetry.propagation import pending_at_caller
from otel_llm.telemetry.sampling import Sampler, mark_kept
from otel_llm.telemetry.spans import CallSpan, SdkSpanSink, make_sink
from otel_llm.parse.routes import match_route
from otel_llm.version import __version__

__all__ = ["Exchange", "GatewayTelemetry", "access_logger"]

_perf_ns = time.perf_counter_ns
_UNSET = Status(StatusCode.UNSET)
_MAX_LOGGED = 256  # characters of client-chosen text (path, model) kept in logs and spans


class _AsgiHeaders:
    """``propagate.extract`` getter over ASGI header pairs."""

    @staticmethod
    def get(carrier: dict[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return [value] if value is not None else None

    @staticmethod
    def keys(carrier: dict[str, str]) -> list[str]:
        return list(carrier)


@dataclass(slots=True)
class Exchange:
    """One request through the gateway: what was decided and when (``perf_counter_ns``)."""

    method: str
    path: str
    client: tuple[str, int] | None
    t0: int = 0
    epoch0: int = 0
    key_id: str | None = None
    model: str | None = None
    outcome: str = "allowed"
    status: int = 0
    auth: tuple[int, int] | None = None
    queue: tuple[int, int] | None = None
    queue_depth: int | None = None
    upstream_start: int | None = None
    first_byte: int | None = None
    head_sent: int | None = None
    end: int | None = None
    bytes_out: int = 0
    complete: bool = False  # the last byte of the response was handed to the server
    recorded: bool = True  # False: a refusal past its address's budget, counted in the metrics only
    error: str | None = None
    # the proxy only: the caller's side of the relay is timed; (arrived, written) per piece relayed
    # message by message (the first MAX_WRITES; a direct relay writes each piece as it arrives)
    caller_timed: bool = False
    writes: list[tuple[int, int]] | None = None
    write_wait: int = 0  # ns spent waiting for the caller to take the response
    first_token_written: int | None = None

    def __post_init__(self) -> None:
        if not self.t0:
            self.t0, self.epoch0 = clock_anchor()

    def epoch(self, t_ns: int) -> int:
        return self.epoch0 + (t_ns - self.t0)

    def ms(self, start: int | None, end: int | None) -> float | None:
        if start is None or end is None:
            return None
        return round((end - start) / 1e6, 3)

    @property
    def queue_wait_s(self) -> float:
        return (self.queue[1] - self.queue[0]) / 1e9 if self.queue else 0.0

    def server_timing(self) -> str:
        """``Server-Timing`` as of now (for a stream: up to the response head)."""
        now = _perf_ns()
        parts = []
        if self.auth:
            parts.append(f"auth;dur={self.ms(*self.auth)}")
        if self.queue:
            parts.append(f"queue;dur={self.ms(*self.queue)}")
        if self.upstream_start is not None and self.first_byte is not None:
            parts.append(f'upstream;desc="first byte";dur={self.ms(self.upstream_start, self.first_byte)}')
        parts.append(f"total;dur={self.ms(self.t0, now)}")
        return ", ".join(parts)


def access_logger(target: str, max_bytes: int = 100 * 1024 * 1024, backups: int = 1) -> logging.Logger | None:
    """The access logger writing bare JSON lines to stderr ("-"), a file, or nowhere ("off"); a
    file is rotated (``FILE.1``...) past ``max_bytes`` (0: never), ``backups`` previous ones kept."""
    if target == "off":
        return None
    logger = logging.getLogger("otel_llm.gateway.access")
    logger.handlers.clear()
    handler: logging.Handler
    if target == "-":
        handler = logging.StreamHandler()
    elif max_bytes and backups:
        handler = logging.handlers.RotatingFileHandler(target, maxBytes=max_bytes, backupCount=backups,
                                                       encoding="utf-8")
    elif max_bytes:  # no previous file kept: start the file afresh
        handler = _TruncatingHandler(target, max_bytes)
    else:
        handler = logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class _TruncatingHandler(logging.handlers.RotatingFileHandler):
    """A file that is emptied, not renamed, when it would pass its size (``backups`` 0)."""

    def __init__(self, path: str, max_bytes: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=0, encoding="utf-8")

    def doRollover(self) -> None:  # noqa: N802 - logging's name
        if self.stream:
            self.stream.close()
        self.stream = open(self.baseFilename, "w", encoding="utf-8")  # noqa: SIM115 - kept open


class _PendingSpan(NonRecordingSpan):
    """The SERVER span while the request runs: its context is the current one (the upstream
    call's parent); the span itself is built when the request ends."""

    def __init__(self, span: CallSpan) -> None:
        super().__init__(span.context)
        self.span = span
        self.caller_decides = False  # the caller is otel_llm: its sampled flag is a pending decision


def _children(exchange: Exchange) -> Iterator[tuple[str, int, int, dict[str, Any] | None]]:
    """The SERVER span's children: (name, start, end, attributes), epoch nanoseconds."""
    if exchange.auth is not None:
        yield sc.SPAN_GATEWAY_AUTH, exchange.epoch(exchange.auth[0]), exchange.epoch(exchange.auth[1]), None
    if exchange.queue is not None:
        attrs = {sc.LLM_GATEWAY_QUEUE_DEPTH: exchange.queue_depth} if exchange.queue_depth is not None else None
        yield sc.SPAN_GATEWAY_QUEUE, exchange.epoch(exchange.queue[0]), exchange.epoch(exchange.queue[1]), attrs


def _clip(text: str | None) -> str | None:
    return text if text is None or len(text) <= _MAX_LOGGED else text[:_MAX_LOGGED] + "..."


class GatewayTelemetry:
    """Tracer, instruments and access log of one gateway."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider,
                 access_log: logging.Logger | None = None, queue_depth: Any = None,
                 user_agent: bool = False, sampler: Sampler | None = None) -> None:
        self.tracer = tracer_provider.get_tracer(f"{sc.INSTRUMENTATION_NAME}.gateway", __version__)
        sink = make_sink(self.tracer, decide_later=sampler is not None)
        self._sdk = sink if isinstance(sink, SdkSpanSink) else None
        # sample_rate set: the span tree is kept with the model call it relays, or by the rules
        self._sampler = sampler if self._sdk is not None else None
        meter = meter_provider.get_meter(f"{sc.INSTRUMENTATION_NAME}.gateway", __version__)
        self.requests = meter.create_counter(
            sc.METRIC_GATEWAY_REQUESTS, unit="{request}", description="Requests by outcome")
        self.queue_wait = meter.create_histogram(
            sc.METRIC_GATEWAY_QUEUE_WAIT, unit="s", description="Time spent waiting for an upstream slot",
            explicit_bucket_boundaries_advisory=sc.QUEUE_WAIT_BUCKETS)
        self.duration = meter.create_histogram(
            sc.METRIC_HTTP_SERVER_DURATION, unit="s", description="Duration of gateway requests",
            explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS)
        self._queue_depth = queue_depth
        if queue_depth is not None:
            meter.create_observable_gauge(
                sc.METRIC_GATEWAY_QUEUE_DEPTH, callbacks=[self._observe_depth], unit="{request}",
                description="Requests waiting for an upstream slot")
        self.access_log = access_log
        self._user_agent = user_agent  # the proxy records the caller's User-Agent; the gateway no header value

    def _observe_depth(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self._queue_depth())]

    def start(self, exchange: Exchange, headers: dict[str, str], scope: dict[str, Any]) -> trace.Span:
        """The SERVER span, continuing the caller's trace when it sent ``traceparent``."""
        parent = propagate.extract(headers, getter=_AsgiHeaders)  # type: ignore[arg-type]
        route = match_route(exchange.path, ())
        name = f"{exchange.method} {exchange.path}" if route is not None else exchange.method
        attrs: dict[str, Any] = {
            sc.HTTP_REQUEST_METHOD: exchange.method,
            sc.URL_PATH: _clip(exchange.path),
            sc.URL_SCHEME: scope.get("scheme", "http"),
            sc.NETWORK_PROTOCOL_VERSION: scope.get("http_version", "1.1"),
        }
        if route is not None:
            attrs[sc.HTTP_ROUTE] = exchange.path
        server = scope.get("server")
        if server:
            attrs[sc.SERVER_ADDRESS], attrs[sc.SERVER_PORT] = server[0], server[1]
        if exchange.client:
            attrs[sc.CLIENT_ADDRESS], attrs[sc.CLIENT_PORT] = exchange.client
        if self._user_agent and "user-agent" in headers:
            attrs[sc.USER_AGENT_ORIGINAL] = _clip(headers["user-agent"])
        if self._sdk is not None:
            pending = _PendingSpan(self._sdk.start(name, attrs, exchange.epoch0, SpanKind.SERVER, parent))
            if self._sampler is not None:
                # an otel_llm caller sends the sampled flag while its own decision is pending
                pending.caller_decides = pending_at_caller(headers)
                above = pending.span.parent
                if pending.caller_decides or above is None or not above.trace_flags.sampled:
                    self._sampler.open_parent(pending.span.context)
                # else a trace kept above (the application's): the tree and its call are kept under it
            return pending
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attrs,
                                      start_time=exchange.epoch0)

    def finish(self, exchange: Exchange, span: trace.Span) -> None:
        """End the span tree and record the metrics (``log_access`` writes the access line)."""
        exchange.end = exchange.end or _perf_ns()
        try:
            if exchange.recorded or not isinstance(span, _PendingSpan):  # a started span must end
                self._end_spans(exchange, span)
            elif self._sampler is not None:
                self._sampler.forget_parent(span.span.context)  # nothing recorded: nothing waits on it
        finally:
            self._record(exchange, span.get_span_context())

    def _end_spans(self, exchange: Exchange, span: trace.Span) -> None:
        if isinstance(span, _PendingSpan):
            self._end_tree(exchange, span)
            return
        if span.is_recording():
            context = trace.set_span_in_context(span)
            for name, start, end, attrs in _children(exchange):
                child = self.tracer.start_span(name, context=context, start_time=start, attributes=attrs)
                child.end(end_time=end)
            span.set_attributes(self._end_attributes(exchange))
            if exchange.status >= 500:
                span.set_status(Status(StatusCode.ERROR, exchange.error or exchange.outcome))
        span.end(end_time=exchange.epoch(exchange.end))  # type: ignore[arg-type]

    def _end_tree(self, exchange: Exchange, pending: _PendingSpan) -> None:
        """The SDK path: the finished SERVER span and its children, straight to the processors."""
        sdk, span = self._sdk, pending.span
        if not span.recording or sdk is None:
            return
        context = span.context
        attrs: dict[str, Any] = {k: v for k, v in span.attributes.items() if v is not None}
        attrs.update(self._end_attributes(exchange))
        status = (Status(StatusCode.ERROR, exchange.error or exchange.outcome) if exchange.status >= 500
                  else _UNSET)
        if self._sampler is not None:
            decision = self._sampler.close_parent(context, status.description if exchange.status >= 500 else None,
                                                  None if pending.caller_decides else span.parent)
            if not decision.keep:
                return
            context = mark_kept(decision, attrs, context)
        for name, start, end, child_attrs in _children(exchange):
            sdk.emit(name, sdk.child_context(context), context, SpanKind.INTERNAL, child_attrs, start, end, _UNSET)
        sdk.emit(span.name, context, span.parent, SpanKind.SERVER, attrs, exchange.epoch0,
                 exchange.epoch(exchange.end), status)  # type: ignore[arg-type]

    @staticmethod
    def _end_attributes(exchange: Exchange) -> dict[str, Any]:
        attrs: dict[str, Any] = {sc.LLM_GATEWAY_OUTCOME: exchange.outcome,
                                 sc.LLM_GATEWAY_RESPONSE_BYTES: exchange.bytes_out}
        if exchange.status:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = exchange.status
        if exchange.key_id:
            attrs[sc.LLM_GATEWAY_KEY_ID] = exchange.key_id
        if exchange.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = _clip(exchange.model)
        if exchange.queue:
            attrs[sc.LLM_GATEWAY_QUEUE_WAIT] = exchange.queue_wait_s
        if exchange.upstream_start is not None and exchange.first_byte is not None:
            attrs[sc.LLM_GATEWAY_UPSTREAM_FIRST_BYTE] = (exchange.first_byte - exchange.upstream_start) / 1e9
        if exchange.status >= 500:
            attrs[sc.ERROR_TYPE] = str(exchange.status)
        if exchange.caller_timed:  # the proxy: the caller's side of the relay
            if exchange.head_sent is not None:
                attrs[sc.LLM_PROXY_TIME_TO_FIRST_BYTE] = (exchange.head_sent - exchange.t0) / 1e9
            if exchange.first_token_written is not None:
                attrs[sc.LLM_PROXY_TIME_TO_FIRST_TOKEN] = (exchange.first_token_written - exchange.t0) / 1e9
            attrs[sc.LLM_PROXY_WRITE_WAIT] = exchange.write_wait / 1e9
        return attrs

    def _record(self, exchange: Exchange, span_context: trace.SpanContext) -> None:
        attrs: dict[str, str | int] = {sc.LLM_GATEWAY_OUTCOME: exchange.outcome,
                                       sc.HTTP_RESPONSE_STATUS_CODE: exchange.status,
                                       sc.LLM_GATEWAY_KEY_ID: exchange.key_id or "-"}
        self.requests.add(1, attrs)
        if exchange.queue is not None:
            self.queue_wait.record(exchange.queue_wait_s, {sc.LLM_GATEWAY_OUTCOME: exchange.outcome})
        self.duration.record((exchange.end - exchange.t0) / 1e9, {  # type: ignore[operator]
            sc.HTTP_REQUEST_METHOD: exchange.method, sc.HTTP_RESPONSE_STATUS_CODE: exchange.status})

    def log_access(self, exchange: Exchange, span: trace.Span) -> None:
        """The request's access line, written as it ends (the spans and metrics may come later)."""
        if self.access_log is not None and exchange.recorded:
            line = json.dumps(self._access_record(exchange, span.get_span_context()), separators=(",", ":"))
            self.access_log.info(line)

    @staticmethod
    def _access_record(exchange: Exchange, span_context: trace.SpanContext) -> dict[str, Any]:
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(exchange.epoch0 / 1e9)) + "Z",
            "client": exchange.client[0] if exchange.client else None,
            "key_id": exchange.key_id,
            "method": exchange.method,
            "path": _clip(exchange.path),
            "status": exchange.status,
            "outcome": exchange.outcome,
            "model": _clip(exchange.model),
            "queue_depth": exchange.queue_depth,
            "queue_ms": exchange.ms(*exchange.queue) if exchange.queue else None,
            "upstream_first_byte_ms": exchange.ms(exchange.upstream_start, exchange.first_byte),
            "total_ms": exchange.ms(exchange.t0, exchange.end),
            "bytes": exchange.bytes_out,
            "trace_id": format(span_context.trace_id, "032x") if span_context.is_valid else None,
        }
