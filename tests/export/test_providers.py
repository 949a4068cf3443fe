"""Which tracer and meter providers ``build_providers`` (otel_llm.export.providers) picks for each
combination of options, and what ``Providers.shutdown`` shuts down.

Nothing here talks to a collector: OTLP endpoints are a closed port on 127.0.0.1, nothing is
recorded into their providers, and the providers are shut down at once (their exporters, looked
at through the SDK's private attributes, are only inspected). Prometheus is in test_prometheus.py.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.metrics import NoOpMeter
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_llm._log import reset_log_once
from otel_llm.config import Options
from otel_llm.export import providers as prov
from otel_llm.export.jsonl import JsonLinesSpanExporter
from otel_llm.export.summary import SummarySpanProcessor
from otel_llm_testing.otel import make_otel
from otel_llm_testing.net import free_port

_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "OTEL_METRICS_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")


@pytest.fixture(autouse=True)
def bare_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL_* variables and no global providers, whatever earlier tests installed."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: _ProxyMeterProvider())
    reset_log_once()


@pytest.fixture
def closed_endpoint() -> str:
    """http://127.0.0.1:PORT where nothing listens."""
    port = free_port()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def built() -> Iterator[list[prov.Providers]]:
    """Providers built by a test, shut down after it."""
    made: list[prov.Providers] = []
    yield made
    for providers in made:
        providers.shutdown(timeout=5)


def build(made: list[prov.Providers], **options: Any) -> prov.Providers:
    providers = prov.build_providers(Options(**options))
    made.append(providers)
    return providers


def span_processors(tracer_provider: Any) -> list[Any]:
    return list(tracer_provider._active_span_processor._span_processors)  # private; no public accessor


def span_exporter(tracer_provider: Any) -> Any:
    (processor,) = span_processors(tracer_provider)
    assert isinstance(processor, BatchSpanProcessor)
    return processor._batch_processor._exporter


def metric_readers(meter_provider: Any) -> list[Any]:
    return list(meter_provider._metric_readers)


# --- the application's providers ------------------------------------------------------------


def test_explicit_providers_are_used_unchanged(built: list[prov.Providers]) -> None:
    state = make_otel()
    providers = build(built, tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                      endpoint="http://127.0.0.1:1")
    assert providers.tracer_provider is state.tracer_provider
    assert providers.meter_provider is state.meter_provider
    assert providers.owned == [] and providers.description == "application providers"
    assert metric_readers(state.meter_provider) == [state.reader]


def test_global_providers_are_used_unchanged(monkeypatch: pytest.MonkeyPatch, built: list[prov.Providers]) -> None:
    state = make_otel()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: state.tracer_provider)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: state.meter_provider)
    providers = build(built, endpoint="http://127.0.0.1:1")
    assert (providers.tracer_provider, providers.meter_provider) == (state.tracer_provider, state.meter_provider)
    assert providers.owned == [] and providers.description == "application providers"


def test_explicit_providers_win_over_global_ones(monkeypatch: pytest.MonkeyPatch, built: list[prov.Providers]) -> None:
    app, other = make_otel(), make_otel()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: other.tracer_provider)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: other.meter_provider)
    providers = build(built, tracer_provider=app.tracer_provider)
    assert providers.tracer_provider is app.tracer_provider
    assert providers.meter_provider is other.meter_provider
    assert providers.owned == []


def test_shutting_down_leaves_the_applications_providers_working(built: list[prov.Providers]) -> None:
    state = make_otel()
    providers = build(built, tracer_provider=state.tracer_provider, meter_provider=state.meter_provider)
    providers.shutdown()
    state.tracer_provider.get_tracer("t").start_span("after").end()
    assert [s.name for s in state.spans()] == ["after"]
    state.meter_provider.get_meter("m").create_counter("c").add(1)
    assert "c" in state.metrics()


def test_only_the_missing_meter_provider_is_built(built: list[prov.Providers], tmp_path: Path) -> None:
    state = make_otel()
    providers = build(built, tracer_provider=state.tracer_provider, traces_file=str(tmp_path / "t.jsonl"))
    assert providers.tracer_provider is state.tracer_provider
    assert isinstance(providers.meter_provider, MeterProvider)
    assert providers.owned == [providers.meter_provider]
    assert metric_readers(providers.meter_provider) == []  # no endpoint: metrics are not exported
    assert span_processors(state.tracer_provider)[0].span_exporter is state.exporter  # nothing added
    assert not (tmp_path / "t.jsonl").exists()


def test_only_the_missing_tracer_provider_is_built(built: list[prov.Providers], closed_endpoint: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An application meter provider: OTEL_METRICS_EXPORTER is not otel_llm's business."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    state = make_otel()
    providers = build(built, meter_provider=state.meter_provider, endpoint=closed_endpoint)
    assert providers.meter_provider is state.meter_provider
    assert isinstance(providers.tracer_provider, TracerProvider)
    assert providers.owned == [providers.tracer_provider]
    assert span_exporter(providers.tracer_provider)._endpoint == f"{closed_endpoint}/v1/traces"
    assert metric_readers(state.meter_provider) == [state.reader]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_an_application_tracer_provider_gets_no_unused_span_exporter(
        protocol: str, built: list[prov.Providers], closed_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the application's tracer provider and an endpoint, only the metrics go to OTLP: no
    span exporter is made (it would hold a connection or gRPC channel nobody uses or closes)."""
    made: list[str] = []
    for module in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                   "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"):
        monkeypatch.setattr(f"{module}.OTLPSpanExporter", lambda *a, _m=module, **k: made.append(_m))
    state = make_otel()
    providers = build(built, tracer_provider=state.tracer_provider, endpoint=closed_endpoint, protocol=protocol)
    assert made == []
    assert providers.tracer_provider is state.tracer_provider
    (reader,) = metric_readers(providers.meter_provider)
    assert isinstance(reader, PeriodicExportingMetricReader)
    assert providers.description == f"application tracer provider; metrics OTLP {protocol} to {closed_endpoint}"
    assert providers.traces_to == ""  # the spans are the application's


# --- OTLP ---------------------------------------------------------------------------------------


def test_an_http_endpoint_gets_the_signal_paths(built: list[prov.Providers], closed_endpoint: str) -> None:
    providers = build(built, endpoint=closed_endpoint + "/", service_name="svc")
    assert providers.description == f"OTLP http/protobuf to {closed_endpoint}/"
    spans = span_exporter(providers.tracer_provider)
    assert isinstance(spans, HttpSpanExporter) and spans._endpoint == f"{closed_endpoint}/v1/traces"
    (reader,) = metric_readers(providers.meter_provider)
    assert isinstance(reader, PeriodicExportingMetricReader)
    assert isinstance(reader._exporter, HttpMetricExporter)
    assert reader._exporter._endpoint == f"{closed_endpoint}/v1/metrics"
    assert providers.owned == [providers.tracer_provider, providers.meter_provider]


def test_a_grpc_endpoint_is_passed_as_is(built: list[prov.Providers], closed_endpoint: str) -> None:
    providers = build(built, endpoint=closed_endpoint, protocol="grpc")
    assert providers.description == f"OTLP grpc to {closed_endpoint}"
    assert providers.traces_to == f"OTLP grpc to {closed_endpoint}"
    spans = span_exporter(providers.tracer_provider)
    assert isinstance(spans, GrpcSpanExporter) and spans._endpoint == closed_endpoint.removeprefix("http://")
    (reader,) = metric_readers(providers.meter_provider)
    assert isinstance(reader._exporter, GrpcMetricExporter)
    assert providers.owned == [providers.tracer_provider, providers.meter_provider]


def test_the_standard_endpoint_variable(built: list[prov.Providers], closed_endpoint: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", closed_endpoint)
    providers = build(built)
    assert providers.description == f"OTLP http/protobuf to {closed_endpoint}"
    assert span_exporter(providers.tracer_provider)._endpoint == f"{closed_endpoint}/v1/traces"
    (reader,) = metric_readers(providers.meter_provider)
    assert reader._exporter._endpoint == f"{closed_endpoint}/v1/metrics"


def test_the_traces_endpoint_variable_alone_selects_otlp(built: list[prov.Providers], closed_endpoint: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{closed_endpoint}/custom/traces")
    providers = build(built)
    assert providers.description == f"OTLP http/protobuf to {closed_endpoint}/custom/traces"
    assert span_exporter(providers.tracer_provider)._endpoint == f"{closed_endpoint}/custom/traces"


def test_the_endpoint_option_wins_over_the_variables(built: list[prov.Providers], closed_endpoint: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    providers = build(built, endpoint=closed_endpoint)
    assert span_exporter(providers.tracer_provider)._endpoint == f"{closed_endpoint}/v1/traces"


@pytest.mark.parametrize(("env", "option", "expected"), [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None, "grpc"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " GRPC "}, None, "grpc"),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None,
     "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, None, "http/protobuf"),  # not supported: the default
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf", "http/protobuf"),  # the option wins
])
def test_the_protocol(env: dict[str, str], option: str | None, expected: str, built: list[prov.Providers],
                      closed_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    providers = build(built, endpoint=closed_endpoint, protocol=option)
    assert providers.description == f"OTLP {expected} to {closed_endpoint}"
    expected_class = GrpcSpanExporter if expected == "grpc" else HttpSpanExporter
    assert isinstance(span_exporter(providers.tracer_provider), expected_class)


def test_no_metric_reader_when_metrics_are_turned_off(built: list[prov.Providers], closed_endpoint: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    providers = build(built, endpoint=closed_endpoint)
    assert metric_readers(providers.meter_provider) == []
    assert isinstance(span_exporter(providers.tracer_provider), HttpSpanExporter)  # traces still go out
    assert providers.owned == [providers.tracer_provider, providers.meter_provider]


# --- the embedded default -----------------------------------------------------------------------


def test_without_an_endpoint_spans_go_to_the_file_and_the_summary(built: list[prov.Providers],
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    providers = build(built, traces_file=str(path), traces_file_max_bytes=4096, traces_file_backups=3)
    assert providers.description == f"embedded default: {path}"
    assert providers.traces_to == str(path)
    batch, summary = span_processors(providers.tracer_provider)
    exporter = batch._batch_processor._exporter
    assert isinstance(exporter, JsonLinesSpanExporter) and exporter.path == str(path)
    assert (exporter._file.max_bytes, exporter._file.backups) == (4096, 3)
    assert isinstance(summary, SummarySpanProcessor)
    assert metric_readers(providers.meter_provider) == []
    assert providers.owned == [providers.tracer_provider, providers.meter_provider]


def test_the_console_summary_can_be_turned_off(built: list[prov.Providers], tmp_path: Path) -> None:
    providers = build(built, traces_file=str(tmp_path / "t.jsonl"), console_summary=False)
    assert isinstance(span_exporter(providers.tracer_provider), JsonLinesSpanExporter)


def test_a_relative_traces_file_is_described_by_its_absolute_path(built: list[prov.Providers], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    providers = build(built, traces_file="rel.jsonl", console_summary=False)
    assert providers.description == f"embedded default: {tmp_path / 'rel.jsonl'}"
    assert span_exporter(providers.tracer_provider).path == str(tmp_path / "rel.jsonl")


def test_built_providers_carry_the_service_name(built: list[prov.Providers], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    providers = build(built, traces_file=str(tmp_path / "t.jsonl"), service_name="my-app")
    tracer_provider: Any = providers.tracer_provider
    meter_provider: Any = providers.meter_provider
    assert tracer_provider.resource.attributes["service.name"] == "my-app"
    assert meter_provider._sdk_config.resource.attributes["service.name"] == "my-app"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    unnamed: Any = build(built, traces_file=str(tmp_path / "t.jsonl")).tracer_provider
    assert unnamed.resource.attributes["service.name"] == "from-env"


def test_built_providers_are_not_installed_globally(built: list[prov.Providers], tmp_path: Path) -> None:
    real_tracer_provider = trace._TRACER_PROVIDER
    real_meter_provider = metrics._internal._METER_PROVIDER
    build(built, traces_file=str(tmp_path / "t.jsonl"))
    assert trace._TRACER_PROVIDER is real_tracer_provider
    assert metrics._internal._METER_PROVIDER is real_meter_provider


def test_shutdown_flushes_and_stops_what_otel_llm_built(built: list[prov.Providers], tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    providers = build(built, traces_file=str(path), console_summary=False)
    providers.tracer_provider.get_tracer("t").start_span("recorded").end()
    providers.shutdown(timeout=5)
    (line,) = path.read_text().splitlines()
    assert "recorded" in json.dumps(json.loads(line))
    providers.tracer_provider.get_tracer("t").start_span("too late").end()
    assert len(path.read_text().splitlines()) == 1
    assert isinstance(providers.meter_provider.get_meter("m"), NoOpMeter)


# --- Providers.shutdown -----------------------------------------------------------------------


def providers_of(tracer_provider: Any, meter_provider: Any, owned: list[Any]) -> prov.Providers:
    return prov.Providers(tracer_provider, meter_provider, owned)


class FakeProvider:
    def __init__(self, fail: bool = False, block: threading.Event | None = None) -> None:
        self.calls = 0
        self.fail = fail
        self.block = block

    def shutdown(self) -> None:
        self.calls += 1
        if self.block is not None:
            self.block.wait(5)
        if self.fail:
            raise RuntimeError("exporter broke")


def test_shutdown_reaches_only_the_owned_providers() -> None:
    app_tracer, app_meter, owned = FakeProvider(), FakeProvider(), FakeProvider()
    providers_of(app_tracer, app_meter, [owned]).shutdown()
    assert (app_tracer.calls, app_meter.calls, owned.calls) == (0, 0, 1)


def test_a_failing_shutdown_does_not_stop_the_others_nor_raise() -> None:
    first, second = FakeProvider(fail=True), FakeProvider()
    providers_of(None, None, [first, second]).shutdown()
    assert (first.calls, second.calls) == (1, 1)


def test_a_shutdown_that_hangs_is_abandoned_after_the_timeout(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    hanging = FakeProvider(block=release)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            providers_of(None, None, [hanging]).shutdown(timeout=0.01)
            providers_of(None, None, [FakeProvider(block=release)]).shutdown(timeout=0.01)
    finally:
        release.set()
    assert hanging.calls == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "otel_llm"]
    assert len(messages) == 1  # logged once
    assert "the exporters did not finish within 0.01 s" in messages[0]


def test_nothing_owned_returns_at_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        providers_of(FakeProvider(), FakeProvider(), []).shutdown(timeout=0)
    assert caplog.records == []  # with a zero timeout, any worker started would be reported late
