"""vLLM: the ``metrics`` object of a server run with ``--enable-per-request-metrics``; else usage
and finish reasons only.

Without that object no response field proves vLLM, so these tests set ``info.runtime = "vllm"``
after parsing, the way a caller that knows the runtime (OTEL_LLM_RUNTIMES, or the observers'
recognition) would. The fixtures are a real vLLM 0.32.0's answers
(``tools/record_vllm_fixtures.py``: the tiny test model, a 213-token prompt of which 128 come from
the prefix cache, fixed output lengths; ``chat_metrics.json`` and ``chat_stream_metrics.sse`` with
``--per-request-metrics``), except the ``handwritten_*`` ones: answers a healthy run cannot be made
to give (finish reasons that differ between choices, an engine failure mid-stream, speculative
decoding, which the CPU test server does not run).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import runtime_counters
from otel_llm_testing.runtime_fixtures import expect, load, load_json, stream, window

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


# --- the per-request `metrics` object (--enable-per-request-metrics) -----------------------------
def _from_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The counters both recorded answers (85 prompt tokens, 128 cached, stopped by length) give
    from their ``metrics`` object, ms -> s."""
    itl = metrics["mean_itl_ms"] / 1e3
    prefill = metrics["time_to_first_token_ms"] / 1e3
    return dict(runtime="vllm", prompt_tokens=85, cached_tokens=128, finish_reasons=["length"],
                queue_duration=metrics["queue_time_ms"] / 1e3, prompt_eval_duration=prefill,
                prompt_eval_rate=85 / prefill, generation_duration=metrics["generation_time_ms"] / 1e3,
                time_per_output_token=itl, generation_rate=1 / itl)


def test_metrics_of_a_chat_body_are_the_runtime_counters() -> None:
    """A real answer: queue, prefill (vLLM's time_to_first_token_ms counts from scheduling), decode
    and the inter-token latency, ms -> s; the decode rate is the latency's reciprocal, not
    tokens_per_second (which counts the prefill too). The object proves vLLM by itself."""
    info = parse_body(r.API_OPENAI_CHAT, load(RT, "chat_metrics.json"))
    assert info.runtime == "vllm"
    expect(runtime_counters(info), generation_tokens=12,
           **_from_metrics(load_json(RT, "chat_metrics.json")["metrics"]))


def test_metrics_of_a_stream_ride_its_usage_chunk() -> None:
    events = stream(RT, "chat_stream_metrics.sse")
    last = json.loads(events[-2][len(b"data: "):])
    assert last["choices"] == [] and "usage" in last
    metrics = last["metrics"]
    info = parse_events(r.API_OPENAI_CHAT, window(events))
    assert info.runtime == "vllm"
    expect(runtime_counters(info), generation_tokens=8, **_from_metrics(metrics))


def test_speculative_decoding_drafts_and_accepted() -> None:
    """Handwritten in the shape of vLLM 0.32's ``SpeculativeDecodingMetrics``
    (vllm/entrypoints/generate/base/protocol.py; docs/features/speculative_decoding/
    acceptance_metrics.md): 4 verify steps of 3 drafts, 7 accepted, on the real answer's timings."""
    info = parse_body(r.API_OPENAI_CHAT, load(RT, "handwritten_chat_speculative.json"))
    c = runtime_counters(info)
    assert (c.draft_tokens, c.draft_tokens_accepted) == (12, 7)
    assert c.queue_duration is not None and c.generation_duration is not None


def _body(metrics: Any) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "model": "tiny",
                       "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 4, "completion_tokens": 3}, "metrics": metrics}).encode()


@pytest.mark.parametrize("metrics", [None, {}, {"unrelated": 1}, [1, 2], "fast"])
def test_no_metrics_object_changes_nothing(metrics: Any) -> None:
    """n > 1 gives ``"metrics": null``; anything not vLLM's object is not read and proves nothing."""
    info = parse_body(r.API_OPENAI_CHAT, _body(metrics))
    assert info.runtime is None
    info.runtime = "vllm"
    expect(runtime_counters(info), runtime="vllm", prompt_tokens=4, generation_tokens=3,
           finish_reasons=["stop"])


def test_bad_metrics_values_dropped() -> None:
    body = _body({"queue_time_ms": -1.0, "time_to_first_token_ms": float("nan"),
                  "generation_time_ms": 1e30, "mean_itl_ms": True, "tokens_per_second": 5.0,
                  "speculative_decoding": {"num_draft_tokens": 2.5, "num_accepted_draft_tokens": -3}})
    info = parse_body(r.API_OPENAI_CHAT, body)
    assert info.runtime == "vllm"
    expect(runtime_counters(info), runtime="vllm", prompt_tokens=4, generation_tokens=3,
           finish_reasons=["stop"])


def test_zero_inter_token_latency_gives_no_rate() -> None:
    info = parse_body(r.API_OPENAI_CHAT, _body({"queue_time_ms": 0, "mean_itl_ms": 0, "generation_time_ms": 0}))
    expect(runtime_counters(info), runtime="vllm", prompt_tokens=4, generation_tokens=3, finish_reasons=["stop"],
           queue_duration=0.0, generation_duration=0.0, time_per_output_token=0.0)


def test_metrics_give_the_runtime_spans_and_the_unaccounted_wait() -> None:
    """What llama.cpp's timings give, from the streamed fixture: queue then prefill up to the first
    token, decode after it, and the wait before the first token less those two is unaccounted."""
    from otel_llm import semconv as sc
    from otel_llm.telemetry.diagnosis import unaccounted_wait
    from otel_llm.telemetry.runtime import synthesized_spans

    c = runtime_counters(parse_events(r.API_OPENAI_CHAT, window(stream(RT, "chat_stream_metrics.sse"))))
    assert c.queue_duration and c.prompt_eval_duration and c.generation_duration
    first_token = 10**12
    spans = synthesized_spans(c, first_token, True, 0, 2 * first_token)
    assert [p.name for p in spans] == [sc.SPAN_RUNTIME_QUEUE, sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE]
    assert spans[1].end_ns == spans[2].start_ns == first_token
    assert spans[0].end_ns == spans[1].start_ns
    wait = 0.050
    assert unaccounted_wait(wait, c, True) == pytest.approx(wait - c.queue_duration - c.prompt_eval_duration)
