"""Beside another GenAI instrumentation: the other span is the call's, otel_llm's is its transport
view, and the ``gen_ai.client.*`` metrics are left to an instrumentation known to record them.

The other instrumentation here is a tracer of another scope opening the span it would (the real
packages, each in a virtualenv of its own, are in ``tests/e2e/test_beside_instrumentations.py``);
the calls are real (httpx, requests, aiohttp) to a local model server.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanKind

import otel_llm
from otel_llm import semconv as sc
from otel_llm.telemetry.beside import genai_parent, metrics_left_to, transport_attributes, transport_name
from otel_llm_testing.clients import post_with_each_transport
from otel_llm_testing.model_server import ModelServer
from otel_llm_testing.otel import Otel, make_otel

BODY = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]}
OFFICIAL = "opentelemetry.instrumentation.genai.openai"
GENAI_METRICS = (sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_TO_FIRST_CHUNK,
                 sc.METRIC_TIME_PER_OUTPUT_CHUNK)


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer(tokens=4, first_token_delay=0.0, token_interval=0.001) as model_server:
        yield model_server


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield make_otel()
    otel_llm.uninstrument()


def _instrument(otel: Otel, **options: Any) -> None:
    otel_llm.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False, console_summary=False,
                        **options)


def _under_genai_span(otel: Otel, url: str, scope: str = OFFICIAL, name: str = "chat m",
                      attributes: dict[str, Any] | None = None) -> None:
    """Three calls (one per HTTP stack), each under its own span of ``scope``, as a GenAI
    instrumentation opens it around the client's call."""
    tracer = otel.tracer_provider.get_tracer(scope)
    attributes = {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m"} if attributes is None \
        else attributes
    for post in _posts(url):
        with tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes):
            post()


def _posts(url: str) -> list[Any]:
    import asyncio

    import aiohttp
    import requests

    async def aio() -> None:
        async with aiohttp.ClientSession() as session, session.post(url, json=BODY) as response:
            await response.read()

    return [lambda: httpx.post(url, json=BODY, timeout=10).read(),
            lambda: requests.post(url, json=BODY, timeout=10).close(),
            lambda: asyncio.run(aio())]


def _counts(otel: Otel) -> dict[str, int]:
    """Data points' total count per histogram name, over every scope."""
    return {name: sum(getattr(point, "count", 0) for point in points) for name, points in otel.metrics().items()}


def test_under_a_genai_span_otel_llm_s_span_is_its_transport_view(otel: Otel, server: ModelServer) -> None:
    _instrument(otel)
    _under_genai_span(otel, server.url("/v1/chat/completions"))
    spans = otel.spans()
    theirs = [s for s in spans if s.instrumentation_scope.name == OFFICIAL]
    ours = [s for s in spans if s.instrumentation_scope.name == sc.INSTRUMENTATION_NAME
            and s.kind is SpanKind.CLIENT]
    assert len(theirs) == 3 and len(ours) == 3
    # one span per call carries the GenAI view: the other instrumentation's
    assert [s.name for s in spans if sc.GEN_AI_OPERATION_NAME in (s.attributes or {})] == ["chat m"] * 3
    for call, parent in zip(ours, theirs):
        attributes = dict(call.attributes or {})
        assert call.name == "POST /v1/chat/completions" and call.parent is not None
        assert call.parent.span_id == parent.context.span_id
        assert attributes[sc.LLM_BESIDE_INSTRUMENTATION] == OFFICIAL
        assert not [key for key in attributes if key.startswith("gen_ai.")], attributes
        assert attributes[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] > 0 and attributes[sc.SERVER_PORT] == server.port
        phases = [s.name for s in otel.children(call)]
        assert phases and "llm.decode" in phases, phases
    counts = _counts(otel)
    # left to the official instrumentation (which would record them under its own scope)
    assert not [name for name in GENAI_METRICS if counts.get(name)], counts
    assert counts[sc.METRIC_PHASE_DURATION] > 0


def test_an_instrumentation_not_known_to_record_metrics_leaves_them_to_otel_llm(otel: Otel,
                                                                                server: ModelServer) -> None:
    """OpenInference's instrumentations, say, record no metric: otel_llm still records the gen_ai
    ones, once per call, while its span is the transport view."""
    _instrument(otel)
    _under_genai_span(otel, server.url("/v1/chat/completions"), scope="openinference.instrumentation.openai",
                      name="ChatCompletion", attributes={"openinference.span.kind": "LLM"})
    ours = [s for s in otel.calls() if s.instrumentation_scope.name == sc.INSTRUMENTATION_NAME]
    assert [s.name for s in ours] == ["POST /v1/chat/completions"] * 3
    counts = _counts(otel)
    assert counts[sc.METRIC_OPERATION_DURATION] == 3 and counts[sc.METRIC_TIME_TO_FIRST_CHUNK] == 3
    assert counts[sc.METRIC_TIME_PER_OUTPUT_CHUNK] == 3 * 3  # four output chunks a call


def test_beside_genai_off_gives_otel_llm_s_own_call_span(otel: Otel, server: ModelServer) -> None:
    _instrument(otel, beside_genai=False)
    _under_genai_span(otel, server.url("/v1/chat/completions"))
    ours = [s for s in otel.calls() if s.instrumentation_scope.name == sc.INSTRUMENTATION_NAME]
    assert [s.name for s in ours] == ["chat m"] * 3
    assert all(sc.LLM_BESIDE_INSTRUMENTATION not in (s.attributes or {}) for s in ours)
    assert _counts(otel)[sc.METRIC_OPERATION_DURATION] == 3


@pytest.mark.parametrize("case", ["another model", "another server", "internal span", "not a model call",
                                  "otel_llm's own"])
def test_a_span_for_something_else_is_not_joined(otel: Otel, server: ModelServer, case: str) -> None:
    """The application's own span around the request, or a GenAI span for another call, stays the
    parent of otel_llm's call span as alone."""
    _instrument(otel)
    url = server.url("/v1/chat/completions")
    attributes: dict[str, Any] = {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m"}
    scope, kind, name = OFFICIAL, SpanKind.CLIENT, "chat m"
    if case == "another model":
        attributes[sc.GEN_AI_REQUEST_MODEL] = "other"
    elif case == "another server":
        attributes[sc.SERVER_ADDRESS] = "api.example.com"
    elif case == "internal span":
        kind = SpanKind.INTERNAL
    elif case == "not a model call":
        attributes, name = {sc.GEN_AI_OPERATION_NAME: "invoke_agent"}, "invoke_agent planner"
    else:
        scope = sc.INSTRUMENTATION_NAME
    tracer = otel.tracer_provider.get_tracer(scope)
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes):
        httpx.post(url, json=BODY, timeout=10).read()
    call = next(s for s in otel.spans() if s.name == "chat m" and s.parent is not None)
    assert sc.LLM_BESIDE_INSTRUMENTATION not in (call.attributes or {})
    assert _counts(otel)[sc.METRIC_OPERATION_DURATION] == 1


def test_a_span_named_for_a_model_call_is_joined_before_its_attributes_are_set(otel: Otel,
                                                                               server: ModelServer) -> None:
    """openlit sets its span's attributes once the response is back: its ``chat m`` CLIENT span is
    recognised by its name."""
    _instrument(otel)
    _under_genai_span(otel, server.url("/v1/chat/completions"), scope="openlit.instrumentation.openai",
                      attributes={})
    ours = [s for s in otel.calls() if s.instrumentation_scope.name == sc.INSTRUMENTATION_NAME]
    assert [(s.attributes or {}).get(sc.LLM_BESIDE_INSTRUMENTATION) for s in ours] == \
        ["openlit.instrumentation.openai"] * 3
    assert not _counts(otel).get(sc.METRIC_OPERATION_DURATION)


def test_every_stack_s_bytes_reach_the_application_unchanged_under_the_other_span(otel: Otel,
                                                                                  server: ModelServer) -> None:
    url = server.url("/v1/chat/completions")
    plain = httpx.post(url, json=BODY, timeout=10).content
    _instrument(otel)
    with otel.tracer_provider.get_tracer(OFFICIAL).start_as_current_span(
            "chat m", kind=SpanKind.CLIENT, attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
        joined = httpx.post(url, json=BODY, timeout=10).content
        post_with_each_transport(url, BODY)
    assert _text(joined) == _text(plain) and joined.count(b"data:") == plain.count(b"data:")


def _text(body: bytes) -> str:
    """The server's chunks less their ids and timestamps."""
    import json

    parts = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            parts.extend((choice.get("delta") or {}).get("content") or "" for choice in event.get("choices") or [])
    return "".join(parts)


def test_genai_parent_reads_only_what_it_can() -> None:
    tracer = TracerProvider().get_tracer(OFFICIAL)
    with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT) as span:
        assert genai_parent(span, "m", "127.0.0.1") == OFFICIAL
        assert genai_parent(span, None, None) == OFFICIAL
    assert genai_parent(INVALID_SPAN, "m", None) is None
    assert genai_parent(NonRecordingSpan(INVALID_SPAN.get_span_context()), "m", None) is None

    class Hostile:
        def is_recording(self) -> bool:
            raise RuntimeError("no")

    assert genai_parent(Hostile(), "m", None) is None
    assert genai_parent(object(), "m", None) is None


def test_metrics_left_to_by_scope() -> None:
    """What each instrumentation records itself, from its sources and the real runs."""
    client = {sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_TO_FIRST_CHUNK,
              sc.METRIC_TIME_PER_OUTPUT_CHUNK}
    assert metrics_left_to(OFFICIAL) == client
    assert metrics_left_to("opentelemetry.instrumentation.openai_v2") == {sc.METRIC_OPERATION_DURATION,
                                                                          sc.METRIC_TOKEN_USAGE}
    assert metrics_left_to("openlit.instrumentation.openai") == client | {sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN,
                                                                          sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN}
    assert metrics_left_to("opentelemetry.instrumentation.openai.v1") == {  # OpenLLMetry's
        sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN}
    assert not metrics_left_to("openinference.instrumentation.openai") and not metrics_left_to("my.company.llm")
    assert not metrics_left_to(None)


def test_transport_name_and_attributes() -> None:
    assert transport_name("POST", "/v1/chat/completions?x=1") == "POST /v1/chat/completions"
    assert transport_attributes({"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 3,
                                 "server.port": 1, "llm.client.chunks": 2}) == {"server.port": 1,
                                                                                "llm.client.chunks": 2}


def test_the_viewer_and_the_summary_show_one_call_named_from_the_other_span(otel: Otel,
                                                                            server: ModelServer) -> None:
    """``otel-llm view`` shows each call once, named and completed (model, tokens) from the other
    instrumentation's span, with otel_llm's phases; the summary line is written for otel_llm's
    transport view only."""

    from otel_llm.export.jsonl import flatten_spans
    from otel_llm.export.summary import SummarySpanProcessor, is_model_call
    from otel_llm.tools.view import group_calls, render_call

    lines = io.StringIO()
    otel.tracer_provider.add_span_processor(SummarySpanProcessor(lines))
    _instrument(otel)
    tracer = otel.tracer_provider.get_tracer(OFFICIAL)
    with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT,
                                      attributes={sc.GEN_AI_OPERATION_NAME: "chat"}) as span:
        httpx.post(server.url("/v1/chat/completions"), json=BODY, timeout=10).read()
        span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 4)  # as the official one does at the end
    spans = otel.spans()
    assert [s.name for s in spans if is_model_call(s)] == ["POST /v1/chat/completions"]
    assert lines.getvalue().startswith("otel-llm  POST /v1/chat/completions @127.0.0.1:"), lines.getvalue()
    [call] = group_calls(flatten_spans(spans))
    assert call.span["name"] == "POST /v1/chat/completions" and call.genai is not None
    assert [p["name"] for p in call.phases][-1] == "llm.decode"
    text = render_call(call, 100)
    assert text.startswith("chat m  127.0.0.1:") and "out 4" in text, text


def test_each_attempt_under_one_genai_span_is_a_transport_view_of_its_own(otel: Otel, server: ModelServer) -> None:
    """A client that retries makes several requests under its instrumentation's one span."""
    from otel_llm.export.jsonl import flatten_spans
    from otel_llm.tools.view import group_calls

    _instrument(otel)
    tracer = otel.tracer_provider.get_tracer(OFFICIAL)
    with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT,
                                      attributes={sc.GEN_AI_OPERATION_NAME: "chat"}) as span:
        for _ in range(2):
            httpx.post(server.url("/v1/chat/completions"), json=BODY, timeout=10).read()
    views = [s for s in otel.calls() if s.instrumentation_scope.name == sc.INSTRUMENTATION_NAME]
    assert len(views) == 2 and {v.parent.span_id for v in views if v.parent} == {span.get_span_context().span_id}
    calls = group_calls(flatten_spans(otel.spans()))
    assert len(calls) == 2 and all(call.genai is not None and call.phases for call in calls)


def test_beside_an_instrumentation_that_records_some_gen_ai_metrics_otel_llm_records_the_rest(
        otel: Otel, server: ModelServer) -> None:
    """OpenLLMetry records the duration and token usage, not the chunk timings: otel_llm records
    those, once per call (per chunk), and nothing of what OpenLLMetry records."""
    _instrument(otel)
    _under_genai_span(otel, server.url("/v1/chat/completions"), scope="opentelemetry.instrumentation.openai.v1")
    counts = _counts(otel)
    assert not counts.get(sc.METRIC_OPERATION_DURATION) and not counts.get(sc.METRIC_TOKEN_USAGE), counts
    assert counts[sc.METRIC_TIME_TO_FIRST_CHUNK] == 3 and counts[sc.METRIC_TIME_PER_OUTPUT_CHUNK] == 3 * 3
