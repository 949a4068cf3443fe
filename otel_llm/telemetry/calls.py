"""The sink of captured calls: start a model call (sampling decision, ``traceparent``), and at
its end turn capture's frozen :class:`~otel_llm.capture.record.CallRecord` into telemetry in
three steps: parse reads the response (``parse.answer``), ``build.build_call`` turns record,
answer and evidence into a :class:`~otel_llm.telemetry.build.CallResult`, and the span and
metric emitters record it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from otel_llm import semconv as sc
from otel_llm._log import log_once
from otel_llm.capture.record import END_CANCELLED, CallRecord, CallRequest
from otel_llm.config import GENAI_DEFAULT
from otel_llm.observers.evidence import Evidence
from otel_llm.parse.answer import read_answer
from otel_llm.parse.request import RequestInfo, parse_request
from otel_llm.parse.routes import Route, match_route
from otel_llm.telemetry import attributes as attr_build
from otel_llm.telemetry.beside import genai_parent, metrics_left_to, transport_name
from otel_llm.telemetry.build import CallResult, CallStart, Endpoint, build_call
from otel_llm.telemetry.inflight import InFlight
from otel_llm.telemetry.metrics import call_metrics
from otel_llm.telemetry.propagation import inject_context, recorded_by_caller
from otel_llm.telemetry.sampling import Sampler, mark_kept
from otel_llm.telemetry.spans import ApiSpanSink, CallSpan, make_sink
from otel_llm.telemetry.suppression import note_suppressed, suppressed
from otel_llm.version import __version__

if TYPE_CHECKING:
    from otel_llm.capture.call import LlmCall

__all__ = ["CallSettings", "Telemetry"]

_MAX_ENDPOINTS = 256


@dataclass
class CallSettings:
    """What the capture and build layers need from the user's options."""

    capture_content: bool = False
    runtimes: Mapping[str, str] = field(default_factory=dict)
    llm_routes: Sequence[str] = ()
    genai_semconv: str = GENAI_DEFAULT  # OTEL_SEMCONV_STABILITY_OPT_IN's choice (otel_llm.config.genai_semconv)
    sampler: Sampler | None = None  # sample_rate set: which calls' spans are kept, decided after each
    record_suppressed: bool = False  # calls inside suppress_instrumentation() recorded anyway
    chunk_metric: bool = True  # time_per_output_chunk per output chunk (a histogram record each)
    beside_genai: bool = True  # under another instrumentation's GenAI call span: join it (``beside``)


class Telemetry:
    """The capture layer's :class:`~otel_llm.capture.call.CallSink`: tracer, instruments and
    settings shared by every call while instrumented."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider, settings: CallSettings,
                 evidence: Evidence | None = None) -> None:
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
        self._sampler = settings.sampler
        self._spans = make_sink(self.tracer, decide_later=self._sampler is not None,
                                unsuppressed=settings.record_suppressed)
        if self._sampler is not None and isinstance(self._spans, ApiSpanSink):
            log_once("sample_rate needs the OpenTelemetry SDK's tracer provider: with this one, its "
                     "sampler decides which calls are recorded", exc_info=False)
            self._sampler = None
        self.evidence = evidence
        self._endpoints: dict[tuple[str, str], Endpoint] = {}
        self._relayed = False

    @property
    def sampler(self) -> Sampler | None:
        """The keep decision after each call (``sample_rate`` set, with the SDK's tracer), else None."""
        return self._sampler

    # -- the capture seam (CallSink) ---------------------------------------------------------
    def route(self, path: str) -> Route | None:
        """The model call this request path is, if any: none inside OpenTelemetry's
        ``suppress_instrumentation()`` unless ``record_suppressed`` (see ``suppression``)."""
        route = match_route(path, self._llm_routes)
        if route is not None and not self.settings.record_suppressed and suppressed():
            note_suppressed()
            return None
        return route

    def call_started(self, call: LlmCall) -> CallStart:
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
        beside = genai_parent(trace.get_current_span(), info.model, request.host) \
            if self.settings.beside_genai else None
        if beside is None:
            span = self._spans.start(attr_build.span_name(call.route.operation, info.model), attrs, call.epoch0)
        else:  # the other instrumentation's span is the call's: this one is its transport view
            attrs[sc.LLM_BESIDE_INSTRUMENTATION] = beside
            span = self._spans.start(transport_name(request.method, request.path), attrs, call.epoch0,
                                     beside=beside)
        if self.evidence is not None:
            _note_start(self.evidence, request, endpoint, span)
        inject_context(request.headers, span, self._sampler is not None and self._sampler.pending(span.parent))
        return CallStart(info, endpoint, admission, span)

    def call_finished(self, record: CallRecord, state: object) -> None:
        if not isinstance(state, CallStart):  # not a call this sink started
            return
        self.in_flight.release(state.admission)
        result = self.result(record, state)
        if self._sampler is not None:
            self._decide(self._sampler, state.span, result)
        self.emit(record, state, result)

    @staticmethod
    def _decide(sampler: Sampler, span: CallSpan, result: CallResult) -> None:
        """Keep the call's spans (with why, and how many calls they stand for) or drop them."""
        try:
            events = result.events  # usually None: no generator made for it
            restarted = any(name == sc.EVENT_RUNTIME_RESTARTED for name, _ in events) if events else False
            decision = sampler.decide(span.context, span.parent, result.attributes, result.error, result.duration,
                                      restarted)
        except Exception:
            log_once("deciding whether to keep a call's spans failed; it is kept")
            return
        if not decision.keep:
            span.recording = False  # no span is built; the metrics still count the call
            return
        span.context = mark_kept(decision, result.attributes, span.context)

    def result(self, record: CallRecord, start: CallStart) -> CallResult:
        """The call's telemetry as a value: parse, then build (no span, no record yet)."""
        evidence = self.evidence
        answer = read_answer(record.route.api, record.response_headers, record.stream, record.body,
                             record.captured, record.end_reason == END_CANCELLED, self.capture_content,
                             lambda: start.endpoint.runtime or self._recognized(start))
        end = None
        if evidence is not None:
            requested = start.span.attributes.get(sc.GEN_AI_REQUEST_MODEL)
            end = evidence.call_ended(start.endpoint.server, record.timeline.start, record.timeline.end,
                                      requested if isinstance(requested, str) else None)
        return build_call(record, start, answer, end, self.capture_content)

    def emit(self, record: CallRecord, start: CallStart, result: CallResult) -> None:
        """Turn the result into the call's spans and metric records."""
        span = start.span
        self._spans.finish(record.timeline, span, result)
        try:
            self.metrics.record(result.attributes, result.duration,
                                result.chunk_gaps if self.settings.chunk_metric else (), result.phases,
                                span.context if span.recording else None, result.counters,
                                metrics_left_to(span.beside))
        except Exception:
            log_once("recording model-call metrics failed")

    def _recognized(self, start: CallStart) -> str | None:
        return self.evidence.runtime_at(start.endpoint.server) if self.evidence is not None else None

    def _endpoint(self, request: CallRequest, route: Route) -> Endpoint:
        """What depends only on the URL and method, computed once per endpoint: an application
        calls the same few over and over."""
        key = (request.url, request.method)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            configured = self._configured_runtime(request.url)
            runtime = configured or route.runtime
            provider = attr_build.provider_name(runtime, request.host, route.api)
            attrs = attr_build.endpoint_attributes(route, request, runtime, provider)
            endpoint = Endpoint(runtime, configured is not None, (request.host, request.port or 0), attrs)
            if len(self._endpoints) >= _MAX_ENDPOINTS:  # URLs with ever-changing query strings
                self._endpoints.clear()
            self._endpoints[key] = endpoint
        return endpoint

    def relaying_sink(self) -> Telemetry:
        """A sink for the calls a gateway relays, beside this one (same tracer, instruments, calls
        in flight and evidence). A call whose caller says it records the call itself
        (``otel_llm.recorded=1`` in the request's baggage, see ``propagation``) carries
        ``llm.gateway.relayed`` on its span and metrics, so a view of the whole fleet counts it
        once, from the caller's record, rather than once per hop; a call from a caller that records
        nothing (curl) is not marked: the gateway's record is the only one."""
        sink = copy.copy(self)
        sink._relayed = True
        self.metrics.relaying()
        return sink

    def watch(self, url: str) -> None:
        """Tell the observers of a model server before any call to it (the gateway's upstream),
        so its runtime is recognized before the first call ends. Never raises."""
        if self.evidence is None:
            return
        try:
            parts = urlsplit(url)
            scheme = parts.scheme or "http"
            port = parts.port or (443 if scheme == "https" else 80)
            if parts.hostname:
                self.evidence.watch((parts.hostname, port), self._configured_runtime(url.rstrip("/")), scheme)
        except Exception:
            log_once(f"watching the model server {url!r} failed")

    def _configured_runtime(self, url: str) -> str | None:
        for base, name in self._runtimes:
            if url.startswith(base):
                return name
        return None


def _note_start(evidence: Evidence, request: CallRequest, endpoint: Endpoint, span: CallSpan) -> None:
    """What the observers know as the call starts: its runtime's queue, a restart since the last call."""
    start = evidence.call_started(endpoint.server, endpoint.runtime, request.scheme)
    if start.attributes:
        span.attributes.update(start.attributes)
    if start.restart is not None:
        span.events = [(sc.EVENT_RUNTIME_RESTARTED, start.restart)]  # the watch may still complete it


def _unloads(info: RequestInfo) -> bool:
    """Ollama unloads the model after a request with keep_alive 0 (number or "0", "0s", "0m")."""
    keep_alive = info.keep_alive
    if isinstance(keep_alive, (int, float)) and not isinstance(keep_alive, bool):
        return keep_alive == 0
    return isinstance(keep_alive, str) and keep_alive.strip() in ("0", "0s", "0m", "0h")
