"""The trace context written into model requests: the direct path for the default propagators
writes what the propagator would, and every other configuration goes through the propagator.
Next to ``traceparent`` goes ``otel_llm.recorded=1`` in the baggage (a gateway reads it), merged
into a baggage header the application sends."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import baggage, context, propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_llm.telemetry.propagation import (PENDING_ENTRY, RECORDED_ENTRY, inject_context, pending_at_caller,
                                            recorded_by_caller)
from otel_llm.telemetry.spans import CallSpan


class Upper(TextMapPropagator):
    """A propagator of its own: its header must appear, and no traceparent of ours."""

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        carrier["x-upper"] = "1"

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context

    @property
    def fields(self) -> set[str]:
        return {"x-upper"}


def _span(flags: int = TraceFlags.SAMPLED, state: TraceState | None = None) -> CallSpan:
    ctx = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0x00F067AA0BA902B7, False, TraceFlags(flags),
                      state or TraceState())
    return CallSpan(ctx, None, True, "chat m", {})


def _by_propagator(span: CallSpan) -> dict[str, str]:
    """What the global propagator itself writes for the span."""
    from opentelemetry import trace

    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(trace.NonRecordingSpan(span.context)))
    return headers


@pytest.fixture
def textmap() -> Any:
    previous = propagate.get_global_textmap()
    yield propagate.set_global_textmap
    propagate.set_global_textmap(previous)


@pytest.mark.parametrize("members", [
    [TraceContextTextMapPropagator(), W3CBaggagePropagator()], [TraceContextTextMapPropagator()],
])
@pytest.mark.parametrize("flags, state", [
    (TraceFlags.SAMPLED, None), (TraceFlags.DEFAULT, None), (TraceFlags.SAMPLED, TraceState([("a", "b"), ("c", "d")])),
])
def test_default_propagators_get_the_same_headers(textmap: Any, members: list[Any], flags: int,
                                                  state: TraceState | None) -> None:
    textmap(CompositePropagator(members))
    span = _span(flags, state)
    headers: dict[str, str] = {}
    inject_context(headers, span)
    # the mark goes where baggage is propagated (OTEL_PROPAGATORS=tracecontext: no baggage header)
    mark = {"baggage": RECORDED_ENTRY} if len(members) == 2 else {}
    assert headers == {**_by_propagator(span), **mark}
    assert headers["traceparent"] == f"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-{flags:02x}"
    assert ("tracestate" in headers) == bool(state)


def test_baggage_in_the_context_is_propagated(textmap: Any) -> None:
    textmap(CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()]))
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        headers: dict[str, str] = {}
        inject_context(headers, _span())
    finally:
        context.detach(token)
    assert headers["baggage"] == f"tenant=acme,{RECORDED_ENTRY}"
    assert headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")


@pytest.mark.parametrize("members", [
    [Upper()], [TraceContextTextMapPropagator(), Upper()], [W3CBaggagePropagator(), Upper()],
    [TraceContextTextMapPropagator(), W3CBaggagePropagator(), Upper()],
])
def test_other_propagators_are_used_as_configured(textmap: Any, members: list[Any]) -> None:
    textmap(CompositePropagator(members))
    headers: dict[str, str] = {}
    inject_context(headers, _span())
    assert headers["x-upper"] == "1"
    tracecontext = any(isinstance(p, TraceContextTextMapPropagator) for p in members)
    assert ("traceparent" in headers) == tracecontext
    # the mark travels with the W3C trace context, and only where baggage is propagated
    with_baggage = any(isinstance(p, W3CBaggagePropagator) for p in members)
    assert headers.get("baggage") == (RECORDED_ENTRY if tracecontext and with_baggage else None)


def test_no_propagators_write_no_header(textmap: Any) -> None:
    """``OTEL_PROPAGATORS=none``: neither ``traceparent`` nor the baggage mark."""
    textmap(CompositePropagator([]))
    headers: dict[str, str] = {"x-app": "1"}
    inject_context(headers, _span())
    assert headers == {"x-app": "1"}


def test_otel_propagators_decides_in_a_fresh_process() -> None:
    """The variable as users set it, read by OpenTelemetry at import: ``tracecontext`` alone sends
    ``traceparent`` and no baggage; ``none`` sends neither."""
    import os
    import subprocess
    import sys

    script = ("from tests.telemetry.test_propagation import _span\n"
              "from otel_llm.telemetry.propagation import inject_context\n"
              "h = {}\ninject_context(h, _span())\nprint(sorted(h))")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    seen = {}
    for value in ("tracecontext,baggage", "tracecontext", "none"):
        env = {**os.environ, "OTEL_PROPAGATORS": value, "PYTHONPATH": root}
        seen[value] = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                     env=env, cwd=root).stdout.strip()
    assert seen == {"tracecontext,baggage": "['baggage', 'traceparent']", "tracecontext": "['traceparent']",
                    "none": "[]"}


@pytest.mark.parametrize("sent, merged", [
    ("tenant=acme", f"tenant=acme,{RECORDED_ENTRY}"),
    ("tenant=acme;ttl=5, user=bob", f"tenant=acme;ttl=5, user=bob,{RECORDED_ENTRY}"),
    (f"a=1,{RECORDED_ENTRY}", f"a=1,{RECORDED_ENTRY}"),  # already there (a gateway forwarding it): once
    ("otel_llm.recorded=0", "otel_llm.recorded=0"),  # the application's own word is left alone
    ("x=" + "y" * 8190, "x=" + "y" * 8190),  # already at the W3C limit of 8192 bytes: left as it is
])
def test_the_applications_baggage_header_is_kept_and_the_mark_added(sent: str, merged: str) -> None:
    import httpx

    headers = httpx.Headers({"Baggage": sent, "x-app": "1"})
    inject_context(headers, _span())
    assert headers.get_list("baggage") == [merged]
    assert headers["x-app"] == "1" and headers["traceparent"].startswith("00-")


def test_baggage_on_several_lines_is_merged_into_one() -> None:
    from multidict import CIMultiDict

    headers: CIMultiDict[str] = CIMultiDict([("baggage", "a=1"), ("Baggage", "b=2")])
    inject_context(headers, _span())
    assert headers.getall("baggage") == [f"a=1,b=2,{RECORDED_ENTRY}"]


@pytest.mark.parametrize("sent, recorded", [
    (None, False), ("", False), ("tenant=acme", False), (RECORDED_ENTRY, True),
    (f"tenant=acme, {RECORDED_ENTRY};prop", True), ("otel_llm.recorded=0", False),
    ("xotel_llm.recorded=1", False), ("otel_llm.recorded=1x", False),
])
def test_a_gateway_reads_whether_the_caller_recorded_the_call(sent: str | None, recorded: bool) -> None:
    assert recorded_by_caller({} if sent is None else {"baggage": sent}) is recorded


@pytest.mark.parametrize("sent, pending", [
    (None, False), (RECORDED_ENTRY, False), (PENDING_ENTRY, True), (f"tenant=acme, {RECORDED_ENTRY} ; pending", True),
    (f"{RECORDED_ENTRY};prop", False), ("otel_llm.recorded=0;pending", False), ("pending=1", False),
    ("tenant=acme;pending", False),
])
def test_a_gateway_reads_whether_the_caller_s_decision_is_pending(sent: str | None, pending: bool) -> None:
    assert pending_at_caller({} if sent is None else {"baggage": sent}) is pending


def test_a_pending_decision_is_marked_beside_the_application_s_baggage() -> None:
    headers = {"baggage": "tenant=acme"}
    inject_context(headers, _span(), pending=True)
    assert headers["baggage"] == f"tenant=acme,{PENDING_ENTRY}"
    assert recorded_by_caller(headers) and pending_at_caller(headers)
    decided: dict[str, str] = {}
    inject_context(decided, _span())
    assert decided["baggage"] == RECORDED_ENTRY and not pending_at_caller(decided)
