"""An application that sets up OpenTelemetry itself: otel_llm uses its providers unchanged.

When the application has installed a global TracerProvider and MeterProvider before calling
``otel_llm.instrument()``, the model-call spans and metrics go through them: same resource
(service name), same processors and exporters, same sampling; otel_llm creates no provider and
no file of its own. Model calls made inside the application's own spans become their children.

Here the exporters print to the console, or send OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set:

    python examples/own_providers.py
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/own_providers.py

``OTEL_LLM_EXAMPLE_URL`` and ``OTEL_LLM_EXAMPLE_MODEL`` choose the server (default: Ollama on
http://127.0.0.1:11434) and the model.
"""

from __future__ import annotations

import os

import openai
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

import otel_llm

URL = os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")


def setup_opentelemetry() -> tuple[TracerProvider, MeterProvider]:
    """What an application typically does at start-up, independently of otel_llm."""
    resource = Resource.create({"service.name": "own-providers-example", "deployment.environment": "dev"})
    span_exporter: SpanExporter
    metric_exporter: MetricExporter
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter, metric_exporter = OTLPSpanExporter(), OTLPMetricExporter()  # read the OTEL_* variables
    else:
        span_exporter, metric_exporter = ConsoleSpanExporter(), ConsoleMetricExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    meter_provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter)])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    return tracer_provider, meter_provider


def main() -> int:
    tracer_provider, meter_provider = setup_opentelemetry()
    otel_llm.instrument()  # after the global providers are set: it picks them up

    tracer = trace.get_tracer("own-providers-example")
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")
    # the application's own span; the model call's span becomes its child, in the same trace
    with tracer.start_as_current_span("answer-question") as span:
        span.set_attribute("app.question.id", 42)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is OpenTelemetry?"}], max_tokens=32,
            stream=True, stream_options={"include_usage": True})
        print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))

    otel_llm.uninstrument()  # removes the hooks; the application's providers stay its own
    tracer_provider.shutdown()  # the application flushes and shuts down what it created
    meter_provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
