"""``suppress_instrumentation()`` and model calls: one rule whatever the tracer provider.

Each test makes real calls (httpx, requests, aiohttp) to a local model server that records what it
received, under the SDK's own tracer (otel_llm's cheap sink) and under a tracer provider of another
kind that, like some vendors' providers, hands out non-recording spans while instrumentation is
suppressed (otel_llm's API sink).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.utils import (is_instrumentation_enabled, suppress_http_instrumentation,
                                                 suppress_instrumentation)
from opentelemetry.trace import INVALID_SPAN

import otel_llm
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.telemetry import suppression
from otel_llm_testing.clients import post_with_each_transport
from otel_llm_testing.model_server import ModelServer
from otel_llm_testing.otel import Otel, make_otel

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class _HonouringTracer(trace.Tracer):
    """Another provider's tracer: the SDK's spans, none while instrumentation is suppressed."""

    def __init__(self, inner: trace.Tracer) -> None:
        self._inner = inner

    def start_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> trace.Span:
        parent = context if context is not None else None
        from opentelemetry import context as otel_context
        if otel_context.get_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY, parent):  # noqa: SLF001
            return INVALID_SPAN
        return self._inner.start_span(name, context, *args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.start_as_current_span(*args, **kwargs)


class _HonouringProvider(trace.TracerProvider):
    def __init__(self, inner: trace.TracerProvider) -> None:
        self._inner = inner

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _HonouringTracer(self._inner.get_tracer(*args, **kwargs))


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(tokens=3, first_token_delay=0.0, token_interval=0.0) as model_server:
        yield model_server


def _instrument(sink: str, **options: Any) -> Otel:
    reset_log_once()
    state = make_otel()
    provider: Any = state.tracer_provider if sink == "sdk" else _HonouringProvider(state.tracer_provider)
    otel_llm.instrument(tracer_provider=provider, meter_provider=state.meter_provider, host_metrics=False,
                        gpu_metrics=False, runtime_metrics=False, console_summary=False, **options)
    return state


@pytest.fixture(params=["sdk", "api"])
def sink(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param
    otel_llm.uninstrument()


def _three_clients(url: str) -> None:
    post_with_each_transport(url, BODY)


def _duration_points(otel: Otel) -> int:
    points = otel.metrics().get(sc.METRIC_OPERATION_DURATION, [])
    return sum(p.count for p in points)


def test_suppressed_calls_leave_no_span_metric_or_trace_context_and_are_logged_once(
        sink: str, server: ModelServer, caplog: pytest.LogCaptureFixture) -> None:
    otel = _instrument(sink)
    url = server.url("/v1/chat/completions")
    with caplog.at_level(logging.WARNING, logger="otel_llm"), suppress_instrumentation():
        _three_clients(url)
    assert len(server.requests) == 3 and all(r.body for r in server.requests), "the calls themselves went out"
    assert otel.spans() == []
    assert _duration_points(otel) == 0
    assert not any("traceparent" in r.headers for r in server.requests)
    said = [r.getMessage() for r in caplog.records if "suppress_instrumentation" in r.getMessage()]
    assert len(said) == 1 and "OTEL_LLM_RECORD_SUPPRESSED=true" in said[0]
    # outside it, the same calls are recorded again
    _three_clients(url)
    assert len(otel.calls()) == 3 and _duration_points(otel) == 3
    assert all("traceparent" in r.headers for r in server.requests[3:])


def test_suppressing_http_instrumentation_only_leaves_model_calls_recorded(sink: str, server: ModelServer) -> None:
    otel = _instrument(sink)
    with suppress_http_instrumentation():
        _three_clients(server.url("/v1/chat/completions"))
    calls = otel.calls()
    assert len(calls) == 3 and _duration_points(otel) == 3
    assert all(otel.children(call) for call in calls), "each with its phases"


def test_record_suppressed_records_them_under_either_tracer(sink: str, server: ModelServer,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    otel = _instrument(sink, record_suppressed=True)
    with caplog.at_level(logging.WARNING, logger="otel_llm"), suppress_instrumentation():
        _three_clients(server.url("/v1/chat/completions"))
    calls = otel.calls()
    assert len(calls) == 3 and _duration_points(otel) == 3
    assert all({sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT} <= {c.name for c in otel.children(call)} for call in calls)
    for call, received in zip(sorted(calls, key=lambda c: c.start_time), server.requests):
        assert received.headers["traceparent"].split("-")[2] == format(call.context.span_id, "016x")
    assert not [r for r in caplog.records if "suppress_instrumentation" in r.getMessage()]


def test_the_option_reads_its_variable() -> None:
    from otel_llm.config import resolve

    assert resolve({}, {}).record_suppressed is False
    assert resolve({}, {"OTEL_LLM_RECORD_SUPPRESSED": "true"}).record_suppressed is True
    assert resolve({}, {"OTEL_LLM_RECORD_SUPPRESSED": "false"}).record_suppressed is False
    assert resolve({"record_suppressed": True}, {}).record_suppressed is True
    assert resolve({}, {"OTEL_LLM_RECORD_SUPPRESSED": "maybe"}).record_suppressed is False  # logged, default


def test_unsuppressed_lifts_both_spellings_of_the_key() -> None:
    from opentelemetry import context

    with suppress_instrumentation():
        assert suppression.suppressed() and not is_instrumentation_enabled()
        token = context.attach(suppression.unsuppressed())
        try:
            assert not suppression.suppressed() and is_instrumentation_enabled()
        finally:
            context.detach(token)
        assert suppression.suppressed()
    assert not suppression.suppressed()
