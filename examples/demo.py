"""`make demo`: where the time goes on a real model server, llama.cpp with Gemma 3 270M.

Builds (first run only, about 8 minutes on 2 cores) and starts the real `llama-server` with one
slot, then makes streamed calls with the real `openai` client under `otel_llm.instrument()`:
one cold call, a few warm calls, a long-prompt call and two concurrent calls. Prints each call as
a waterfall with the runtime's own counters beside it, then a summary table (warm calls as median
and range, the cold one apart). Spans go to the embedded default file, and also over OTLP when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set.

    python examples/demo.py [--traces-file FILE] [--warm N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from typing import Any

import openai
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm import semconv as sc
from otel_llm.tools.view import group_calls, render_call
from otel_llm.export.jsonl import JsonLinesSpanExporter, flatten_spans
from otel_llm_testing import LlamaServer

SHORT_PROMPT = "In one sentence: why do we measure time to first token separately?"
LONG_PROMPT = " ".join(f"Note {i}: the shipment left the harbour on time." for i in range(90)) + \
    " Summarise the notes in one line."


def tracer_provider(traces_file: str, recent: InMemorySpanExporter) -> TracerProvider:
    """The embedded default's file, an in-memory copy for printing, and OTLP if configured."""
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-llm-demo"}))
    provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(traces_file)))
    provider.add_span_processor(SimpleSpanProcessor(recent))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def chat(client: openai.OpenAI, prompt: str, tokens: int = 32) -> None:
    stream = client.chat.completions.create(
        model="gemma-3-270m", messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
        stream=True, stream_options={"include_usage": True})
    for _ in stream:
        pass


def native_line(attrs: dict[str, Any]) -> str:
    """The runtime's own counters, beside the client's view."""
    def get(key: str) -> Any:
        return attrs.get(key)
    parts = []
    if get(sc.LLM_RUNTIME_PROMPT_EVAL_DURATION) is not None:
        parts.append(f"prompt {get(sc.LLM_RUNTIME_PROMPT_TOKENS)} tok in "
                     f"{get(sc.LLM_RUNTIME_PROMPT_EVAL_DURATION) * 1000:.0f} ms "
                     f"({get(sc.LLM_RUNTIME_PROMPT_EVAL_RATE) or 0:.0f} tok/s)")
    if get(sc.LLM_RUNTIME_CACHED_TOKENS) is not None:
        parts.append(f"cached {get(sc.LLM_RUNTIME_CACHED_TOKENS)} tok")
    if get(sc.LLM_RUNTIME_GENERATION_DURATION) is not None:
        parts.append(f"generated {get(sc.LLM_RUNTIME_GENERATION_TOKENS)} tok in "
                     f"{get(sc.LLM_RUNTIME_GENERATION_DURATION) * 1000:.0f} ms "
                     f"({get(sc.LLM_RUNTIME_GENERATION_RATE) or 0:.1f} tok/s)")
    return "  llama.cpp reports: " + ", ".join(parts) if parts else "  (no runtime counters)"


def show(label: str, kind: str, recent: InMemorySpanExporter, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """Print the calls recorded since the last show() and keep their attributes, by kind."""
    calls = group_calls(flatten_spans(recent.get_finished_spans()))
    recent.clear()
    for index, call in enumerate(calls, 1):
        print(f"\n== {label}{index if len(calls) > 1 else ''}")
        print(render_call(call, width=100))
        print(native_line(call.span["attributes"]))
        rows.append((kind, call.span["attributes"]))


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0] * 1000:.0f}"
    return f"{statistics.median(values) * 1000:.0f} ({min(values) * 1000:.0f}-{max(values) * 1000:.0f})"


def summary(rows: list[tuple[str, dict[str, Any]]]) -> None:
    """Median and range per kind of call; the cold call is never mixed with warm ones."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for kind, attrs in rows:
        kinds.setdefault(kind, []).append(attrs)
    print("\nsummary (ms: median (range) over the calls of each kind)")
    print(f"{'kind':14s} {'n':>2s} {'ttft':>14s} {'native prefill':>15s} {'unaccounted':>14s} "
          f"{'client tok/s':>13s} {'native tok/s':>13s}  bottleneck")
    for kind, group in kinds.items():
        def col(key: str) -> list[float]:
            return [a[key] for a in group if a.get(key) is not None]
        rates = col(sc.LLM_CLIENT_GENERATION_RATE)
        native = col(sc.LLM_RUNTIME_GENERATION_RATE)
        print(f"{kind:14s} {len(group):2d} {_ms(col(sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN)):>14s} "
              f"{_ms(col(sc.LLM_RUNTIME_PROMPT_EVAL_DURATION)):>15s} "
              f"{_ms(col(sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT)):>14s} "
              f"{statistics.median(rates) if rates else 0:13.1f} {statistics.median(native) if native else 0:13.1f}  "
              f"{', '.join(sorted({str(a.get(sc.LLM_DIAGNOSIS_BOTTLENECK)) for a in group}))}")


def scenario(client: openai.OpenAI, recent: InMemorySpanExporter, warm: int) -> list[tuple[str, dict[str, Any]]]:
    rows: list[tuple[str, dict[str, Any]]] = []
    chat(client, SHORT_PROMPT)
    show("cold (first call after start)", "cold", recent, rows)
    for i in range(warm):
        chat(client, SHORT_PROMPT)
        show(f"warm #{i + 1}", "warm", recent, rows)
    chat(client, LONG_PROMPT)
    show("long prompt", "long prompt", recent, rows)
    threads = [threading.Thread(target=chat, args=(client, f"Call {i}: name a colour and a fruit."))
               for i in range(2)]
    for thread in threads:
        thread.start()
        threading.Event().wait(0.2)
    for thread in threads:
        thread.join()
    show("concurrent #", "concurrent", recent, rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces-file", default="otel-llm-traces.jsonl")
    parser.add_argument("--warm", type=int, default=3)
    args = parser.parse_args(argv)
    print("starting llama-server (the first run builds llama.cpp: about 8 minutes)...", flush=True)
    with LlamaServer(slots=1) as server:
        print(f"llama-server on {server.base_url}, one slot; spans to {args.traces_file}", flush=True)
        recent = InMemorySpanExporter()
        provider = tracer_provider(args.traces_file, recent)
        otel_llm.instrument(tracer_provider=provider, console_summary=False)
        try:
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
            rows = scenario(client, recent, args.warm)
        finally:
            otel_llm.uninstrument()
            provider.shutdown()
    summary(rows)
    print(f"\nall calls: otel-llm view {args.traces_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
