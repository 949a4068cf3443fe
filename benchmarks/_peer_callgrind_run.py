"""One measured run of ``benchmarks/instructions.py --peers``, under callgrind: instrument as
``_peers_worker.py`` does for ``peers.py`` (same configurations, same no-op pipeline), make
three warm-up calls, then COUNT calls of one workload, and flush the span pipeline.

    python _peer_callgrind_run.py CONFIG CLIENT KIND TOKENS COUNT BASE_URL CONTENT

CLIENT is httpx or openai; KIND is call, stream or async (streams one after another on an
async client, so per chunk is measured on the event-loop path). Imports only what the worker
imports, so it runs under each peer's virtualenv.

CONFIG ``sdk-floor`` measures what otel_llm's telemetry costs in the OpenTelemetry SDK alone:
one call of the workload is made instrumented, its finished spans and histogram records are
kept, and every later "call" replays exactly those SDK calls with no model call at all: the same
finished spans handed to the span processors as otel_llm hands them over, and the same records
into otel_llm's own instruments (names, buckets, attributes, contexts).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peers_worker as worker


def runner(clients: worker.Clients, client: str, kind: str, tokens: int) -> Callable[[int], None]:
    """A function that makes ``n`` calls of the workload."""
    if kind == "async":
        make, one, _close = worker._async_runner(clients, client)
        loop = asyncio.new_event_loop()
        session = loop.run_until_complete(_made(make))

        async def block(n: int) -> None:
            for _ in range(n):
                await one(session, tokens)

        return lambda n: loop.run_until_complete(block(n))
    call = getattr(clients, f"{client}_{kind}")

    def run(n: int) -> None:
        for _ in range(n):
            call(tokens)

    return run


async def _made(make: Callable[[], object]) -> object:
    return make()  # an async client is made inside a running loop


def sdk_floor(clients: worker.Clients, client: str, kind: str, tokens: int) -> Callable[[int], None]:
    """A function that replays ``n`` times the SDK calls otel_llm made for one call."""
    spans, records = _record_one(clients, client, kind, tokens)
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Status, StatusCode

    from otel_llm.telemetry.inflight import InFlight
    from otel_llm.telemetry.metrics import CallMetrics
    from otel_llm.telemetry.spans import SdkSpanSink

    pipeline = worker.Pipeline()
    tracer_provider, meter_provider = pipeline.sdk_providers()
    sink = SdkSpanSink(tracer_provider.get_tracer("otel_llm"))  # how otel_llm hands its spans over
    metrics = CallMetrics(meter_provider, InFlight())  # otel_llm's own instruments, same buckets
    instruments = {h.name: h for h in vars(metrics).values() if hasattr(h, "record")}
    no_span = Context({"otel_llm.no_span": True})
    status = Status(StatusCode.UNSET)

    def replay() -> None:
        linked = no_span
        for context, parent, name, span_kind, attributes, start, end in spans:
            sink.emit(name, context, parent, span_kind, attributes, start, end, status)
            if parent is None or not parent.is_valid:
                linked = trace.set_span_in_context(trace.NonRecordingSpan(context), no_span)
        for name, value, attributes, in_span in records:
            instruments[name].record(value, attributes, linked if in_span else no_span)

    def run(n: int) -> None:
        for _ in range(n):
            replay()

    return run


def _record_one(clients: worker.Clients, client: str, kind: str, tokens: int) -> tuple[list, list]:
    """(spans as (context, parent context, name, kind, attributes, start, end), histogram records
    as (instrument, value, attributes, in the call span's context)) of one call."""
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics._internal.instrument import Histogram
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    import otel_llm

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    records: list = []
    original = Histogram.record

    def record(self: Histogram, amount: float, attributes: dict | None = None, context: object = None) -> None:
        in_span = trace.get_current_span(context).get_span_context().is_valid
        records.append((self.name, amount, dict(attributes or {}), in_span))
        original(self, amount, attributes, context)

    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(),
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    runner(clients, client, kind, tokens)(1)  # a first call: connection set up, routes learned
    otel_llm.uninstrument()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(),
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    exporter.clear()
    Histogram.record = record
    try:
        runner(clients, client, kind, tokens)(1)
    finally:
        Histogram.record = original
        otel_llm.uninstrument()
    spans = [(s.context, s.parent, s.name, s.kind, dict(s.attributes), s.start_time, s.end_time)
             for s in exporter.get_finished_spans()]
    return spans, records


def main(argv: list[str]) -> int:
    config, client, kind, tokens, count, base_url, content = argv
    if config == "sdk-floor":
        run = sdk_floor(worker.Clients(base_url, "m"), client, kind, int(tokens))
        pipeline = None
    else:
        pipeline = worker.Pipeline()
        worker.setup(config, pipeline, content == "1")
        run = runner(worker.Clients(base_url, "m"), client, kind, int(tokens))
    run(3)
    settle()
    run(int(count))
    if pipeline is not None:
        pipeline.flush()
        spans_file = os.environ.get("INSTRUCTIONS_SPANS_FILE")
        if spans_file:  # every span exported since setup, warm-up included (the parent takes differences)
            Path(spans_file).write_text(str(pipeline.count))
    return 0


def settle() -> None:
    """Collect, then move every object that survived the warm-up out of the collector's reach.
    A full collection walks the whole heap (the openai client and pydantic make it large), and
    whether one falls inside the N-call or the 2N-call run varies: it moved a difference by
    several million instructions per call. The collections of what the calls themselves
    allocate still run and are counted."""
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
