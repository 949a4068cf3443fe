"""The sink of captured calls: start a model call (sampling decision, ``traceparent``), and
build the rest of its telemetry once when it finishes, from the capture layer's frozen
:class:`~otel_llm.capture.record.CallRecord`: phases from its timeline, attributes from request,
response and timeline, the span tree (see ``spans``) and the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from otel_llm import semconv as sc
from otel_llm._log import log_once
from otel_llm._types import Attributes
from otel_llm.config import GENAI_DEFAULT
from otel_llm.telemetry import attributes as attr_build
from otel_llm.telemetry import diagnosis
from otel_llm.telemetry.metrics import call_metrics
from otel_llm.telemetry.phases import Phase, compute_phases
from otel_llm.telemetry.propagation import inject_context, recorded_by_caller
from otel_llm.telemetry.spans import CallSpan, make_sink
from otel_llm.telemetry.inflight import Admission, InFlight
from otel_llm.telemetry.runtime import runtime_attributes, synthesized_spans
from otel_llm.capture.record import END_CANCELLED, END_ERROR, END_EXIT, CallRecord, CallRequest, TlsInfo
from otel_llm.parse.content import stream_text
from otel_llm.parse.formats import NDJSON
from otel_llm.parse.request import RequestInfo, parse_request
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.routes import Route, match_route
from otel_llm.parse.server_timing import parse_server_timing
from otel_llm.parse.runtimes import RuntimeCounters, runtime_counters
from otel_llm.version import __version__

if TYPE_CHECKING:
    from otel_llm.capture.call import LlmCall
    from otel_llm.observers.manager import Observers

_NS = 1e-9


_MAX_ENDPOINTS = 256


@dataclass(frozen=True, slots=True)
class _Endpoint:
    runtime: str | None  # configured, else implied by the route
    configured: bool  # the `runtimes` option named it: evidence from the response does not override
    server: tuple[str, int]
    attributes: Attributes  # never mutated: each call copies it


@dataclass(slots=True)
class CallState:
    """The sink's own record of a call in progress."""

    request: RequestInfo
    endpoint: _Endpoint
    admission: Admission
    span: CallSpan


@dataclass
class CallSettings:
    """What the capture and build layers need from the user's options."""

    capture_content: bool = False
    runtimes: Mapping[str, str] = field(default_factory=dict)
    llm_routes: Sequence[str] = ()
    genai_semconv: str = GENAI_DEFAULT  # OTEL_SEMCONV_STABILITY_OPT_IN's choice (otel_llm.config.genai_semconv)


class Telemetry:
    """The capture layer's :class:`~otel_llm.capture.call.CallSink`: tracer, instruments and
    settings shared by every call while instrumented."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider, settings: CallSettings,
                 observers: Observers | None = None) -> None:
        self.tracer = tracer_provider.get_tracer(sc.INSTRUMENTATION_NAME, __version__)
        self.in_flight = InFlight()
        self.metrics = call_metrics(meter_provider, self.in_flight, settings.genai_semconv)
        self.settings = settings
        self._runtimes = sorted(
            ((base.rstrip("/"), name) for base, name in settings.runtimes.items()),
            key=lambda item: -len(item[0]),
        )
        self._llm_routes = tuple(settings.llm_routes)
        self.capture_content = settings.capture_content
        self._spans = make_sink(self.tracer)
        self.observers = observers
        self.live: dict[int, tuple[LlmCall, CallState]] = {}  # calls not finished yet, by key
        self._endpoints: dict[tuple[str, str], _Endpoint] = {}
        self._relayed = False

    # -- the capture seam (CallSink) ---------------------------------------------------------
    def route(self, path: str) -> Route | None:
        return match_route(path, self._llm_routes)

    def call_started(self, call: LlmCall) -> None:
        """Sampling decision, in-flight admission, ``traceparent`` into the request headers."""
        request = call.request
        info = parse_request(call.route.api, request.body)
        endpoint = self._endpoint(request, call.route)
        # read before this process adds its own mark to the baggage
        relayed = self._relayed and recorded_by_caller(request.headers)
        admission = self.in_flight.admit(endpoint.server, request.body, request.headers, info.model,
                                         _unloads(info), relayed)
        attrs = attr_build.request_attributes(endpoint.attributes, info, self.settings.capture_content)
        if relayed:
            attrs[sc.LLM_GATEWAY_RELAYED] = True
        span = self._spans.start(attr_build.span_name(call.route.operation, info.model), attrs, call.epoch0)
        if self.observers is not None:
            self._note_server(self.observers, request, endpoint, span)
        inject_context(request.headers, span)
        self.live[call.key] = (call, CallState(info, endpoint, admission, span))

    def call_finished(self, record: CallRecord) -> None:
        entry = self.live.pop(record.key, None)
        if entry is None:  # its start failed (and was logged)
            return
        state = entry[1]
        self.in_flight.release(state.admission)
        self.emit(record, state)

    def _endpoint(self, request: CallRequest, route: Route) -> _Endpoint:
        """What depends only on the URL and method, computed once per endpoint: an application
        calls the same few over and over."""
        key = (request.url, request.method)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            configured = self._configured_runtime(request.url)
            runtime = configured or route.runtime
            provider = attr_build.provider_name(runtime, request.host, route.api)
            attrs = attr_build.endpoint_attributes(route, request, runtime, provider)
            endpoint = _Endpoint(runtime, configured is not None, (request.host, request.port or 0), attrs)
            if len(self._endpoints) >= _MAX_ENDPOINTS:  # URLs with ever-changing query strings
                self._endpoints.clear()
            self._endpoints[key] = endpoint
        return endpoint

    @staticmethod
    def _note_server(observers: Observers, request: CallRequest, endpoint: _Endpoint, span: CallSpan) -> None:
        """Let the observers watch this server; note what its runtime had queued, and a restart
        of it noticed since the previous call."""
        observers.activity.touch()
        host, port = endpoint.server
        observers.registry.note(host, port, endpoint.runtime, request.scheme)
        span.attributes.update(observers.runtime_at_start(host, port))
        if observers.pending_restarts:  # almost always empty: one attribute load and a truth test
            _restart_event(observers, host, port, span)

    def relaying(self) -> None:
        """Every call from now on relays a request this process received (the gateway). A call
        whose caller says it records the call itself (``otel_llm.recorded=1`` in the request's
        baggage, see ``propagation``) carries ``llm.gateway.relayed`` on its span and metrics, so
        a view of the whole fleet counts it once, from the caller's record, rather than once per
        hop; a call from a caller that records nothing (curl) is not marked: the gateway's record
        is the only one."""
        self._relayed = True
        self.metrics.relaying()

    def watch(self, url: str) -> None:
        """Tell the observers of a model server before any call to it (the gateway's upstream),
        so its runtime is recognized before the first call ends. Never raises."""
        if self.observers is None:
            return
        try:
            parts = urlsplit(url)
            scheme = parts.scheme or "http"
            port = parts.port or (443 if scheme == "https" else 80)
            if parts.hostname:
                self.observers.registry.note(parts.hostname, port, self._configured_runtime(url.rstrip("/")), scheme)
        except Exception:
            log_once(f"watching the model server {url!r} failed")

    def finish_live_calls(self) -> None:
        """End the calls still open (at process exit), so their spans are exported too."""
        for call, _ in list(self.live.values()):
            call.finish(END_EXIT)

    def _configured_runtime(self, url: str) -> str | None:
        for base, name in self._runtimes:
            if url.startswith(base):
                return name
        return None

    # -- finish --------------------------------------------------------------------------------
    def emit(self, call: CallRecord, state: CallState) -> None:
        """Build the call's attributes, phase spans and metrics, once."""
        span = state.span
        stream = call.stream
        first_token = stream.first_token_ns if stream is not None else 0
        timeline = call.timeline
        phases = compute_phases(timeline, stream is not None, first_token)
        response = self._parse_response(call)
        attrs = span.attributes
        self._add_end_attributes(call, response, attrs)
        duration, per_chunk = client_timings(call, response, attrs)
        error_type = _error_type(call)
        if error_type:
            attrs[sc.ERROR_TYPE] = error_type
        error = _error_message(call, response) if error_type else None
        counters = None
        if response is not None:
            # vLLM leaves no trace in its responses: a configured, route-implied or recognized
            # runtime (the observers', from its process or its /metrics) stands in
            response.runtime = response.runtime or state.endpoint.runtime or self._recognized(state)
            if response.runtime or response.native:  # TGI's headers are in native too
                counters = runtime_counters(response, call.response_headers)
        synthesized = self._runtime_evidence(call, state, counters, phases, first_token, attrs)
        if self.observers is not None:
            attrs.update(self.observers.call_attributes(timeline.start, timeline.end))
            self._model(state, attrs)
        children = phases + synthesized
        self._spans.finish(timeline, span, error, children,
                           [_phase_attributes(call, p) for p in phases] + [_SYNTHESIZED] * len(synthesized))
        try:
            self.metrics.record(attrs, duration, per_chunk, phases, span.context if span.recording else None,
                                counters)
        except Exception:
            log_once("recording model-call metrics failed")

    def _model(self, state: CallState, attrs: Attributes) -> None:
        """The served model's llm.model.* attributes, and how much of its context the prompt took."""
        assert self.observers is not None
        try:
            requested = attrs.get(sc.GEN_AI_REQUEST_MODEL)
            model = self.observers.model_attributes(*state.endpoint.server,
                                                    requested if isinstance(requested, str) else None)
        except Exception:
            log_once("reading the runtime's model metadata failed")
            return
        if not model:
            return
        attrs.update(model)
        pressure = diagnosis.context_pressure(attrs.get(sc.GEN_AI_USAGE_INPUT_TOKENS),
                                              model.get(sc.LLM_MODEL_CONTEXT_LENGTH))
        if pressure is not None:
            attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] = pressure
            attrs[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] = pressure > diagnosis.CONTEXT_PRESSURE

    def _recognized(self, state: CallState) -> str | None:
        if self.observers is None:
            return None
        try:
            return self.observers.runtime_of(*state.endpoint.server)
        except Exception:
            log_once("reading the recognized runtime failed")
            return None

    def _runtime_evidence(self, call: CallRecord, state: CallState, counters: RuntimeCounters | None,
                          phases: list[Phase], first_token: int, attrs: Attributes) -> list[Phase]:
        """Runtime attributes, diagnosis attributes, and the synthesized runtime spans."""
        if counters is not None:
            if counters.runtime and not state.endpoint.configured:
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
        admission = state.admission
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

    def _parse_response(self, call: CallRecord) -> ResponseInfo | None:
        api = call.route.api
        headers = call.response_headers
        stream = call.stream
        if stream is not None:
            info = parse_events(api, stream.events, headers)
            if call.captured is not None:
                info.output_text = stream_text(api, call.captured, stream.format.framing == NDJSON)
            return info
        if call.body and call.end_reason != END_CANCELLED:
            return parse_body(api, call.body, headers, want_text=self.settings.capture_content)
        return None

    def _add_end_attributes(self, call: CallRecord, response: ResponseInfo | None, attrs: Attributes) -> None:
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
        server_timing = call.response_headers.get("server-timing")
        if server_timing:
            for name, seconds in parse_server_timing(server_timing).items():
                attrs[sc.LLM_SERVER_TIMING_PREFIX + name] = seconds
        attr_build.response_attributes(response, attrs, self.settings.capture_content)


_SYNTHESIZED = {sc.LLM_SYNTHESIZED: True}
# request headers whose values are credentials: a server that echoes one in its error message
# (an invalid key quoted back) must not put it on the span
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")
_MIN_SECRET = 6  # shorter values are not searched for (they would mask ordinary words)


def _restart_event(observers: Observers, host: str, port: int, span: CallSpan) -> None:
    try:
        event = observers.take_restart(host, port)
        if event is not None:
            span.events = [(sc.EVENT_RUNTIME_RESTARTED, dict(event))]  # the watch may still complete it
    except Exception:
        log_once("attaching a runtime restart to a call failed")


def _unloads(info: Any) -> bool:
    """Ollama unloads the model after a request with keep_alive 0 (number or "0", "0s", "0m")."""
    keep_alive = info.keep_alive
    if isinstance(keep_alive, (int, float)) and not isinstance(keep_alive, bool):
        return keep_alive == 0
    return isinstance(keep_alive, str) and keep_alive.strip() in ("0", "0s", "0m", "0h")


def _phase_attributes(call: CallRecord, phase: Phase) -> Attributes | None:
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


def client_timings(call: CallRecord, response: ResponseInfo | None, attrs: Attributes) -> tuple[float, float | None]:
    """Add the llm.client.* attributes (seconds) to ``attrs``; returns what only the metrics
    need: the call's duration and, for a stream, the mean time between its output chunks."""
    timeline = call.timeline
    start = timeline.start
    duration = (timeline.end - start) * _NS
    if timeline.headers:
        attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] = (timeline.headers - start) * _NS
    stream = call.stream
    if stream is None:
        return duration, None
    attrs[sc.LLM_CLIENT_CHUNKS] = stream.token_events
    attrs[sc.LLM_CLIENT_RESPONSE_BYTES] = stream.size
    if not stream.first_token_ns:
        return duration, None
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
    if stream.token_events > 1 and generation > 0:
        return duration, generation / (stream.token_events - 1)
    return duration, None


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
