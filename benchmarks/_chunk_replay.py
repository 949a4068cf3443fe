"""One run of ``benchmarks/instructions.py --replay``, under callgrind: STREAMS streams of the
async openai client, each answered by replaying the network chunks the simulator once sent for a
stream, through httpx2's real transport with its connection pool swapped for one that hands the
recorded chunks back (the request body is still consumed, the response headers are the
simulator's). No socket and no event-loop wake-up depend on timing, so a run counts nearly the
same instructions every time (within about 2 M of 5 G: CPython's type-attribute cache is indexed
by object addresses), where the per-chunk figure of a live stream moved by several k between runs
with how many tokens one read of the socket happened to get.

    python _chunk_replay.py CONFIG WARMUP RECORDING STREAMS

CONFIG is ``none`` or ``otel_llm`` (see ``_instrument``); WARMUP and RECORDING
are JSON files the parent wrote: {"headers": [[name, value], ...], "chunks": [chunk, ...]},
latin-1 text. Three warm-up streams of WARMUP (the same in every run, so that the difference of
two runs is their measured streams alone), then the collector's heap is frozen (see
``_peer_callgrind_run.settle``), then STREAMS streams of RECORDING.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _peer_callgrind_run import settle  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


class _Body:
    """The recorded chunks, one per ``__anext__``, as httpcore2's response stream yields them."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = iter(chunks)

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        for chunk in self._chunks:
            return chunk
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


class _ReplayPool:
    """Stands in for httpcore2's connection pool behind httpx2's transport."""

    def __init__(self, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> None:
        self._headers, self._chunks = headers, chunks

    async def handle_async_request(self, request: Any) -> Any:
        import httpcore2

        async for _ in request.stream:  # the body, read as a pool sending it would
            pass
        return httpcore2.Response(200, headers=self._headers, content=_Body(self._chunks),
                                  extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        pass


def _pool(path: str) -> _ReplayPool:
    recording = json.loads(Path(path).read_text())
    return _ReplayPool([(k.encode("latin-1"), v.encode("latin-1")) for k, v in recording["headers"]],
                       [c.encode("latin-1") for c in recording["chunks"]])


def _instrument() -> None:
    """otel_llm as the peers' workers set it up, minus every thread that could run during the
    streams: spans are exported on the application's thread (a SimpleSpanProcessor into a no-op
    exporter) and the observers are off. A chunk's work involves neither; threads beside it made
    the main thread's count move by millions between identical runs (the collections their
    allocations trigger, the waits of a flush)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    import otel_llm

    class Noop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Noop()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, host_metrics=False,
                        gpu_metrics=False, runtime_metrics=False, console_summary=False)


def main(argv: list[str]) -> int:
    config, warmup, recording, streams = argv[0], _pool(argv[1]), _pool(argv[2]), int(argv[3])
    if config == "otel_llm":
        _instrument()
    import httpx2
    import openai

    transport = httpx2.AsyncHTTPTransport()
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="replay", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=transport))

    async def run(pool: _ReplayPool, count: int) -> None:
        transport._pool = pool  # noqa: SLF001 - the seam this benchmark needs
        for _ in range(count):
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            async for _ in stream:
                pass

    loop = asyncio.new_event_loop()
    loop.run_until_complete(run(warmup, 3))
    settle()
    loop.run_until_complete(run(recording, streams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
