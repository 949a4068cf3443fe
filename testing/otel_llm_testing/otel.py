"""In-memory OpenTelemetry providers, and what a test reads from them (spans, phases, metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

__all__ = ["Otel", "make_otel", "until_recognized"]


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
    """Fresh in-memory providers: a span exporter behind a simple processor, a metric reader."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return Otel(exporter, reader, tracer_provider, MeterProvider(metric_readers=[reader]))


def until_recognized(host: str, port: int, timeout: float = 30.0) -> str | None:
    """Wait (bounded) for the running session's observers to recognize the server at host:port;
    they do it on their own thread, from /proc and the server's own endpoints, so on a loaded
    machine calls made at once may come before it. Returns the runtime, or None at the deadline."""
    import otel_llm

    session = otel_llm.current_session()
    assert session is not None and session.observers is not None, "no running session with observers"
    deadline = time.monotonic() + timeout
    while (runtime := session.observers.runtime_of(host, port)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return runtime
