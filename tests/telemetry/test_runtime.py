"""The runtime's own counters on a call (otel_llm.telemetry.runtime): which llm.runtime.* attributes
each counter gives, and where the synthesized runtime spans sit relative to their anchor and bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.parse import routes
from otel_llm.parse.response import parse_body
from otel_llm.parse.runtimes import RuntimeCounters, runtime_counters
from otel_llm.telemetry.phases import Phase
from otel_llm.telemetry.runtime import runtime_attributes, synthesized_spans

MS = 1_000_000
S = 1_000_000_000
# binary fractions: seconds * 1e9 is exact, so expected nanoseconds are plain sums
QUEUE, LOAD, PREFILL, DECODE = 0.125, 0.25, 0.5, 1.0
ALL = RuntimeCounters(queue_duration=QUEUE, load_duration=LOAD, prompt_eval_duration=PREFILL,
                      generation_duration=DECODE)
ANCHOR, LOWER, UPPER = 2_000 * MS, 100 * MS, 5_000 * MS


def _ns(seconds: float) -> int:
    return int(seconds * S)


def _spans(phases: list[Phase]) -> list[tuple[str, int, int]]:
    assert all(p.complete for p in phases)
    return [(p.name, p.start_ns, p.end_ns) for p in phases]


# --- runtime_attributes --------------------------------------------------------------------------


def test_every_reported_counter_becomes_its_attribute() -> None:
    counters = RuntimeCounters(
        runtime="llama.cpp", load_duration=1.5, queue_duration=0.25, prompt_tokens=120, prompt_eval_duration=0.5,
        prompt_eval_rate=240.0, cached_tokens=30, generation_tokens=64, generation_duration=2.0,
        generation_rate=32.0, total_duration=4.25, draft_tokens=16, draft_tokens_accepted=12,
        finish_reasons=["stop"])
    attrs: dict[str, Any] = {"kept": 1}
    runtime_attributes(counters, attrs)
    assert attrs == {
        "kept": 1,
        sc.LLM_RUNTIME_LOAD_DURATION: 1.5, sc.LLM_RUNTIME_QUEUE_DURATION: 0.25, sc.LLM_RUNTIME_PROMPT_TOKENS: 120,
        sc.LLM_RUNTIME_PROMPT_EVAL_DURATION: 0.5, sc.LLM_RUNTIME_PROMPT_EVAL_RATE: 240.0,
        sc.LLM_RUNTIME_CACHED_TOKENS: 30, sc.LLM_RUNTIME_GENERATION_TOKENS: 64,
        sc.LLM_RUNTIME_GENERATION_DURATION: 2.0, sc.LLM_RUNTIME_GENERATION_RATE: 32.0,
        sc.LLM_RUNTIME_TOTAL_DURATION: 4.25, sc.LLM_RUNTIME_DRAFT_TOKENS: 16,
        sc.LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED: 12, sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE: 0.75,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 30,  # the cached count stands in for the usage block's
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
    }
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] is not counters.finish_reasons  # a copy


@pytest.mark.parametrize("drafted, accepted, rate", [
    (16, 12, 0.75), (8, 0, 0.0), (0, 0, None), (None, 3, None), (4, None, None), (4, 5, None), (4, -1, None),
])
def test_the_acceptance_rate_needs_both_counts_and_a_draft(drafted: int | None, accepted: int | None,
                                                           rate: float | None) -> None:
    attrs: dict[str, Any] = {}
    runtime_attributes(RuntimeCounters(draft_tokens=drafted, draft_tokens_accepted=accepted), attrs)
    assert attrs.get(sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE) == rate


def test_unreported_counters_add_nothing() -> None:
    attrs: dict[str, Any] = {}
    runtime_attributes(RuntimeCounters(), attrs)
    assert attrs == {}
    # counters with no attribute of their own (they feed metrics and diagnosis)
    runtime_attributes(RuntimeCounters(runtime="tgi", validation_duration=0.1, time_to_first_token=0.2,
                                       time_per_output_token=0.03, inference_duration=0.4, truncated=True,
                                       finish_reasons=[]), attrs)
    assert attrs == {}


def test_a_reported_zero_is_kept() -> None:
    attrs: dict[str, Any] = {}
    runtime_attributes(RuntimeCounters(generation_tokens=0, cached_tokens=0, load_duration=0.0), attrs)
    assert attrs == {sc.LLM_RUNTIME_GENERATION_TOKENS: 0, sc.LLM_RUNTIME_CACHED_TOKENS: 0,
                     sc.LLM_RUNTIME_LOAD_DURATION: 0.0, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 0}


def test_the_usage_blocks_cached_count_wins() -> None:
    attrs: dict[str, Any] = {sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 8}
    runtime_attributes(RuntimeCounters(cached_tokens=5), attrs)
    assert attrs == {sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 8, sc.LLM_RUNTIME_CACHED_TOKENS: 5}


# --- synthesized_spans ----------------------------------------------------------------------------


def test_streaming_prefill_ends_at_the_first_token() -> None:
    spans = _spans(synthesized_spans(ALL, ANCHOR, True, LOWER, UPPER))
    prefill_start = ANCHOR - _ns(PREFILL)
    load_start = prefill_start - _ns(LOAD)
    assert spans == [
        (sc.SPAN_RUNTIME_QUEUE, load_start - _ns(QUEUE), load_start),
        (sc.SPAN_RUNTIME_LOAD, load_start, prefill_start),
        (sc.SPAN_RUNTIME_PREFILL, prefill_start, ANCHOR),
        (sc.SPAN_RUNTIME_DECODE, ANCHOR, ANCHOR + _ns(DECODE)),
    ]


def test_a_whole_answer_decode_ends_at_the_headers() -> None:
    spans = _spans(synthesized_spans(ALL, ANCHOR, False, LOWER, UPPER))
    decode_start = ANCHOR - _ns(DECODE)
    prefill_start = decode_start - _ns(PREFILL)
    load_start = prefill_start - _ns(LOAD)
    assert spans == [
        (sc.SPAN_RUNTIME_QUEUE, load_start - _ns(QUEUE), load_start),
        (sc.SPAN_RUNTIME_LOAD, load_start, prefill_start),
        (sc.SPAN_RUNTIME_PREFILL, prefill_start, decode_start),
        (sc.SPAN_RUNTIME_DECODE, decode_start, ANCHOR),
    ]


@pytest.mark.parametrize("missing", [None, 0.0])
def test_unreported_steps_leave_no_gap(missing: float | None) -> None:
    counters = RuntimeCounters(queue_duration=QUEUE, load_duration=missing, prompt_eval_duration=PREFILL,
                               generation_duration=missing)
    spans = _spans(synthesized_spans(counters, ANCHOR, True, LOWER, UPPER))
    prefill_start = ANCHOR - _ns(PREFILL)
    assert spans == [(sc.SPAN_RUNTIME_QUEUE, prefill_start - _ns(QUEUE), prefill_start),
                     (sc.SPAN_RUNTIME_PREFILL, prefill_start, ANCHOR)]


def test_no_durations_no_spans() -> None:
    assert synthesized_spans(RuntimeCounters(runtime="vllm", generation_tokens=8), ANCHOR, True, LOWER, UPPER) == []


def test_spans_are_clipped_to_the_lower_bound() -> None:
    """Nothing starts before the request was sent: a span partly before it is cut, one wholly
    before it is dropped."""
    load_start = ANCHOR - _ns(PREFILL) - _ns(LOAD)
    lower = load_start + 50 * MS  # inside runtime.load; runtime.queue lies wholly before it
    spans = _spans(synthesized_spans(ALL, ANCHOR, True, lower, UPPER))
    assert [name for name, _, _ in spans] == [sc.SPAN_RUNTIME_LOAD, sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE]
    assert spans[0] == (sc.SPAN_RUNTIME_LOAD, lower, ANCHOR - _ns(PREFILL))


def test_spans_are_clipped_to_the_end_of_the_call() -> None:
    upper = ANCHOR + 300 * MS  # the stream was closed during decode
    spans = _spans(synthesized_spans(ALL, ANCHOR, True, LOWER, upper))
    assert spans[-1] == (sc.SPAN_RUNTIME_DECODE, ANCHOR, upper)
    # a call that ended before the first token would have arrived keeps only what fits
    early = _spans(synthesized_spans(ALL, ANCHOR, True, LOWER, ANCHOR - _ns(PREFILL)))
    assert [name for name, _, _ in early] == [sc.SPAN_RUNTIME_QUEUE, sc.SPAN_RUNTIME_LOAD]


def test_a_slow_runtime_longer_than_the_call_is_cut_to_the_window() -> None:
    """Reported durations longer than the whole call (clock skew, a shared batch) still give
    spans inside [lower, upper], back to back."""
    counters = RuntimeCounters(load_duration=10.0, prompt_eval_duration=10.0, generation_duration=10.0)
    spans = _spans(synthesized_spans(counters, ANCHOR, True, LOWER, UPPER))
    assert spans == [(sc.SPAN_RUNTIME_PREFILL, LOWER, ANCHOR), (sc.SPAN_RUNTIME_DECODE, ANCHOR, UPPER)]


# --- bad values never reach them --------------------------------------------------------------------


def test_bad_runtime_values_are_dropped_before_attributes_and_spans() -> None:
    """What calls.py hands these functions comes from runtime_counters: a NaN, negative or
    non-numeric counter is None there, so it gives neither an attribute nor a span."""
    answer = {"model": "llama3", "message": {"role": "assistant", "content": "hi"}, "done": True,
              "done_reason": "stop", "load_duration": "nan", "prompt_eval_duration": -5_000_000,
              "prompt_eval_count": "many", "total_duration": "-1",
              "eval_count": 10, "eval_duration": _ns(DECODE)}
    info = parse_body(routes.API_OLLAMA_CHAT, json.dumps(answer).encode(), {})
    counters = runtime_counters(info, {})
    assert counters.runtime == "ollama"
    attrs: dict[str, Any] = {}
    runtime_attributes(counters, attrs)
    assert attrs == {sc.LLM_RUNTIME_GENERATION_TOKENS: 10, sc.LLM_RUNTIME_GENERATION_DURATION: DECODE,
                     sc.LLM_RUNTIME_GENERATION_RATE: 10 / DECODE, sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"]}
    spans = _spans(synthesized_spans(counters, ANCHOR, False, LOWER, UPPER))
    assert spans == [(sc.SPAN_RUNTIME_DECODE, ANCHOR - _ns(DECODE), ANCHOR)]
