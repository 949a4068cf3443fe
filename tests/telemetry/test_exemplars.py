"""Latency histograms carry exemplars pointing at the call's trace, so a dashboard panel can
open the slow call it shows; other histograms stay exemplar-free (cheaper)."""

from __future__ import annotations

import httpx

from otel_llm import semconv as sc
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim


def test_duration_and_first_token_carry_the_calls_trace_id(otel: Otel, sim) -> None:
    configure_sim(sim, tokens=4, token_interval=0.005, first_token_delay=0.01)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=10) as client, client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                                                           json=body) as response:
        response.read()
    call, _ = otel.one_call()
    points = otel.metrics()
    for name in (sc.METRIC_OPERATION_DURATION, sc.METRIC_TIME_TO_FIRST_CHUNK):
        exemplars = [e for point in points[name] for e in point.exemplars]
        assert exemplars, name
        assert {e.trace_id for e in exemplars} == {call.context.trace_id}, name
        assert {e.span_id for e in exemplars} == {call.context.span_id}, name
    assert not [e for point in points[sc.METRIC_PHASE_DURATION] for e in point.exemplars]


def test_other_histograms_stay_exemplar_free_inside_an_application_span(otel: Otel, sim) -> None:
    """The application's own sampled span is current while the call finishes: only the latency
    histograms get an exemplar, and it points at the call, not at the application's span."""
    configure_sim(sim, tokens=4, token_interval=0.002)
    tracer = otel.tracer_provider.get_tracer("app")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with tracer.start_as_current_span("app work") as app_span, httpx.Client(timeout=10) as client:
        client.post(f"{sim.base_url}/v1/chat/completions", json=body).read()
    call, _ = otel.one_call()
    points = otel.metrics()
    for name in (sc.METRIC_PHASE_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_DIAGNOSIS_CALLS):
        assert points[name], name
        assert not [e for point in points[name] for e in point.exemplars], name
    exemplars = [e for point in points[sc.METRIC_OPERATION_DURATION] for e in point.exemplars]
    assert {e.span_id for e in exemplars} == {call.context.span_id} != {app_span.get_span_context().span_id}
