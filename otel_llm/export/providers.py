"""Choose the tracer and meter providers that model calls are recorded with.

Explicit providers win. Otherwise the application's global providers are used unchanged if it
configured any. Otherwise otel_llm builds private SDK providers (never installed globally, so
``uninstrument()`` can shut them down and leave the process as it was): OTLP when an endpoint is
configured, else the embedded default, OTLP-JSON lines in a file plus a summary line per call.

Metrics of private providers follow the standard ``OTEL_METRICS_EXPORTER`` (comma-separated):
``otlp`` (the default: OTLP when an endpoint is configured, as for traces), ``prometheus`` (a
``PrometheusMetricReader`` served by ``prometheus_client.start_http_server`` on
``OTEL_EXPORTER_PROMETHEUS_HOST``:``OTEL_EXPORTER_PROMETHEUS_PORT``, default localhost:9464, once per
process; a busy port is logged once, never raised) and ``none``; both ``otlp,prometheus`` may be
listed. Applications with their own meter provider add a ``PrometheusMetricReader`` themselves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from opentelemetry import metrics, trace

from otel_llm._log import log_once, logger
from otel_llm.config import Options

if TYPE_CHECKING:  # the SDK's classes are imported only when otel_llm builds its own providers
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    OwnedProvider = Union[SdkTracerProvider, SdkMeterProvider]

__all__ = ["Providers", "build_providers", "metrics_exporters", "prometheus_address"]

_OTLP_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

METRICS_EXPORTER_ENV = "OTEL_METRICS_EXPORTER"
PROMETHEUS_HOST_ENV = "OTEL_EXPORTER_PROMETHEUS_HOST"
PROMETHEUS_PORT_ENV = "OTEL_EXPORTER_PROMETHEUS_PORT"
PROMETHEUS_DEFAULT_HOST = "localhost"
PROMETHEUS_DEFAULT_PORT = 9464
_METRICS_EXPORTERS = ("otlp", "prometheus", "none")
# Resource attributes copied onto every Prometheus series (as service_name, host_name when the
# resource has it), so dashboards can filter by service whether metrics were scraped directly or
# went through a collector with resource_to_telemetry_conversion.
_PROMETHEUS_RESOURCE_LABELS = frozenset({"service.name", "host.name"})
SHUTDOWN_TIMEOUT = 5.0  # seconds uninstrument() and process exit wait for otel_llm's own exporters

# The Prometheus endpoint is served once per process (it serves prometheus_client's global
# registry, where every PrometheusMetricReader registers itself): later sessions reuse it.
_prometheus_lock = threading.Lock()
_prometheus_server: Any = None  # (server, thread) from start_http_server, or True if it returned None
_prometheus_address: tuple[str, int] | None = None  # the address bound
_prometheus_requested: tuple[str, int] | None = None  # the address asked for (port may be 0)
_prometheus_failed: set[tuple[str, int]] = set()


@dataclass
class Providers:
    """The providers model calls are recorded with, and which of them otel_llm owns."""

    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider
    owned: list[OwnedProvider] = field(default_factory=list)  # created here: shut down here
    description: str = ""
    # where otel_llm's own tracer provider sends spans ("OTLP <protocol> to <endpoint>" or the
    # traces file's path); empty when the spans go to the application's tracer provider
    traces_to: str = ""

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush and shut down the providers otel_llm created, waiting at most ``timeout`` seconds
        (SHUTDOWN_TIMEOUT): with a collector that accepts connections and never answers, the SDK
        would hold uninstrument() and process exit for the exporters' whole budget (about 40 s with
        the defaults: a 30 s batch-processor join, then a 10 s metric export)."""
        owned = list(self.owned)
        if not owned:
            return

        def run() -> None:
            for provider in owned:
                try:
                    provider.shutdown()
                except Exception:  # shutting down must not fail uninstrument()
                    pass

        limit = SHUTDOWN_TIMEOUT if timeout is None else timeout
        worker = threading.Thread(target=run, name="otel_llm-shutdown", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            log_once(f"the exporters did not finish within {limit:g} s; telemetry not sent yet is dropped",
                     exc_info=False)


def _global_tracer_provider() -> trace.TracerProvider | None:
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def _global_meter_provider() -> metrics.MeterProvider | None:
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


def _resource(options: Options) -> Resource:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    attrs = {SERVICE_NAME: options.service_name} if options.service_name else {}
    return Resource.create(attrs)


def _otlp_exporters(options: Options, protocol: str, with_spans: bool = True, with_metrics: bool = True,
                    meter_provider: metrics.MeterProvider | None = None,
                    ) -> tuple[SpanExporter | None, MetricExporter | None]:
    """(span exporter, metric exporter), each None when not asked for (a provider the
    application gave needs none: an unused exporter would hold a channel open); explicit
    endpoints get the signal path appended for HTTP. The span exporter counts what it exported
    and failed to into ``meter_provider`` when the SDK's own metrics are on."""
    endpoint = options.endpoint
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return (_counted(OTLPSpanExporter, meter_provider, endpoint=endpoint) if with_spans else None,
                OTLPMetricExporter(endpoint=endpoint) if with_metrics else None)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetric
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpan

    if endpoint is None:  # the exporters read the standard variables themselves
        return (_counted(HttpSpan, meter_provider) if with_spans else None,
                HttpMetric() if with_metrics else None)
    base = endpoint.rstrip("/")
    return (_counted(HttpSpan, meter_provider, endpoint=f"{base}/v1/traces") if with_spans else None,
            HttpMetric(endpoint=f"{base}/v1/metrics") if with_metrics else None)


def _counted(component: Any, meter_provider: metrics.MeterProvider | None, *args: Any, **kwargs: Any) -> Any:
    """``component(*args, **kwargs)`` (a span processor or exporter) reporting the SDK's own
    metrics (``otel.sdk.processor.span.processed``, ``otel.sdk.exporter.span.exported``...: what it
    dropped and why) into otel_llm's meter provider rather than the global one. They are recorded
    only when ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` is true; SDK releases without them
    take no meter provider."""
    if meter_provider is not None:
        try:
            return component(*args, meter_provider=meter_provider, **kwargs)
        except TypeError:
            pass
    return component(*args, **kwargs)


def metrics_exporters(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The names listed in ``OTEL_METRICS_EXPORTER`` that otel_llm knows (default ``otlp``);
    unknown names are logged once and ignored."""
    env = os.environ if environ is None else environ
    raw = env.get(METRICS_EXPORTER_ENV)
    if raw is None or not raw.strip():
        return frozenset({"otlp"})
    names = {name.strip().lower() for name in raw.split(",") if name.strip()}
    unknown = sorted(names - set(_METRICS_EXPORTERS))
    if unknown:
        log_once(f"{METRICS_EXPORTER_ENV}: ignoring unsupported exporter(s) {', '.join(unknown)} "
                 f"(otel_llm's own providers support {', '.join(_METRICS_EXPORTERS)})", exc_info=False)
    known = names & set(_METRICS_EXPORTERS)
    return frozenset() if "none" in known else frozenset(known)


def prometheus_address(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) from ``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT``; bad ports are logged once."""
    env = os.environ if environ is None else environ
    host = (env.get(PROMETHEUS_HOST_ENV) or "").strip() or PROMETHEUS_DEFAULT_HOST
    raw = (env.get(PROMETHEUS_PORT_ENV) or "").strip()
    port = PROMETHEUS_DEFAULT_PORT
    if raw:
        try:
            port = int(raw)
            if not 0 <= port <= 65535:
                raise ValueError(raw)
        except ValueError:
            log_once(f"{PROMETHEUS_PORT_ENV}={raw!r} is not a port; using {PROMETHEUS_DEFAULT_PORT}", exc_info=False)
            port = PROMETHEUS_DEFAULT_PORT
    return host, port


def _prometheus_reader() -> PrometheusMetricReader | None:
    """A PrometheusMetricReader on prometheus_client's global registry, or None (logged once)
    when opentelemetry-exporter-prometheus is not installed."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
    except ImportError:
        log_once(f"{METRICS_EXPORTER_ENV} lists prometheus but opentelemetry-exporter-prometheus is not "
                 "installed: pip install opentelemetry-exporter-prometheus", exc_info=False)
        return None
    try:
        return PrometheusMetricReader(resource_attribute_filter=_PROMETHEUS_RESOURCE_LABELS.__contains__)
    except TypeError:  # exporter releases before resource_attribute_filter
        return PrometheusMetricReader()


def serve_prometheus(host: str, port: int) -> tuple[str, int] | None:
    """Serve prometheus_client's global registry on host:port, once per process.

    Returns the address served (an earlier one if already serving), or None when the port could
    not be bound: logged once per address, never raised; the reader still registers, so an
    application that serves the global registry itself shows otel_llm's metrics there."""
    global _prometheus_server, _prometheus_address, _prometheus_requested
    with _prometheus_lock:
        if _prometheus_server is not None:
            if (host, port) not in (_prometheus_address, _prometheus_requested):
                log_once(f"Prometheus metrics already served on {_url(*_prometheus_address)}; "  # type: ignore[misc]
                         f"not also on {_url(host, port)}", exc_info=False)
            return _prometheus_address
        if (host, port) in _prometheus_failed:
            return None
        from prometheus_client import start_http_server

        try:
            started = start_http_server(port, addr=host)
        except (OSError, ValueError) as exc:  # busy port, unknown host
            _prometheus_failed.add((host, port))
            logger.warning("otel_llm: cannot serve Prometheus metrics on %s (%s); the metrics are not exposed "
                           "by otel_llm (set %s to a free port)", _url(host, port), exc, PROMETHEUS_PORT_ENV)
            return None
        _prometheus_server = started if started is not None else True
        bound = port
        if isinstance(started, tuple):
            bound = int(started[0].server_address[1])  # the real port when port 0 was asked
        _prometheus_address, _prometheus_requested = (host, bound), (host, port)
        logger.debug("otel_llm: Prometheus metrics on %s", _url(host, bound))
        return _prometheus_address


def _stop_prometheus() -> None:
    """Stop the endpoint and forget failures (tests only: in an application it lives as long as
    the process)."""
    global _prometheus_server, _prometheus_address, _prometheus_requested
    with _prometheus_lock:
        server, _prometheus_server = _prometheus_server, None
        _prometheus_address = _prometheus_requested = None
        _prometheus_failed.clear()
    if isinstance(server, tuple):
        httpd, thread = server
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def build_providers(options: Options) -> Providers:
    """The providers for this instrumentation session (see module docstring)."""
    given_tracer = options.tracer_provider or _global_tracer_provider()
    given_meter = options.meter_provider or _global_meter_provider()
    if given_tracer is not None and given_meter is not None:
        return Providers(given_tracer, given_meter, description="application providers")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    owned: list[OwnedProvider] = []
    description = traces_to = ""
    resource = _resource(options)
    endpoint = _otlp_endpoint(options)
    exporters = metrics_exporters() if given_meter is None else frozenset()
    metric_exporter: MetricExporter | None = None
    protocol = _protocol(options) if endpoint else ""
    if endpoint:
        _, metric_exporter = _otlp_exporters(options, protocol, with_spans=False, with_metrics="otlp" in exporters)
        description = f"OTLP {protocol} to {endpoint}"
        if given_tracer is not None:
            description = f"application tracer provider; metrics {description}" if metric_exporter else ""
    prometheus = ""  # said after where the traces go
    if given_meter is None:
        readers: list[MetricReader] = []
        if metric_exporter is not None:
            readers.append(PeriodicExportingMetricReader(metric_exporter))
        if "prometheus" in exporters:
            reader = _prometheus_reader()
            if reader is not None:
                readers.append(reader)
                served = serve_prometheus(*prometheus_address())
                if served is not None:
                    prometheus = f"; metrics on Prometheus {_url(*served)}"
        own_meter = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        owned.append(own_meter)
        given_meter = own_meter
    if given_tracer is None:
        # otel_llm shuts its own providers down at exit, after finishing calls still open.
        own_tracer = TracerProvider(resource=resource, shutdown_on_exit=False)
        if endpoint:
            span_exporter, _ = _otlp_exporters(options, protocol, with_metrics=False, meter_provider=given_meter)
            own_tracer.add_span_processor(_counted(BatchSpanProcessor, given_meter, span_exporter))
            traces_to = description
        else:
            _add_embedded(own_tracer, options, given_meter)
            traces_to = os.path.abspath(options.traces_file)
            description = f"embedded default: {traces_to}"
        owned.insert(0, own_tracer)  # shut down first: its spans' metrics still have a provider
        given_tracer = own_tracer
    return Providers(given_tracer, given_meter, owned, description + prometheus, traces_to)


def _add_embedded(tracer_provider: SdkTracerProvider, options: Options,
                  meter_provider: metrics.MeterProvider) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from otel_llm.export.jsonl import JsonLinesSpanExporter
    from otel_llm.export.summary import SummarySpanProcessor

    exporter = JsonLinesSpanExporter(options.traces_file, options.traces_file_max_bytes, options.traces_file_backups)
    tracer_provider.add_span_processor(_counted(BatchSpanProcessor, meter_provider, exporter))
    if options.console_summary:
        tracer_provider.add_span_processor(SummarySpanProcessor())
