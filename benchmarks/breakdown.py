"""Where otel_llm's per-call CPU goes, measured in one process.

1. The SDK's own cost of one histogram record (warm, back to back), with 0, 3 and 7 attributes
   and with an exemplar: the floor under each of the records a model call makes.
2. Added CPU per non-streamed openai call (llama.cpp flavour of the simulator: native counters
   on every call), interleaved in rounds: the official httpx instrumentation (httpx2, as the
   openai client sends through it), otel_llm, and otel_llm with its metric records switched off.
3. Added CPU per streamed chunk with raw async httpx, slope between 256- and 16-token streams,
   while the consumer does ``--busy`` JSON parses per chunk (as a client like openai does): how
   much the application's own per-chunk work makes otel_llm's few lines per chunk run cold.

    python benchmarks/breakdown.py [--rounds 9] [--calls 200] [--streams 20] [--busy 12]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from typing import Any, Callable, Sequence

import httpx
import openai
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import otel_llm
from otel_llm.telemetry.metrics import CallMetrics
from otel_llm.tools.sim import SimProcess

_EVENT = (b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
          b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}')


class _NoopExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def record_costs(count: int = 20000) -> dict[str, float]:
    """Microseconds per SDK histogram record, warm."""
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("breakdown")
    histogram = meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=[0.01 * i for i in range(14)])
    attrs7 = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
              "gen_ai.response.model": "m", "server.address": "127.0.0.1", "server.port": 8080, "error.type": "500"}
    attrs3 = dict(list(attrs7.items())[:3])
    plain = Context({"breakdown": True})
    linked = trace.set_span_in_context(NonRecordingSpan(SpanContext(1, 1, False, TraceFlags(1))), plain)
    cases = {"0 attributes": ({}, plain), "3 attributes": (attrs3, plain), "7 attributes": (attrs7, plain),
             "7 attributes + exemplar": (attrs7, linked)}
    costs = {}
    for name, (attrs, context) in cases.items():
        for _ in range(2):  # the second pass is the warm one
            start = time.process_time()
            for _ in range(count):
                histogram.record(0.5, attrs, context)
            costs[name] = (time.process_time() - start) / count * 1e6
    return costs


class _Config:
    def __init__(self, name: str, enable: Callable[[], None], disable: Callable[[], None]) -> None:
        self.name, self.enable, self.disable = name, enable, disable


def _configs(tracer_provider: TracerProvider, meter_provider: MeterProvider) -> list[_Config]:
    def otel_llm_on() -> None:
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

    original = CallMetrics.record

    def no_metrics_on() -> None:
        CallMetrics.record = lambda *args, **kwargs: None  # type: ignore[method-assign]
        otel_llm_on()

    def no_metrics_off() -> None:
        otel_llm.uninstrument()
        CallMetrics.record = original  # type: ignore[method-assign]

    official = HTTPX2ClientInstrumentor()
    return [
        _Config("none", lambda: None, lambda: None),
        _Config("httpx-official", lambda: official.instrument(tracer_provider=tracer_provider,
                                                              meter_provider=meter_provider), official.uninstrument),
        _Config("otel_llm", otel_llm_on, otel_llm.uninstrument),
        _Config("otel_llm, no metric records", no_metrics_on, no_metrics_off),
    ]


def per_call(base_url: str, rounds: int, calls: int) -> dict[str, list[float]]:
    """Added CPU (us) per non-streamed openai call, per round, for each configuration."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_NoopExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

    def call() -> None:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16)

    configs = _configs(tracer_provider, meter_provider)
    cpu: dict[str, list[float]] = {c.name: [] for c in configs}
    for index in range(rounds):
        for config in configs[index % len(configs):] + configs[:index % len(configs)]:
            config.enable()
            try:
                for _ in range(20):
                    call()
                tracer_provider.force_flush()
                gc.collect()
                start = time.process_time()
                for _ in range(calls):
                    call()
                tracer_provider.force_flush()
                cpu[config.name].append((time.process_time() - start) / calls * 1e6)
            finally:
                config.disable()
    return {name: [v - n for v, n in zip(values, cpu["none"])] for name, values in cpu.items() if name != "none"}


async def _stream_block(client: httpx.AsyncClient, url: str, tokens: int, streams: int, busy: int) -> tuple[float, int]:
    body = {"model": "m", "stream": True, "max_tokens": tokens, "messages": [{"role": "user", "content": "hi"}]}
    chunks = 0
    start = time.process_time()
    for _ in range(streams):
        async with client.stream("POST", url, json=body) as response:
            async for _ in response.aiter_raw():
                chunks += 1
                for _ in range(busy):
                    json.loads(_EVENT)
    return time.process_time() - start, chunks


async def _per_chunk(url: str, rounds: int, streams: int, busy: int) -> list[float]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_NoopExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    slopes: dict[bool, list[float]] = {False: [], True: []}
    async with httpx.AsyncClient() as client:
        for index in range(rounds):
            for instrumented in ((False, True) if index % 2 == 0 else (True, False)):
                if instrumented:
                    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
                try:
                    figures = {}
                    for tokens in (256, 16):
                        await _stream_block(client, url, tokens, 1, busy)
                        gc.collect()
                        figures[tokens] = await _stream_block(client, url, tokens, streams, busy)
                        tracer_provider.force_flush()
                finally:
                    if instrumented:
                        otel_llm.uninstrument()
                (long_cpu, long_chunks), (short_cpu, short_chunks) = figures[256], figures[16]
                slopes[instrumented].append((long_cpu - short_cpu) / (long_chunks - short_chunks) * 1e6)
    return [on - off for on, off in zip(slopes[True], slopes[False])]


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f} us (rounds {min(values):.2f} to {max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--busy", type=int, default=12, help="JSON parses per chunk in the busy consumer")
    args = parser.parse_args(argv)
    print("SDK histogram record, warm:")
    for name, cost in record_costs().items():
        print(f"  {name:28s} {cost:6.2f} us")
    with SimProcess(runtime="llama.cpp", headers_delay=0.0, first_token_delay=0.0, token_interval=0.0,
                    tokens=256) as sim:
        added = per_call(sim.base_url, args.rounds, args.calls)
        print(f"added CPU per non-streamed openai call (median of {args.rounds} rounds):")
        for name, values in added.items():
            print(f"  {name:28s} {_summary(values)}")
        url = f"{sim.base_url}/v1/chat/completions"
        for busy in (0, args.busy):
            chunk = asyncio.run(_per_chunk(url, args.rounds, args.streams, busy))
            print(f"otel_llm added CPU per chunk, async httpx, consumer doing {busy} JSON parses per chunk: "
                  f"{_summary(chunk)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
