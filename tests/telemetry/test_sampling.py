"""Sampling decided after the call: the pure rules (threshold, randomness, the typical value, the
keep reasons), then instrumented calls to the simulator with injected outliers."""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace._sampling_experimental._trace_state import OtelTraceState
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

import otel_llm
from otel_llm import semconv as sc
from otel_llm.config import KEEP_REASONS, resolve
from otel_llm.telemetry import sampling
from otel_llm.telemetry.sampling import MAX_SERIES, Decision, Sampler, Typical
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.simulator import configure_sim

RANDOM = TraceFlags(TraceFlags.SAMPLED | 0x02)


def _context(trace_id: int, flags: int = RANDOM, state: TraceState | None = None) -> SpanContext:
    return SpanContext(trace_id, 0x1234, False, TraceFlags(flags), state)


# --- the probability-sampling arithmetic, checked against the OpenTelemetry SDK's own parser -----
@pytest.mark.parametrize("rate", [1.0, 0.5, 0.1, 0.01, 0.001])
def test_the_threshold_round_trips_through_the_sdk_s_trace_state_parser(rate: float) -> None:
    th = sampling.threshold(rate)
    state = TraceState([("vendor", "x"), ("ot", "rv:00000000000001;k:v")])
    context = sampling.with_threshold(_context(1, state=state), th)
    parsed = OtelTraceState.parse(context.trace_state)
    assert parsed.threshold == th
    assert parsed.random_value == 1 and list(parsed.rest) == ["k:v"]  # the other members kept
    assert context.trace_state.get("vendor") == "x"
    assert sampling.adjusted_count(th) == pytest.approx(1 / rate)


def test_rate_zero_keeps_nothing_and_counts_nothing() -> None:
    assert sampling.threshold(0.0) == 1 << 56
    assert math.isinf(sampling.adjusted_count(sampling.threshold(0.0)))


def test_randomness_is_the_trace_id_s_last_56_bits_unless_the_trace_state_gives_rv() -> None:
    assert sampling.randomness(_context(0xABCD << 56 | 0x42)) == 0x42
    given = TraceState([("ot", "th:8;rv:00000000000fff")])
    assert sampling.randomness(_context(0x42, state=given)) == 0xFFF
    garbled = TraceState([("ot", "rv:zz")])
    assert sampling.randomness(_context(0x42, state=garbled)) == 0x42


# --- the typical value -----------------------------------------------------------------------------
def test_typical_median_and_slowest_percent_follow_the_values() -> None:
    typical = Typical()
    rng = random.Random(7)
    for _ in range(50):
        typical.add(rng.uniform(0.09, 0.11))
    median = typical.quantile(0.5)
    assert median is not None and 0.095 <= median <= 0.115  # a bucket's upper edge: within 9 %
    assert not typical.is_slow(0.2)  # 2x: not slow while the slowest 1 % is not trusted yet
    assert typical.is_slow(0.6)  # over 5x the median
    for _ in range(450):
        typical.add(rng.uniform(0.09, 0.11))
    assert typical.is_slow(0.13)  # above every value seen: among the slowest 1 %
    assert not typical.is_slow(0.1)


def test_typical_judges_nothing_before_enough_calls() -> None:
    typical = Typical()
    for _ in range(sampling.MIN_TYPICAL - 1):
        typical.add(0.1)
    assert not typical.is_slow(10.0)
    typical.add(0.1)
    assert typical.is_slow(10.0)


def test_typical_memory_stays_bounded_and_old_values_fade() -> None:
    typical = Typical(window=200)
    for _ in range(1000):
        typical.add(1.0)
    for _ in range(1000):
        typical.add(0.01)
    assert typical.total < 200
    assert len(typical.counts) <= 2
    assert typical.quantile(0.5) == pytest.approx(0.01, rel=0.1)  # the recent values rule


# --- the decision --------------------------------------------------------------------------------
def _attrs(**extra: Any) -> dict[str, Any]:
    return {sc.SERVER_ADDRESS: "h", sc.SERVER_PORT: 1, sc.GEN_AI_REQUEST_MODEL: "m",
            sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.05, **extra}


def _warm(sampler: Sampler, n: int = 200) -> None:
    for _ in range(n):
        sampler.reasons(_attrs(), None, 0.5)


@pytest.mark.parametrize("reason,attrs,error,restarted", [
    ("failed", {}, "HTTP 500", False),
    ("slow", {sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 1.0}, None, False),
    ("cold", {sc.LLM_DIAGNOSIS_COLD_START: True}, None, False),
    ("buffered", {sc.LLM_DIAGNOSIS_STREAM_BUFFERED: True}, None, False),
    ("queued", {sc.LLM_DIAGNOSIS_BOTTLENECK: "queue"}, None, False),
    ("restart", {}, None, True),
    ("retry", {sc.LLM_DIAGNOSIS_RETRY: True}, None, False),
])
def test_each_rule_keeps_its_calls_unless_left_out(reason: str, attrs: dict[str, Any], error: str | None,
                                                  restarted: bool) -> None:
    dropped_by_rate = _context(0)  # randomness 0: below any threshold but rate 1's
    sampler = Sampler(0.5, KEEP_REASONS)
    _warm(sampler)
    decision = sampler.decide(dropped_by_rate, None, _attrs(**attrs), error, 0.5, restarted)
    assert decision.keep and decision.reasons == (reason,) and decision.threshold == 0
    without = Sampler(0.5, [r for r in KEEP_REASONS if r != reason])
    _warm(without)
    assert not without.decide(dropped_by_rate, None, _attrs(**attrs), error, 0.5, restarted).keep


def test_ordinary_calls_are_kept_by_their_trace_id_at_the_rate() -> None:
    sampler = Sampler(0.25, ())
    rng = random.Random(1)
    ids = [rng.getrandbits(128) for _ in range(4000)]
    kept = [i for i in ids if sampler.decide(_context(i), None, _attrs(), None, 0.5).keep]
    assert abs(len(kept) - 1000) < 4 * math.sqrt(4000 * 0.25 * 0.75)
    again = Sampler(0.25, ())  # another process with the same rate keeps the same traces
    assert [i for i in ids if again.decide(_context(i), None, _attrs(), None, 0.5).keep] == kept
    decision = sampler.decide(_context(kept[0]), None, _attrs(), None, 0.5)
    assert decision.reasons == ("rate",) and decision.threshold == sampling.threshold(0.25)


def test_the_application_s_sampled_parent_keeps_the_call_and_a_dropped_one_only_a_rule() -> None:
    sampler = Sampler(0.0, KEEP_REASONS)
    kept_parent = _context(5, TraceFlags.SAMPLED, TraceState([("ot", "th:c")]))
    decision = sampler.decide(_context(5), kept_parent, _attrs(), None, 0.5)
    assert decision.keep and decision.reasons == ("parent",)
    assert decision.threshold == 0xC << 52  # the parent's: the trace's adjusted count
    plain_parent = _context(5, TraceFlags.SAMPLED)
    assert sampler.decide(_context(5), plain_parent, _attrs(), None, 0.5).threshold is None  # unknown
    dropped_parent = _context(5, TraceFlags.DEFAULT)
    every = Sampler(1.0, KEEP_REASONS)
    assert not every.decide(_context(5), dropped_parent, _attrs(), None, 0.5).keep  # the rate never overrides it
    assert every.decide(_context(5), dropped_parent, _attrs(), "HTTP 500", 0.5).reasons == ("failed",)


def test_fixed_thresholds_make_a_call_slow_from_the_first_one() -> None:
    sampler = Sampler(0.0, ["slow"], slow_ttft=0.5, slow_duration=2.0)
    assert sampler.reasons(_attrs(**{sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.6}), None, 1.0) == ("slow",)
    assert sampler.reasons(_attrs(), None, 2.5) == ("slow",)
    assert sampler.reasons(_attrs(), None, 1.0) == ()


def test_the_series_followed_are_bounded() -> None:
    sampler = Sampler(0.5, ["slow"])
    for n in range(MAX_SERIES * 3):
        sampler.reasons(_attrs(**{sc.GEN_AI_REQUEST_MODEL: f"m{n}"}), None, 0.5)
    assert len(sampler._series) == MAX_SERIES


def test_bad_values_never_raise() -> None:
    sampler = Sampler(0.5, KEEP_REASONS)
    odd = _attrs(**{sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: float("nan"), sc.GEN_AI_REQUEST_MODEL: ["x"]})
    for duration in (0.0, -1.0, float("inf"), float("nan")):
        sampler.decide(_context(3), None, odd, None, duration)


# --- the options -----------------------------------------------------------------------------------
def test_the_options_and_their_variables(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve({}).sample_rate is None and resolve({}).sample_keep == KEEP_REASONS
    options = resolve({}, {"OTEL_LLM_SAMPLE_RATE": "0.1", "OTEL_LLM_SAMPLE_KEEP": "slow, FAILED",
                           "OTEL_LLM_SLOW_TTFT": "2"})
    assert (options.sample_rate, options.sample_keep, options.slow_ttft) == (0.1, ("failed", "slow"), 2.0)
    assert resolve({"sample_keep": "none"}).sample_keep == ()
    assert resolve({"sample_rate": "1.5"}).sample_rate is None
    assert resolve({"sample_rate": "nan"}).sample_rate is None
    assert resolve({"slow_duration": "-1"}).slow_duration is None
    assert resolve({"sample_keep": "slow,typo"}).sample_keep == ("slow",)
    assert "typo" in caplog.text and "sample_rate" in caplog.text


# --- instrumented calls ----------------------------------------------------------------------------
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CALLS = 400
RATE = 0.1


@pytest.fixture
def sampled(sim: Any) -> Iterator[Otel]:
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False, sample_rate=RATE)
    configure_sim(sim, tokens=4, first_token_delay=0.002, token_interval=0.0005)
    try:
        yield state
    finally:
        otel_llm.uninstrument()


def _injected(index: int) -> tuple[str | None, dict[str, str]]:
    if index % 40 == 39:
        return "slow", {"x-sim-first-token-delay": "0.5"}
    if index % 40 == 19:
        return "failed", {"x-sim-error-status": "503"}
    return None, {}


def test_every_injected_outlier_is_kept_whole_and_the_rest_at_the_rate(sim: Any, sampled: Otel) -> None:
    injected: dict[int, str] = {}
    with httpx.Client(base_url=sim.base_url, timeout=10) as client:
        for index in range(CALLS):
            kind, headers = _injected(index)
            with client.stream("POST", "/v1/chat/completions", json=BODY, headers={"x-n": str(index), **headers}) as r:
                r.read()
                if kind:
                    injected[r.request.headers["traceparent"].split("-")[1]] = kind
    calls = sampled.calls()
    by_trace = {f"{s.context.trace_id:032x}": s for s in calls}
    # every outlier kept, for its reason, with its phase spans
    for trace_id, kind in injected.items():
        span = by_trace[trace_id]
        assert kind in span.attributes[sc.LLM_SAMPLING_REASON]
        assert span.attributes[sc.LLM_SAMPLING_ADJUSTED_COUNT] == 1.0
        assert len(sampled.children(span)) >= 3
    # the ordinary calls: the rate's binomial share, plus the few that were slow by chance
    ordinary = [s for s in calls if f"{s.context.trace_id:032x}" not in injected]
    by_rate = [s for s in ordinary if s.attributes[sc.LLM_SAMPLING_REASON] == ("rate",)]
    n = CALLS - len(injected)
    assert abs(len(by_rate) - n * RATE) <= 4 * math.sqrt(n * RATE * (1 - RATE)) + 1
    assert len(ordinary) - len(by_rate) <= 0.05 * n
    # counting from the kept spans: the adjusted counts sum to the calls made
    total = sum(s.attributes[sc.LLM_SAMPLING_ADJUSTED_COUNT] for s in calls)
    assert abs(total - CALLS) <= 4 * math.sqrt(n * (1 - RATE) / RATE) + 0.05 * n
    # the trace state says the same, in OpenTelemetry's form
    assert {OtelTraceState.parse(s.context.trace_state).threshold for s in by_rate} == {sampling.threshold(RATE)}
    # every call in the metrics; exemplars only from kept traces
    counts = collections.Counter()
    exemplar_traces = set()
    for rm in sampled.reader.get_metrics_data().resource_metrics:
        for scope in rm.scope_metrics:
            for metric in scope.metrics:
                if metric.name == sc.METRIC_OPERATION_DURATION:
                    for point in metric.data.data_points:
                        counts["calls"] += point.count
                        exemplar_traces.update(e.trace_id for e in point.exemplars if e.trace_id)
    assert counts["calls"] == CALLS
    assert exemplar_traces and exemplar_traces <= {s.context.trace_id for s in calls}


def test_a_call_under_the_application_s_span_follows_it(sim: Any, sampled: Otel) -> None:
    tracer = sampled.tracer_provider.get_tracer("app")
    unsampled = trace.NonRecordingSpan(SpanContext(0x77 << 64 | 1, 0x99, False, TraceFlags(TraceFlags.DEFAULT)))
    with httpx.Client(base_url=sim.base_url, timeout=10) as client:
        for _ in range(20):
            with tracer.start_as_current_span("app"):
                client.post("/v1/chat/completions", json=BODY).read()
        with trace.use_span(unsampled):
            for _ in range(20):
                client.post("/v1/chat/completions", json=BODY).read()
            client.post("/v1/chat/completions", json=BODY, headers={"x-sim-error-status": "500"}).read()
    calls = sampled.calls()
    under_app = [s for s in calls if s.parent is not None and s.parent.span_id != 0x99]
    assert len(under_app) == 20 and all(s.attributes[sc.LLM_SAMPLING_REASON] == ("parent",) for s in under_app)
    under_dropped = [s for s in calls if s.parent is not None and s.parent.span_id == 0x99]
    assert [s.attributes[sc.LLM_SAMPLING_REASON] for s in under_dropped] == [("failed",)]
    assert under_dropped[0].context.trace_id == 0x77 << 64 | 1  # exported under its parent's ids


def test_unset_every_call_is_recorded_with_no_sampling_attribute(sim: Any, otel: Otel) -> None:
    with httpx.Client(base_url=sim.base_url, timeout=10) as client:
        for _ in range(5):
            client.post("/v1/chat/completions", json=BODY).read()
    calls = otel.calls()
    assert len(calls) == 5
    assert not any(sc.LLM_SAMPLING_REASON in s.attributes or s.context.trace_state for s in calls)


def test_a_waiting_parent_is_kept_with_its_kept_child_and_its_children_decide_alone() -> None:
    sampler = Sampler(0.0, KEEP_REASONS)
    server = _context(9)  # sampled flag set while pending, as the gateway's SERVER span
    sampler.open_parent(server)
    # a child under the waiting parent is not kept for the parent's sampled flag...
    assert not sampler.decide(_context(9), server, _attrs(), None, 0.5).keep
    assert not sampler.close_parent(server, None, None).keep
    # ...but when a rule keeps it, the parent is kept with it, for the same reasons
    sampler.open_parent(server)
    child = sampler.decide(_context(9), server, _attrs(), "HTTP 500", 0.5)
    assert child.reasons == ("failed",)
    assert sampler.close_parent(server, None, None) == child
    assert sampler._waiting == {}
    sampler.open_parent(server)
    sampler.forget_parent(server)
    assert sampler._waiting == {}


def test_a_parent_left_alone_is_kept_for_its_own_error_never_for_its_duration() -> None:
    sampler = Sampler(0.0, KEEP_REASONS)
    server = _context(9)
    for _ in range(30):  # a history of fast requests would make a slow one "slow" if it were judged
        sampler.open_parent(server)
        sampler.close_parent(server, None, None)
    sampler.open_parent(server)
    assert sampler.close_parent(server, "HTTP 503", None) == Decision(True, ("failed",), 0)
    sampler.open_parent(server)
    assert not sampler.close_parent(server, None, None).keep
    assert not Sampler(0.0, ("slow",)).close_parent(server, "HTTP 503", None).keep  # failed left out
    # under the application's sampled span it is kept as a call would be
    sampler.open_parent(server)
    assert sampler.close_parent(server, None, _context(1)).reasons == ("parent",)


def test_a_call_s_decision_is_pending_unless_the_application_kept_its_parent() -> None:
    sampler = Sampler(0.5, KEEP_REASONS)
    assert sampler.pending(None)
    assert sampler.pending(_context(1, flags=0))
    assert not sampler.pending(_context(1))
    waiting = _context(2)
    sampler.open_parent(waiting)
    assert sampler.pending(waiting)  # the gateway's own span: its sampled flag is pending too
