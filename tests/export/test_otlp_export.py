"""Real OTLP on the wire: otel_llm's private providers export to loopback receivers that decode
the protobuf payloads (http/protobuf, gRPC, and the standard OTEL_EXPORTER_OTLP_ENDPOINT)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace

import otel_llm
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.collectors import OtlpGrpcCollector, OtlpHttpCollector, Received, attributes_of
from otel_llm_testing.subprocesses import clean_env, run_python
from otel_llm_testing.net import wait_for

STREAMED_PHASES = [sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
KIND_CLIENT, KIND_INTERNAL = 3, 1  # OTLP numbering
TOKENS = 5


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only explicit options configure the in-process exporters; no global providers exist."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    reset_log_once()
    yield


def _streamed_call(base_url: str, model: str = "otlp-model") -> None:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hello there"}],
            "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=10) as client, client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        r.read()


def _check_export(received: Received, service: str, model: str = "otlp-model") -> None:
    """One call span with its phase children (right parents), the resource and gen_ai.* attributes."""
    spans = received.spans()
    calls = [(res, s) for res, s in spans if s.kind == KIND_CLIENT]
    assert len(calls) == 1, [s.name for _, s in spans]
    resource, call = calls[0]
    assert resource["service.name"] == service
    assert call.name == f"chat {model}"
    assert not call.parent_span_id
    attrs = attributes_of(call.attributes)
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == model
    assert attrs[sc.GEN_AI_RESPONSE_MODEL] == model
    assert attrs[sc.GEN_AI_REQUEST_STREAM] is True
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == TOKENS
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert attrs[sc.LLM_CLIENT_CHUNKS] == TOKENS
    children = sorted((s for _, s in spans if s.parent_span_id == call.span_id), key=lambda s: s.start_time_unix_nano)
    # a pool wait shows up only when getting the connection took over 1 ms
    assert [c.name for c in children if c.name != sc.SPAN_POOL_WAIT] == STREAMED_PHASES
    for child in children:
        assert child.trace_id == call.trace_id and child.kind == KIND_INTERNAL
        assert call.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= call.end_time_unix_nano
    assert children[0].start_time_unix_nano == call.start_time_unix_nano
    assert children[-1].end_time_unix_nano == call.end_time_unix_nano
    for earlier, later in zip(children, children[1:]):
        assert earlier.end_time_unix_nano == later.start_time_unix_nano  # phases tile the call
    assert len(spans) == 1 + len(children)


def _check_exemplars(received: Received) -> None:
    """The latency histograms reach the wire with exemplars naming the call span (what lets a
    collector and Prometheus link a dashboard panel to the trace)."""
    call = next(s for _, s in received.spans() if s.kind == KIND_CLIENT)
    found = {}
    for request in received.metrics:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.WhichOneof("data") == "histogram":
                        for point in metric.histogram.data_points:
                            found.setdefault(metric.name, []).extend(point.exemplars)
    for name in (sc.METRIC_OPERATION_DURATION, sc.METRIC_TIME_TO_FIRST_CHUNK):
        assert found.get(name), name
        assert {(e.trace_id, e.span_id) for e in found[name]} == {(call.trace_id, call.span_id)}, name


def _check_metrics(received: Received) -> None:
    names = received.metric_names()
    assert {sc.METRIC_OPERATION_DURATION, sc.METRIC_PHASE_DURATION, sc.METRIC_TOKEN_USAGE} <= names, names


def test_http_protobuf(sim) -> None:
    """endpoint + protocol="http/protobuf": traces and metrics arrive at /v1/traces and /v1/metrics."""
    configure_sim(sim, tokens=TOKENS, first_token_delay=0.01, token_interval=0.002)
    with OtlpHttpCollector() as collector:
        otel_llm.instrument(endpoint=collector.endpoint, protocol="http/protobuf", service_name="svc-x")
        try:
            _streamed_call(sim.base_url)
        finally:
            otel_llm.uninstrument()  # flushes and shuts down the private providers
        received = collector.received
        assert received.traces, "no trace export arrived"
        assert all(ct == "application/x-protobuf" for ct in received.content_types)
        _check_export(received, "svc-x")
        _check_metrics(received)
        _check_exemplars(received)


def test_grpc(sim) -> None:
    """protocol="grpc" to an insecure http:// endpoint reaches a real grpc.server."""
    configure_sim(sim, tokens=TOKENS, first_token_delay=0.01, token_interval=0.002)
    with OtlpGrpcCollector() as collector:
        otel_llm.instrument(endpoint=collector.endpoint, protocol="grpc", service_name="svc-grpc")
        try:
            _streamed_call(sim.base_url)
        finally:
            otel_llm.uninstrument()
        assert wait_for(lambda: bool(collector.received.traces), 5), "no trace export arrived"
        _check_export(collector.received, "svc-grpc")
        _check_metrics(collector.received)


_STANDARD_ENV_SCRIPT = """
import sys, httpx, otel_llm
otel_llm.instrument()
body = {"model": "env-model", "stream": True, "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": True}}
with httpx.Client(timeout=10) as client, client.stream("POST", sys.argv[1] + "/v1/chat/completions", json=body) as r:
    r.read()
# no uninstrument(): the exit must flush
"""


ENV_CASES = {
    "standard": ({"OTEL_SERVICE_NAME": "svc-env"}, "OTEL_EXPORTER_OTLP_ENDPOINT", ""),
    "standard-gzip": ({"OTEL_SERVICE_NAME": "svc-env", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
                      "OTEL_EXPORTER_OTLP_ENDPOINT", "gzip"),
    "otel-llm-vars": ({"OTEL_LLM_SERVICE_NAME": "svc-env", "OTEL_LLM_PROTOCOL": "http/protobuf"},
                      "OTEL_LLM_ENDPOINT", ""),
}


@pytest.mark.parametrize("case", sorted(ENV_CASES))
def test_endpoint_variable_http(sim, tmp_path: Path, case: str) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT alone (clean env, subprocess) exports over HTTP at exit; so does
    OTEL_LLM_ENDPOINT. No JSONL file and no summary lines are written."""
    extra, endpoint_variable, encoding = ENV_CASES[case]
    configure_sim(sim, tokens=TOKENS, first_token_delay=0.01, token_interval=0.002)
    with OtlpHttpCollector() as collector:
        env = clean_env(**extra, **{endpoint_variable: collector.endpoint})
        result = run_python(_STANDARD_ENV_SCRIPT, tmp_path, env, sim.base_url)
        assert result.returncode == 0, result.stderr
        received = collector.received
        assert wait_for(lambda: bool(received.traces), 5), result.stderr
        assert set(received.encodings) == {encoding}
        _check_export(received, "svc-env", model="env-model")
        _check_metrics(received)
    assert not (tmp_path / "otel-llm-traces.jsonl").exists()
    assert not [line for line in result.stderr.splitlines() if line.startswith("otel-llm")]


def test_endpoint_variable_grpc(sim, tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc with OTEL_EXPORTER_OTLP_ENDPOINT exports over gRPC at exit."""
    configure_sim(sim, tokens=TOKENS, first_token_delay=0.01, token_interval=0.002)
    with OtlpGrpcCollector() as collector:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                        OTEL_SERVICE_NAME="svc-env-grpc")
        result = run_python(_STANDARD_ENV_SCRIPT, tmp_path, env, sim.base_url)
        assert result.returncode == 0, result.stderr
        assert wait_for(lambda: bool(collector.received.traces), 5), result.stderr
        _check_export(collector.received, "svc-env-grpc", model="env-model")
        _check_metrics(collector.received)
