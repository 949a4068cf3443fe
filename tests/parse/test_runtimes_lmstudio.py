"""LM Studio: `stats` of the v0 body and of the v1 `chat.end` event (seconds)."""

from __future__ import annotations

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import RuntimeCounters, runtime_counters
from otel_llm_testing.runtime_fixtures import expect, from_body, from_stream, stream, window

RT = "lmstudio"


def test_v0_body() -> None:
    _, c = from_body(r.API_OPENAI_CHAT, RT, "v0_chat.json")
    expect(c, runtime="lmstudio", prompt_tokens=24, generation_tokens=53,
           generation_duration=0.954, generation_rate=51.43709529007664,
           time_to_first_token=0.111, time_per_output_token=0.954 / 53,
           finish_reasons=["stop"])


def test_v0_body_length() -> None:
    _, c = from_body(r.API_OPENAI_CHAT, RT, "v0_chat_length.json")
    expect(c, runtime="lmstudio", prompt_tokens=10, generation_tokens=4,
           generation_duration=0.1, generation_rate=40.0, time_to_first_token=0.05,
           time_per_output_token=0.025, finish_reasons=["length"])


def test_v1_body() -> None:
    _, c = from_body(r.API_LMSTUDIO_V1_CHAT, RT, "v1_chat.json")
    expect(c, runtime="lmstudio", prompt_tokens=359, generation_tokens=218,
           generation_rate=41.097718386623356, time_to_first_token=1.367)


def test_v1_stream_chat_end() -> None:
    _, c = from_stream(r.API_LMSTUDIO_V1_CHAT, RT, "v1_chat_stream.sse")
    expect(c, runtime="lmstudio", load_duration=3.21, prompt_tokens=19, generation_tokens=7,
           generation_rate=38.2, time_to_first_token=0.412)


def test_v1_stream_load_time_from_chat_end_outside_window() -> None:
    """model_load.end falls outside the window; chat.end repeats the load time."""
    events = stream(RT, "v1_chat_stream_long.sse")
    assert not any(b"model_load.end" in e for e in window(events))
    _, c = from_stream(r.API_LMSTUDIO_V1_CHAT, RT, "v1_chat_stream_long.sse")
    expect(c, runtime="lmstudio", load_duration=2.5, prompt_tokens=19, generation_tokens=6,
           generation_rate=42.5, time_to_first_token=0.25)


@pytest.mark.parametrize("reason, want", [
    ("eosFound", "stop"), ("stopStringFound", "stop"),
    ("maxPredictedTokensReached", "length"), ("contextLengthReached", "length"),
    ("userStopped", "userStopped"),
])
def test_stop_reason_mapping(reason: str, want: str) -> None:
    """Through response.py (no choices: stats.stop_reason is used) and built directly."""
    body = b'{"stats":{"stop_reason":"%s","tokens_per_second":1.0}}' % reason.encode()
    _, c = _body(body)
    assert c.finish_reasons == [want]
    direct = ResponseInfo(native={"lmstudio.stats": {"stop_reason": reason}})
    assert runtime_counters(direct).finish_reasons == [want]


def test_bad_stats_dropped() -> None:
    """negative, 7.5 tokens, "n/a", null, 1e8 s."""
    _, c = from_body(r.API_LMSTUDIO_V1_CHAT, RT, "v1_bad_stats.json")
    expect(c, runtime="lmstudio")


def test_error_mid_stream() -> None:
    info, c = from_stream(r.API_LMSTUDIO_V1_CHAT, RT, "v1_error_stream.sse")
    assert info.error == "Context length exceeded"
    expect(c, runtime="lmstudio")


def test_truncated_chat_end() -> None:
    events = stream(RT, "v1_chat_stream.sse")
    events[-1] = events[-1][:-80]
    info = parse_events(r.API_LMSTUDIO_V1_CHAT, window(events))
    expect(runtime_counters(info), runtime="lmstudio")


def _body(body: bytes) -> tuple[ResponseInfo, RuntimeCounters]:
    info = parse_body(r.API_OPENAI_CHAT, body)
    return info, runtime_counters(info)
