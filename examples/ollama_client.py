"""Trace calls made with the ``ollama`` client against Ollama's native API.

Ollama reports its own counters in the final message of every answer (``load_duration``,
``prompt_eval_duration``, ``eval_duration``...). otel_llm reads them and adds ``runtime.load``,
``runtime.prefill`` and ``runtime.decode`` spans beside the client's phases, so a cold model load
shows up as such instead of as a long "server wait".

    ollama pull llama3.2 && python examples/ollama_client.py
    otel-llm view --last 2

``OTEL_LLM_EXAMPLE_URL`` (or argv[1]) and ``OTEL_LLM_EXAMPLE_MODEL`` choose another server/model.
"""

from __future__ import annotations

import os
import sys

import ollama

import otel_llm

URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")


def main() -> int:
    otel_llm.instrument(service_name="ollama-client-example")
    client = ollama.Client(host=URL)
    messages = [{"role": "user", "content": "Name three colours."}]

    # 1. streamed /api/chat: the span has llm.first_token and llm.decode phases
    for part in client.chat(model=MODEL, messages=messages, stream=True):
        print(part.message.content, end="", flush=True)
    print()

    # 2. not streamed /api/generate: all the work shows as llm.server_wait, then http.download;
    #    the runtime.* spans still tell prefill from decode
    reply = client.generate(model=MODEL, prompt="Say OK.", options={"num_predict": 8})
    print(reply.response)

    otel_llm.uninstrument()  # flush
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
