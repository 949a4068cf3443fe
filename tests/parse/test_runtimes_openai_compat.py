"""OpenAI- and Anthropic-compatible servers that prove no runtime: usage and finish reasons."""

from __future__ import annotations

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_events
from otel_llm.parse.runtimes import RuntimeCounters, openai_compat, runtime_counters
from otel_llm_testing.runtime_fixtures import expect, from_body, from_stream, stream, window

RT = "openai_compat"


def test_ollama_v1_stream() -> None:
    """Ollama /v1: usage = prompt_eval_count / eval_count, no timings, no cache count."""
    _, c = from_stream(r.API_OPENAI_CHAT, RT, "ollama_v1_chat_stream.sse")
    expect(c, prompt_tokens=26, generation_tokens=2, finish_reasons=["stop"])


def test_ollama_v1_body() -> None:
    _, c = from_body(r.API_OPENAI_CHAT, RT, "ollama_v1_chat.json")
    expect(c, prompt_tokens=26, generation_tokens=10, finish_reasons=["stop"])


def test_anthropic_usage_split_between_start_and_delta() -> None:
    """input/cache counts in message_start (first event), output in message_delta (last)."""
    events = stream(RT, "anthropic_messages_stream.sse")
    assert len(window(events)) < len(events)
    _, c = from_stream(r.API_ANTHROPIC_MESSAGES, RT, "anthropic_messages_stream.sse")
    # 25 input + 10 cache write + 100 cache read; evaluated = 135 - 100
    expect(c, prompt_tokens=35, cached_tokens=100, generation_tokens=15,
           finish_reasons=["tool_calls"])


def test_anthropic_without_first_event_loses_input_only() -> None:
    events = window(stream(RT, "anthropic_messages_stream.sse"))[1:]
    c = runtime_counters(parse_events(r.API_ANTHROPIC_MESSAGES, events))
    expect(c, generation_tokens=15, finish_reasons=["tool_calls"])


def test_anthropic_body_max_tokens() -> None:
    _, c = from_body(r.API_ANTHROPIC_MESSAGES, RT, "anthropic_message.json")
    expect(c, prompt_tokens=212, cached_tokens=1000, generation_tokens=9,
           finish_reasons=["length"])


def test_responses_api() -> None:
    _, c = from_body(r.API_OPENAI_RESPONSES, RT, "responses_incomplete.json")
    expect(c, prompt_tokens=10, generation_tokens=16, finish_reasons=["length"])
    _, c = from_stream(r.API_OPENAI_RESPONSES, RT, "responses_stream.sse")
    expect(c, prompt_tokens=37, cached_tokens=0, generation_tokens=11,
           finish_reasons=["completed"])


@pytest.mark.parametrize("reason, want", [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
    ("tool_use", "tool_calls"), ("refusal", "refusal"), ("content_filter", "content_filter"),
])
def test_anthropic_reason_mapping(reason: str, want: str) -> None:
    assert openai_compat.read(ResponseInfo(finish_reasons=[reason])).finish_reasons == [want]


def test_error_mid_stream() -> None:
    info, c = from_stream(r.API_OPENAI_CHAT, RT, "error_stream.sse")
    assert info.error == "model runner has unexpectedly stopped"
    expect(c)


def test_truncated_usage_chunk() -> None:
    _, c = from_stream(r.API_OPENAI_CHAT, RT, "truncated_stream.sse")
    expect(c, finish_reasons=["stop"])


def test_merge_usage_only_fills_gaps() -> None:
    c = RuntimeCounters(prompt_tokens=1, cached_tokens=2, generation_tokens=3)
    openai_compat.merge_usage(c, ResponseInfo(input_tokens=9, output_tokens=9,
                                              cached_input_tokens=9))
    assert (c.prompt_tokens, c.cached_tokens, c.generation_tokens) == (1, 2, 3)
