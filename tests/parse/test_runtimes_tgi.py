"""Hugging Face TGI: x-* headers (ms; x-compute-time in s) and `details`."""

from __future__ import annotations

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import runtime_counters
from otel_llm_testing.runtime_fixtures import expect, from_body, from_stream, load, load_json, stream, window

RT = "tgi"


def test_generate_body_with_headers() -> None:
    headers = load_json(RT, "generate_headers.json")
    _, c = from_body(r.API_TGI_GENERATE, RT, "generate.json", headers)
    expect(c, runtime="tgi", total_duration=0.208, validation_duration=0.001,
           queue_duration=0.0, inference_duration=0.207, time_per_output_token=0.041,
           prompt_tokens=7, generation_tokens=5, finish_reasons=["length"])


def test_headers_given_only_to_runtime_counters() -> None:
    """Capture layers that pass headers only here (any case) get the same result."""
    headers = {k.title(): v for k, v in load_json(RT, "generate_headers.json").items()}
    info = parse_body(r.API_TGI_GENERATE, load(RT, "generate.json"))
    assert "tgi.headers" not in info.native
    expect(runtime_counters(info, headers), runtime="tgi", total_duration=0.208,
           validation_duration=0.001, queue_duration=0.0, inference_duration=0.207,
           time_per_output_token=0.041, prompt_tokens=7, generation_tokens=5,
           finish_reasons=["length"])


def test_chat_body_with_headers() -> None:
    _, c = from_body(r.API_OPENAI_CHAT, RT, "chat.json", load_json(RT, "chat_headers.json"))
    expect(c, runtime="tgi", total_duration=0.125, validation_duration=0.002,
           queue_duration=0.003, inference_duration=0.12, time_per_output_token=0.03,
           prompt_tokens=31, generation_tokens=4, finish_reasons=["stop"])


def test_compute_time_is_seconds_fallback_for_total() -> None:
    c = runtime_counters(ResponseInfo(), {"x-compute-time": "0.5", "x-compute-type": "cpu"})
    expect(c, runtime="tgi", total_duration=0.5)
    both = {"x-compute-time": "0.2081", "x-total-time": "208"}
    assert runtime_counters(ResponseInfo(), both).total_duration == 0.208


def test_generate_stream_details() -> None:
    """Streams carry no timing headers; last event has details (eos_token -> stop)."""
    headers = load_json(RT, "stream_headers.json")
    events = stream(RT, "generate_stream.sse")
    assert any(e.strip() == b":" for e in events)  # keep-alive comments
    info, c = from_stream(r.API_TGI_GENERATE_STREAM, RT, "generate_stream.sse", headers)
    assert info.native["tgi.headers"]["x-compute-type"] == "gpu+optimized"
    expect(c, runtime="tgi", prompt_tokens=7, generation_tokens=6, finish_reasons=["stop"])


def test_generate_stream_without_details() -> None:
    _, c = from_stream(r.API_TGI_GENERATE_STREAM, RT, "generate_stream_no_details.sse")
    expect(c, runtime="tgi")


def test_chat_stream_usage_chunk() -> None:
    headers = load_json(RT, "stream_headers.json")
    _, c = from_stream(r.API_OPENAI_CHAT, RT, "chat_stream.sse", headers)
    expect(c, runtime="tgi", prompt_tokens=31, generation_tokens=2, finish_reasons=["stop"])


@pytest.mark.parametrize("reason, want", [
    ("eos_token", "stop"), ("stop_sequence", "stop"), ("length", "length"), ("other", "other"),
])
def test_finish_reason_mapping(reason: str, want: str) -> None:
    info = ResponseInfo(native={"tgi.details": {"finish_reason": reason}})
    assert runtime_counters(info).finish_reasons == [want]


def test_bad_headers_dropped() -> None:
    """nan, negative, non-numbers, empty, 1e14 ms, 1e400, 7.5 tokens, a superscript digit."""
    headers = load_json(RT, "bad_headers.json")
    _, c = from_body(r.API_TGI_GENERATE, RT, "generate.json", headers)
    expect(c, runtime="tgi", generation_tokens=5, finish_reasons=["length"])


def test_bad_details_dropped() -> None:
    details = {"generated_tokens": -1, "input_length": "x", "finish_reason": 3}
    expect(runtime_counters(ResponseInfo(native={"tgi.details": details})), runtime="tgi")


def test_error_mid_stream() -> None:
    info, c = from_stream(r.API_TGI_GENERATE_STREAM, RT, "error_stream.sse")
    assert info.error.startswith("Request failed during generation")
    expect(c, runtime="tgi")


def test_truncated_last_event() -> None:
    events = stream(RT, "generate_stream.sse")
    events[-1] = events[-1][:-40]
    info = parse_events(r.API_TGI_GENERATE_STREAM, window(events))
    expect(runtime_counters(info), runtime="tgi")
