"""Prometheus export from otel_llm's own providers (``OTEL_METRICS_EXPORTER=prometheus``): the
options, the endpoint served once per process, a busy port, and a real Prometheus server (the
Debian package, installed here when missing) scraping an instrumented process.

The ``Prometheus`` helper and the ``prometheus_binary`` fixture are shared with test_dashboards.py.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from prometheus_client import REGISTRY, generate_latest

import otel_llm
from otel_llm._log import reset_log_once
from otel_llm.config import resolve
from otel_llm.export import providers as prov
from otel_llm_testing.collectors import OtlpHttpCollector
from otel_llm_testing.subprocesses import clean_env
from otel_llm_testing.net import free_port
from otel_llm_testing.prometheus import Prometheus, finite_values, wait_until

LOOPBACK = "127.0.0.1"


# --- options and the endpoint, in this process ---------------------------------------------------


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTel variables, no global providers, and no Prometheus endpoint left behind."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    reset_log_once()
    prov._stop_prometheus()
    yield
    prov._stop_prometheus()


def _metrics_text(port: int) -> str:
    return httpx.get(f"http://{LOOPBACK}:{port}/metrics", timeout=5).text


def _streamed_call(base_url: str, model: str = "prom-model") -> None:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(timeout=10) as client, client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        r.read()


def _instrument(tmp_path: Path) -> None:
    otel_llm.instrument(service_name="prom-test", console_summary=False, traces_file=str(tmp_path / "t.jsonl"),
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)


def _readers(meter_provider: Any) -> list[Any]:
    return list(meter_provider._metric_readers)  # private; no public accessor


def test_metrics_exporter_option(caplog: pytest.LogCaptureFixture) -> None:
    assert prov.metrics_exporters({}) == {"otlp"}
    assert prov.metrics_exporters({"OTEL_METRICS_EXPORTER": ""}) == {"otlp"}
    assert prov.metrics_exporters({"OTEL_METRICS_EXPORTER": "prometheus"}) == {"prometheus"}
    assert prov.metrics_exporters({"OTEL_METRICS_EXPORTER": " otlp , Prometheus "}) == {"otlp", "prometheus"}
    assert prov.metrics_exporters({"OTEL_METRICS_EXPORTER": "none"}) == set()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        assert prov.metrics_exporters({"OTEL_METRICS_EXPORTER": "console,prometheus"}) == {"prometheus"}
        assert prov.metrics_exporters({"OTEL_METRICS_EXPORTER": "console,prometheus"}) == {"prometheus"}
    assert len([r for r in caplog.records if "unsupported exporter(s) console" in r.getMessage()]) == 1

    assert prov.prometheus_address({}) == ("localhost", 9464)
    env = {"OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0", "OTEL_EXPORTER_PROMETHEUS_PORT": "9999"}
    assert prov.prometheus_address(env) == ("0.0.0.0", 9999)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        assert prov.prometheus_address({"OTEL_EXPORTER_PROMETHEUS_PORT": "http"}) == ("localhost", 9464)
    assert "is not a port" in caplog.text


def test_readers_follow_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """otlp (default), prometheus, both, none; traces keep going to OTLP whatever metrics do."""
    port = free_port()
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", LOOPBACK)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    with OtlpHttpCollector() as collector:
        cases = {None: [PeriodicExportingMetricReader], "otlp": [PeriodicExportingMetricReader],
                 "prometheus": [PrometheusMetricReader],
                 "otlp,prometheus": [PeriodicExportingMetricReader, PrometheusMetricReader], "none": []}
        for value, expected in cases.items():
            if value is None:
                monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
            else:
                monkeypatch.setenv("OTEL_METRICS_EXPORTER", value)
            providers = prov.build_providers(resolve({"endpoint": collector.endpoint}))
            try:
                assert [type(r) for r in _readers(providers.meter_provider)] == expected, value
                assert providers.description.startswith("OTLP http/protobuf"), providers.description
                assert ("metrics on Prometheus" in providers.description) == ("prometheus" in (value or ""))
            finally:
                providers.shutdown()
        # no endpoint: traces go to the embedded file, metrics to Prometheus only
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
        providers = prov.build_providers(resolve({"traces_file": os.devnull}))
        try:
            assert [type(r) for r in _readers(providers.meter_provider)] == [PrometheusMetricReader]
            assert providers.description.startswith("embedded default")
            assert providers.description.endswith(f"metrics on Prometheus http://{LOOPBACK}:{port}/metrics")
        finally:
            providers.shutdown()


def test_application_providers_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """An application with its own providers adds a PrometheusMetricReader itself: otel_llm
    neither adds one nor opens a port."""
    from otel_llm_testing.otel import make_otel

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(free_port()))
    state = make_otel()
    providers = prov.build_providers(resolve({"tracer_provider": state.tracer_provider,
                                              "meter_provider": state.meter_provider}))
    assert providers.description == "application providers" and providers.owned == []
    assert _readers(state.meter_provider) == [state.reader]
    assert prov._prometheus_server is None


def test_endpoint_served_once_per_process(sim: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port = free_port()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", LOOPBACK)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=box-1,deployment.environment=test")
    _instrument(tmp_path)
    try:
        _streamed_call(sim.base_url)
        text = _metrics_text(port)
        assert 'gen_ai_client_operation_duration_seconds_bucket{' in text
        assert 'llm_client_phase_duration_seconds_count{' in text and 'llm_phase="llm.decode"' in text
        assert 'service_name="prom-test"' in text and 'gen_ai_request_model="prom-model"' in text
        # service.name and host.name label every series; other resource attributes stay in target_info
        duration = [line for line in text.splitlines()
                    if line.startswith("gen_ai_client_operation_duration_seconds_count")]
        assert duration and all('host_name="box-1"' in line and "deployment" not in line for line in duration)
        assert 'deployment_environment="test"' in text
    finally:
        otel_llm.uninstrument()
    # the session's reader left the registry with its providers; the endpoint stays up
    assert "gen_ai_client_operation_duration_seconds" not in _metrics_text(port)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(free_port()))  # ignored: already serving
    _instrument(tmp_path)
    try:
        _streamed_call(sim.base_url, "second-model")
        text = _metrics_text(port)
        assert 'gen_ai_request_model="second-model"' in text and 'gen_ai_request_model="prom-model"' not in text
    finally:
        otel_llm.uninstrument()


def test_busy_port_is_logged_once_not_raised(sim: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """The port is taken (say by the application's own prometheus_client server): one warning,
    no exception, and the reader still registers in prometheus_client's global registry, so an
    application serving that registry shows otel_llm's metrics."""
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
        monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", LOOPBACK)
        monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            for _ in range(2):
                _instrument(tmp_path)
                try:
                    _streamed_call(sim.base_url, "busy-model")
                    assert b'gen_ai_request_model="busy-model"' in generate_latest(REGISTRY)
                finally:
                    otel_llm.uninstrument()
    warnings = [r.getMessage() for r in caplog.records if "cannot serve Prometheus metrics" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert f"{LOOPBACK}:{port}" in warnings[0]


# --- a real Prometheus scraping an instrumented process ----------------------------------------

_APP = """
import os, sys, time, httpx, otel_llm
otel_llm.instrument(console_summary=False, traces_file=os.devnull, gpu_metrics=False, runtime_metrics=False)
body = {"model": "scraped-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
with httpx.Client(timeout=10) as client:
    while not os.path.exists(sys.argv[2]):
        with client.stream("POST", sys.argv[1] + "/v1/chat/completions", json=body) as r:
            r.read()
        time.sleep(0.1)
"""


@pytest.mark.backend
def test_real_prometheus_scrapes_an_instrumented_process(sim: Any, prometheus_binary: str, tmp_path: Path) -> None:
    port = free_port()
    stop = tmp_path / "stop"
    (tmp_path / "app.py").write_text(_APP)
    env = clean_env(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_HOST=LOOPBACK,
                    OTEL_EXPORTER_PROMETHEUS_PORT=str(port), OTEL_SERVICE_NAME="scraped-app",
                    PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with Prometheus(prometheus_binary, {"scraped-app": f"{LOOPBACK}:{port}"}) as prom:
        app = subprocess.Popen([sys.executable, str(tmp_path / "app.py"), sim.base_url, str(stop)], env=env,
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            prom.wait_ready()
            expr = ('histogram_quantile(0.5, sum by (le, service_name, gen_ai_request_model) '
                    '(rate(gen_ai_client_operation_duration_seconds_bucket[5s])))')
            result = wait_until(lambda: finite_values(prom.query(expr)) and prom.query(expr), 30)
            assert result, (prom.up(), prom.log())
            assert prom.up() == {"scraped-app": 1.0}
            labels = result[0]["metric"]
            assert labels["service_name"] == "scraped-app" and labels["gen_ai_request_model"] == "scraped-model"
            # the simulator answers 16 tokens after 50 ms at 10 ms each: about 0.2 s per call
            assert 0.05 < float(result[0]["value"][1]) < 2.0
            assert {"gen_ai_client_operation_duration_seconds_bucket", "llm_client_phase_duration_seconds_bucket",
                    "llm_client_active_requests", "system_cpu_utilization", "target_info"} <= prom.metric_names()
        finally:
            stop.touch()
            try:
                app.wait(10)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait()
    assert app.returncode == 0, app.stdout.read().decode(errors="replace") if app.stdout else ""
