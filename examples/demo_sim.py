"""`make demo-sim`: trace a few model calls end to end with no backend and no model at all.

Starts the simulator (a stand-in for Ollama / an OpenAI-compatible server with known timings:
a cold model load on the first call, 120 ms of prompt evaluation, 40 tokens at 25 ms), adds
`otel_llm.instrument()`, makes calls with the real `openai` and `ollama` clients and raw httpx,
then prints what was recorded with `otel-llm view`.

    python examples/demo_sim.py [--traces-file FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import httpx
import ollama
import openai

import otel_llm
from otel_llm.tools.sim import SimProcess

TIMINGS = dict(runtime="ollama", cold_delay=0.8, headers_delay=0.02, first_token_delay=0.12,
               token_interval=0.025, tokens=40)


def run_calls(base_url: str) -> None:
    """Four model calls, each a different client and API."""
    messages = [{"role": "user", "content": "Why is the sky blue? Answer in one paragraph."}]

    print("1. ollama client, native /api/chat, streaming (the model is cold: it loads first)")
    for _ in ollama.Client(host=base_url).chat(model="llama3.2", messages=messages, stream=True):
        pass

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="demo-key-not-recorded")
    print("2. openai client, /v1/chat/completions, streaming (warm)")
    stream = client.chat.completions.create(model="llama3.2", messages=messages, stream=True,
                                            stream_options={"include_usage": True})
    for _ in stream:
        pass

    print("3. openai client, /v1/chat/completions, not streaming: no token is seen before the end")
    client.chat.completions.create(model="llama3.2", messages=messages, max_tokens=20)

    print("4. raw httpx, llama.cpp-style /completion, streaming, with the runtime's own timings")
    with httpx.Client() as raw:
        with raw.stream("POST", f"{base_url}/completion", json={"prompt": "Hello", "stream": True, "n_predict": 16},
                        headers={"x-sim-runtime": "llama.cpp"}) as response:
            response.read()


def otlp_tracer_provider(traces_file: str) -> Any:
    """With an OTLP endpoint configured: spans to it *and* to the file that `otel-llm view` reads."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from otel_llm.export.jsonl import JsonLinesSpanExporter
    from otel_llm.export.summary import SummarySpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "otel-llm-demo"}))
    provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(traces_file)))
    provider.add_span_processor(SummarySpanProcessor())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces-file", default="otel-llm-traces.jsonl")
    args = parser.parse_args(argv)
    with SimProcess(**TIMINGS) as sim:
        print(f"simulator on {sim.base_url}; tracing to {args.traces_file} (summary lines on stderr)\n")
        # The embedded default writes the file; an OTLP endpoint would replace it, so keep both.
        provider = otlp_tracer_provider(args.traces_file) if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") else None
        otel_llm.instrument(service_name="otel-llm-demo", traces_file=args.traces_file, tracer_provider=provider)
        try:
            run_calls(sim.base_url)
        finally:
            otel_llm.uninstrument()  # flushes the spans to the file
            if provider is not None:
                provider.shutdown()
    sys.stderr.flush()
    print(f"\n$ otel-llm view --last 4 {args.traces_file}\n", flush=True)
    return subprocess.call([sys.executable, "-m", "otel_llm.tools.main", "view", "--last", "4", args.traces_file])


if __name__ == "__main__":
    raise SystemExit(main())
