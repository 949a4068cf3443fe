"""The instruments of fixed name: the normalized state and Ollama's loaded models, per server."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm import semconv as sc
from otel_llm.observers import _runtime_gauges
from otel_llm.observers._ollama_ps import LoadedModel
from otel_llm.observers._runtime_prometheus import Reemitter
from otel_llm.observers._runtime_server import ServerState
from otel_llm.parse.runtimes import STATE_REQUESTS_RUNNING


def test_gauges_report_each_servers_state() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("t")
    states = {("h", 1): ServerState(runtime="vllm", normalized={STATE_REQUESTS_RUNNING: 3}),
              ("h", 2): ServerState(runtime="ollama", models=(
                  LoadedModel("m", 100, 40, time.time() + 60), LoadedModel("n", None, None, None)))}
    _runtime_gauges.register(meter, lambda: list(states.items()), Reemitter(meter, lambda: [], lambda *a: None))
    data = reader.get_metrics_data()
    points: dict[str, list[tuple[Any, dict[str, Any]]]] = {
        m.name: [(p.value, dict(p.attributes)) for p in m.data.data_points]
        for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert points[sc.METRIC_RUNTIME_REQUESTS_RUNNING] == [
        (3, {sc.SERVER_ADDRESS: "h", sc.SERVER_PORT: 1, sc.LLM_RUNTIME_NAME: "vllm"})]
    assert sorted(a[sc.GEN_AI_REQUEST_MODEL] for _, a in points[sc.METRIC_RUNTIME_MODEL_LOADED]) == ["m", "n"]
    assert sorted((v, a[sc.LLM_RUNTIME_MEMORY_LOCATION]) for v, a in points[sc.METRIC_RUNTIME_MODEL_MEMORY]) == [
        (40, "vram"), (100, "total")]
    ((expires, _),) = points[sc.METRIC_RUNTIME_MODEL_EXPIRES_IN]
    assert 55 < expires <= 60
    assert sc.METRIC_RUNTIME_KV_CACHE_USAGE not in points or not points[sc.METRIC_RUNTIME_KV_CACHE_USAGE]
    provider.shutdown()
