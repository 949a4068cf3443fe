"""CPU that otel_llm adds per model call and per streamed chunk, next to the official httpx
instrumentation (one span per request) as the reference.

One run, on loopback, the simulator in another process with zero injected delays. Configurations
are alternated in rounds (none, official httpx instrumentation, otel_llm, rotated), and CPU is
``time.process_time()`` of this process, so the BatchSpanProcessor's export thread is included
(each measured block ends with ``force_flush()``). Both instrumented configurations export to
the same no-op exporter and record metrics into an SDK MeterProvider.

Per call: non-streamed chat calls. Per chunk: the slope between streamed calls of 16 and of
1024 tokens, divided by the difference in network chunks actually received, so per-call costs
cancel out.

    python benchmarks/overhead.py [--rounds 7] [--calls 300] [--streams 40]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import httpx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import otel_llm
from otel_llm.sim import SimProcess

SHORT, LONG = 16, 1024
CHUNKS: dict[int, list[int]] = {SHORT: [], LONG: []}  # network chunks received per streamed call
CONFIGS = ("none", "httpx-official", "otel_llm")


class NoopExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


class Config:
    """Turns one configuration on and off, with its own providers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.exporter = NoopExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def enable(self) -> None:
        if self.name == "httpx-official":
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

            HTTPXClientInstrumentor().instrument(
                tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)
        elif self.name == "otel_llm":
            otel_llm.instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def disable(self) -> None:
        if self.name == "httpx-official":
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

            HTTPXClientInstrumentor().uninstrument()
        elif self.name == "otel_llm":
            otel_llm.uninstrument()

    def flush(self) -> None:
        self.tracer_provider.force_flush()


def non_streamed(client: httpx.Client, url: str) -> None:
    response = client.post(url, json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": SHORT})
    response.read()


def streamed(tokens: int) -> Callable[[httpx.Client, str], None]:
    def run(client: httpx.Client, url: str) -> None:
        body = {"model": "m", "stream": True, "max_tokens": tokens,
                "messages": [{"role": "user", "content": "hi"}]}
        chunks = 0
        with client.stream("POST", url, json=body) as response:
            for _ in response.iter_raw():
                chunks += 1
        CHUNKS[tokens].append(chunks)
    return run


def cpu_per_call(config: Config, work: Callable[[httpx.Client, str], None], url: str, calls: int) -> float:
    config.enable()
    try:
        with httpx.Client() as client:
            for _ in range(5):
                work(client, url)
            config.flush()
            gc.collect()
            start = time.process_time()
            for _ in range(calls):
                work(client, url)
            config.flush()
            return (time.process_time() - start) / calls
    finally:
        config.disable()


def measure(url: str, rounds: int, calls: int, streams: int) -> dict[str, dict[str, list[float]]]:
    configs = [Config(name) for name in CONFIGS]
    workloads = {"call": (non_streamed, calls), "short": (streamed(SHORT), streams),
                 "long": (streamed(LONG), streams)}
    results: dict[str, dict[str, list[float]]] = {c.name: {w: [] for w in workloads} for c in configs}
    for round_index in range(rounds):
        order = configs[round_index % len(configs):] + configs[:round_index % len(configs)]
        for config in order:
            for workload, (work, count) in workloads.items():
                results[config.name][workload].append(cpu_per_call(config, work, url, count))
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr)
    return results


def report(results: dict[str, dict[str, list[float]]]) -> None:
    median = {c: {w: statistics.median(v) for w, v in ws.items()} for c, ws in results.items()}
    base = median["none"]
    added = {c: {w: median[c][w] - base[w] for w in base} for c in median if c != "none"}
    print(f"baseline CPU per non-streamed call (no instrumentation): {base['call'] * 1e6:.1f} us")
    print(f"{'configuration':16s} {'added per call':>16s} {'added per chunk':>16s}")
    per_chunk = {}
    chunk_delta = statistics.mean(CHUNKS[LONG]) - statistics.mean(CHUNKS[SHORT])
    print(f"network chunks per streamed call: {statistics.mean(CHUNKS[SHORT]):.0f} ({SHORT} tokens), "
          f"{statistics.mean(CHUNKS[LONG]):.0f} ({LONG} tokens)")
    for name, values in added.items():
        per_chunk[name] = (values["long"] - values["short"]) / chunk_delta
        print(f"{name:16s} {values['call'] * 1e6:13.1f} us {per_chunk[name] * 1e6:13.2f} us")
    # The ratio is taken within each round (both configurations measured minutes apart at most),
    # then the median over rounds: drifts of the machine between rounds cancel out.
    ratios = sorted(
        (ours - none) / (official - none)
        for ours, official, none in zip(results["otel_llm"]["call"], results["httpx-official"]["call"],
                                        results["none"]["call"])
        if official > none
    )
    ratio = statistics.median(ratios) if ratios else float("inf")
    spread = f"rounds {ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios else "no valid round"
    print(f"otel_llm / httpx-official, added CPU per call: {ratio:.2f}x ({spread}; target <= 1.5x)")
    print(f"otel_llm added CPU per streamed chunk: {per_chunk['otel_llm'] * 1e6:.2f} us (target <= 2 us)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--streams", type=int, default=40)
    args = parser.parse_args(argv)
    with SimProcess(headers_delay=0.0, first_token_delay=0.0, token_interval=0.0, tokens=LONG) as sim:
        url = f"{sim.base_url}/v1/chat/completions"
        results = measure(url, args.rounds, args.calls, args.streams)
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
