"""The smallest useful setup: one line of otel_llm in an application that calls a model.

Starts the real llama.cpp server (otel_llm_testing; built once, about 8 minutes the first time),
then makes one streamed call with the openai client. With no backend configured, otel_llm prints
a summary line per call on stderr and appends the spans to otel-llm-traces.jsonl; set
OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector instead.

    python examples/quickstart.py && otel-llm view --last 1
"""

from __future__ import annotations

import openai

import otel_llm
from otel_llm_testing import LlamaServer


def main() -> int:
    otel_llm.instrument(service_name="quickstart")  # the one line
    with LlamaServer() as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        stream = client.chat.completions.create(
            model="gemma-3-270m", messages=[{"role": "user", "content": "Say hello in French."}],
            max_tokens=16, stream=True, stream_options={"include_usage": True})
        print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    otel_llm.uninstrument()  # flushes; at process exit this happens by itself
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
