"""Choose the tracer and meter providers that model calls are recorded with.

Explicit providers win. Otherwise the application's global providers are used unchanged if it
configured any. Otherwise otel_llm builds private SDK providers (never installed globally, so
``uninstrument()`` can shut them down and leave the process as it was): OTLP when an endpoint is
configured, else the embedded default, OTLP-JSON lines in a file plus a summary line per call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace

from otel_llm.config import Options

_OTLP_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@dataclass
class Providers:
    tracer_provider: Any
    meter_provider: Any
    owned: list[Any] = field(default_factory=list)  # providers we created and must shut down
    description: str = ""

    def shutdown(self) -> None:
        for provider in self.owned:
            try:
                provider.shutdown()
            except Exception:  # shutting down must not fail uninstrument()
                pass


def _global_tracer_provider() -> Any | None:
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def _global_meter_provider() -> Any | None:
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    provider = metrics.get_meter_provider()
    return None if isinstance(provider, _ProxyMeterProvider) else provider


def _otlp_endpoint(options: Options) -> str | None:
    if options.endpoint:
        return options.endpoint
    for variable in _OTLP_ENV:
        if os.environ.get(variable):
            return os.environ[variable]
    return None


def _protocol(options: Options) -> str:
    if options.protocol:
        return options.protocol
    env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return "grpc" if (env or "").strip().lower() == "grpc" else "http/protobuf"


def _resource(options: Options) -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    attrs = {SERVICE_NAME: options.service_name} if options.service_name else {}
    return Resource.create(attrs)


def _otlp_exporters(options: Options, protocol: str) -> tuple[Any, Any]:
    """(span exporter, metric exporter); explicit endpoints get the signal path appended for HTTP."""
    endpoint = options.endpoint
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint), OTLPMetricExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetric
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpan

    if endpoint is None:  # the exporters read the standard variables themselves
        return HttpSpan(), HttpMetric()
    base = endpoint.rstrip("/")
    return HttpSpan(endpoint=f"{base}/v1/traces"), HttpMetric(endpoint=f"{base}/v1/metrics")


def build_providers(options: Options) -> Providers:
    """The providers for this instrumentation session (see module docstring)."""
    tracer_provider = options.tracer_provider or _global_tracer_provider()
    meter_provider = options.meter_provider or _global_meter_provider()
    result = Providers(tracer_provider, meter_provider)
    if tracer_provider is not None and meter_provider is not None:
        result.description = "application providers"
        return result
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = _resource(options)
    endpoint = _otlp_endpoint(options)
    span_exporter = metric_exporter = None
    if endpoint:
        protocol = _protocol(options)
        span_exporter, metric_exporter = _otlp_exporters(options, protocol)
        result.description = f"OTLP {protocol} to {endpoint}"
    if tracer_provider is None:
        # otel_llm shuts its own providers down at exit, after finishing calls still open.
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if span_exporter is not None:
            tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        else:
            _add_embedded(tracer_provider, options)
            result.description = f"embedded default: {os.path.abspath(options.traces_file)}"
        result.owned.append(tracer_provider)
    if meter_provider is None:
        readers = [PeriodicExportingMetricReader(metric_exporter)] if metric_exporter is not None else []
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        result.owned.append(meter_provider)
    result.tracer_provider, result.meter_provider = tracer_provider, meter_provider
    return result


def _add_embedded(tracer_provider: Any, options: Options) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from otel_llm.export.jsonl import JsonLinesSpanExporter
    from otel_llm.export.summary import SummarySpanProcessor

    tracer_provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(options.traces_file)))
    if options.console_summary:
        tracer_provider.add_span_processor(SummarySpanProcessor())
