"""vLLM: no per-response timings; usage and finish reasons only.

No response field proves vLLM, so these tests set ``info.runtime = "vllm"`` after parsing,
the way a caller that knows the runtime (OTEL_LLM_RUNTIMES) would.
"""

from __future__ import annotations

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import runtime_counters
from tests.test_runtimes_common import expect, load, stream, window

RT = "vllm"


def _stream(api: str, name: str) -> ResponseInfo:
    info = parse_events(api, window(stream(RT, name)))
    assert info.runtime is None  # nothing in a vLLM response proves vLLM
    info.runtime = "vllm"
    return info


def test_chat_stream_usage_chunk() -> None:
    """role chunk, deltas, finish chunk, then `choices:[]` usage chunk."""
    c = runtime_counters(_stream(r.API_OPENAI_CHAT, "chat_stream.sse"))
    expect(c, runtime="vllm", prompt_tokens=5, cached_tokens=16, generation_tokens=8,
           finish_reasons=["stop"])


def test_chat_body_two_choices() -> None:
    info = parse_body(r.API_OPENAI_CHAT, load(RT, "chat.json"))
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", prompt_tokens=2, cached_tokens=16,
           generation_tokens=22, finish_reasons=["stop", "length"])


def test_continuous_usage_last_wins() -> None:
    c = runtime_counters(_stream(r.API_OPENAI_CHAT, "chat_stream_continuous_usage.sse"))
    expect(c, runtime="vllm", prompt_tokens=9, generation_tokens=5, finish_reasons=["length"])


def test_completions_stream_without_cache_details() -> None:
    """No prompt_tokens_details: cached unknown, so prompt_tokens is the whole prompt."""
    c = runtime_counters(_stream(r.API_OPENAI_COMPLETIONS, "completions_stream.sse"))
    expect(c, runtime="vllm", prompt_tokens=5, generation_tokens=8,
           finish_reasons=["length", "stop"])


def test_without_runtime_hint_same_tokens() -> None:
    info = parse_events(r.API_OPENAI_CHAT, window(stream(RT, "chat_stream.sse")))
    expect(runtime_counters(info), prompt_tokens=5, cached_tokens=16, generation_tokens=8,
           finish_reasons=["stop"])


def test_abort_passes_through() -> None:
    info = ResponseInfo(runtime="vllm", finish_reasons=["abort"], output_tokens=3)
    expect(runtime_counters(info), runtime="vllm", generation_tokens=3,
           finish_reasons=["abort"])


def test_error_mid_stream() -> None:
    info = _stream(r.API_OPENAI_CHAT, "error_stream.sse")
    assert info.error.startswith("EngineCore encountered")
    expect(runtime_counters(info), runtime="vllm")


def test_truncated_usage_chunk() -> None:
    events = stream(RT, "chat_stream.sse")
    events[-2] = events[-2][:60]
    info = parse_events(r.API_OPENAI_CHAT, window(events))
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", finish_reasons=["stop"])


def test_bad_usage_values_dropped() -> None:
    body = (b'{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":'
            b'3000000000,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":-1}}}')
    info = parse_body(r.API_OPENAI_CHAT, body)
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", generation_tokens=2)
