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
from otel_llm.config import GENAI_DEFAULT
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
                   1.5, (30_000_000,), [Phase("llm.wait", 0, 10 * MS, True)], counters=counters)
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
    CallMetrics(meter.provider, InFlight()).record(CALL, 1.5, (), [])
    (point,) = meter.points(sc.METRIC_OPERATION_DURATION)
    assert dict(point.attributes) == METRIC_ATTRS  # no URL, no response id
    assert (point.count, point.sum) == (1, 1.5)


def test_error_type_and_relayed_calls_are_metric_attributes(meter: Reader) -> None:
    attrs = {**CALL, sc.ERROR_TYPE: "timeout", sc.LLM_GATEWAY_RELAYED: True}
    CallMetrics(meter.provider, InFlight()).record(attrs, 2.0, (), [Phase("llm.wait", 0, MS, False)])
    (point,) = meter.points(sc.METRIC_OPERATION_DURATION)
    assert dict(point.attributes) == {**METRIC_ATTRS, sc.ERROR_TYPE: "timeout", sc.LLM_GATEWAY_RELAYED: True}
    (phase,) = meter.points(sc.METRIC_PHASE_DURATION)
    assert dict(phase.attributes) == {**PHASE_ATTRS, sc.LLM_GATEWAY_RELAYED: True, sc.LLM_PHASE: "llm.wait"}


def test_tokens_are_recorded_by_type(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, (), [])
    metrics.record({**CALL, sc.GEN_AI_USAGE_INPUT_TOKENS: 8, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 1}, 1.0, (), [])
    points = meter.by_attrs(sc.METRIC_TOKEN_USAGE)
    assert set(points) == {key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "input"}),
                           key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "output"})}
    assert points[key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "input"})].sum == 20
    assert points[key({**METRIC_ATTRS, sc.GEN_AI_TOKEN_TYPE: "output"})].sum == 6


@pytest.mark.parametrize("value", [None, 3.0, True, "12"])
def test_token_counts_that_are_not_ints_are_not_recorded(meter: Reader, value: Any) -> None:
    attrs = {**CALL, sc.GEN_AI_USAGE_INPUT_TOKENS: value, sc.GEN_AI_USAGE_OUTPUT_TOKENS: value}
    CallMetrics(meter.provider, InFlight()).record(attrs, 1.0, (), [])
    assert meter.points(sc.METRIC_TOKEN_USAGE) == []
    assert len(meter.points(sc.METRIC_OPERATION_DURATION)) == 1


def test_first_chunk_and_per_chunk_only_when_known(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, (), [])
    assert meter.points(sc.METRIC_TIME_TO_FIRST_CHUNK) == []
    assert meter.points(sc.METRIC_TIME_PER_OUTPUT_CHUNK) == []
    # one value per output chunk after the first (nanoseconds from the previous one), as the convention says
    metrics.record({**CALL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.25}, 1.0, (40_000_000, 0, 20_000_000), [])
    (first,) = meter.points(sc.METRIC_TIME_TO_FIRST_CHUNK)
    (per_chunk,) = meter.points(sc.METRIC_TIME_PER_OUTPUT_CHUNK)
    assert (first.count, first.sum, dict(first.attributes)) == (1, 0.25, METRIC_ATTRS)
    assert (per_chunk.count, dict(per_chunk.attributes)) == (3, METRIC_ATTRS)
    assert (per_chunk.sum, per_chunk.min, per_chunk.max) == pytest.approx((0.06, 0.0, 0.04))


def test_each_phase_is_a_record_in_seconds_by_phase_name(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    phases = [Phase("llm.connect", 0, 2 * MS, True), Phase("llm.wait", 2 * MS, 52 * MS, True),
              Phase("llm.stream", 52 * MS, 152 * MS, False)]
    metrics.record(CALL, 0.2, (), phases)
    metrics.record(CALL, 0.2, (), phases[1:2])
    points = meter.by_attrs(sc.METRIC_PHASE_DURATION)
    assert set(points) == {key({**PHASE_ATTRS, sc.LLM_PHASE: name})
                           for name in ("llm.connect", "llm.wait", "llm.stream")}
    wait = points[key({**PHASE_ATTRS, sc.LLM_PHASE: "llm.wait"})]
    assert wait.count == 2 and wait.sum == pytest.approx(0.1)
    assert points[key({**PHASE_ATTRS, sc.LLM_PHASE: "llm.stream"})].sum == pytest.approx(0.1)
    assert points[key({**PHASE_ATTRS, sc.LLM_PHASE: "llm.connect"})].sum == pytest.approx(0.002)


def test_diagnosis_counts_calls_by_verdict(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, (), [])
    metrics.record(CALL, 1.0, (), [])
    cold = {**CALL, sc.LLM_DIAGNOSIS_BOTTLENECK: "model_load", sc.LLM_DIAGNOSIS_COLD_START: True}
    metrics.record(cold, 1.0, (), [])
    metrics.record({**CALL, sc.LLM_DIAGNOSIS_STREAM_BUFFERED: True}, 1.0, (), [])
    points = meter.by_attrs(sc.METRIC_DIAGNOSIS_CALLS)
    assert {attrs: point.value for attrs, point in points.items()} == {
        key({**PHASE_ATTRS, sc.LLM_DIAGNOSIS_BOTTLENECK: "none"}): 2,
        key({**PHASE_ATTRS, sc.LLM_DIAGNOSIS_BOTTLENECK: "model_load", sc.LLM_DIAGNOSIS_COLD_START: True}): 1,
        key({**PHASE_ATTRS, sc.LLM_DIAGNOSIS_BOTTLENECK: "none", sc.LLM_DIAGNOSIS_STREAM_BUFFERED: True}): 1,
    }
    assert meter.points(sc.METRIC_DIAGNOSIS_UNACCOUNTED_WAIT) == []


def test_unaccounted_wait_is_recorded_with_the_phase_attributes(meter: Reader) -> None:
    CallMetrics(meter.provider, InFlight()).record({**CALL, sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT: 0.3}, 1.0, (), [])
    (point,) = meter.points(sc.METRIC_DIAGNOSIS_UNACCOUNTED_WAIT)
    assert (point.count, point.sum, dict(point.attributes)) == (1, 0.3, PHASE_ATTRS)


def test_runtime_latencies_and_rates(meter: Reader) -> None:
    counters = RuntimeCounters(time_to_first_token=0.12, time_per_output_token=0.02, prompt_eval_rate=800.0,
                               generation_rate=45.0)
    CallMetrics(meter.provider, InFlight()).record(CALL, 1.0, (), [], counters=counters)
    for name, value in ((sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN, 0.12), (sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN, 0.02),
                        (sc.METRIC_RUNTIME_PROMPT_EVAL_RATE, 800.0), (sc.METRIC_RUNTIME_GENERATION_RATE, 45.0)):
        (point,) = meter.points(name)
        assert (point.count, point.sum, dict(point.attributes)) == (1, value, RUNTIME_ATTRS), name


def test_runtime_time_to_first_token_is_queue_load_and_prompt_eval_when_not_reported(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, (), [], counters=RuntimeCounters(queue_duration=0.05, load_duration=1.5,
                                                                 prompt_eval_duration=0.25))
    metrics.record(CALL, 1.0, (), [], counters=RuntimeCounters(prompt_eval_duration=0.5))
    (point,) = meter.points(sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN)
    assert point.count == 2 and point.sum == pytest.approx(1.8 + 0.5)
    assert meter.points(sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN) == []


def test_no_runtime_records_without_what_they_need(meter: Reader) -> None:
    metrics = CallMetrics(meter.provider, InFlight())
    metrics.record(CALL, 1.0, (), [])
    metrics.record(CALL, 1.0, (), [], counters=RuntimeCounters(runtime="vllm", queue_duration=0.2,
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
    # a gateway: the calls whose callers recorded them too are counted apart, marked relayed
    metrics.relaying()
    in_flight.admit(("gpu-box", 8000), b"d", {}, "m", False, relayed=True)
    marked = in_flight.admit(("127.0.0.1", 11434), b"e", {}, "m", False, relayed=True)
    in_flight.release(marked)
    values = {attrs: point.value for attrs, point in meter.by_attrs(sc.METRIC_ACTIVE_REQUESTS).items()}
    assert values == {key({sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: 11434}): 1,
                      key({sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: 11434, sc.LLM_GATEWAY_RELAYED: True}): 0,
                      key({sc.SERVER_ADDRESS: "gpu-box", sc.SERVER_PORT: 8000}): 1,
                      key({sc.SERVER_ADDRESS: "gpu-box", sc.SERVER_PORT: 8000, sc.LLM_GATEWAY_RELAYED: True}): 1}


def test_a_new_session_on_the_same_provider_reads_its_own_table_and_keeps_counting(meter: Reader) -> None:
    """The SDK keeps the first callback per instrument name: after uninstrument()/instrument(),
    active requests come from the new in-flight table, diagnosis counts go on, relaying is reset."""
    old = InFlight()
    first = CallMetrics(meter.provider, old)
    first.relaying()
    old.admit(("old-host", 1), b"x", {}, "m", False)
    first.record(CALL, 1.0, (), [])
    new = InFlight()
    second = CallMetrics(meter.provider, new)
    new.admit(("new-host", 2), b"x", {}, "m", False)
    second.record(CALL, 1.0, (), [])
    active = meter.by_attrs(sc.METRIC_ACTIVE_REQUESTS)
    assert {attrs: point.value for attrs, point in active.items()} == {
        key({sc.SERVER_ADDRESS: "new-host", sc.SERVER_PORT: 2}): 1}  # not the old table, not relayed
    (calls,) = meter.points(sc.METRIC_DIAGNOSIS_CALLS)
    assert calls.value == 2
    (duration,) = meter.points(sc.METRIC_OPERATION_DURATION)
    assert duration.count == 2


def test_separate_providers_keep_separate_counts() -> None:
    one, two = Reader(), Reader()
    CallMetrics(one.provider, InFlight()).record(CALL, 1.0, (), [])
    CallMetrics(two.provider, InFlight())
    assert [p.value for p in one.points(sc.METRIC_DIAGNOSIS_CALLS)] == [1]
    assert two.points(sc.METRIC_DIAGNOSIS_CALLS) == []


def test_only_sampled_calls_link_duration_and_first_chunk_to_their_trace(meter: Reader) -> None:
    sampled = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    unsampled = SpanContext(0x9999, 0x8888, is_remote=False, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    metrics = CallMetrics(meter.provider, InFlight())
    attrs = {**CALL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.2}
    metrics.record(attrs, 1.0, (10_000_000,), [Phase("llm.wait", 0, MS, True)], span_context=sampled)
    metrics.record(attrs, 1.0, (10_000_000,), [Phase("llm.wait", 0, MS, True)], span_context=unsampled)
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
        metrics.record({**CALL, sc.GEN_AI_REQUEST_MODEL: f"m{index}"}, 1.0, (), [])
    metrics.record(CALL, 3.0, (), [])
    points = meter.by_attrs(sc.METRIC_OPERATION_DURATION)
    assert len(points) == 301
    assert points[key(METRIC_ATTRS)].sum == 3.0
    assert points[key({**METRIC_ATTRS, sc.GEN_AI_REQUEST_MODEL: "m299"})].count == 1


# --- OTEL_SEMCONV_STABILITY_OPT_IN: semantic-conventions-genai's names -------------------------------

# What one streamed call to the simulator exports whatever the mode, beside the client metrics.
ALWAYS = {sc.METRIC_PHASE_DURATION, sc.METRIC_DIAGNOSIS_CALLS, sc.METRIC_ACTIVE_REQUESTS}
DEFAULT_NAMES = {sc.METRIC_OPERATION_DURATION, sc.METRIC_TIME_TO_FIRST_CHUNK, sc.METRIC_TIME_PER_OUTPUT_CHUNK,
                 sc.METRIC_TOKEN_USAGE}
LATEST_NAMES = {sc.METRIC_INFERENCE_DURATION, sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK,
                sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK, sc.METRIC_INFERENCE_USAGE_INPUT_TOKENS,
                sc.METRIC_INFERENCE_USAGE_OUTPUT_TOKENS, sc.METRIC_INFERENCE_OPERATION_INPUT_TOKENS,
                sc.METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS}


def _streamed_call(sim: Any, monkeypatch: pytest.MonkeyPatch, opt_in: str | None) -> dict[str, list[Any]]:
    """One streamed chat call to the simulator, instrumented with OTEL_SEMCONV_STABILITY_OPT_IN set
    to ``opt_in`` (None: unset); the data points exported, by metric name."""
    import httpx

    import otel_llm
    from otel_llm._log import reset_log_once
    from otel_llm.config import ENV_SEMCONV_OPT_IN
    from otel_llm_testing.simulator import configure_sim
    from otel_llm_testing.otel import make_otel

    if opt_in is None:
        monkeypatch.delenv(ENV_SEMCONV_OPT_IN, raising=False)
    else:
        monkeypatch.setenv(ENV_SEMCONV_OPT_IN, opt_in)
    reset_log_once()
    configure_sim(sim, tokens=4, first_token_delay=0.0, token_interval=0.0)
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.Client() as client:
            with client.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body) as response:
                response.read()
    finally:
        otel_llm.uninstrument()
    return state.metrics()


def test_without_the_opt_in_the_call_metrics_keep_their_names(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(_streamed_call(sim, monkeypatch, None)) == ALWAYS | DEFAULT_NAMES


def test_gen_ai_latest_experimental_gives_the_inference_names_only(sim: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = _streamed_call(sim, monkeypatch, "http,gen_ai_latest_experimental")
    assert set(metrics) == ALWAYS | LATEST_NAMES
    (usage,) = metrics[sc.METRIC_INFERENCE_USAGE_OUTPUT_TOKENS]
    assert usage.value == 4 and usage.attributes[sc.GEN_AI_TOKEN_MODALITY] == "unknown"
    (operation,) = metrics[sc.METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS]
    assert operation.sum == 4 and sc.GEN_AI_TOKEN_MODALITY not in operation.attributes
    (duration,) = metrics[sc.METRIC_INFERENCE_DURATION]
    assert list(duration.explicit_bounds) == list(sc.DURATION_BUCKETS)
    assert list(operation.explicit_bounds) == list(sc.TOKEN_BUCKETS)


def test_gen_ai_latest_experimental_dup_gives_both(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = _streamed_call(sim, monkeypatch, "gen_ai_latest_experimental/dup")
    assert set(metrics) == ALWAYS | DEFAULT_NAMES | LATEST_NAMES
    (old,) = metrics[sc.METRIC_OPERATION_DURATION]
    (new,) = metrics[sc.METRIC_INFERENCE_DURATION]
    assert (old.sum, dict(old.attributes)) == (new.sum, dict(new.attributes))  # one value, two names


def test_a_bad_gen_ai_value_changes_nothing_and_is_logged_once(sim: Any, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="otel_llm"):
        metrics = _streamed_call(sim, monkeypatch, "gen_ai_latest")
    assert set(metrics) == ALWAYS | DEFAULT_NAMES
    complaints = [r for r in caplog.records if "OTEL_SEMCONV_STABILITY_OPT_IN" in r.getMessage()]
    assert len(complaints) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("value, mode", [
    (None, "default"), ("", "default"), ("http", "default"), ("gen_ai_latest_experimental", "latest"),
    (" database , gen_ai_latest_experimental ", "latest"), ("gen_ai_latest_experimental/dup", "dup"),
    ("gen_ai_latest_experimental,gen_ai_latest_experimental/dup", "dup"),
    ("gen_ai_latest_experimental/dup,gen_ai_latest_experimental", "dup"), ("GEN_AI_LATEST_EXPERIMENTAL", "default"),
])
def test_the_opt_in_is_read_as_opentelemetry_reads_it(value: str | None, mode: str) -> None:
    from otel_llm import config

    modes = {"default": config.GENAI_DEFAULT, "latest": config.GENAI_LATEST, "dup": config.GENAI_DUP}
    environ = {} if value is None else {config.ENV_SEMCONV_OPT_IN: value}
    assert config.genai_semconv(environ) == modes[mode]


def test_the_inference_usage_counters_and_histograms(meter: Reader) -> None:
    """Counters for every call with usage (cache-read and reasoning subsets too), by modality and
    without error.type; the per-operation histograms for successful calls only."""
    from otel_llm.config import GENAI_LATEST
    from otel_llm.telemetry.metrics import call_metrics

    metrics = call_metrics(meter.provider, InFlight(), GENAI_LATEST)
    metrics.record({**CALL, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 8, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: 3},
                   1.0, (), [])
    metrics.record({**CALL, sc.ERROR_TYPE: "timeout"}, 2.0, (), [])
    usage = {**METRIC_ATTRS, sc.GEN_AI_TOKEN_MODALITY: "unknown"}
    for name, total in ((sc.METRIC_INFERENCE_USAGE_INPUT_TOKENS, 24), (sc.METRIC_INFERENCE_USAGE_OUTPUT_TOKENS, 10),
                        (sc.METRIC_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS, 8),
                        (sc.METRIC_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS, 3)):
        assert meter.metrics()[name].unit == "{token}", name
        assert {k: p.value for k, p in meter.by_attrs(name).items()} == {key(usage): total}, name
    for name, value in ((sc.METRIC_INFERENCE_OPERATION_INPUT_TOKENS, 12),
                        (sc.METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS, 5)):
        (point,) = meter.points(name)
        assert (point.count, point.sum, dict(point.attributes)) == (1, value, METRIC_ATTRS), name
    durations = meter.by_attrs(sc.METRIC_INFERENCE_DURATION)
    assert durations[key({**METRIC_ATTRS, sc.ERROR_TYPE: "timeout"})].sum == 2.0
    assert sc.METRIC_OPERATION_DURATION not in meter.metrics() and sc.METRIC_TOKEN_USAGE not in meter.metrics()


@pytest.mark.parametrize("semconv", ["default", "latest", "dup"])
@pytest.mark.parametrize("scope", ["opentelemetry.instrumentation.genai.openai", "openlit.instrumentation.openai",
                                   "opentelemetry.instrumentation.openai.v1"])
def test_metrics_left_to_another_instrumentation_are_not_recorded(meter: Reader, semconv: str, scope: str) -> None:
    """Beside an instrumentation that records some gen_ai metrics (``beside.metrics_left_to``):
    those are not recorded, under any naming; the others, and otel_llm's own llm.* metrics, are."""
    from otel_llm.config import GENAI_DUP, GENAI_LATEST
    from otel_llm.telemetry.beside import metrics_left_to
    from otel_llm.telemetry.metrics import call_metrics

    mode = {"default": GENAI_DEFAULT, "latest": GENAI_LATEST, "dup": GENAI_DUP}[semconv]
    left = metrics_left_to(scope)
    counters = RuntimeCounters(time_to_first_token=0.12, time_per_output_token=0.02, generation_rate=45.0)
    phases = [Phase("llm.decode", 0, 5 * MS, True)]
    attrs = {**CALL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.2}
    call_metrics(meter.provider, InFlight(), mode).record(attrs, 1.0, (MS, MS), phases, counters=counters, left=left)
    recorded = {name for name, metric in meter.metrics().items()
                if any(getattr(p, "count", getattr(p, "value", 0)) for p in metric.data.data_points)}
    # the same quantity under the semantic-conventions-genai names
    renamed = {sc.METRIC_OPERATION_DURATION: {sc.METRIC_INFERENCE_DURATION},
               sc.METRIC_TIME_TO_FIRST_CHUNK: {sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK},
               sc.METRIC_TIME_PER_OUTPUT_CHUNK: {sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK},
               sc.METRIC_TOKEN_USAGE: {sc.METRIC_INFERENCE_USAGE_INPUT_TOKENS, sc.METRIC_INFERENCE_USAGE_OUTPUT_TOKENS,
                                       sc.METRIC_INFERENCE_OPERATION_INPUT_TOKENS,
                                       sc.METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS}}
    quantities = [sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_TO_FIRST_CHUNK,
                  sc.METRIC_TIME_PER_OUTPUT_CHUNK, sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN,
                  sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN]
    assert left and set(left) <= set(quantities)
    for quantity in quantities:
        names = {quantity, *renamed.get(quantity, ())}
        assert (not names & recorded) == (quantity in left), (quantity, sorted(recorded))
    assert {sc.METRIC_PHASE_DURATION, sc.METRIC_RUNTIME_GENERATION_RATE} <= recorded, recorded
