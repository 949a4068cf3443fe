"""build_call: a finished call's record, answer and evidence in, a CallResult out, with no tracer,
no meter and nothing changed in what it was given."""

from __future__ import annotations

import copy
import json

from opentelemetry.trace import INVALID_SPAN_CONTEXT

from otel_llm import semconv as sc
from otel_llm.capture.record import END_EOF, END_ERROR, CallRecord, CallRequest, Timeline
from otel_llm.observers.evidence import CallEnd
from otel_llm.parse import routes
from otel_llm.parse.answer import NO_ANSWER, Answer, read_answer
from otel_llm.parse.formats import stream_format
from otel_llm.parse.framing import StreamStats
from otel_llm.parse.request import parse_request
from otel_llm.telemetry import attributes as attr_build
from otel_llm.telemetry.build import CallResult, CallStart, Endpoint, build_call
from otel_llm.telemetry.inflight import Admission
from otel_llm.telemetry.spans import CallSpan

MS = 1_000_000
T0, EPOCH = 5_000 * MS, 1_760_000_000 * 1_000_000_000
CHAT = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)
OLLAMA = routes.Route(routes.API_OLLAMA_CHAT, routes.OP_CHAT, "ollama")
SERVER = ("10.1.2.3", 8000)
BODY = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
TIMELINE = Timeline(T0, EPOCH, T0 + 400 * MS, connect_start=T0 + 1 * MS, connect_end=T0 + 3 * MS,
                    upload_start=T0 + 4 * MS, body_sent=T0 + 5 * MS, headers=T0 + 30 * MS)
EVENTS = (b'data: {"id":"c1","model":"m-1","choices":[{"delta":{"content":"a"}}]}',
          b'data: {"id":"c1","model":"m-1","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":9}}',
          b"data: [DONE]")
STATS = StreamStats(stream_format(routes.API_OPENAI_CHAT, "text/event-stream"), chunks=9, size=900, token_events=9,
                    first_token_ns=T0 + 80 * MS, last_token_ns=T0 + 380 * MS, max_gap_ns=40 * MS,
                    arrival_groups=9, events=EVENTS, gaps=(40 * MS,) * 4 + (35 * MS,) * 4)


def _request(route: routes.Route = CHAT, body: bytes = BODY, headers: dict[str, str] | None = None) -> CallRequest:
    path = "/api/chat" if route is OLLAMA else "/v1/chat/completions"
    return CallRequest("POST", "http", SERVER[0], SERVER[1], path, f"http://{SERVER[0]}:{SERVER[1]}{path}",
                       headers or {}, body)


def _start(request: CallRequest, route: routes.Route = CHAT, concurrent: int = 0) -> CallStart:
    info = parse_request(route.api, request.body)
    runtime = route.runtime
    endpoint_attrs = attr_build.endpoint_attributes(route, request, runtime,
                                                    attr_build.provider_name(runtime, request.host, route.api))
    attrs = attr_build.request_attributes(endpoint_attrs, info, False)
    span = CallSpan(INVALID_SPAN_CONTEXT, None, False, attr_build.span_name(route.operation, info.model), attrs)
    return CallStart(info, Endpoint(runtime, False, SERVER, endpoint_attrs), Admission(SERVER, None, concurrent,
                                                                                        False, False), span)


def _record(request: CallRequest, route: routes.Route = CHAT, **fields: object) -> CallRecord:
    values: dict[str, object] = dict(
        key=1, route=route, request=request, timeline=TIMELINE, peer=SERVER, tls=None, http_version="HTTP/1.1",
        status=200, response_headers={"content-type": "text/event-stream"}, stream=STATS, body=None,
        captured=None, end_reason=END_EOF, exception=None)
    values.update(fields)
    return CallRecord(**values)  # type: ignore[arg-type]


def _answer(record: CallRecord, runtime: str | None = None) -> Answer:
    return read_answer(record.route.api, record.response_headers, record.stream, record.body, record.captured,
                       False, False, lambda: runtime)


def test_a_streamed_call_becomes_attributes_phases_and_metric_inputs() -> None:
    request = _request()
    start = _start(request, concurrent=2)
    given = copy.deepcopy(start.span.attributes)
    record = _record(request)
    result = build_call(record, start, _answer(record), None, False)
    assert isinstance(result, CallResult) and result.error is None
    attrs = result.attributes
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] == 0.08
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 9 and attrs[sc.GEN_AI_RESPONSE_MODEL] == "m-1"
    assert attrs[sc.LLM_CLIENT_END_REASON] == END_EOF and attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 2
    assert [p.name for p in result.phases] == [p.name for p in result.children]  # no runtime counters
    assert sc.SPAN_CONNECT in [p.name for p in result.phases] and len(result.child_attributes) == len(result.children)
    assert result.duration == 0.4 and result.chunk_gaps == STATS.gaps
    assert result.counters is None
    assert start.span.attributes == given  # nothing written back into what it was given


def test_the_same_inputs_give_the_same_result() -> None:
    request = _request()
    record = _record(request)
    first = build_call(record, _start(request), _answer(record), None, False)
    second = build_call(record, _start(request), _answer(record), None, False)
    assert first == second


def test_a_failed_call_carries_its_error_with_the_credential_scrubbed() -> None:
    secret = "sk-verysecretkey-123"
    request = _request(headers={"authorization": f"Bearer {secret}"})
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {secret}"}}).encode()
    record = _record(request, status=401, stream=None, body=body,
                     response_headers={"content-type": "application/json"})
    result = build_call(record, _start(request), _answer(record), None, False)
    assert result.attributes[sc.ERROR_TYPE] == "401"
    assert result.error == "Incorrect API key provided: ***"


def test_an_exception_names_its_type_on_the_call() -> None:
    request = _request()
    record = _record(request, stream=None, status=0, end_reason=END_ERROR, exception=ConnectionResetError("x"),
                     response_headers={})
    answer = _answer(record)
    assert answer == NO_ANSWER  # nothing was answered
    result = build_call(record, _start(request), answer, None, False)
    assert result.attributes[sc.ERROR_TYPE] == "ConnectionResetError" and result.error == "ConnectionResetError"


def test_the_runtime_s_counters_become_synthesized_children() -> None:
    body = json.dumps({"model": "llama3", "message": {"role": "assistant", "content": "hi"}, "done": True,
                       "load_duration": 250 * MS, "prompt_eval_count": 20, "prompt_eval_duration": 100 * MS,
                       "eval_count": 11, "eval_duration": 200 * MS}).encode()
    request = _request(OLLAMA, body=json.dumps({"model": "llama3", "messages": []}).encode())
    timeline = Timeline(T0, EPOCH, T0 + 600 * MS, upload_start=T0 + 1 * MS, body_sent=T0 + 2 * MS,
                        headers=T0 + 590 * MS)
    record = _record(request, OLLAMA, timeline=timeline, stream=None, body=body,
                     response_headers={"content-type": "application/json"})
    result = build_call(record, _start(request, OLLAMA), _answer(record), None, False)
    assert result.counters is not None and result.counters.runtime == "ollama"
    synthesized = result.children[len(result.phases):]
    assert synthesized and all(a == {sc.LLM_SYNTHESIZED: True}
                               for a in result.child_attributes[len(result.phases):])
    assert result.attributes[sc.LLM_RUNTIME_NAME] == "ollama"


def test_the_evidence_at_the_end_adds_host_and_model_attributes() -> None:
    request = _request()
    record = _record(request)
    end = CallEnd({"llm.host.cpu.utilization": 0.5}, {sc.LLM_MODEL_CONTEXT_LENGTH: 1024})
    result = build_call(record, _start(request), _answer(record), end, False)
    attrs = result.attributes
    assert attrs["llm.host.cpu.utilization"] == 0.5 and attrs[sc.LLM_MODEL_CONTEXT_LENGTH] == 1024
    assert attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] == 1000 / 1024
    assert attrs[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is True
