"""Telemetry, the sink of captured calls (otel_llm.telemetry.calls), driven directly with hand-built
records: the span tree, the llm.client.* timings, errors and metrics each record gives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.capture import call as capture_call
from otel_llm.capture.call import LlmCall
from otel_llm.capture.record import (
    END_CANCELLED, END_CLOSED, END_EOF, END_ERROR, END_EXIT, CallRecord, CallRequest, Timeline, TlsInfo,
)
from otel_llm.parse import routes
from otel_llm.parse.formats import stream_format
from otel_llm.parse.framing import StreamStats
from otel_llm.telemetry import calls as calls_module
from otel_llm.telemetry.calls import CallSettings, Telemetry
from otel_llm_testing.otel import Otel, make_otel

MS = 1_000_000
NS = 1e-9
T0 = 7_000 * MS  # the call's start on the perf counter
EPOCH = 1_750_000_000 * 1_000_000_000  # wall-clock nanoseconds at T0
CHAT = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)
OLLAMA = routes.Route(routes.API_OLLAMA_CHAT, routes.OP_CHAT, "ollama")
HOST, PORT = "10.0.0.5", 8000
URL = f"http://{HOST}:{PORT}/v1/chat/completions"
PEER = ("10.0.0.5", 8000)
MODEL = "gpt-test"
STREAM_BODY = json.dumps({"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
SSE_HEADERS = {"content-type": "text/event-stream"}

# A fresh TLS connection: dns 0-3 ms, connect 3-6, tls 6-10, upload 10-12 (the tiling starts the
# upload where TLS ended), server wait 12-40, first token at 90, last at 490, end at 500.
FRESH = Timeline(T0, EPOCH, T0 + 500 * MS, connect_start=T0 + 1 * MS, dns_start=T0 + 1 * MS, dns_end=T0 + 3 * MS,
                 connect_end=T0 + 6 * MS, tls_start=T0 + 6 * MS, tls_end=T0 + 10 * MS, upload_start=T0 + 11 * MS,
                 body_sent=T0 + 12 * MS, headers=T0 + 40 * MS)
FIRST_TOKEN, LAST_TOKEN, MAX_GAP = T0 + 90 * MS, T0 + 490 * MS, 35 * MS
TOKEN_EVENTS, INPUT_TOKENS, OUTPUT_TOKENS = 5, 7, 9  # usage says 9 tokens, in 5 events
EVENTS = (
    b'data: {"id":"c1","model":"gpt-test-0613","choices":[{"delta":{"role":"assistant"}}]}',
    b'data: {"id":"c1","model":"gpt-test-0613","choices":[{"delta":{},"finish_reason":"stop"}]}',
    b'data: {"id":"c1","model":"gpt-test-0613","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}'
    % (INPUT_TOKENS, OUTPUT_TOKENS),
    b"data: [DONE]",
)
STATS = StreamStats(stream_format(routes.API_OPENAI_CHAT, "text/event-stream"), chunks=7, size=1234,
                    token_events=TOKEN_EVENTS, first_token_ns=FIRST_TOKEN, last_token_ns=LAST_TOKEN,
                    max_gap_ns=MAX_GAP, arrival_groups=TOKEN_EVENTS, events=EVENTS,
                    gaps=(MAX_GAP,) + ((LAST_TOKEN - FIRST_TOKEN - MAX_GAP) // (TOKEN_EVENTS - 2),)
                    * (TOKEN_EVENTS - 2))
TLS = TlsInfo("TLSv1.3", "TLS_AES_256_GCM_SHA384", "http/1.1")


def _request(url: str = URL, headers: Any = None, body: bytes | None = STREAM_BODY, method: str = "POST",
             path: str = "/v1/chat/completions") -> CallRequest:
    parts = httpx.URL(url)
    return CallRequest(method, parts.scheme, parts.host, parts.port, path, url, {} if headers is None else headers,
                       body)


class Sink:
    """A Telemetry over in-memory providers, and the calls it was told about."""

    def __init__(self, otel: Otel, settings: CallSettings | None = None) -> None:
        self.otel = otel
        self.telemetry = Telemetry(otel.tracer_provider, otel.meter_provider, settings or CallSettings())

    def open(self, request: CallRequest | None = None, route: routes.Route = CHAT) -> LlmCall:
        return LlmCall.open(self.telemetry, route, request or _request())

    def finish(self, call: LlmCall, timeline: Timeline = FRESH, **fields: Any) -> None:
        """Hand Telemetry the record of ``call`` (defaults: a streamed 200 that ended at EOF)."""
        values: dict[str, Any] = dict(
            key=call.key, route=call.route, request=call.request, timeline=timeline, peer=PEER, tls=TLS,
            http_version="HTTP/1.1", status=200, response_headers=SSE_HEADERS, stream=STATS, body=None,
            captured=None, end_reason=END_EOF, exception=None)
        values.update(fields)
        # what LlmCall.finish does, with a hand-built record
        capture_call._open.pop(call.key, None)
        state, call.state = call.state, None
        call.sink.call_finished(CallRecord(**values), state)

    def call(self, **fields: Any) -> tuple[ReadableSpan, list[ReadableSpan]]:
        """One call opened and finished; its call span and phase spans."""
        self.finish(self.open(), **fields)
        return self.otel.one_call()


@pytest.fixture
def sink() -> Iterator[Sink]:
    reset_log_once()
    yield Sink(make_otel())


def _offsets(spans: list[ReadableSpan]) -> list[tuple[str, float, float]]:
    """(name, start, end) of each span in milliseconds after the call's start."""
    return [(s.name, (s.start_time - EPOCH) / MS, (s.end_time - EPOCH) / MS) for s in spans]


def _one(points: list[Any], **attributes: Any) -> Any:
    found = [p for p in points if all(p.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, [dict(p.attributes) for p in points]
    return found[0]


# --- the span tree ------------------------------------------------------------------------------


def test_streamed_call_gives_its_phase_spans_on_the_wall_clock(sink: Sink) -> None:
    call, kids = sink.call()
    assert call.name == f"chat {MODEL}" and call.kind == SpanKind.CLIENT and call.parent is None
    assert (call.start_time, call.end_time) == (EPOCH, EPOCH + (FRESH.end - T0))
    assert _offsets(kids) == [
        (sc.SPAN_DNS, 0, 3), (sc.SPAN_CONNECT, 3, 6), (sc.SPAN_TLS, 6, 10), (sc.SPAN_UPLOAD, 10, 12),
        (sc.SPAN_SERVER_WAIT, 12, 40), (sc.SPAN_FIRST_TOKEN, 40, (FIRST_TOKEN - T0) / MS),
        (sc.SPAN_DECODE, (FIRST_TOKEN - T0) / MS, 500),
    ]
    assert all(k.kind == SpanKind.INTERNAL and k.status.status_code == StatusCode.UNSET for k in kids)
    assert all(k.context.trace_id == call.context.trace_id for k in kids)
    assert call.status.status_code == StatusCode.UNSET
    by_name = {k.name: dict(k.attributes or {}) for k in kids}
    assert by_name[sc.SPAN_TLS] == {sc.TLS_PROTOCOL_VERSION: TLS.version, sc.TLS_CIPHER: TLS.cipher,
                                    sc.TLS_NEXT_PROTOCOL: TLS.alpn}
    assert by_name[sc.SPAN_DNS] == {sc.DNS_QUESTION_NAME: HOST}
    assert by_name[sc.SPAN_CONNECT] == {}  # the handshake had its own phase


def test_traceparent_written_at_start_names_the_exported_call_span(sink: Sink) -> None:
    headers: dict[str, Any] = {}
    sink.finish(sink.open(_request(headers=headers)))
    call, _ = sink.otel.one_call()
    context = call.context
    assert headers["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert context.trace_flags.sampled


def test_a_connect_step_that_includes_the_handshake_carries_the_tls_attributes(sink: Sink) -> None:
    timeline = FRESH._replace(tls_start=0, tls_end=0)
    _, kids = sink.call(timeline=timeline)
    connect = next(k for k in kids if k.name == sc.SPAN_CONNECT)
    assert sc.SPAN_TLS not in [k.name for k in kids]
    assert dict(connect.attributes or {}) == {sc.TLS_PROTOCOL_VERSION: TLS.version, sc.TLS_CIPHER: TLS.cipher,
                                              sc.TLS_NEXT_PROTOCOL: TLS.alpn}


# --- llm.client.* and the other end attributes ------------------------------------------------------


def test_streamed_call_timings(sink: Sink) -> None:
    call, _ = sink.call()
    attrs = call.attributes
    ttft = (FIRST_TOKEN - T0) * NS
    generation = (LAST_TOKEN - FIRST_TOKEN) * NS
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] == pytest.approx((FRESH.headers - T0) * NS)
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] == pytest.approx(ttft)
    assert attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(ttft)
    assert attrs[sc.LLM_CLIENT_GENERATION_DURATION] == pytest.approx(generation)
    # the usage block's token count wins over the number of token events
    assert attrs[sc.LLM_CLIENT_GENERATION_RATE] == pytest.approx((OUTPUT_TOKENS - 1) / generation)
    assert attrs[sc.LLM_CLIENT_MAX_CHUNK_GAP] == pytest.approx(MAX_GAP * NS)
    assert attrs[sc.LLM_CLIENT_CHUNKS] == TOKEN_EVENTS
    assert attrs[sc.LLM_CLIENT_RESPONSE_BYTES] == STATS.size
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == INPUT_TOKENS
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == OUTPUT_TOKENS
    assert attrs[sc.GEN_AI_RESPONSE_MODEL] == "gpt-test-0613"
    assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop",)


def test_without_usage_the_rate_counts_token_events(sink: Sink) -> None:
    stats = STATS._replace(events=EVENTS[:2])  # no usage block
    call, _ = sink.call(stream=stats)
    generation = (LAST_TOKEN - FIRST_TOKEN) * NS
    assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in call.attributes
    assert call.attributes[sc.LLM_CLIENT_GENERATION_RATE] == pytest.approx((TOKEN_EVENTS - 1) / generation)


def test_a_single_token_has_no_rate(sink: Sink) -> None:
    stats = STATS._replace(token_events=1, last_token_ns=FIRST_TOKEN, events=EVENTS[:2])
    call, _ = sink.call(stream=stats)
    assert call.attributes[sc.LLM_CLIENT_GENERATION_DURATION] == 0
    assert sc.LLM_CLIENT_GENERATION_RATE not in call.attributes


def test_a_stream_without_any_token_has_no_token_timings(sink: Sink) -> None:
    stats = STATS._replace(token_events=0, first_token_ns=0, last_token_ns=0, max_gap_ns=0, events=())
    call, kids = sink.call(stream=stats)
    attrs = call.attributes
    for key in (sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN, sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
                sc.LLM_CLIENT_GENERATION_DURATION, sc.LLM_CLIENT_GENERATION_RATE, sc.LLM_CLIENT_MAX_CHUNK_GAP):
        assert key not in attrs, key
    assert attrs[sc.LLM_CLIENT_CHUNKS] == 0
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] == pytest.approx((FRESH.headers - T0) * NS)
    assert kids[-1].name == sc.SPAN_DOWNLOAD and kids[-1].end_time == call.end_time


def test_a_whole_body_has_time_to_first_byte_only(sink: Sink) -> None:
    body = json.dumps({"id": "r1", "model": MODEL, "choices": [{"message": {"content": "hello"},
                                                                   "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 4}}).encode()
    timeline = Timeline(T0, EPOCH, T0 + 80 * MS, upload_start=T0 + 1 * MS, body_sent=T0 + 2 * MS,
                        headers=T0 + 70 * MS)
    call, kids = sink.call(timeline=timeline, stream=None, body=body,
                           response_headers={"content-type": "application/json"})
    attrs = call.attributes
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] == pytest.approx(70 * MS * NS)
    assert sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN not in attrs and sc.LLM_CLIENT_CHUNKS not in attrs
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (3, 4)
    assert _offsets(kids) == [(sc.SPAN_UPLOAD, 0, 2), (sc.SPAN_SERVER_WAIT, 2, 70), (sc.SPAN_DOWNLOAD, 70, 80)]


@pytest.mark.parametrize("reason", [END_EOF, END_CLOSED, END_EXIT])
def test_end_reason_peer_and_protocol(sink: Sink, reason: str) -> None:
    call, _ = sink.call(end_reason=reason, peer=("192.0.2.9", 31337), http_version="HTTP/2")
    attrs = call.attributes
    assert attrs[sc.LLM_CLIENT_END_REASON] == reason
    assert (attrs[sc.NETWORK_PEER_ADDRESS], attrs[sc.NETWORK_PEER_PORT]) == ("192.0.2.9", 31337)
    assert attrs[sc.NETWORK_PROTOCOL_VERSION] == "2"
    assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert sc.ERROR_TYPE not in attrs and call.status.status_code == StatusCode.UNSET


def test_no_peer_no_status_no_version_give_no_attribute(sink: Sink) -> None:
    timeline = Timeline(T0, EPOCH, T0 + 5 * MS, upload_start=T0 + 1 * MS, body_sent=T0 + 2 * MS)
    call, _ = sink.call(timeline=timeline, peer=None, status=0, http_version=None, stream=None,
                        response_headers={}, end_reason=END_CLOSED)
    for key in (sc.NETWORK_PEER_ADDRESS, sc.NETWORK_PEER_PORT, sc.HTTP_RESPONSE_STATUS_CODE,
                sc.NETWORK_PROTOCOL_VERSION, sc.LLM_CLIENT_TIME_TO_FIRST_BYTE):
        assert key not in call.attributes, key


@pytest.mark.parametrize(("timeline", "reused"), [
    (FRESH, False),
    (Timeline(T0, EPOCH, T0 + 50 * MS, upload_start=T0 + 1 * MS, body_sent=T0 + 2 * MS, headers=T0 + 40 * MS), True),
    (Timeline(T0, EPOCH, T0 + 50 * MS, connect_start=T0 + 1 * MS), False),  # refused: a new connection
    (Timeline(T0, EPOCH, T0 + 50 * MS, pool_start=T0 + 1 * MS), None),  # nothing sent yet: unknown
])
def test_connection_reused(sink: Sink, timeline: Timeline, reused: bool | None) -> None:
    call, _ = sink.call(timeline=timeline, stream=None, status=0, response_headers={}, end_reason=END_CLOSED)
    assert call.attributes.get(sc.LLM_CLIENT_CONNECTION_REUSED) == reused


# --- errors ---------------------------------------------------------------------------------------


class _AppError(Exception):
    pass


@pytest.mark.parametrize(("exception", "reason", "status", "error_type", "message"), [
    (ConnectionResetError("reset by peer"), END_ERROR, 0, "ConnectionResetError", "ConnectionResetError"),
    (httpx.ReadTimeout("timed out"), END_ERROR, 200, "httpx.ReadTimeout", "ReadTimeout"),
    (asyncio.CancelledError(), END_CANCELLED, 200, "asyncio.CancelledError", "CancelledError"),
    (_AppError("x"), END_ERROR, 0, "tests._AppError", "_AppError"),
    # an exception that ended the call wins over the status it had already received
    (httpx.RemoteProtocolError("cut"), END_ERROR, 502, "httpx.RemoteProtocolError", "RemoteProtocolError"),
    (None, END_EOF, 503, "503", "HTTP 503"),
    (None, END_EOF, 400, "400", "HTTP 400"),
])
def test_error_type_and_status(sink: Sink, exception: BaseException | None, reason: str, status: int,
                               error_type: str, message: str) -> None:
    call, _ = sink.call(exception=exception, end_reason=reason, status=status, stream=None, body=b"",
                        response_headers={"content-type": "application/json"})
    assert call.attributes[sc.ERROR_TYPE] == error_type
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == reason
    assert (call.status.status_code, call.status.description) == (StatusCode.ERROR, message)


def test_an_exception_the_call_did_not_end_with_is_not_an_error(sink: Sink) -> None:
    """error.type comes from the exception only when the call ended in error or cancellation."""
    call, _ = sink.call(exception=RuntimeError("late"), end_reason=END_CLOSED, status=399)
    assert sc.ERROR_TYPE not in call.attributes
    assert call.status.status_code == StatusCode.UNSET


def test_the_phase_a_failed_call_ended_in_is_an_error(sink: Sink) -> None:
    timeline = Timeline(T0, EPOCH, T0 + 30_000 * MS, upload_start=T0 + 1 * MS, body_sent=T0 + 2 * MS)
    call, kids = sink.call(timeline=timeline, exception=httpx.ReadTimeout("t"), end_reason=END_ERROR, status=0,
                           stream=None, response_headers={})
    assert [(k.name, k.status.status_code) for k in kids] == [(sc.SPAN_UPLOAD, StatusCode.UNSET),
                                                              (sc.SPAN_SERVER_WAIT, StatusCode.ERROR)]
    assert kids[-1].end_time == call.end_time == EPOCH + 30_000 * MS


SECRET = "sk-test-0123456789abcdef"
BYTES_SECRET = "xk-bytes-secret"


def test_credentials_the_server_quotes_back_are_scrubbed(sink: Sink) -> None:
    headers = {"authorization": f"Bearer {SECRET}", "x-api-key": BYTES_SECRET.encode(), "api-key": "abc"}
    quoted = (f"Incorrect API key provided: {SECRET}. Header: 'Bearer {SECRET}'. Other: {BYTES_SECRET}. "
              "Short: abc")
    body = json.dumps({"error": {"message": quoted, "type": "invalid_request_error"}}).encode()
    call = sink.open(_request(headers=headers))
    sink.finish(call, stream=None, status=401, body=body, response_headers={"content-type": "application/json"})
    span, _ = sink.otel.one_call()
    # the whole header value first, then the credential after its scheme; values under 6 characters stay
    expected = "Incorrect API key provided: ***. Header: '***'. Other: ***. Short: abc"
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, expected)
    assert span.attributes[sc.ERROR_TYPE] == "401"
    for exported in sink.otel.spans():
        text = repr(dict(exported.attributes or {})) + repr(exported.status.description)
        assert SECRET not in text and BYTES_SECRET not in text


# --- what Telemetry keeps between start and finish -------------------------------------------------


def test_a_record_without_the_state_its_start_returned_is_ignored(sink: Sink) -> None:
    call = sink.open()
    state = call.state
    sink.telemetry.call_finished(call.record(), None)  # not a call this sink started
    sink.telemetry.call_finished(call.record(), object())
    assert sink.otel.spans() == []
    assert sink.telemetry.in_flight.by_server == {(HOST, PORT): 1}
    call.state = state
    sink.finish(call)
    sink.finish(call)  # handed over twice: the state went with the first
    assert len(sink.otel.calls()) == 1
    assert sink.telemetry.in_flight.by_server == {(HOST, PORT): 0}


def test_open_calls_are_captures_and_end_at_exit(sink: Sink) -> None:
    done = LlmCall.open(sink.telemetry, CHAT, _request())
    done.finish(END_EOF)
    first = LlmCall.open(sink.telemetry, CHAT, _request())
    second = LlmCall.open(sink.telemetry, CHAT, _request())
    assert {first, second} <= set(capture_call.open_calls()) and done not in capture_call.open_calls()
    sink.otel.clear()
    assert capture_call.end_open_calls() >= 2
    assert first.finished and second.finished and first not in capture_call.open_calls()
    calls = sink.otel.calls()
    assert len(calls) == 2
    assert {c.attributes[sc.LLM_CLIENT_END_REASON] for c in calls} == {END_EXIT}
    assert capture_call.end_open_calls() == 0  # nothing left to end
    assert len(sink.otel.calls()) == 2


def test_endpoint_cache_is_bounded(sink: Sink) -> None:
    telemetry = sink.telemetry
    limit = calls_module._MAX_ENDPOINTS
    first = telemetry._endpoint(_request(url=f"{URL}?n=0"), CHAT)
    assert telemetry._endpoint(_request(url=f"{URL}?n=0"), CHAT) is first  # computed once per endpoint
    assert telemetry._endpoint(_request(url=f"{URL}?n=0", method="PUT"), CHAT) is not first
    for n in range(1, limit - 1):
        telemetry._endpoint(_request(url=f"{URL}?n={n}"), CHAT)
    assert len(telemetry._endpoints) == limit
    telemetry._endpoint(_request(url=f"{URL}?n={limit}"), CHAT)  # one more: the cache starts over
    assert len(telemetry._endpoints) == 1
    assert telemetry._endpoint(_request(url=f"{URL}?n=0"), CHAT) is not first


def test_a_call_never_writes_into_its_endpoint_attributes(sink: Sink) -> None:
    sink.finish(sink.open(), exception=ConnectionResetError(), end_reason=END_ERROR, status=0)
    (endpoint,) = sink.telemetry._endpoints.values()
    assert sc.ERROR_TYPE not in endpoint.attributes and sc.LLM_CLIENT_END_REASON not in endpoint.attributes
    assert endpoint.attributes[sc.URL_FULL] == URL and endpoint.server == (HOST, PORT)
    sink.otel.clear()
    call, _ = sink.call()
    assert sc.ERROR_TYPE not in call.attributes


def test_a_configured_runtime_is_not_overridden_by_the_response() -> None:
    otel = make_otel()
    sink = Sink(otel, CallSettings(runtimes={"http://127.0.0.1:11434/": "my-runtime"}))
    request = _request(url="http://127.0.0.1:11434/api/chat", path="/api/chat",
                       body=json.dumps({"model": "llama3", "messages": []}).encode())
    sink.finish(sink.open(request, OLLAMA), timeline=_OLLAMA_TIMELINE, stream=None, body=_OLLAMA_BODY,
                response_headers={"content-type": "application/json"})
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_RUNTIME_NAME] == call.attributes[sc.GEN_AI_PROVIDER_NAME] == "my-runtime"


# --- the runtime's counters: synthesized spans on the client's clock --------------------------------

LOAD, PREFILL, DECODE = 250 * MS, 125 * MS, 500 * MS
_OLLAMA_BODY = json.dumps({"model": "llama3", "message": {"role": "assistant", "content": "hi"}, "done": True,
                           "done_reason": "stop", "load_duration": LOAD, "prompt_eval_count": 20,
                           "prompt_eval_duration": PREFILL, "eval_count": 11, "eval_duration": DECODE}).encode()
_OLLAMA_TIMELINE = Timeline(T0, EPOCH, T0 + 905 * MS, upload_start=T0 + 1 * MS, body_sent=T0 + 2 * MS,
                            headers=T0 + 900 * MS)


def test_a_whole_answer_places_the_runtime_spans_before_its_headers(sink: Sink) -> None:
    request = _request(url="http://127.0.0.1:11434/api/chat", path="/api/chat",
                       body=json.dumps({"model": "llama3", "messages": []}).encode())
    sink.finish(sink.open(request, OLLAMA), timeline=_OLLAMA_TIMELINE, stream=None, body=_OLLAMA_BODY,
                response_headers={"content-type": "application/json"})
    call, kids = sink.otel.one_call()
    headers = (_OLLAMA_TIMELINE.headers - T0) / MS
    # decode ends when the headers arrived; prefill and load precede it, back to back
    assert _offsets(sink.otel.children(call, synthesized=True)) == [
        (sc.SPAN_RUNTIME_LOAD, headers - (DECODE + PREFILL + LOAD) / MS, headers - (DECODE + PREFILL) / MS),
        (sc.SPAN_RUNTIME_PREFILL, headers - (DECODE + PREFILL) / MS, headers - DECODE / MS),
        (sc.SPAN_RUNTIME_DECODE, headers - DECODE / MS, headers),
    ]
    assert [k.name for k in kids] == [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
    attrs = call.attributes
    assert attrs[sc.LLM_RUNTIME_NAME] == "ollama"
    assert attrs[sc.LLM_RUNTIME_LOAD_DURATION] == pytest.approx(LOAD * NS)
    assert attrs[sc.LLM_RUNTIME_GENERATION_RATE] == pytest.approx(11 / (DECODE * NS))


# --- metrics --------------------------------------------------------------------------------------


def test_metrics_of_a_streamed_call(sink: Sink) -> None:
    call = sink.open()
    (active,) = sink.otel.metrics()[sc.METRIC_ACTIVE_REQUESTS]
    assert active.value == 1 and dict(active.attributes) == {sc.SERVER_ADDRESS: HOST, sc.SERVER_PORT: PORT}
    sink.finish(call)
    metrics = sink.otel.metrics()
    assert [p.value for p in metrics[sc.METRIC_ACTIVE_REQUESTS]] == [0]
    (duration,) = metrics[sc.METRIC_OPERATION_DURATION]
    assert duration.count == 1 and duration.sum == pytest.approx((FRESH.end - T0) * NS)
    assert dict(duration.attributes) == {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_PROVIDER_NAME: "openai_compatible",
                                         sc.GEN_AI_REQUEST_MODEL: MODEL, sc.GEN_AI_RESPONSE_MODEL: "gpt-test-0613",
                                         sc.SERVER_ADDRESS: HOST, sc.SERVER_PORT: PORT}
    (first,) = metrics[sc.METRIC_TIME_TO_FIRST_CHUNK]
    assert first.sum == pytest.approx((FIRST_TOKEN - T0) * NS)
    (per_chunk,) = metrics[sc.METRIC_TIME_PER_OUTPUT_CHUNK]  # each gap between the token events
    assert per_chunk.count == TOKEN_EVENTS - 1 and per_chunk.min == pytest.approx(MAX_GAP * NS)
    assert per_chunk.sum == pytest.approx(sum(STATS.gaps) * NS)
    tokens = metrics[sc.METRIC_TOKEN_USAGE]
    assert _one(tokens, **{sc.GEN_AI_TOKEN_TYPE: "input"}).sum == INPUT_TOKENS
    assert _one(tokens, **{sc.GEN_AI_TOKEN_TYPE: "output"}).sum == OUTPUT_TOKENS
    phases = metrics[sc.METRIC_PHASE_DURATION]
    expected = {sc.SPAN_DNS: 3, sc.SPAN_CONNECT: 3, sc.SPAN_TLS: 4, sc.SPAN_UPLOAD: 2, sc.SPAN_SERVER_WAIT: 28,
                sc.SPAN_FIRST_TOKEN: (FIRST_TOKEN - FRESH.headers) / MS, sc.SPAN_DECODE: (FRESH.end - FIRST_TOKEN) / MS}
    assert len(phases) == len(expected)
    for name, ms in expected.items():
        assert _one(phases, **{sc.LLM_PHASE: name}).sum == pytest.approx(ms * MS * NS), name


def test_a_gateway_marks_relayed_only_the_calls_whose_caller_recorded_them(sink: Sink) -> None:
    """Relaying (the gateway), a call is marked llm.gateway.relayed when the request's baggage
    says its caller recorded it (otel_llm.recorded=1), on the span and every metric record; a call
    from a caller that records nothing is not: the gateway's record is its only one. Either way
    the call sends the mark on, since this process records it."""
    relay = sink.telemetry.relaying_sink()
    recorded: dict[str, Any] = {"baggage": "tenant=acme,otel_llm.recorded=1"}
    plain: dict[str, Any] = {"baggage": "tenant=acme"}
    marked_call = LlmCall.open(relay, CHAT, _request(headers=recorded))
    other_call = LlmCall.open(relay, CHAT, _request(headers=plain))
    own_call = sink.open(_request(headers=dict(recorded)))  # the session's own sink never marks
    assert sc.LLM_GATEWAY_RELAYED not in own_call.state.span.attributes
    sink.finish(own_call)
    sink.otel.clear()
    active = {tuple(sorted(p.attributes.items())): p.value for p in sink.otel.metrics()[sc.METRIC_ACTIVE_REQUESTS]}
    server = ((sc.SERVER_ADDRESS, HOST), (sc.SERVER_PORT, PORT))
    assert active == {server: 1, tuple(sorted(server + ((sc.LLM_GATEWAY_RELAYED, True),))): 1}
    sink.finish(marked_call)
    sink.finish(other_call)
    assert recorded["baggage"] == "tenant=acme,otel_llm.recorded=1"
    assert plain["baggage"] == "tenant=acme,otel_llm.recorded=1"
    spans = {s.context.span_id: s for s in sink.otel.calls()}
    assert len(spans) == 2
    marked = [s for s in spans.values() if (s.attributes or {}).get(sc.LLM_GATEWAY_RELAYED) is True]
    assert len(marked) == 1
    metrics = sink.otel.metrics()
    for name in (sc.METRIC_OPERATION_DURATION, sc.METRIC_TIME_TO_FIRST_CHUNK):
        assert sorted(p.attributes.get(sc.LLM_GATEWAY_RELAYED, False) for p in metrics[name]) == [False, True], name
    assert {p.attributes.get(sc.LLM_GATEWAY_RELAYED, False) for p in metrics[sc.METRIC_PHASE_DURATION]} == {False, True}


def test_an_application_never_marks_its_calls_relayed(sink: Sink) -> None:
    sink.finish(sink.open(_request(headers={"baggage": "otel_llm.recorded=1"})))
    call, _ = sink.otel.one_call()
    assert sc.LLM_GATEWAY_RELAYED not in (call.attributes or {})


def test_an_error_is_a_metric_attribute(sink: Sink) -> None:
    sink.finish(sink.open(), status=503, stream=None, body=b"", response_headers={})
    (duration,) = sink.otel.metrics()[sc.METRIC_OPERATION_DURATION]
    assert duration.attributes[sc.ERROR_TYPE] == "503"


def test_a_sampled_out_call_records_metrics_but_no_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    base = make_otel()
    otel = Otel(exporter, base.reader, provider, base.meter_provider)
    sink = Sink(otel)
    headers: dict[str, Any] = {}
    sink.finish(sink.open(_request(headers=headers)))
    assert otel.spans() == []
    assert not int(headers["traceparent"][-2:], 16) & 1  # the server learns the call was not sampled
    (duration,) = otel.metrics()[sc.METRIC_OPERATION_DURATION]
    assert duration.count == 1 and duration.sum == pytest.approx((FRESH.end - T0) * NS)
    assert not duration.exemplars  # no trace to link to
