"""The span sinks (otel_llm.telemetry.spans): SdkSpanSink and ApiSpanSink emit the same call span
tree, honour the sampler's decision and attributes, and make_sink picks between them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, Tracer as SdkTracer, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes

from otel_llm import semconv as sc
from otel_llm.capture.record import Timeline
from otel_llm.telemetry.phases import Phase
from otel_llm.telemetry.build import CallResult
from otel_llm.telemetry.spans import ApiSpanSink, CallSpan, SdkSpanSink, make_sink

MS = 1_000_000
T0 = 3_000 * MS  # perf-counter start of the call
EPOCH = 1_760_000_000 * 1_000_000_000
# the call failed waiting for the headers: upload complete, server wait not
TIMELINE = Timeline(T0, EPOCH, T0 + 100 * MS, upload_start=T0, body_sent=T0 + 2 * MS)
PHASES = [Phase(sc.SPAN_UPLOAD, T0, T0 + 2 * MS, True), Phase(sc.SPAN_SERVER_WAIT, T0 + 2 * MS, T0 + 100 * MS, False)]
PHASE_ATTRIBUTES: list[dict[str, Any] | None] = [{"phase.n": 1}, None]
SINKS = [SdkSpanSink, ApiSpanSink]


def _result(span: CallSpan, error: str | None, phases: list[Phase], attributes: list[Any]) -> CallResult:
    """What build_call would hand the sink for these children (the emitters read nothing else)."""
    return CallResult(span.attributes, span.events, error, list(phases), list(phases), list(attributes),
                      0.0, None, None)


class Collect(SpanProcessor):
    """Every span a processor is handed, sampled or not."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self.started.append(span)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def _provider(sampler: Sampler | None = None) -> tuple[TracerProvider, InMemorySpanExporter, Collect]:
    exporter = InMemorySpanExporter()
    collect = Collect()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(collect)
    return provider, exporter, collect


def _emit(sink_type: type, error: str | None, timeline: Timeline = TIMELINE, phases: Sequence[Phase] = PHASES,
          phase_attributes: Sequence[dict[str, Any] | None] = PHASE_ATTRIBUTES) -> list[ReadableSpan]:
    provider, exporter, _ = _provider()
    sink = sink_type(provider.get_tracer("test-scope", "1.2"))
    span = sink.start("chat m", {"call.n": 1}, timeline.epoch)
    span.attributes["late"] = "added before finish"  # Telemetry adds the end attributes here
    sink.finish(timeline, span, _result(span, error, phases, phase_attributes))
    return list(exporter.get_finished_spans())


def _tree(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    """Each span without its ids: name, kind, parent's name, times, status, attributes, scope."""
    names = {s.context.span_id: s.name for s in spans}
    return sorted(
        (s.name, s.kind, names.get(s.parent.span_id) if s.parent else None, s.start_time, s.end_time,
         s.status.status_code, s.status.description, dict(s.attributes or {}), s.instrumentation_scope.name)
        for s in spans)


@pytest.mark.parametrize("error", [None, "boom"])
def test_both_sinks_give_the_same_tree(error: str | None) -> None:
    sdk, api = _tree(_emit(SdkSpanSink, error)), _tree(_emit(ApiSpanSink, error))
    assert sdk == api
    failed = StatusCode.ERROR if error else StatusCode.UNSET
    call_attributes = {"call.n": 1, "late": "added before finish"}
    assert sdk == sorted([
        ("chat m", SpanKind.CLIENT, None, TIMELINE.to_epoch(T0), TIMELINE.to_epoch(TIMELINE.end), failed, error,
         call_attributes, "test-scope"),
        (sc.SPAN_UPLOAD, SpanKind.INTERNAL, "chat m", TIMELINE.to_epoch(PHASES[0].start_ns),
         TIMELINE.to_epoch(PHASES[0].end_ns), StatusCode.UNSET, None, {"phase.n": 1}, "test-scope"),
        # the phase the call ended in is an error only when the call failed
        (sc.SPAN_SERVER_WAIT, SpanKind.INTERNAL, "chat m", TIMELINE.to_epoch(PHASES[1].start_ns),
         TIMELINE.to_epoch(PHASES[1].end_ns), failed, None, {}, "test-scope"),
    ])


@pytest.mark.parametrize("sink_type", SINKS)
def test_phase_times_are_shifted_onto_the_wall_clock(sink_type: type) -> None:
    timeline = Timeline(10_000, 77 * 10**9, 10_000 + 9 * MS)
    phases = [Phase(sc.SPAN_UPLOAD, 10_000, 10_500, True), Phase(sc.SPAN_DOWNLOAD, 10_500, 10_000 + 9 * MS, True)]
    spans = {s.name: s for s in _emit(sink_type, None, timeline, phases, [None, None])}
    assert (spans["chat m"].start_time, spans["chat m"].end_time) == (77 * 10**9, 77 * 10**9 + 9 * MS)
    assert (spans[sc.SPAN_UPLOAD].start_time, spans[sc.SPAN_UPLOAD].end_time) == (77 * 10**9, 77 * 10**9 + 500)
    assert spans[sc.SPAN_DOWNLOAD].end_time == spans["chat m"].end_time


@pytest.mark.parametrize("sink_type", SINKS)
def test_children_share_the_call_span_trace(sink_type: type) -> None:
    spans = _emit(sink_type, None)
    (call,) = [s for s in spans if s.kind == SpanKind.CLIENT]
    kids = [s for s in spans if s is not call]
    assert len(kids) == len(PHASES)
    assert len({s.context.span_id for s in spans}) == len(spans)
    for kid in kids:
        assert kid.parent is not None and kid.parent.span_id == call.context.span_id
        assert kid.context.trace_id == call.context.trace_id
        assert kid.context.trace_flags.sampled


@pytest.mark.parametrize("sink_type", SINKS)
def test_the_call_span_is_a_child_of_the_current_span(sink_type: type) -> None:
    provider, exporter, _ = _provider()
    tracer = provider.get_tracer("test-scope")
    sink = sink_type(tracer)
    with tracer.start_as_current_span("app") as app:
        span = sink.start("chat m", {}, TIMELINE.epoch)
    assert span.context.trace_id == app.get_span_context().trace_id
    sink.finish(TIMELINE, span, _result(span, None, [], []))
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "chat m"]
    assert call.parent is not None and call.parent.span_id == app.get_span_context().span_id


@pytest.mark.parametrize("sink_type", SINKS)
def test_a_sampled_out_call_emits_nothing(sink_type: type) -> None:
    provider, exporter, collect = _provider(ALWAYS_OFF)
    sink = sink_type(provider.get_tracer("test-scope"))
    span = sink.start("chat m", {"call.n": 1}, TIMELINE.epoch)
    assert not span.recording and not span.context.trace_flags.sampled
    assert span.context.is_valid  # still a trace context to propagate
    sink.finish(TIMELINE, span, _result(span, "boom", PHASES, PHASE_ATTRIBUTES))
    assert exporter.get_finished_spans() == () and collect.ended == []


class RuleSampler(Sampler):
    """Records, with its own attribute and trace state, what it was asked about."""

    def __init__(self, decision: Decision = Decision.RECORD_AND_SAMPLE) -> None:
        self.decision = decision
        self.asked: list[tuple[str, SpanKind, dict[str, Any]]] = []

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: TraceState | None = None) -> SamplingResult:
        self.asked.append((name, kind or SpanKind.INTERNAL, dict(attributes or {})))
        return SamplingResult(self.decision, {"sampler.rule": "keep"}, TraceState([("vendor", "v1")]))

    def get_description(self) -> str:
        return "RuleSampler"


@pytest.mark.parametrize("sink_type", SINKS)
def test_sampler_attributes_are_merged_into_the_call_span(sink_type: type) -> None:
    sampler = RuleSampler()
    provider, exporter, _ = _provider(sampler)
    sink = sink_type(provider.get_tracer("test-scope"))
    given = {"call.n": 1}
    span = sink.start("chat m", given, TIMELINE.epoch)
    assert sampler.asked == [("chat m", SpanKind.CLIENT, {"call.n": 1})]
    assert given == {"call.n": 1}  # the caller's dict is not written into
    assert span.context.trace_state.get("vendor") == "v1"
    sink.finish(TIMELINE, span, _result(span, None, PHASES, PHASE_ATTRIBUTES))
    spans = list(exporter.get_finished_spans())
    (call,) = [s for s in spans if s.name == "chat m"]
    assert dict(call.attributes or {}) == {"call.n": 1, "sampler.rule": "keep"}
    assert all(s.context.trace_state.get("vendor") == "v1" for s in spans)
    if sink_type is SdkSpanSink:  # consulted once per call: the phases follow the call span's decision
        assert len(sampler.asked) == 1
        assert [dict(s.attributes or {}) for s in spans if s is not call] == [{"phase.n": 1}, {}]
    else:  # ordinary spans: the SDK asks the sampler for each phase too
        assert [name for name, _, _ in sampler.asked] == ["chat m"] + [p.name for p in PHASES]


@pytest.mark.parametrize("sink_type", SINKS)
def test_record_only_reaches_the_processors_but_not_a_sampled_exporter(sink_type: type) -> None:
    provider, exporter, collect = _provider(RuleSampler(Decision.RECORD_ONLY))
    sink = sink_type(provider.get_tracer("test-scope"))
    span = sink.start("chat m", {}, TIMELINE.epoch)
    assert span.recording and not span.context.trace_flags.sampled
    sink.finish(TIMELINE, span, _result(span, None, PHASES, PHASE_ATTRIBUTES))
    assert sorted(s.name for s in collect.ended) == sorted(["chat m"] + [p.name for p in PHASES])
    assert exporter.get_finished_spans() == ()  # SimpleSpanProcessor exports sampled spans only


def test_both_sinks_give_the_same_trace_flags() -> None:
    sdk = [s for s in _emit(SdkSpanSink, None) if s.name == "chat m"][0]
    api = [s for s in _emit(ApiSpanSink, None) if s.name == "chat m"][0]
    assert sdk.context.trace_flags == api.context.trace_flags


# --- make_sink ----------------------------------------------------------------------------------


def test_make_sink_picks_the_sdk_sink_for_the_sdk_tracer() -> None:
    provider, _, _ = _provider()
    tracer = provider.get_tracer("test-scope")
    assert type(tracer) is SdkTracer
    assert isinstance(make_sink(tracer), SdkSpanSink)


def test_make_sink_picks_the_api_sink_for_other_tracers() -> None:
    assert isinstance(make_sink(trace.NoOpTracer()), ApiSpanSink)
    provider, _, _ = _provider()
    tracer = provider.get_tracer("test-scope")

    class Wrapped(SdkTracer):
        """A subclass may change how spans start: not the SDK's own."""

    wrapped = Wrapped.__new__(Wrapped)
    wrapped.__dict__.update(tracer.__dict__)
    assert isinstance(make_sink(wrapped), ApiSpanSink)


def test_make_sink_picks_the_api_sink_for_a_disabled_sdk_tracer() -> None:
    from opentelemetry.sdk.trace import _disable_tracer_configurator

    provider, exporter, collect = _provider()
    provider._set_tracer_configurator(tracer_configurator=_disable_tracer_configurator)
    tracer = provider.get_tracer("test-scope")
    assert type(tracer) is SdkTracer and not tracer._is_enabled()
    sink = make_sink(tracer)
    assert isinstance(sink, ApiSpanSink)
    span = sink.start("chat m", {}, TIMELINE.epoch)
    sink.finish(TIMELINE, span, _result(span, None, PHASES, PHASE_ATTRIBUTES))
    assert not span.recording and exporter.get_finished_spans() == () and collect.ended == []
