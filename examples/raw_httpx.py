"""Trace a model call made with plain ``httpx``: no SDK needed.

otel_llm hooks httpx's transport, so any POST to a known model route (``/v1/chat/completions``,
``/api/chat``, ``/completion``, ``/generate``...) is traced, whichever code makes it. Routes of
your own are added with ``llm_routes=["/my/route"]`` (or ``OTEL_LLM_LLM_ROUTES``).

    python examples/raw_httpx.py                  # OpenAI-compatible server (Ollama by default)
    otel-llm view --last 1

``OTEL_LLM_EXAMPLE_URL`` (or argv[1]) and ``OTEL_LLM_EXAMPLE_MODEL`` choose another server/model.
"""

from __future__ import annotations

import json
import os
import sys

import httpx

import otel_llm

URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")


def main() -> int:
    otel_llm.instrument(service_name="raw-httpx-example")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 32, "stream": True}
    with httpx.Client(base_url=URL, timeout=120) as client:
        # A streamed response: read it as server-sent events, one "data: {...}" line per chunk.
        # otel_llm times the chunks as your code reads them; the span ends when the body does.
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[len("data: "):]).get("choices") or [{}]
                print(choices[0].get("delta", {}).get("content") or "", end="", flush=True)
        print()
    otel_llm.uninstrument()  # flush
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
