"""The load generator's own CPU per stream through each client ``otel-llm bench`` can send with.

    python benchmarks/bench_clients.py [--streams N] [--tokens N]

Streams of ``--tokens`` tokens from the simulator (another process, no delays) at concurrency 4,
read and parsed as the bench reads them, through aiohttp and httpx, with otel_llm instrumented
and without; each configuration in a fresh child process. Prints the client's CPU time per
stream (``time.process_time``), the figure behind ``--http-client``'s default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

CONCURRENCY = 4


async def _streams(url: str, client: str, streams: int, tokens: int) -> float:
    body = {"model": "sim-model", "prompt": "hello " * 100, "max_tokens": tokens, "stream": True, "ignore_eos": True}
    if client == "httpx":
        import httpx

        session = httpx.AsyncClient(timeout=60, trust_env=False)

        async def one() -> None:
            async with session.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        json.loads(line[6:])
    else:
        import aiohttp

        session = aiohttp.ClientSession(trust_env=False)

        async def one() -> None:
            async with session.post(url + "/v1/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        json.loads(line[6:])

    async def worker(n: int) -> None:
        for _ in range(n):
            await one()

    await worker(2)  # connections and imports warm
    cpu0 = time.process_time()
    await asyncio.gather(*(worker(streams // CONCURRENCY) for _ in range(CONCURRENCY)))
    cpu = time.process_time() - cpu0
    await (session.aclose() if client == "httpx" else session.close())  # type: ignore[union-attr]
    return cpu / (streams // CONCURRENCY * CONCURRENCY)


def child(url: str, client: str, instrumented: bool, streams: int, tokens: int) -> None:
    if instrumented:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        import otel_llm

        otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(),
                            host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    print(asyncio.run(_streams(url, client, streams, tokens)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=120)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    from otel_llm.tools.sim import SimProcess

    with SimProcess(runtime="vllm", headers_delay=0.0, first_token_delay=0.0, token_interval=0.0,
                    tokens=args.tokens) as sim:
        for client in ("aiohttp", "httpx"):
            for instrumented in (False, True):
                out = subprocess.run([sys.executable, __file__, "--child", sim.base_url, client, str(int(instrumented)),
                                      str(args.streams), str(args.tokens)], capture_output=True, text=True, check=True)
                per = float(out.stdout.strip().splitlines()[-1])
                print(f"{client:<8} otel_llm {'on ' if instrumented else 'off'}  client CPU per {args.tokens}-token "
                      f"stream: {per * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, client, instrumented, streams, tokens = sys.argv[2:7]
        child(url, client, instrumented == "1", int(streams), int(tokens))
        sys.exit(0)
    sys.exit(main())
