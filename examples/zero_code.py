"""An application that never imports otel_llm, traced with zero code changes.

The otel_llm package registers an ``opentelemetry_instrumentor`` entry point, so OpenTelemetry's
launcher, ``opentelemetry-instrument`` (from ``opentelemetry-instrumentation``, installed with
otel_llm), turns it on before the application starts:

    opentelemetry-instrument python examples/zero_code.py
    otel-llm view --last 1                     # with no backend: the embedded default file

    OTEL_SERVICE_NAME=my-app OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\
        opentelemetry-instrument python examples/zero_code.py          # to a collector (OTLP/HTTP)

Every ``OTEL_LLM_*`` option (see the README) works here as an environment variable. The launcher
also turns on every other instrumentor installed, e.g. ``opentelemetry-instrumentation-httpx``:
its spans go nowhere unless an SDK is configured globally (``opentelemetry-distro``), and
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=httpx`` turns it off. Run as plain
``python examples/zero_code.py``, the same program makes the same call and records nothing.

``OTEL_LLM_EXAMPLE_URL`` and ``OTEL_LLM_EXAMPLE_MODEL`` choose the server (default: Ollama on
http://127.0.0.1:11434) and the model.
"""

from __future__ import annotations

import os

import openai

URL = os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")


def main() -> int:
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, stream=True,
        stream_options={"include_usage": True})
    print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
