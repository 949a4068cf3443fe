"""Stream formats: SSE or NDJSON framing per API and content type, and each API's token regex,
which matches an event carrying non-empty output and nothing else. tests/parse/test_framing.py
checks the trie regexes against plain alternations and scans whole streams."""

from __future__ import annotations

import json

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.formats import NDJSON, SSE, StreamFormat, is_stream_content_type, stream_format

SSE_APIS = [r.API_OPENAI_CHAT, r.API_OPENAI_COMPLETIONS, r.API_OPENAI_RESPONSES, r.API_ANTHROPIC_MESSAGES,
            r.API_LLAMACPP_COMPLETION, r.API_TGI_GENERATE_STREAM, r.API_TGI_GENERATE, r.API_LMSTUDIO_V1_CHAT]
NDJSON_APIS = [r.API_OLLAMA_CHAT, r.API_OLLAMA_GENERATE]


def _matches(api: str, event: object, content_type: str = "text/event-stream") -> int:
    data = event if isinstance(event, bytes) else json.dumps(event).encode()
    return len(stream_format(api, content_type).token.findall(data))


@pytest.mark.parametrize("api", SSE_APIS)
def test_sse_apis(api: str) -> None:
    fmt = stream_format(api, "text/event-stream")
    assert fmt.framing == SSE and fmt.delimiter == b"\n\n"


@pytest.mark.parametrize("api", NDJSON_APIS)
def test_ndjson_apis(api: str) -> None:
    fmt = stream_format(api, "application/x-ndjson")
    assert fmt.framing == NDJSON and fmt.delimiter == b"\n"


@pytest.mark.parametrize("content_type", ["application/x-ndjson", "application/ndjson; charset=utf-8",
                                          "application/jsonl", "application/x-jsonlines"])
@pytest.mark.parametrize("api", [r.API_OPENAI_CHAT, r.API_LLAMACPP_COMPLETION])
def test_an_ndjson_content_type_reframes_an_sse_api_with_the_same_token(api: str, content_type: str) -> None:
    sse = stream_format(api, "text/event-stream")
    fmt = stream_format(api, content_type)
    assert fmt.framing == NDJSON and fmt.token is sse.token


def test_the_built_in_formats_are_shared_not_rebuilt() -> None:
    assert stream_format(r.API_OPENAI_CHAT, "text/event-stream") is stream_format(r.API_OPENAI_CHAT, "")
    assert stream_format(r.API_OLLAMA_CHAT, "application/x-ndjson") is stream_format(r.API_OLLAMA_CHAT, "jsonl")


@pytest.mark.parametrize(("content_type", "framing"), [
    ("text/event-stream", SSE), ("", SSE), ("application/x-ndjson", NDJSON), ("application/jsonl", NDJSON),
])
@pytest.mark.parametrize("api", [r.API_GENERIC, "unknown.api"])
def test_generic_apis_follow_the_content_type(api: str, content_type: str, framing: str) -> None:
    fmt = stream_format(api, content_type)
    assert fmt.framing == framing
    assert fmt.token.search(b'{"choices":[{"text":"x"}]}') and fmt.token.search(b'{"response":"x"}')
    assert fmt.token.search(b'{"message":{"content":"x"}}')


def test_stream_format_is_frozen() -> None:
    fmt = stream_format(r.API_OPENAI_CHAT, "text/event-stream")
    with pytest.raises(AttributeError):
        fmt.framing = NDJSON  # type: ignore[misc]
    assert StreamFormat(SSE, fmt.token) == fmt


@pytest.mark.parametrize(("content_type", "streamed"), [
    ("text/event-stream", True), ("text/event-stream; charset=utf-8", True), ("application/x-ndjson", True),
    ("application/jsonl", True), ("application/json", False), ("text/plain", False), ("", False),
    ("text/html", False),
])
def test_is_stream_content_type(content_type: str, streamed: bool) -> None:
    assert is_stream_content_type(content_type) is streamed


# (api, events that carry output: one match each, events that carry none)
TOKENS: list[tuple[str, list[object], list[object]]] = [
    (r.API_OPENAI_CHAT,
     [{"choices": [{"delta": {"content": "x"}}]}, {"choices": [{"delta": {"reasoning_content": "x"}}]},
      {"choices": [{"delta": {"reasoning": "x", "content": None}}]}, {"choices": [{"delta": {"refusal": "no"}}]},
      {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]},
      {"choices": [{"delta": {"role": "assistant", "content": " "}}]}],
     [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}, {"choices": [{"delta": {"content": None}}]},
      {"choices": [{"delta": {"tool_calls": []}}]}, {"choices": [], "usage": {"completion_tokens": 3}},
      {"choices": [{"delta": {}, "finish_reason": "stop"}]}, b": keep-alive", b"data: [DONE]"]),
    (r.API_OPENAI_COMPLETIONS, [{"choices": [{"text": "x"}]}], [{"choices": [{"text": ""}]}]),
    (r.API_OPENAI_RESPONSES,
     [{"type": "response.output_text.delta", "delta": "x"}, {"type": "response.refusal.delta", "delta": "x"},
      {"type": "response.reasoning_summary_text.delta", "delta": "x"},
      {"type": "response.function_call_arguments.delta", "delta": "{"}],
     [{"type": "response.created"}, {"type": "response.output_text.done", "text": "x"},
      {"type": "response.completed", "response": {"output_text": "x"}}]),
    (r.API_ANTHROPIC_MESSAGES,
     [{"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}},
      {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "x"}},
      {"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{"}}],
     [{"type": "ping"}, {"type": "content_block_delta", "delta": {"type": "signature_delta", "signature": "s"}},
      {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}]),
    (r.API_OLLAMA_CHAT,
     [{"message": {"role": "assistant", "content": "x"}}, {"message": {"role": "assistant", "thinking": "x"}},
      {"message": {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}}],
     [{"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 3}]),
    (r.API_OLLAMA_GENERATE, [{"response": "x"}, {"response": "", "thinking": "x"}],
     [{"response": "", "done": True}]),
    (r.API_LLAMACPP_COMPLETION, [{"content": "x", "stop": False}], [{"content": "", "stop": True}]),
    (r.API_TGI_GENERATE_STREAM,
     [{"index": 1, "token": {"id": 5, "text": "x", "special": False}, "top_tokens": [{"id": 5, "text": "x"}]},
      {"token": {"id": 2, "text": "</s>", "special": True}, "generated_text": "x"}],
     [{"top_tokens": [{"id": 5, "text": "x"}]}, {"generated_text": "x", "details": {"tokens": []}}]),
    (r.API_TGI_GENERATE, [{"text": "x", "meta_info": {}}], [{"text": "", "meta_info": {}}]),
    (r.API_LMSTUDIO_V1_CHAT,
     [b'event: message.delta\ndata: {"content":"x"}', b'event:reasoning.delta\ndata: {"content":"x"}'],
     [b"event: chat.start\ndata: {}", b'event: prompt_processing.progress\ndata: {"progress":0.5}',
      b"event: message.end\ndata: {}"]),
]


@pytest.mark.parametrize(("api", "tokens", "others"), TOKENS, ids=[t[0] for t in TOKENS])
def test_the_token_pattern_matches_each_output_event_once(api: str, tokens: list[object],
                                                          others: list[object]) -> None:
    assert [_matches(api, event) for event in tokens] == [1] * len(tokens)
    assert [_matches(api, event) for event in others] == [0] * len(others)


@pytest.mark.parametrize(("api", "event"), [
    (r.API_OPENAI_CHAT, {"choices": [{"delta": {"content": '{"content": "nested"}'}}]}),
    (r.API_OLLAMA_GENERATE, {"response": '"response": "x"'}),
    (r.API_ANTHROPIC_MESSAGES, {"type": "content_block_delta",
                                "delta": {"type": "text_delta", "text": '{"type":"text_delta"}'}}),
])
def test_a_key_inside_generated_text_is_escaped_and_not_counted(api: str, event: object) -> None:
    assert _matches(api, event) == 1


def test_lmstudio_event_name_inside_generated_text_is_not_counted() -> None:
    event = b'event: message.delta\ndata: {"type":"message.delta","content":"event: message.delta"}'
    assert _matches(r.API_LMSTUDIO_V1_CHAT, event) == 1


@pytest.mark.parametrize("separator", [b":", b": "])
def test_a_space_after_the_colon_is_optional(separator: bytes) -> None:
    assert _matches(r.API_LLAMACPP_COMPLETION, b'{"content"' + separator + b'"x"}') == 1
    assert _matches(r.API_LLAMACPP_COMPLETION, b'{"content"' + separator + b'""}') == 0


def test_ndjson_and_sse_of_the_same_events_count_the_same() -> None:
    events = [{"message": {"content": c}} for c in ("a", "", "b", "c")]
    ndjson = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    as_ndjson = stream_format(r.API_OLLAMA_CHAT, "application/x-ndjson")
    as_sse = stream_format(r.API_GENERIC, "text/event-stream")
    assert len(as_ndjson.token.findall(ndjson)) == len(as_sse.token.findall(sse)) == 3
    assert len(ndjson.split(as_ndjson.delimiter)) - 1 == len(sse.split(as_sse.delimiter)) - 1 == 4
