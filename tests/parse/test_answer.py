"""read_answer: what a finished call's response said, in one value."""

from __future__ import annotations

import json

from otel_llm.parse import routes
from otel_llm.parse.answer import NO_ANSWER, read_answer
from otel_llm.parse.formats import stream_format
from otel_llm.parse.framing import StreamStats

OLLAMA_BODY = json.dumps({"model": "llama3", "message": {"role": "assistant", "content": "hi"}, "done": True,
                          "eval_count": 11, "eval_duration": 200_000_000}).encode()
JSON = {"content-type": "application/json"}


def _never() -> str | None:
    raise AssertionError("the runtime was asked for although the response named it")


def test_a_body_gives_the_response_and_its_runtime_s_counters() -> None:
    answer = read_answer(routes.API_OLLAMA_CHAT, JSON, None, OLLAMA_BODY, None, False, False, _never)
    assert answer.response is not None and answer.response.output_tokens == 11
    assert answer.counters is not None and answer.counters.runtime == "ollama"
    assert answer.server_timing is None


def test_the_runtime_is_asked_for_only_when_the_response_does_not_say() -> None:
    body = json.dumps({"id": "c", "model": "m", "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    asked: list[bool] = []

    def runtime() -> str | None:
        asked.append(True)
        return "vllm"

    answer = read_answer(routes.API_OPENAI_CHAT, JSON, None, body, None, False, False, runtime)
    assert asked == [True] and answer.response is not None and answer.response.runtime == "vllm"
    assert answer.counters is not None


def test_a_stream_is_read_from_its_kept_events_and_server_timing_from_its_header() -> None:
    events = (b'data: {"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":5}}',)
    stats = StreamStats(stream_format(routes.API_OPENAI_CHAT, "text/event-stream"), 2, 100, 5, 1, 2, 1, 1, events)
    headers = {"content-type": "text/event-stream", "server-timing": "queue;dur=12.5, prefill;dur=3"}
    answer = read_answer(routes.API_OPENAI_CHAT, headers, stats, None, None, False, False, lambda: None)
    assert answer.response is not None and answer.response.output_tokens == 5
    assert answer.server_timing == {"queue": 0.0125, "prefill": 0.003}


def test_nothing_to_read_is_no_answer() -> None:
    assert read_answer(routes.API_OPENAI_CHAT, {}, None, None, None, False, False, _never) == NO_ANSWER
    # a cancelled call's partial body is not parsed
    assert read_answer(routes.API_OLLAMA_CHAT, JSON, None, OLLAMA_BODY, None, True, False, _never) == NO_ANSWER


def test_a_malformed_body_gives_an_answer_without_counters_never_an_exception() -> None:
    answer = read_answer(routes.API_OPENAI_CHAT, JSON, None, b'{"choices": [tru', None, False, False, lambda: None)
    assert answer.counters is None
