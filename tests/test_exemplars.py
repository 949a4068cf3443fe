"""Latency histograms carry exemplars pointing at the call's trace, so a dashboard panel can
open the slow call it shows; other histograms stay exemplar-free (cheaper)."""

from __future__ import annotations

import httpx

from otel_llm import semconv as sc
from tests.conftest import Otel, configure_sim


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
