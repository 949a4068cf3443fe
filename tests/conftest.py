"""Shared fixtures: in-memory OpenTelemetry providers around an instrumented process, and the
simulator running in its own process (so client and server never share a GIL)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import otel_llm
from otel_llm._log import reset_log_once


@dataclass
class Otel:
    """What an instrumented test can look at."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def calls(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.kind == SpanKind.CLIENT]

    def children(self, call: ReadableSpan, synthesized: bool = False) -> list[ReadableSpan]:
        """The call's phase spans in time order (or its synthesized runtime spans)."""
        kids = [s for s in self.spans() if s.parent is not None and s.parent.span_id == call.context.span_id
                and bool((s.attributes or {}).get("llm.synthesized")) == synthesized]
        return sorted(kids, key=lambda s: s.start_time)

    def one_call(self) -> tuple[ReadableSpan, list[ReadableSpan]]:
        calls = self.calls()
        assert len(calls) == 1, [c.name for c in calls]
        return calls[0], self.children(calls[0])

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource_metrics in data.resource_metrics if data else []:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def clear(self) -> None:
        self.exporter.clear()


def make_otel() -> Otel:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return Otel(exporter, reader, tracer_provider, MeterProvider(metric_readers=[reader]))


@pytest.fixture
def otel() -> Iterator[Otel]:
    """An instrumented process whose spans and metrics stay in memory."""
    reset_log_once()
    state = make_otel()
    # observers have their own tests; here they would only add background threads and probes
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    try:
        yield state
    finally:
        otel_llm.uninstrument()
        gc.collect()


@pytest.fixture(scope="session")
def sim_process() -> Iterator[Any]:
    from otel_llm.sim import SimProcess

    with SimProcess() as sim:
        yield sim


@pytest.fixture
def sim(sim_process: Any) -> Iterator[Any]:
    """The simulator, reset to its start configuration before each test."""
    httpx.post(f"{sim_process.base_url}/sim/reset", timeout=10).raise_for_status()
    yield sim_process


def configure_sim(sim: Any, **fields: Any) -> None:
    httpx.post(f"{sim.base_url}/sim/config", json=fields, timeout=10).raise_for_status()


def sim_stats(sim: Any) -> dict[str, Any]:
    return httpx.get(f"{sim.base_url}/sim/stats", timeout=10).json()
