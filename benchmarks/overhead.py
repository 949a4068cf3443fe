"""CPU that otel_llm adds per model call and per streamed chunk, next to the official httpx
instrumentation (one span per request) as the reference, on each HTTP stack it hooks.

One run, on loopback, the simulator in another process with zero injected delays. Configurations
are alternated in rounds (none, official httpx instrumentation, otel_llm, rotated), and CPU is
``time.process_time()`` of this process, so the BatchSpanProcessor's export thread is included
(each measured block ends with ``force_flush()``). Both instrumented configurations export to
the same no-op exporter and record metrics into an SDK MeterProvider.

Per call: non-streamed chat calls. Per chunk: the slope between streamed calls of 16 and of
1024 tokens, divided by the difference in network chunks actually received, so per-call costs
cancel out. Stacks: httpx (sync), aiohttp (``ClientSession``, one event loop per block) and
requests (a ``Session``, on urllib3); each gets the same workloads, and the aiohttp and requests
paths' added CPU is compared with the httpx path's within each round.

    python benchmarks/overhead.py [--rounds 7] [--calls 300] [--streams 40] [--stacks httpx,aiohttp,requests]
"""

from __future__ import annotations

import argparse
import asyncio
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
from otel_llm.tools.sim import SimProcess

SHORT, LONG = 16, 1024
STACKS = ("httpx", "aiohttp", "requests")
# network chunks received per streamed call, by stack and tokens
CHUNKS: dict[str, dict[int, list[int]]] = {stack: {SHORT: [], LONG: []} for stack in STACKS}
CONFIGS = ("none", "httpx-official", "otel_llm")
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


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


Work = Callable[[str, int], None]  # (url, calls) -> None: one block of calls on one client


def _httpx(tokens: int | None) -> Work:
    def run(url: str, calls: int) -> None:
        with httpx.Client() as client:
            for _ in range(calls):
                if tokens is None:
                    client.post(url, json={**BODY, "max_tokens": SHORT}).read()
                    continue
                chunks = 0
                with client.stream("POST", url, json={**BODY, "stream": True, "max_tokens": tokens}) as response:
                    for _ in response.iter_raw():
                        chunks += 1
                CHUNKS["httpx"][tokens].append(chunks)
    return run


def _aiohttp(tokens: int | None) -> Work:
    import aiohttp

    async def block(url: str, calls: int) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(calls):
                if tokens is None:
                    async with session.post(url, json={**BODY, "max_tokens": SHORT}) as response:
                        await response.read()
                    continue
                chunks = 0
                async with session.post(url, json={**BODY, "stream": True, "max_tokens": tokens}) as response:
                    async for _ in response.content.iter_any():
                        chunks += 1
                CHUNKS["aiohttp"][tokens].append(chunks)

    return lambda url, calls: asyncio.run(block(url, calls))


def _requests(tokens: int | None) -> Work:
    import requests

    def run(url: str, calls: int) -> None:
        with requests.Session() as session:
            for _ in range(calls):
                if tokens is None:
                    _ = session.post(url, json={**BODY, "max_tokens": SHORT}).content
                    continue
                chunks = 0
                with session.post(url, json={**BODY, "stream": True, "max_tokens": tokens}, stream=True) as response:
                    for _ in response.iter_content(None):
                        chunks += 1
                CHUNKS["requests"][tokens].append(chunks)
    return run


WORKLOADS = {"httpx": _httpx, "aiohttp": _aiohttp, "requests": _requests}


def cpu_per_call(config: Config, work: Work, url: str, calls: int) -> float:
    config.enable()
    try:
        work(url, 3)  # warm-up: imports, connections, caches
        config.flush()
        gc.collect()
        start = time.process_time()
        work(url, calls)
        config.flush()
        return (time.process_time() - start) / calls
    finally:
        config.disable()


Results = dict[str, dict[str, dict[str, list[float]]]]  # stack -> configuration -> workload -> CPU per call


def measure(url: str, rounds: int, calls: int, streams: int, stacks: Sequence[str]) -> Results:
    configs = [Config(name) for name in CONFIGS]
    results: Results = {}
    for stack in stacks:
        names = CONFIGS if stack == "httpx" else ("none", "otel_llm")  # the official one hooks httpx only
        results[stack] = {name: {"call": [], "short": [], "long": []} for name in names}
    for round_index in range(rounds):
        order = configs[round_index % len(configs):] + configs[:round_index % len(configs)]
        for config in order:
            for stack in stacks:
                if config.name not in results[stack]:
                    continue
                make = WORKLOADS[stack]
                for workload, work, count in (("call", make(None), calls), ("short", make(SHORT), streams),
                                              ("long", make(LONG), streams)):
                    results[stack][config.name][workload].append(cpu_per_call(config, work, url, count))
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr)
    return results


def _added(stack_results: dict[str, dict[str, list[float]]], name: str, stack: str) -> tuple[list[float], list[float]]:
    """Per round: the added CPU per call, and per chunk, of configuration ``name``."""
    none, ours = stack_results["none"], stack_results[name]
    chunks = CHUNKS[stack]
    delta = statistics.mean(chunks[LONG]) - statistics.mean(chunks[SHORT])
    per_call = [o - n for o, n in zip(ours["call"], none["call"])]
    per_chunk = [((ol - nl) - (os_ - ns)) / delta
                 for ol, nl, os_, ns in zip(ours["long"], none["long"], ours["short"], none["short"])]
    return per_call, per_chunk


def _ratio(values: list[float], reference: list[float]) -> tuple[str, str]:
    """The median over rounds of ``values / reference``, formatted; a round whose reference is not
    positive (the noise of a busy machine exceeded the overhead) cannot give a ratio."""
    ratios = sorted(v / r for v, r in zip(values, reference) if r > 0)
    if not ratios:
        return "n/a", "no round with a positive reference: too noisy, rerun with more --rounds/--calls"
    return f"{statistics.median(ratios):.2f}x", f"rounds {ratios[0]:.2f}-{ratios[-1]:.2f}"


def report(results: Results) -> None:
    print(f"{'stack':9s} {'configuration':16s} {'baseline per call':>18s} {'added per call':>15s} "
          f"{'added per chunk':>16s}  chunks per stream")
    added: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for stack, stack_results in results.items():
        base = statistics.median(stack_results["none"]["call"])
        chunks = CHUNKS[stack]
        for name in stack_results:
            if name == "none":
                continue
            added[stack, name] = per_call, per_chunk = _added(stack_results, name, stack)
            print(f"{stack:9s} {name:16s} {base * 1e6:15.1f} us {statistics.median(per_call) * 1e6:12.1f} us "
                  f"{statistics.median(per_chunk) * 1e6:13.2f} us  {statistics.mean(chunks[SHORT]):.0f} "
                  f"({SHORT} tokens), {statistics.mean(chunks[LONG]):.0f} ({LONG} tokens)")
    if ("httpx", "otel_llm") not in added:
        return
    ours_call, ours_chunk = added["httpx", "otel_llm"]
    # Ratios are taken within each round (both configurations measured minutes apart at most),
    # then the median over rounds: drifts of the machine between rounds cancel out.
    ratio, spread = _ratio(ours_call, added["httpx", "httpx-official"][0])
    print(f"otel_llm / httpx-official, added CPU per call: {ratio} ({spread}; target <= 1.5x)")
    print(f"otel_llm added CPU per streamed chunk: {statistics.median(ours_chunk) * 1e6:.2f} us (target <= 2 us)")
    for stack in ("aiohttp", "requests"):
        if (stack, "otel_llm") not in added:
            continue
        stack_call, stack_chunk = added[stack, "otel_llm"]
        call_ratio, call_spread = _ratio(stack_call, ours_call)
        chunk_ratio, chunk_spread = _ratio(stack_chunk, ours_chunk)
        print(f"{stack} path / httpx path, otel_llm's added CPU: per call {call_ratio} ({call_spread}), "
              f"per chunk {chunk_ratio} ({chunk_spread}); target <= 1.5x each")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--stacks", default=",".join(STACKS), help="comma-separated: " + ", ".join(STACKS))
    args = parser.parse_args(argv)
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    unknown = sorted(set(stacks) - set(STACKS))
    if unknown or not stacks:
        parser.error(f"unknown stack(s): {', '.join(unknown) or 'none given'}")
    with SimProcess(headers_delay=0.0, first_token_delay=0.0, token_interval=0.0, tokens=LONG) as sim:
        url = f"{sim.base_url}/v1/chat/completions"
        results = measure(url, args.rounds, args.calls, args.streams, stacks)
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
