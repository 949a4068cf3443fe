"""SGLang /generate: `meta_info` (seconds); evaluated prompt = prompt_tokens - cached_tokens."""

from __future__ import annotations

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_events
from otel_llm.parse.runtimes import runtime_counters
from otel_llm_testing.runtime_fixtures import expect, from_body, from_stream, stream, window

RT = "sglang"


def test_generate_body() -> None:
    _, c = from_body(r.API_TGI_GENERATE, RT, "generate.json")
    expect(c, runtime="sglang", prompt_tokens=1, cached_tokens=5, generation_tokens=7,
           total_duration=0.2412, queue_duration=0.0031, finish_reasons=["length"])


def test_generate_stream_last_meta_info_wins() -> None:
    """meta_info on every event; cached_tokens and e2e_latency appear only on the last."""
    events = stream(RT, "generate_stream.sse")
    assert len(window(events)) < len(events)
    _, c = from_stream(r.API_TGI_GENERATE, RT, "generate_stream.sse")
    expect(c, runtime="sglang", prompt_tokens=2, cached_tokens=8, generation_tokens=7,
           total_duration=0.1834, finish_reasons=["stop"])


def test_unfinished_stream_has_no_latency() -> None:
    events = stream(RT, "generate_stream.sse")[:3]
    c = runtime_counters(parse_events(r.API_TGI_GENERATE, events))
    expect(c, runtime="sglang", prompt_tokens=10, cached_tokens=0, generation_tokens=3)


def test_abort() -> None:
    info, c = from_stream(r.API_TGI_GENERATE, RT, "abort_stream.sse")
    assert info.error == "Client disconnected"
    expect(c, runtime="sglang", prompt_tokens=6, cached_tokens=0, generation_tokens=1,
           total_duration=0.0421, finish_reasons=["abort"])


def test_error_mid_stream() -> None:
    info, c = from_stream(r.API_TGI_GENERATE, RT, "error_stream.sse")
    assert info.error.startswith("The input (9000 tokens)")
    expect(c, runtime="sglang", prompt_tokens=6, cached_tokens=0, generation_tokens=1)


def test_bad_values_dropped() -> None:
    """e2e_latency -1, queue_time 1e9 s, 2e9 tokens; a numeric string count is accepted."""
    _, c = from_body(r.API_TGI_GENERATE, RT, "bad_values.json")
    expect(c, runtime="sglang", prompt_tokens=1, cached_tokens=5, finish_reasons=["stop"])


def test_cached_above_prompt_drops_prompt() -> None:
    meta = {"prompt_tokens": 3, "cached_tokens": 9}
    expect(runtime_counters(ResponseInfo(native={"sglang.meta_info": meta})),
           runtime="sglang", cached_tokens=9)


def test_finish_reason_from_meta_when_info_has_none() -> None:
    for fr, want in (({"type": "length", "length": 7}, ["length"]), ("stop", ["stop"]),
                     ({"matched": 1}, None), (None, None)):
        meta = {"finish_reason": fr}
        assert runtime_counters(ResponseInfo(native={"sglang.meta_info": meta})).finish_reasons \
            == want


def test_truncated_last_event() -> None:
    events = stream(RT, "generate_stream.sse")
    events[-2] = events[-2][:-30]  # the finished event, before [DONE]
    c = runtime_counters(parse_events(r.API_TGI_GENERATE, window(events)))
    expect(c, runtime="sglang", prompt_tokens=10, cached_tokens=0, generation_tokens=6)


def test_openai_chat_stream_is_usage_only() -> None:
    """SGLang's /v1 stream proves no runtime: usage with --enable-cache-report."""
    _, c = from_stream(r.API_OPENAI_CHAT, RT, "chat_stream.sse")
    expect(c, prompt_tokens=4, cached_tokens=16, generation_tokens=2, finish_reasons=["stop"])
