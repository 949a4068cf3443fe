"""The re-emission of a runtime's Prometheus series: names, kinds, and one instrument per name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.observers._runtime_prometheus import COUNTER, GAUGE, Point, Reemitter, names_in, otel_name, samples

FIXTURES = Path(__file__).parents[1] / "fixtures" / "observers"


def _samples(text: str) -> list[tuple[str, str, dict[str, str], float, str]]:
    return samples(list(text_string_to_metric_families(text)), names_in(text))


def test_name_mapping_rule() -> None:
    assert otel_name("llamacpp:requests_processing") == "llamacpp.requests_processing"
    assert otel_name("vllm:prompt_tokens_total") == "vllm.prompt_tokens_total"
    assert otel_name("tgi_queue_size") == "tgi_queue_size"
    assert otel_name("_private:x") == "private.x"
    assert otel_name("x" * 300) is None


def test_counters_keep_their_written_name_and_summaries_only_sum_and_count() -> None:
    found = {(name, kind) for name, kind, *_ in _samples((FIXTURES / "tgi_metrics.txt").read_text())}
    assert ("tgi_request_count", COUNTER) in found  # not the parser's tgi_request_count_total
    assert ("tgi_queue_size", GAUGE) in found
    assert {("tgi_request_duration_sum", COUNTER), ("tgi_request_duration_count", COUNTER)} <= found
    assert not {name for name, _ in found if name.endswith("_bucket") or name == "tgi_request_duration"}


def test_created_timestamps_and_values_that_are_not_finite_are_skipped() -> None:
    vllm = _samples((FIXTURES / "vllm_metrics.txt").read_text())
    assert vllm and not [name for name, *_ in vllm if name.endswith("_created")]
    text = "# TYPE g gauge\ng NaN\n# TYPE h gauge\nh{x=\"1\"} 2\n"
    assert _samples(text) == [("h", GAUGE, {"x": "1"}, 2.0, "")]


def test_names_in_lists_the_written_sample_names() -> None:
    assert names_in("# HELP a x\na{l=\"1\"} 1\n\n b 2\n") == {"a", "b"}


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[tuple[Any, ...], str, int]] = []

    def __call__(self, key: tuple[Any, ...], message: str, level: int) -> None:
        self.lines.append((key, message, level))


def test_one_instrument_per_name_and_a_series_of_another_kind_is_dropped() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    servers: list[dict[str, list[Point]]] = []
    log = _Log()
    reemitter = Reemitter(provider.get_meter("t"), lambda: servers, log)
    reemitter.reserve("llm.runtime.requests.running")
    attrs = {"server.port": 8000}
    first = reemitter.series([("vllm:x", GAUGE, {"l": "a"}, 1.0, "help")], attrs, "http://h:8000")
    assert first == {"vllm.x": [(1.0, {"l": "a", "server.port": 8000})]}
    servers.append(first)
    again = reemitter.series([("vllm:x", COUNTER, {}, 2.0, ""), ("llm.runtime.requests.running", GAUGE, {}, 3.0, "")],
                             attrs, "http://h:8000")
    assert again == {"llm.runtime.requests.running": [(3.0, {"server.port": 8000})]}
    assert [(key, level) for key, _, level in log.lines] == [(("kind", "vllm.x", COUNTER), logging.WARNING)]
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert [p.value for p in metrics["vllm.x"].data.data_points] == [1.0]
    assert "llm.runtime.requests.running" not in metrics  # reserved: made elsewhere
    provider.shutdown()
