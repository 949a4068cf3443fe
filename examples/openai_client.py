"""Trace a streamed chat with the official ``openai`` client against any OpenAI-compatible server.

Ollama (``/v1``), llama.cpp's ``llama-server``, vLLM, SGLang, LM Studio, TGI... all serve
``/v1/chat/completions``. One line, ``otel_llm.instrument()``, turns the call into a trace: the
CLIENT span ``chat <model>`` with its phases (connect, upload, server wait, first token, decode).

    python examples/openai_client.py                        # Ollama on http://127.0.0.1:11434
    OTEL_LLM_EXAMPLE_URL=http://127.0.0.1:8080 OTEL_LLM_EXAMPLE_MODEL=any \\
        python examples/openai_client.py                    # llama-server
    otel-llm view --last 1                                  # the call as a waterfall

With no backend configured the spans go to ``otel-llm-traces.jsonl`` and a summary line per call
is printed on stderr; set ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_LLM_ENDPOINT``) to send
them to a collector instead.
"""

from __future__ import annotations

import os
import sys

import openai

import otel_llm

# The server's base URL (without /v1) and a model it serves; argv[1] overrides the URL.
URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")


def main() -> int:
    otel_llm.instrument(service_name="openai-client-example")  # before or after creating clients

    # Local servers ignore the key; it is never recorded in any span either way.
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Why is the sky blue? One sentence."}],
        max_tokens=64,
        stream=True,
        # ask for token usage in the last chunk: it becomes gen_ai.usage.* on the span
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()

    otel_llm.uninstrument()  # flushes the spans (at process exit this happens by itself)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
