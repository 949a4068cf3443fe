"""The normalized state: counts summed over label sets, the KV-cache usage averaged."""

from __future__ import annotations

from otel_llm.observers._runtime_normalize import NORMALIZED_SOURCES, infer_runtime, normalize
from otel_llm.parse.runtimes import STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING
from otel_llm.runtimes import OBSERVED


def _gauge(name: str, value: float, engine: str = "0") -> tuple[str, str, dict[str, str], float, str]:
    return (name, "gauge", {"engine": engine}, value, "")


def test_counts_are_summed_and_the_kv_cache_usage_averaged() -> None:
    found = [_gauge("vllm:num_requests_running", 2, "0"), _gauge("vllm:num_requests_running", 3, "1"),
             _gauge("vllm:kv_cache_usage_perc", 0.2, "0"), _gauge("vllm:kv_cache_usage_perc", 0.4, "1")]
    state = normalize(found)
    assert state[STATE_REQUESTS_RUNNING] == 5 and isinstance(state[STATE_REQUESTS_RUNNING], int)
    assert state[STATE_REQUESTS_WAITING] is None
    assert abs((state[STATE_KV_CACHE_USAGE] or 0) - 0.3) < 1e-9


def test_the_first_series_present_wins() -> None:
    legacy = normalize([_gauge("vllm:gpu_cache_usage_perc", 0.5)])
    both = normalize([_gauge("vllm:gpu_cache_usage_perc", 0.5), _gauge("vllm:kv_cache_usage_perc", 0.1)])
    assert (legacy[STATE_KV_CACHE_USAGE], both[STATE_KV_CACHE_USAGE]) == (0.5, 0.1)


def test_sources_and_runtimes_come_from_each_runtimes_declaration() -> None:
    for name, observed in OBSERVED.items():
        for key, series in observed.normalized.items():
            assert set(series) <= set(NORMALIZED_SOURCES[key])
            assert infer_runtime([_gauge(series[0], 1)]) == name
    assert infer_runtime([_gauge("process_cpu_seconds_total", 1)]) is None
