"""Trace several concurrent streamed calls made with ``openai.AsyncOpenAI`` and asyncio.

Each call gets its own trace; calls that overlap record how many others were in flight
(``llm.diagnosis.concurrent_requests``), which is how a server that runs one generation at a
time (one llama.cpp slot, ``OLLAMA_NUM_PARALLEL=1``) shows up: the later calls wait in
``llm.server_wait`` while the first one decodes.

    python examples/async_streaming.py [N]        # N concurrent streams, default 3
    otel-llm view --last 3

``OTEL_LLM_EXAMPLE_URL`` and ``OTEL_LLM_EXAMPLE_MODEL`` choose the server (default: Ollama on
http://127.0.0.1:11434) and the model.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import openai

import otel_llm

URL = os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")
QUESTIONS = ["What is a photon?", "What is a phonon?", "What is a gluon?", "What is a muon?"]


async def ask(client: openai.AsyncOpenAI, number: int, question: str) -> None:
    started = time.perf_counter()
    first_token = None
    parts = []
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=48, stream=True,
        stream_options={"include_usage": True})
    async for chunk in stream:  # every chunk is timed by otel_llm as it arrives
        if chunk.choices and chunk.choices[0].delta.content:
            first_token = first_token or time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
    total = time.perf_counter() - started
    print(f"stream {number}: first token after {first_token or 0:.3f} s, done after {total:.3f} s: "
          f"{''.join(parts)[:60]!r}")


async def run(streams: int) -> None:
    async with openai.AsyncOpenAI(base_url=f"{URL}/v1", api_key="unused") as client:
        await asyncio.gather(*(ask(client, i + 1, QUESTIONS[i % len(QUESTIONS)]) for i in range(streams)))


def main() -> int:
    otel_llm.instrument(service_name="async-streaming-example")  # hooks httpx's async transport too
    asyncio.run(run(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
    otel_llm.uninstrument()  # flush
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
