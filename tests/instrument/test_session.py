"""The Session: what otel_llm.instrument() starts, and the seams the tools use (its providers and
tracer, a relaying sink of its own, a server to watch), ended in order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.capture.call import END_EXIT, CallRequest, LlmCall, open_calls
from otel_llm.parse import routes
from otel_llm_testing.otel import Otel, make_otel

CHAT = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)
QUIET = {"console_summary": False, "host_metrics": False, "gpu_metrics": False, "runtime_metrics": False}


@pytest.fixture
def otel() -> Iterator[Otel]:
    assert otel_llm.current_session() is None
    reset_log_once()
    found = make_otel()
    otel_llm.instrument(tracer_provider=found.tracer_provider, meter_provider=found.meter_provider, **QUIET)
    yield found
    otel_llm.uninstrument()


def _request(headers: dict[str, str]) -> CallRequest:
    return CallRequest("POST", "http", "127.0.0.1", 8080, "/v1/chat/completions",
                       "http://127.0.0.1:8080/v1/chat/completions", headers, b'{"model": "m"}')


def test_the_session_holds_the_providers_it_was_given(otel: Otel) -> None:
    session = otel_llm.current_session()
    assert session is not None and session.active
    assert session.tracer_provider is otel.tracer_provider and session.meter_provider is otel.meter_provider
    assert session.sink() is session.telemetry
    with session.tracer().start_as_current_span("bench request"):
        pass
    (span,) = otel.spans()
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == sc.INSTRUMENTATION_NAME


def test_a_relaying_sink_marks_its_calls_and_the_session_s_own_does_not(otel: Otel) -> None:
    session = otel_llm.current_session()
    assert session is not None
    relay = session.relaying_sink()
    assert relay is not session.telemetry and relay.in_flight is session.telemetry.in_flight
    for sink in (relay, session.telemetry):
        call = LlmCall.open(sink, CHAT, _request({"baggage": "otel_llm.recorded=1"}))
        call.finish(END_EXIT)
    marks = sorted(bool((s.attributes or {}).get(sc.LLM_GATEWAY_RELAYED)) for s in otel.calls())
    assert marks == [False, True]


def test_after_stop_the_sink_is_gone_and_end_ends_open_calls() -> None:
    reset_log_once()
    found = make_otel()
    otel_llm.instrument(tracer_provider=found.tracer_provider, meter_provider=found.meter_provider, **QUIET)
    session = otel_llm.current_session()
    assert session is not None
    call = LlmCall.open(session.telemetry, CHAT, _request({}))
    assert call in open_calls()
    session.end()  # what the exit handler does
    assert call.finished and call not in open_calls()
    (span, _) = found.one_call()
    assert span.attributes[sc.LLM_CLIENT_END_REASON] == END_EXIT
    otel_llm.uninstrument()
    assert not session.active and session.sink() is None and otel_llm.current_session() is None
    session.watch("not a url")  # never raises, even stopped
