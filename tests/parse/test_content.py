"""Opt-in content capture: the generated text each API's stream events carry (``event_text``) and
the joined text of a captured stream (``stream_text``). tests/parse/test_framing.py covers
``stream_text`` for OpenAI chat, SGLang's cumulative text, Ollama generate and a broken event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.content import MAX_TEXT_CHARS, event_text, stream_text


def _sse(*objs: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return b"".join(head + b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)


def _ndjson(*objs: object) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


# (api, an event carrying "Hi", an event of the same API carrying no output)
EVENTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (r.API_OPENAI_CHAT, {"choices": [{"delta": {"content": "Hi"}}]},
     {"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
    (r.API_OPENAI_COMPLETIONS, {"choices": [{"text": "Hi"}]}, {"choices": [], "usage": {"completion_tokens": 3}}),
    (r.API_OPENAI_RESPONSES, {"type": "response.output_text.delta", "delta": "Hi"},
     {"type": "response.function_call_arguments.delta", "delta": "{\"a\":"}),
    (r.API_ANTHROPIC_MESSAGES, {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}},
     {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{"}}),
    (r.API_OLLAMA_CHAT, {"message": {"role": "assistant", "content": "Hi"}, "done": False},
     {"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 2}),
    (r.API_OLLAMA_GENERATE, {"response": "Hi", "done": False}, {"response": "", "done": True}),
    (r.API_LLAMACPP_COMPLETION, {"content": "Hi", "stop": False}, {"content": "", "stop": True, "timings": {}}),
    (r.API_TGI_GENERATE_STREAM, {"token": {"id": 1, "text": "Hi", "special": False}},
     {"token": {"id": 2, "text": "</s>", "special": True}, "generated_text": "Hi"}),
    (r.API_TGI_GENERATE, {"text": "Hi", "meta_info": {}}, {"text": "", "meta_info": {"completion_tokens": 0}}),
    (r.API_LMSTUDIO_V1_CHAT, {"type": "message.delta", "content": "Hi"}, {"type": "chat.end", "result": {}}),
]


@pytest.mark.parametrize(("api", "with_text", "without"), EVENTS, ids=[e[0] for e in EVENTS])
def test_event_text_per_api(api: str, with_text: dict[str, Any], without: dict[str, Any]) -> None:
    assert event_text(api, with_text) == "Hi"
    assert event_text(api, without) is None


def test_an_unknown_api_reads_events_as_openai_chat() -> None:
    assert event_text(r.API_GENERIC, {"choices": [{"delta": {"content": "x"}}]}) == "x"
    assert event_text("some.future.api", {"response": "x"}) is None


@pytest.mark.parametrize("obj", [
    {}, {"choices": None}, {"choices": []}, {"choices": "abc"}, {"choices": 5}, {"choices": [None]},
    {"choices": [{"delta": None}]}, {"choices": [{"delta": "text"}]}, {"choices": [{"delta": {"content": 7}}]},
    {"choices": [{"delta": {"content": ["a", "b"]}}]}, {"choices": [{"delta": {"content": None}}]},
])
def test_odd_openai_chat_events_carry_no_text(obj: dict[str, Any]) -> None:
    assert event_text(r.API_OPENAI_CHAT, obj) is None


@pytest.mark.parametrize(("api", "obj"), [
    (r.API_ANTHROPIC_MESSAGES, {"delta": "text"}),
    (r.API_ANTHROPIC_MESSAGES, {"delta": {"type": "thinking_delta", "thinking": "hmm"}}),
    (r.API_OPENAI_RESPONSES, {"type": "response.output_text.delta", "delta": {"text": "x"}}),
    (r.API_OLLAMA_CHAT, {"message": "Hi"}),
    (r.API_TGI_GENERATE_STREAM, {"token": "Hi"}),
    (r.API_TGI_GENERATE_STREAM, {"token": {"text": None}}),
    (r.API_TGI_GENERATE, {"text": ["Hi"]}),
    (r.API_LLAMACPP_COMPLETION, {"content": {"text": "Hi"}}),
])
def test_odd_events_of_other_apis_carry_no_text(api: str, obj: dict[str, Any]) -> None:
    assert event_text(api, obj) is None


@pytest.mark.parametrize("api", [r.API_OPENAI_CHAT, r.API_OPENAI_COMPLETIONS])
def test_choices_as_an_object_carries_no_text(api: str) -> None:
    assert event_text(api, {"choices": {"0": {"delta": {"content": "x"}, "text": "x"}}}) is None
    assert stream_text(api, _sse({"choices": {"a": 1}}, {"choices": [{"text": "y"}]}), ndjson=False) in (None, "y")


def test_stream_text_anthropic_keeps_only_text_deltas() -> None:
    data = (_sse({"type": "message_start", "message": {"id": "m", "content": []}}, event="message_start")
            + _sse({"type": "ping"}, event="ping")
            + _sse({"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "hmm"}})
            + _sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hel"}})
            + _sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "lo"}})
            + _sse({"type": "message_stop"}, event="message_stop"))
    assert stream_text(r.API_ANTHROPIC_MESSAGES, data, ndjson=False) == "Hello"


def test_stream_text_responses_api() -> None:
    data = _sse({"type": "response.created", "response": {"id": "r"}},
                {"type": "response.output_text.delta", "delta": "A"},
                {"type": "response.reasoning_text.delta", "delta": "thinking"},
                {"type": "response.output_text.delta", "delta": "B"},
                {"type": "response.output_text.done", "text": "AB"})
    assert stream_text(r.API_OPENAI_RESPONSES, data, ndjson=False) == "AB"


def test_stream_text_tgi_skips_special_tokens() -> None:
    data = _sse({"token": {"id": 1, "text": "a", "special": False}},
                {"token": {"id": 2, "text": "b", "special": False}},
                {"token": {"id": 3, "text": "</s>", "special": True}, "generated_text": "ab"})
    assert stream_text(r.API_TGI_GENERATE_STREAM, data, ndjson=False) == "ab"


def test_stream_text_ollama_chat_ndjson_with_crlf_and_junk_lines() -> None:
    data = (_ndjson({"message": {"role": "assistant", "content": "x"}}).replace(b"\n", b"\r\n")
            + b"not json\n" + b"[1, 2]\n" + b"\n"
            + _ndjson({"message": {"role": "assistant", "content": "y"}}, {"done": True, "eval_count": 2}))
    assert stream_text(r.API_OLLAMA_CHAT, data, ndjson=True) == "xy"


def test_stream_text_sse_with_crlf_comments_and_done() -> None:
    data = (b": keep-alive\r\n\r\n"
            + _sse({"choices": [{"delta": {"content": "a"}}]}).replace(b"\n", b"\r\n")
            + b"data: [DONE]\n\n"
            + _sse({"choices": [{"delta": {"content": "b"}}]}))
    assert stream_text(r.API_OPENAI_CHAT, data, ndjson=False) == "ab"


def test_stream_text_reads_sse_as_sse_only() -> None:
    """NDJSON lines read as SSE (no `data:`) carry nothing, and SSE read as NDJSON neither."""
    ndjson = _ndjson({"response": "x"})
    assert stream_text(r.API_OLLAMA_GENERATE, ndjson, ndjson=False) is None
    assert stream_text(r.API_OLLAMA_GENERATE, _sse({"response": "x"}), ndjson=True) is None


def test_stream_text_sglang_ignores_events_without_text() -> None:
    data = _sse({"text": "a"}, {"text": "ab"}, {"meta_info": {}}, {"text": None})
    assert stream_text(r.API_TGI_GENERATE, data, ndjson=False) == "ab"
    assert stream_text(r.API_TGI_GENERATE, _sse({"meta_info": {}}), ndjson=False) is None


def test_stream_text_is_bounded() -> None:
    piece = "x" * 1000
    data = b"".join(_sse({"choices": [{"delta": {"content": piece}}]}) for _ in range(MAX_TEXT_CHARS // 1000 + 5))
    text = stream_text(r.API_OPENAI_CHAT, data, ndjson=False)
    assert text is not None and len(text) == MAX_TEXT_CHARS
    sglang = _sse({"text": "y" * (MAX_TEXT_CHARS + 10)})
    assert stream_text(r.API_TGI_GENERATE, sglang, ndjson=False) == "y" * MAX_TEXT_CHARS


def test_stream_text_of_nothing() -> None:
    assert stream_text(r.API_OPENAI_CHAT, b"", ndjson=False) is None
    assert stream_text(r.API_OPENAI_CHAT, b"data: [DONE]\n\n", ndjson=False) is None
    assert stream_text(r.API_OLLAMA_CHAT, b"\n\n", ndjson=True) is None


def test_a_stream_cut_mid_event_keeps_the_complete_events() -> None:
    data = _sse({"choices": [{"delta": {"content": "ok"}}]}, {"choices": [{"delta": {"content": "lost"}}]})
    assert stream_text(r.API_OPENAI_CHAT, data[:-12], ndjson=False) == "ok"
