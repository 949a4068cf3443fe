"""The metric instruments of model calls (otel_llm.telemetry.metrics), read back from an SDK
MeterProvider with an InMemoryMetricReader: which instruments exist, and what each record of a
call carries."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.trace import SpanContext, TraceFlags

from otel_llm import semconv as sc
from otel_llm.parse.runtimes import RuntimeCounters
from otel_llm.telemetry.inflight import InFlight
from otel_llm.telemetry.metrics import CallMetrics
from otel_llm.telemetry.phases import Phase

HISTOGRAMS = {
    sc.METRIC_OPERATION_DURATION: ("s", sc.DURATION_BUCKETS),
    sc.METRIC_TOKEN_USAGE: ("{token}", sc.TOKEN_BUCKETS),
    sc.METRIC_TIME_TO_FIRST_CHUNK: ("s", sc.DURATION_BUCKETS),
    sc.METRIC_TIME_PER_OUTPUT_CHUNK: ("s", sc.DURATION_BUCKETS),
    sc.METRIC_PHASE_DURATION: ("s", sc.PHASE_BUCKETS),
    sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN: ("s", sc.SERVER_TTFT_BUCKETS),
    sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN: ("s", sc.SERVER_TPOT_BUCKETS),
    sc.METRIC_RUNTIME_PROMPT_EVAL_RATE: ("{token}/s", sc.RATE_BUCKETS),
    sc.METRIC_RUNTIME_GENERATION_RATE: ("{token}/s", sc.RATE_BUCKETS),
    sc.METRIC_DIAGNOSIS_UNACCOUNTED_WAIT: ("s", sc.PHASE_BUCKETS),
}

# A finished call's span attributes: the metric ones and some that metrics must never carry.
CALL = {
    sc.GEN_AI_OPERATION_NAME: "chat",
    sc.GEN_AI_PROVIDER_NAME: "ollama",
    sc.GEN_AI_REQUEST_MODEL: "llama3",
    sc.GEN_AI_RESPONSE_MODEL: "llama3:8b",
    sc.SERVER_ADDRESS: "127.0.0.1",
    sc.SERVER_PORT: 11434,
    sc.URL_FULL: "http://127.0.0.1:11434/api/chat",
    sc.GEN_AI_RESPONSE_ID: "resp-1",
    sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
}
METRIC_ATTRS = {k: CALL[k] for k in (sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL,
                                     sc.GEN_AI_RESPONSE_MODEL, sc.SERVER_ADDRESS, sc.SERVER_PORT)}
PHASE_ATTRS = {sc.GEN_AI_PROVIDER_NAME: "ollama", sc.GEN_AI_REQUEST_MODEL: "llama3"}
RUNTIME_ATTRS = {sc.GEN_AI_OPERATION_NAME: "chat", **PHASE_ATTRS}
MS = 1_000_000


class Reader:
    """A meter provider and what it collected, by metric name."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        found: dict[str, Metric] = {}
        for resource_metrics in data.resource_metrics if data else []:
            for scope_metrics in resource_metrics.scope_metrics:
                assert scope_metrics.scope.name == sc.INSTRUMENTATION_NAME
                for metric in scope_metrics.metrics:
                    found[metric.name] = metric
        return found

    def points(self, name: str) -> list[Any]:
        metric = self.metrics().get(name)
        return list(metric.data.data_points) if metric is not None else []

    def by_attrs(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        return {frozenset(dict(p.attributes).items()): p for p in self.points(name)}


@pytest.fixture
def meter() -> Reader:
    return Reader()


def key(attrs: dict[str, Any]) -> frozenset[tuple[str, Any]]:
    return frozenset(attrs.items())


def test_every_instrument_is_created_with_its_unit_and_buckets(meter: Reader) -> None:
    in_flight = InFlight()
    in_flight.admit(("127.0.0.1", 11434), b"{}", {}, "llama3", False)
    metrics = CallMetrics(meter.provider, in_flight)
    counters = RuntimeCounters(time_to_first_token=0.1, time_per_output_token=0.02, prompt_eval_rate=900.0,
                               generation_rate=50.0)
    metrics.record({**CALL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.2, sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT: 0.01},
                   1.5, 0.03, [Phase("llm.wait", 0, 10 * MS, True)], counters=counters)
    found = meter.metrics()
    assert set(found) == set(HISTOGRAMS) | {sc.METRIC_ACTIVE_REQUESTS, sc.METRIC_DIAGNOSIS_CALLS}
    for name, (unit, buckets) in HISTOGRAMS.items():
        assert found[name].unit == unit, name
        assert found[name].description, name
        points: list[Any] = list(found[name].data.data_points)
        for point in points:
            assert tuple(point.explicit_bounds) == buckets, name
    assert found[sc.METRIC_ACTIVE_REQUESTS].unit == "{request}"
    assert found[sc.METRIC_DIAGNOSIS_CALLS].unit == "{call}"


def test_nothing_is_recorded_before_a_call(meter: Reader) -> None:
    CallMetrics(meter.provider, InFlight())
    assert meter.metrics() == {}


def test_duration_carries_only_the_low_cardinality_attributes(meter: Reader) -> None:
    CallMetrics(meter.provider, InFlight()).record(CALL, 1.5, None, [])
    (point,) = meter.points(sc.METRIC_OPERATION_DURATION)
    assert dict(point.attributes) == METRIC_ATTRS  # no URL, no response id
    assert (point.count, point.sum) == (1, 1.5)


def test_error_type_and_relayed_calls_are_metric_attributes(meter: Reader) -> None:
    attrs = {**CALL, sc.ERROR_TYPE: "timeout", sc.LLM_GATEWAY_RELAYED: True}
    CallMetrics(meter.provider, InFlight()).record(attrs, 2.0, None, [Phase("llm.wait", 0, MS, False)])
    (point,) = meter.points(sc.METRIC_OPERATION_DURATION)
    assert dict(point.attributes) == {**METRIC_ATTRS, sc.ERROR_TYPE: "timeout", sc.LLM_GATEWAY_RELAYED: True}
    (phase,) = meter.points(sc.METRIC_PHASE_DURATION)
    assert dict(phase.attributes) == {**PHASE_ATTRS, sc.LLM_GATEWAY_RELAYED: True, sc.LLM_PHASE: "llm.wait"}


def test_tokens_are_recorded_by_type(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, None, [])
    metrics.record({**CALL, sc.GEN_AI_USAGE_INPUT_TOKENS: 8, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 1}, 1.0, None, [])
    points = meter.by_attrs(sc.METRIC_TOKEN_USAGE)
    assert set(points) == {key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "input"}),
                           key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "output"})}
    assert points[key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "input"})].sum == 20
    assert points[key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "output"})].sum == 6


@pytest.mark.parametrize("value", [None, 3.0, True, "12"])
def test_token_counts_that_are_not_ints_are_not_recorded(meter: Reader, value: Any) -> None:
    attrs = {**CALL, sc.GEN_AI_USAGE_INPUT_TOKENS: value, sc.GEN_AI_USAGE_OUTPUT_TOKENS: value}
    CallMetrics(meter.provider, InFlight()).record(attrs, 1.0, None, [])
    assert meter.points(sc.METRIC_TOKEN_USAGE) == []
    assert len(meter.points(sc.METRIC_OPERATION_DURATION)) == 1


def test_first_chunk_and_per_chunk_only_when_known(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, None, [])
    assert meter.points(sc.METRIC_TIME_TO_FIRST_CHUNK) == []
    assert meter.points(sc.METRIC_TIME_PER_OUTPUT_CHUNK) == []
    metrics.record({**CALL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.25}, 1.0, 0.04, [])
    (first,) = meter.points(sc.METRIC_TIME_TO_FIRST_CHUNK)
    (per_chunk,) = meter.points(sc.METRIC_TIME_PER_OUTPUT_CHUNK)
    assert (first.count, first.sum, dict(first.attributes)) == (1, 0.25, METRIC_ATTRS)
    assert (per_chunk.count, per_chunk.sum, dict(per_chunk.attributes)) == (1, 0.04, METRIC_ATTRS)


def test_each_phase_is_a_record_in_seconds_by_phase_name(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    phases = [Phase("llm.connect", 0, 2 * MS, True), Phase("llm.wait", 2 * MS, 52 * MS, True),
              Phase("llm.stream", 52 * MS, 152 * MS, False)]
    metrics.record(CALL, 0.2, None, phases)
    metrics.record(CALL, 0.2, None, phases[1:2])
    points = meter.by_attrs(sc.METRIC_PHASE_DURATION)
    assert set(points) == {key({**PHASE_ATTRS, sc.LLM_PHASE: name})
                           for name in ("llm.connect", "llm.wait", "llm.stream")}
    wait = points[key({**PHASE_ATTRS, sc.LLM_PHASE: "llm.wait"})]
    assert wait.count == 2 and wait.sum == pytest.approx(0.1)
    assert points[key({**PHASE_ATTRS, sc.LLM_PHASE: "llm.stream"})].sum == pytest.approx(0.1)
    assert points[key({**PHASE_ATTRS, sc.LLM_PHASE: "llm.connect"})].sum == pytest.approx(0.002)


def test_diagnosis_counts_calls_by_verdict(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, None, [])
    metrics.record(CALL, 1.0, None, [])
    cold = {**CALL, sc.LLM_DIAGNOSIS_BOTTLENECK: "model_load", sc.LLM_DIAGNOSIS_COLD_START: True}
    metrics.record(cold, 1.0, None, [])
    metrics.record({**CALL, sc.LLM_DIAGNOSIS_STREAM_BUFFERED: True}, 1.0, None, [])
    points = meter.by_attrs(sc.METRIC_DIAGNOSIS_CALLS)
    assert {attrs: point.value for attrs, point in points.items()} == {
        key({**PHASE_ATTRS, sc.LLM_DIAGNOSIS_BOTTLENECK: "none"}): 2,
        key({**PHASE_ATTRS, sc.LLM_DIAGNOSIS_BOTTLENECK: "model_load", sc.LLM_DIAGNOSIS_COLD_START: True}): 1,
        key({**PHASE_ATTRS, sc.LLM_DIAGNOSIS_BOTTLENECK: "none", sc.LLM_DIAGNOSIS_STREAM_BUFFERED: True}): 1,
    }
    assert meter.points(sc.METRIC_DIAGNOSIS_UNACCOUNTED_WAIT) == []


def test_unaccounted_wait_is_recorded_with_the_phase_attributes(meter: Reader) -> None:
    CallMetrics(meter.provider, InFlight()).record({**CALL, sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT: 0.3}, 1.0, None, [])
    (point,) = meter.points(sc.METRIC_DIAGNOSIS_UNACCOUNTED_WAIT)
    assert (point.count, point.sum, dict(point.attributes)) == (1, 0.3, PHASE_ATTRS)


def test_runtime_latencies_and_rates(meter: Reader) -> None:
    counters = RuntimeCounters(time_to_first_token=0.12, time_per_output_token=0.02, prompt_eval_rate=800.0,
                               generation_rate=45.0)
    CallMetrics(meter.provider, InFlight()).record(CALL, 1.0, None, [], counters=counters)
    for name, value in ((sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN, 0.12), (sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN, 0.02),
                        (sc.METRIC_RUNTIME_PROMPT_EVAL_RATE, 800.0), (sc.METRIC_RUNTIME_GENERATION_RATE, 45.0)):
        (point,) = meter.points(name)
        assert (point.count, point.sum, dict(point.attributes)) == (1, value, RUNTIME_ATTRS), name


def test_runtime_time_to_first_token_is_queue_load_and_prompt_eval_when_not_reported(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, None, [], counters=RuntimeCounters(queue_duration=0.05, load_duration=1.5,
                                                                 prompt_eval_duration=0.25))
    metrics.record(CALL, 1.0, None, [], counters=RuntimeCounters(prompt_eval_duration=0.5))
    (point,) = meter.points(sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN)
    assert point.count == 2 and point.sum == pytest.approx(1.8 + 0.5)
    assert meter.points(sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN) == []


def test_no_runtime_records_without_what_they_need(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, None, [])
    metrics.record(CALL, 1.0, None, [], counters=RuntimeCounters(runtime="vllm", queue_duration=0.2,
                                                                 generation_tokens=9))
    for name in (sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN, sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN,
                 sc.METRIC_RUNTIME_PROMPT_EVAL_RATE, sc.METRIC_RUNTIME_GENERATION_RATE):
        assert meter.points(name) == [], name


def test_active_requests_report_the_in_flight_table(meter: Reader) -> None:
    in_flight = InFlight()
    metrics = CallMetrics(meter.provider, in_flight)
    first = in_flight.admit(("127.0.0.1", 11434), b"a", {}, "m", False)
    in_flight.admit(("127.0.0.1", 11434), b"b", {}, "m", False)
    in_flight.admit(("gpu-box", 8000), b"c", {}, "m", False)
    in_flight.release(first)
    values = {attrs: point.value for attrs, point in meter.by_attrs(sc.METRIC_ACTIVE_REQUESTS).items()}
    assert values == {key({sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: 11434}): 1,
                      key({sc.SERVER_ADDRESS: "gpu-box", sc.SERVER_PORT: 8000}): 1}
    metrics.relaying()
    values = {attrs: point.value for attrs, point in meter.by_attrs(sc.METRIC_ACTIVE_REQUESTS).items()
              if (sc.LLM_GATEWAY_RELAYED, True) in attrs}
    assert values == {key({sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: 11434, sc.LLM_GATEWAY_RELAYED: True}): 1,
                      key({sc.SERVER_ADDRESS: "gpu-box", sc.SERVER_PORT: 8000, sc.LLM_GATEWAY_RELAYED: True}): 1}


def test_a_new_session_on_the_same_provider_reads_its_own_table_and_keeps_counting(meter: Reader) -> None:
    """The SDK keeps the first callback per instrument name: after uninstrument()/instrument(),
    active requests come from the new in-flight table, diagnosis counts go on, relaying is reset."""
    old = InFlight()
    first = CallMetrics(meter.provider, old)
    first.relaying()
    old.admit(("old-host", 1), b"x", {}, "m", False)
    first.record(CALL, 1.0, None, [])
    new = InFlight()
    second = CallMetrics(meter.provider, new)
    new.admit(("new-host", 2), b"x", {}, "m", False)
    second.record(CALL, 1.0, None, [])
    active = meter.by_attrs(sc.METRIC_ACTIVE_REQUESTS)
    assert {attrs: point.value for attrs, point in active.items()} == {
        key({sc.SERVER_ADDRESS: "new-host", sc.SERVER_PORT: 2}): 1}  # not the old table, not relayed
    (calls,) = meter.points(sc.METRIC_DIAGNOSIS_CALLS)
    assert calls.value == 2
    (duration,) = meter.points(sc.METRIC_OPERATION_DURATION)
    assert duration.count == 2


def test_separate_providers_keep_separate_counts() -> None:
    one, two = Reader(), Reader()
    CallMetrics(one.provider, InFlight()).record(CALL, 1.0, None, [])
    CallMetrics(two.provider, InFlight())
    assert [p.value for p in one.points(sc.METRIC_DIAGNOSIS_CALLS)] == [1]
    assert two.points(sc.METRIC_DIAGNOSIS_CALLS) == []


def test_only_sampled_calls_link_duration_and_first_chunk_to_their_trace(meter: Reader) -> None:
    sampled = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    unsampled = SpanContext(0x9999, 0x8888, is_remote=False, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    metrics = CallMetrics(meter.provider, InFlight())
    attrs = {**CALL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.2}
    metrics.record(attrs, 1.0, 0.01, [Phase("llm.wait", 0, MS, True)], span_context=sampled)
    metrics.record(attrs, 1.0, 0.01, [Phase("llm.wait", 0, MS, True)], span_context=unsampled)
    found = meter.metrics()  # once: the SDK hands each exemplar to one collection
    for name in (sc.METRIC_OPERATION_DURATION, sc.METRIC_TIME_TO_FIRST_CHUNK):
        (point,) = found[name].data.data_points
        assert [e.trace_id for e in point.exemplars] == [0x1234], name
    for name in (sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_PER_OUTPUT_CHUNK, sc.METRIC_PHASE_DURATION):
        assert all(not p.exemplars for p in found[name].data.data_points), name


def test_many_distinct_attribute_sets_are_all_recorded(meter: Reader) -> None:
    """Past the cache of attribute dictionaries (ever-changing models), records stay right."""
    metrics = CallMetrics(meter.provider, InFlight())
    for index in range(300):
        metrics.record({**CALL, sc.GEN_AI_REQUEST_MODEL: f"m{index}"}, 1.0, None, [])
    metrics.record(CALL, 3.0, None, [])
    points = meter.by_attrs(sc.METRIC_OPERATION_DURATION)
    assert len(points) == 301
    assert points[key(METRIC_ATTRS)].sum == 3.0
    assert points[key({**METRIC_ATTRS, sc.GEN_AI_REQUEST_MODEL: "m299"})].count == 1
