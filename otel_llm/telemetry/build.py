"""From a finished call to its telemetry, as a value: :func:`build_call` -> :class:`CallResult`.

Pure: it reads capture's :class:`~otel_llm.capture.record.CallRecord`, what the sink kept at the
call's start (:class:`CallStart`), what parse read from the response
(:class:`~otel_llm.parse.answer.Answer`) and the observers' evidence over the call's time, and
returns the call span's attributes and status, its child spans (transport phases, then the
runtime's synthesized spans) and what the metrics record. No tracer, no meter, no I/O: the
emitters (``spans``, ``metrics``) turn the result into spans and records, and a test can compare
results directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

from otel_llm import semconv as sc
from otel_llm._types import Attributes
from otel_llm.capture.record import END_CANCELLED, END_ERROR, CallRecord, TlsInfo
from otel_llm.observers.evidence import CallEnd
from otel_llm.parse.answer import Answer
from otel_llm.parse.request import RequestInfo
from otel_llm.parse.response import ResponseInfo
from otel_llm.parse.runtimes import RuntimeCounters
from otel_llm.telemetry import attributes as attr_build
from otel_llm.telemetry import diagnosis
from otel_llm.telemetry.inflight import Admission
from otel_llm.telemetry.phases import Phase, compute_phases
from otel_llm.telemetry.runtime import runtime_attributes, synthesized_spans
from otel_llm.telemetry.spans import CallSpan, PhaseAttributes, SpanEvent

__all__ = ["CallResult", "CallStart", "Endpoint", "build_call", "client_timings"]

_NS = 1e-9


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What depends only on a call's URL and method (the sink computes it once per endpoint)."""

    runtime: str | None  # configured, else implied by the route
    configured: bool  # the `runtimes` option named it: evidence from the response does not override
    server: tuple[str, int]
    attributes: Attributes  # never mutated: each call copies it


@dataclass(slots=True)
class CallStart:
    """What the sink kept from a call's start, handed back by capture at its end."""

    request: RequestInfo
    endpoint: Endpoint
    admission: Admission
    span: CallSpan  # its attributes: the request's, and the evidence at the start


@dataclass(slots=True)
class CallResult:
    """A finished call's telemetry, before any span or record exists."""

    attributes: Attributes  # the call span's (the metrics read theirs from it too)
    events: list[SpanEvent] | None  # the call span's events (rare)
    error: str | None  # the call span's error status message; None: not an error
    phases: list[Phase]  # the transport phases
    children: list[Phase]  # the call span's children: the phases, then the runtime's spans
    child_attributes: list[PhaseAttributes]  # one per child
    duration: float  # seconds
    chunk_gaps: Sequence[int]  # a stream's nanoseconds between consecutive output chunks (StreamStats.gaps)
    counters: RuntimeCounters | None  # the runtime's own account of the call


def build_call(record: CallRecord, start: CallStart, answer: Answer, end: CallEnd | None,
               capture_content: bool) -> CallResult:
    """The telemetry of the call ``record`` describes (see the module docstring)."""
    attrs = dict(start.span.attributes)
    stream = record.stream
    first_token = stream.first_token_ns if stream is not None else 0
    phases = compute_phases(record.timeline, stream is not None, first_token)
    response = answer.response
    _end_attributes(record, answer, attrs, capture_content)
    duration = client_timings(record, response, attrs)
    error_type = _error_type(record)
    if error_type:
        attrs[sc.ERROR_TYPE] = error_type
    error = _error_message(record, response) if error_type else None
    synthesized = _runtime_evidence(record, start, answer.counters, phases, first_token, attrs)
    if end is not None:
        attrs.update(end.attributes)
        _model(end.model, attrs)
    child_attributes = [_phase_attributes(record, p) for p in phases]
    if synthesized:
        child_attributes += [_SYNTHESIZED] * len(synthesized)
    return CallResult(attrs, start.span.events, error, phases, phases + synthesized, child_attributes,
                      duration, stream.gaps if stream is not None else (), answer.counters)


def _model(model: Any, attrs: Attributes) -> None:
    """The served model's llm.model.* attributes, and how much of its context the prompt took."""
    if not model:
        return
    attrs.update(model)
    pressure = diagnosis.context_pressure(attrs.get(sc.GEN_AI_USAGE_INPUT_TOKENS),
                                          model.get(sc.LLM_MODEL_CONTEXT_LENGTH))
    if pressure is not None:
        attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] = pressure
        attrs[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] = pressure > diagnosis.CONTEXT_PRESSURE


def _runtime_evidence(call: CallRecord, start: CallStart, counters: RuntimeCounters | None,
                      phases: list[Phase], first_token: int, attrs: Attributes) -> list[Phase]:
    """Runtime attributes, diagnosis attributes, and the synthesized runtime spans."""
    if counters is not None:
        if counters.runtime and not start.endpoint.configured:
            attrs[sc.LLM_RUNTIME_NAME] = attrs[sc.GEN_AI_PROVIDER_NAME] = counters.runtime
        runtime_attributes(counters, attrs)
    timeline = call.timeline
    streamed = bool(call.stream is not None and first_token)
    anchor = first_token if streamed else timeline.headers
    lower = timeline.body_sent or timeline.start
    unaccounted = None
    if anchor:
        unaccounted = diagnosis.unaccounted_wait((anchor - lower) * _NS, counters, streamed)
        if unaccounted is not None:
            attrs[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT] = unaccounted
    admission = start.admission
    cold = diagnosis.cold_start(counters, admission.after_unload)
    if cold is not None:
        attrs[sc.LLM_DIAGNOSIS_COLD_START] = cold
    held = buffered = None
    if streamed and call.stream is not None:
        held = diagnosis.held_back(call.stream, timeline.headers, timeline.body_sent, counters)
        buffered = diagnosis.stream_buffered(call.stream, held)
    if buffered is not None:
        attrs[sc.LLM_DIAGNOSIS_STREAM_BUFFERED] = buffered
    attrs[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] = admission.concurrent
    if admission.retry:
        attrs[sc.LLM_DIAGNOSIS_RETRY] = True
    choke = diagnosis.bottleneck(phases, unaccounted, counters, streamed, buffered, admission.concurrent, held)
    if choke is not None:
        attrs[sc.LLM_DIAGNOSIS_BOTTLENECK] = choke
    if counters is None or not anchor:
        return []
    return synthesized_spans(counters, anchor, streamed, lower, timeline.end)


def _end_attributes(call: CallRecord, answer: Answer, attrs: Attributes, capture_content: bool) -> None:
    if call.status:
        attrs[sc.HTTP_RESPONSE_STATUS_CODE] = call.status
    if call.http_version:
        attrs[sc.NETWORK_PROTOCOL_VERSION] = call.http_version.rpartition("/")[2]
    timeline = call.timeline
    if timeline.upload_start or timeline.connect_start:  # known only once sending began
        attrs[sc.LLM_CLIENT_CONNECTION_REUSED] = not timeline.connect_start
    attrs[sc.LLM_CLIENT_END_REASON] = call.end_reason
    if call.peer is not None:
        attrs[sc.NETWORK_PEER_ADDRESS], attrs[sc.NETWORK_PEER_PORT] = call.peer
    if answer.server_timing:
        for name, seconds in answer.server_timing.items():
            attrs[sc.LLM_SERVER_TIMING_PREFIX + name] = seconds
    attr_build.response_attributes(answer.response, attrs, capture_content)


_SYNTHESIZED = {sc.LLM_SYNTHESIZED: True}
# request headers whose values are credentials: a server that echoes one in its error message
# (an invalid key quoted back) must not put it on the span
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")
_MIN_SECRET = 6  # shorter values are not searched for (they would mask ordinary words)


def _phase_attributes(call: CallRecord, phase: Phase) -> PhaseAttributes:
    """The attributes of a transport phase's span (the synthesized ones carry ``_SYNTHESIZED``)."""
    if call.tls is not None and (phase.name == sc.SPAN_TLS or (phase.name == sc.SPAN_CONNECT
                                                                and not call.timeline.tls_start)):
        return _tls_attributes(call.tls)  # a connect step that includes the handshake carries it
    if phase.name == sc.SPAN_DNS:
        return {sc.DNS_QUESTION_NAME: call.request.host}
    return None


def _tls_attributes(tls: TlsInfo) -> Attributes:
    attrs: Attributes = {}
    if tls.version:
        attrs[sc.TLS_PROTOCOL_VERSION] = tls.version
    if tls.cipher:
        attrs[sc.TLS_CIPHER] = tls.cipher
    if tls.alpn:
        attrs[sc.TLS_NEXT_PROTOCOL] = tls.alpn
    return attrs


def client_timings(call: CallRecord, response: ResponseInfo | None, attrs: Attributes) -> float:
    """Add the llm.client.* attributes (seconds) to ``attrs``; returns the call's duration."""
    timeline = call.timeline
    start = timeline.start
    duration = (timeline.end - start) * _NS
    if timeline.headers:
        attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] = (timeline.headers - start) * _NS
    stream = call.stream
    if stream is None:
        return duration
    attrs[sc.LLM_CLIENT_CHUNKS] = stream.token_events
    attrs[sc.LLM_CLIENT_RESPONSE_BYTES] = stream.size
    if not stream.first_token_ns:
        return duration
    ttft = (stream.first_token_ns - start) * _NS
    attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] = ttft
    attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = ttft
    attrs[sc.LLM_CLIENT_MAX_CHUNK_GAP] = stream.max_gap_ns * _NS
    generation = (stream.last_token_ns - stream.first_token_ns) * _NS
    attrs[sc.LLM_CLIENT_GENERATION_DURATION] = generation
    tokens = response.output_tokens if response is not None and response.output_tokens else None
    counted = tokens if tokens is not None else stream.token_events
    if generation > 0 and counted > 1:
        attrs[sc.LLM_CLIENT_GENERATION_RATE] = (counted - 1) / generation
    return duration


def _error_type(call: CallRecord) -> str | None:
    exc = call.exception
    if exc is not None and call.end_reason in (END_ERROR, END_CANCELLED):
        cls = type(exc)
        module = cls.__module__.split(".")[0]
        return f"{module}.{cls.__qualname__}" if module != "builtins" else cls.__qualname__
    if call.status >= 400:
        return str(call.status)
    return None


def _scrubbed(message: str, headers: Any) -> str:
    """``message`` with every credential the request carried (whole, or after its scheme such as
    ``Bearer``) replaced by ``***``."""
    for name in _CREDENTIAL_HEADERS:
        try:
            value = headers.get(name)
        except Exception:  # noqa: BLE001 - an odd header container
            continue
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(value, str):
            continue
        for secret in (value, value.partition(" ")[2].strip()):
            if len(secret) >= _MIN_SECRET:
                message = message.replace(secret, "***")
    return message


def _error_message(call: CallRecord, response: ResponseInfo | None) -> str:
    if response is not None and response.error:
        return _scrubbed(response.error, call.request.headers)
    if call.exception is not None:
        return type(call.exception).__name__
    return f"HTTP {call.status}"
