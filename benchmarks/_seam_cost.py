"""One child of ``instructions.py --seam``: model calls driven straight through capture's seam.

No HTTP stack, no socket, no simulator: each call is ``LlmCall.open`` on the session's sink, the
request and response steps, CHUNKS server-sent events of one token and a usage event, and
``finish``; spans go to a no-op exporter through a SimpleSpanProcessor (same thread), metrics to
an SDK MeterProvider. What is counted is otel_llm's own work per call and per chunk, so the
figure moves only when otel_llm's call path does.

    python benchmarks/_seam_cost.py CALLS CHUNKS [SAMPLE_RATE]

With SAMPLE_RATE, otel_llm decides after each call (``sample_rate``): 0 drops every call's spans
(none of these calls is failed, slow or otherwise kept by a rule), 1 keeps every one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import otel_llm
from otel_llm.capture.call import END_EOF, CallRequest, CallSink, LlmCall
from otel_llm.instrumentor import current_telemetry
from otel_llm.parse import routes

WARM_UP = 50
ROUTE = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)
BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
URL = "http://127.0.0.1:8000/v1/chat/completions"
CHUNK = b'data: {"id":"c","model":"m","choices":[{"delta":{"content":"tok"}}]}\n\n'
LAST = (b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":20}}\n\n'
        b"data: [DONE]\n\n")
HEADERS = {"content-type": "text/event-stream"}


class _Null(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def call(sink: CallSink, chunks: int) -> None:
    request = CallRequest("POST", "http", "127.0.0.1", 8000, "/v1/chat/completions", URL, {}, BODY)
    one = LlmCall.open(sink, ROUTE, request)
    one.request_started()
    one.request_sent()
    one.response_started(200, HEADERS)
    for _ in range(chunks):
        one.chunk(CHUNK)
    one.chunk(LAST)
    one.finish(END_EOF)


def main(calls: int, chunks: int, sample_rate: float | None = None) -> None:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_Null()))
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(), console_summary=False,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False, sample_rate=sample_rate)
    sink = current_telemetry()
    assert sink is not None
    for _ in range(WARM_UP + calls):
        call(sink, chunks)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)
