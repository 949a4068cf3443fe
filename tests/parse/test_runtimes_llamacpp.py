"""llama.cpp server counters: `timings` in ms, prompt_n evaluated, cache_n reused."""

from __future__ import annotations

import json

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import llamacpp, runtime_counters
from otel_llm_testing.runtime_fixtures import expect, from_body, from_stream, load, stream, window

RT = "llamacpp"

# The last event seen live (runtime-formats.md, "Seen live"), normalized.
LIVE = dict(
    runtime="llama.cpp", prompt_tokens=30, prompt_eval_duration=0.140142,
    prompt_eval_rate=214.06858757545916, cached_tokens=0, generation_tokens=40,
    generation_duration=0.749906, generation_rate=52.006518150274836,
    time_per_output_token=0.019228358974358972,
)


LIVE_EVENT = (  # verbatim from runtime-formats.md
    b'data: {"choices":[],"created":1795973386,"id":"chatcmpl-...","model":"/path/gemma.gguf",'
    b'"system_fingerprint":"b0-unknown","object":"chat.completion.chunk","usage":{"completion_'
    b'tokens":40,"prompt_tokens":30,"total_tokens":70,"prompt_tokens_details":{"cached_tokens"'
    b':0}},"timings":{"cache_n":0,"prompt_n":30,"prompt_ms":140.142,"prompt_per_token_ms":4.67'
    b'14,"prompt_per_second":214.06858757545916,"predicted_n":40,"predicted_ms":749.906,"predi'
    b'cted_per_token_ms":19.228358974358972,"predicted_per_second":52.006518150274836}}'
)


def test_live_sample_verbatim() -> None:
    events = stream(RT, "live_chat_last_events.sse")
    assert [e.strip() for e in events] == [LIVE_EVENT, b"data: [DONE]"]
    info = parse_events(r.API_OPENAI_CHAT, events)
    expect(runtime_counters(info), **LIVE)


def test_chat_stream_finish_and_timings_in_different_chunks() -> None:
    """finish_reason in the finish chunk, timings + usage in the usage chunk."""
    _, c = from_stream(r.API_OPENAI_CHAT, RT, "chat_stream.sse")
    expect(c, **LIVE, finish_reasons=["length"])


def test_chat_body() -> None:
    _, c = from_body(r.API_OPENAI_CHAT, RT, "chat.json")
    expect(c, runtime="llama.cpp", prompt_tokens=2, prompt_eval_duration=0.0091,
           prompt_eval_rate=219.78, cached_tokens=10, generation_tokens=8,
           generation_duration=0.1602, generation_rate=49.93, time_per_output_token=0.020025,
           finish_reasons=["stop"])


def test_completion_body_live_shape() -> None:
    """prompt_n=3 evaluated and cache_n=1 reused; tokens_cached=23 (KV fill) is ignored."""
    info, c = from_body(r.API_LLAMACPP_COMPLETION, RT, "completion.json")
    assert json.loads(load(RT, "completion.json"))["tokens_cached"] == 23
    assert info.finish_reasons == ["limit"]
    expect(c, runtime="llama.cpp", prompt_tokens=3, prompt_eval_duration=0.02805,
           prompt_eval_rate=106.95187165775401, cached_tokens=1, generation_tokens=20,
           generation_duration=0.435832, generation_rate=43.59,
           time_per_output_token=0.0217916, finish_reasons=["length"],
           truncated=False)


def test_completion_stream_final_event() -> None:
    info, c = from_stream(r.API_LLAMACPP_COMPLETION, RT, "completion_stream.sse")
    expect(c, runtime="llama.cpp", prompt_tokens=3, prompt_eval_duration=0.02805,
           prompt_eval_rate=106.95187165775401, cached_tokens=1, generation_tokens=2,
           generation_duration=0.04, generation_rate=50.0, time_per_output_token=0.02,
           finish_reasons=["stop"], truncated=False)


def test_stop_type_word_is_stop() -> None:
    info, c = from_stream(r.API_LLAMACPP_COMPLETION, RT, "completion_stream_word.sse")
    assert info.finish_reasons == ["word"] and c.finish_reasons == ["stop"]
    assert c.time_per_output_token == 0.02 and c.prompt_eval_rate == 106.95187165775401


@pytest.mark.parametrize("reason, want", [
    ("eos", "stop"), ("word", "stop"), ("limit", "length"), ("none", "none"),
    ("tool_calls", "tool_calls"),
])
def test_finish_reason_mapping(reason: str, want: str) -> None:
    info = ResponseInfo(finish_reasons=[reason], native={"llamacpp.timings": {}})
    assert runtime_counters(info).finish_reasons == [want]


@pytest.mark.parametrize("name, api", [
    ("chat_stream_timings_twice.sse", r.API_OPENAI_CHAT),
    ("completion_stream_timings_twice.sse", r.API_LLAMACPP_COMPLETION),
])
def test_duplicated_timings_last_wins(name: str, api: str) -> None:
    """timings_per_token: partial timings on every chunk (twice near the end); last wins."""
    events = stream(RT, name)
    assert sum(b'"timings"' in e for e in events) >= 7
    info = parse_events(api, events)
    c = runtime_counters(info)
    if api == r.API_OPENAI_CHAT:
        expect(c, runtime="llama.cpp", prompt_tokens=12, prompt_eval_duration=0.06,
               prompt_eval_rate=200.0, cached_tokens=4, generation_tokens=8,
               generation_duration=0.16, generation_rate=50.0, time_per_output_token=0.02,
               finish_reasons=["stop"])
    else:
        expect(c, runtime="llama.cpp", prompt_tokens=12, prompt_eval_duration=0.06,
               prompt_eval_rate=200.0, cached_tokens=4, generation_tokens=6,
               generation_duration=0.12, generation_rate=50.0, time_per_output_token=0.02,
               finish_reasons=["stop"], truncated=False)


def test_duplicated_timings_in_window_last_wins() -> None:
    events = window(stream(RT, "chat_stream_timings_twice.sse"))
    c = runtime_counters(parse_events(r.API_OPENAI_CHAT, events))
    assert (c.generation_tokens, c.generation_duration, c.generation_rate) == (8, 0.16, 50.0)
    reversed_pair = events[-3:-1][::-1]  # final timings first, stop-token partial last
    c = runtime_counters(parse_events(r.API_OPENAI_CHAT, reversed_pair))
    assert c.generation_duration == 0.15  # whichever came last on the wire


def test_nulls_are_dropped_not_zeroed() -> None:
    """Fully cached prompt: prompt_n 0, prompt_ms 0, per-second null (inf in the server)."""
    info, c = from_body(r.API_LLAMACPP_COMPLETION, RT, "nulls.json")
    expect(c, runtime="llama.cpp", prompt_tokens=0, prompt_eval_duration=0.0,
           cached_tokens=5, generation_tokens=1, generation_duration=0.0,
           time_per_output_token=0.0, finish_reasons=["length"],
           truncated=False)


def test_bad_values_dropped() -> None:
    """negative ms, 1e12 ms, 5e9 tokens, "fast", true, Infinity, NaN, 1.5 drafts, -1."""
    info, c = from_body(r.API_LLAMACPP_COMPLETION, RT, "bad_values.json")
    assert info.native["llamacpp.timings"]["prompt_n"] == 10
    expect(c, runtime="llama.cpp", prompt_tokens=10, finish_reasons=["length"])


def test_bad_values_built_directly() -> None:
    timings = {"prompt_n": None, "prompt_ms": float("nan"), "predicted_ms": float("inf"),
               "predicted_n": -4, "cache_n": "2", "draft_n": 10**12, "predicted_per_second": 1e10}
    info = ResponseInfo(native={"llamacpp.timings": timings, llamacpp.NATIVE_TRUNCATED: "yes"})
    expect(runtime_counters(info), runtime="llama.cpp", cached_tokens=2)


def test_speculative_draft_counters() -> None:
    _, c = from_body(r.API_OPENAI_CHAT, RT, "speculative.json")
    expect(c, runtime="llama.cpp", prompt_tokens=40, prompt_eval_duration=0.08,
           prompt_eval_rate=500.0, cached_tokens=0, generation_tokens=30,
           generation_duration=0.25, generation_rate=120.0,
           time_per_output_token=0.008333333333333334, draft_tokens=24,
           draft_tokens_accepted=18, finish_reasons=["stop"])


def test_truncated_flag() -> None:
    info = parse_body(r.API_LLAMACPP_COMPLETION, load(RT, "completion_truncated.json"))
    expect(runtime_counters(info), runtime="llama.cpp", prompt_tokens=2048,
           prompt_eval_duration=4.096, prompt_eval_rate=500.0, cached_tokens=0,
           generation_tokens=6, generation_duration=0.12, generation_rate=50.0,
           time_per_output_token=0.02, finish_reasons=["stop"], truncated=True)


@pytest.mark.parametrize("name", ["error_stream.sse", "error_legacy_stream.sse"])
def test_error_mid_stream(name: str) -> None:
    info, c = from_stream(r.API_LLAMACPP_COMPLETION, RT, name)
    assert info.error
    expect(c)


def test_truncated_usage_chunk() -> None:
    """The usage/timings chunk was cut off: only the finish chunk's reason survives."""
    info, c = from_stream(r.API_OPENAI_CHAT, RT, "truncated_stream.sse")
    assert info.error is None
    expect(c, finish_reasons=["length"])
