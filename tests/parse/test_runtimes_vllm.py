"""vLLM: no per-response timings; usage and finish reasons only.

No response field proves vLLM, so these tests set ``info.runtime = "vllm"`` after parsing,
the way a caller that knows the runtime (OTEL_LLM_RUNTIMES, or the observers' recognition)
would. The fixtures are a real vLLM 0.32.0's answers (``tools/record_vllm_fixtures.py``: the
tiny test model, a 213-token prompt of which 128 come from the prefix cache, fixed output
lengths), except the ``handwritten_*`` ones: answers a healthy run cannot be made to give
(finish reasons that differ between choices, an engine failure mid-stream).
"""

from __future__ import annotations

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import runtime_counters
from tests.parse.test_runtimes_common import expect, load, stream, window

RT = "vllm"


def _stream(api: str, name: str) -> ResponseInfo:
    info = parse_events(api, window(stream(RT, name)))
    assert info.runtime is None  # nothing in a vLLM response proves vLLM
    info.runtime = "vllm"
    return info


def test_chat_stream_usage_chunk() -> None:
    """role chunk, deltas, finish chunk, then the `choices:[]` usage chunk with cached tokens."""
    c = runtime_counters(_stream(r.API_OPENAI_CHAT, "chat_stream.sse"))
    expect(c, runtime="vllm", prompt_tokens=213 - 128, cached_tokens=128, generation_tokens=8,
           finish_reasons=["length"])


def test_chat_body_two_choices() -> None:
    info = parse_body(r.API_OPENAI_CHAT, load(RT, "chat.json"))
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", prompt_tokens=85, cached_tokens=128,
           generation_tokens=24, finish_reasons=["length", "length"])


def test_chat_body_choices_with_different_reasons() -> None:
    info = parse_body(r.API_OPENAI_CHAT, load(RT, "handwritten_chat_two_reasons.json"))
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", prompt_tokens=2, cached_tokens=16,
           generation_tokens=22, finish_reasons=["stop", "length"])


def test_continuous_usage_last_wins() -> None:
    """Every chunk carries running usage (continuous_usage_stats); the last one counts."""
    c = runtime_counters(_stream(r.API_OPENAI_CHAT, "chat_stream_continuous_usage.sse"))
    expect(c, runtime="vllm", prompt_tokens=85, cached_tokens=128, generation_tokens=5,
           finish_reasons=["length"])


def test_completions_stream_two_choices() -> None:
    """/v1/completions with n=2: nothing cached (cached_tokens 0), both choices to the limit."""
    c = runtime_counters(_stream(r.API_OPENAI_COMPLETIONS, "completions_stream.sse"))
    expect(c, runtime="vllm", prompt_tokens=203, cached_tokens=0, generation_tokens=12,
           finish_reasons=["length", "length"])


def test_completions_stream_without_cache_details() -> None:
    """No prompt_tokens_details: cached unknown, so prompt_tokens is the whole prompt."""
    c = runtime_counters(_stream(r.API_OPENAI_COMPLETIONS, "handwritten_completions_two_reasons.sse"))
    expect(c, runtime="vllm", prompt_tokens=5, generation_tokens=8,
           finish_reasons=["length", "stop"])


def test_without_runtime_hint_same_tokens() -> None:
    info = parse_events(r.API_OPENAI_CHAT, window(stream(RT, "chat_stream.sse")))
    expect(runtime_counters(info), prompt_tokens=85, cached_tokens=128, generation_tokens=8,
           finish_reasons=["length"])


def test_abort_passes_through() -> None:
    info = ResponseInfo(runtime="vllm", finish_reasons=["abort"], output_tokens=3)
    expect(runtime_counters(info), runtime="vllm", generation_tokens=3,
           finish_reasons=["abort"])


def test_error_mid_stream() -> None:
    info = _stream(r.API_OPENAI_CHAT, "handwritten_error_stream.sse")
    assert info.error.startswith("EngineCore encountered")
    expect(runtime_counters(info), runtime="vllm")


def test_truncated_usage_chunk() -> None:
    events = stream(RT, "chat_stream.sse")
    events[-2] = events[-2][:60]
    info = parse_events(r.API_OPENAI_CHAT, window(events))
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", finish_reasons=["length"])


def test_bad_usage_values_dropped() -> None:
    body = (b'{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":'
            b'3000000000,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":-1}}}')
    info = parse_body(r.API_OPENAI_CHAT, body)
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", generation_tokens=2)
