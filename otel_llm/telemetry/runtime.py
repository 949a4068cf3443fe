"""The runtime's own counters on the call: normalized attributes, and synthesized spans placed
on the client's clock.

Placement rule (the runtime's clock is never compared with ours; only its durations are used):

* Streaming: the first generated token left the runtime when prefill ended, so ``runtime.prefill``
  ends at the client's first-token arrival and extends back by the reported prompt-evaluation
  time; ``runtime.load`` and ``runtime.queue`` precede it, back to back; ``runtime.decode``
  starts at the first token and lasts the reported generation time.
* Not streaming: the response left the runtime when decoding ended, so ``runtime.decode`` ends at
  the arrival of the response headers, and prefill, load and queue precede it, back to back.

Every synthesized span is then clipped to the window between "request sent" and the end of the
call, so none extends outside its parent (the call span) or overlaps another; a span clipped to
nothing is dropped. Network transit is not subtracted: on a remote link each span sits later by
the one-way latency, which is what ``llm.diagnosis.unaccounted_wait`` reports.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from otel_llm import semconv as sc
from otel_llm.telemetry.phases import Phase

if TYPE_CHECKING:
    from otel_llm.parse.runtimes import RuntimeCounters

__all__ = ["runtime_attributes", "synthesized_spans"]

_NS = 1_000_000_000

# RuntimeCounters field -> span attribute; set only when the runtime reported it.
_ATTRIBUTES = (
    ("load_duration", sc.LLM_RUNTIME_LOAD_DURATION),
    ("queue_duration", sc.LLM_RUNTIME_QUEUE_DURATION),
    ("prompt_tokens", sc.LLM_RUNTIME_PROMPT_TOKENS),
    ("prompt_eval_duration", sc.LLM_RUNTIME_PROMPT_EVAL_DURATION),
    ("prompt_eval_rate", sc.LLM_RUNTIME_PROMPT_EVAL_RATE),
    ("cached_tokens", sc.LLM_RUNTIME_CACHED_TOKENS),
    ("generation_tokens", sc.LLM_RUNTIME_GENERATION_TOKENS),
    ("generation_duration", sc.LLM_RUNTIME_GENERATION_DURATION),
    ("generation_rate", sc.LLM_RUNTIME_GENERATION_RATE),
    ("total_duration", sc.LLM_RUNTIME_TOTAL_DURATION),
    ("draft_tokens", sc.LLM_RUNTIME_DRAFT_TOKENS),
    ("draft_tokens_accepted", sc.LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED),
)

_KEYS = tuple(key for _, key in _ATTRIBUTES)
_VALUES = attrgetter(*(field for field, _ in _ATTRIBUTES))  # one call for all the fields


class Synthesized(NamedTuple):
    name: str
    start_ns: int
    end_ns: int


def runtime_attributes(counters: RuntimeCounters, attrs: dict[str, Any]) -> None:
    """Add the llm.runtime.* attributes the runtime reported (never a default zero)."""
    for key, value in zip(_KEYS, _VALUES(counters)):
        if value is not None:
            attrs[key] = value
    drafted, accepted = counters.draft_tokens, counters.draft_tokens_accepted
    if drafted and accepted is not None and 0 <= accepted <= drafted:
        attrs[sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE] = accepted / drafted
    if counters.cached_tokens is not None and sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS not in attrs:
        attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = counters.cached_tokens
    if counters.finish_reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = list(counters.finish_reasons)


def _ns(seconds: float | None) -> int:
    return int(seconds * _NS) if seconds else 0


def synthesized_spans(
    counters: RuntimeCounters, anchor_ns: int, streaming: bool, lower_ns: int, upper_ns: int,
) -> list[Phase]:
    """Spans for the reported queue/load/prefill/decode durations, in time order, clipped to
    ``[lower_ns, upper_ns]`` (see the module docstring for the rule), as complete phases."""
    prefill, load, queue = (_ns(counters.prompt_eval_duration), _ns(counters.load_duration),
                            _ns(counters.queue_duration))
    decode = _ns(counters.generation_duration)
    if streaming:
        before_end, decode_span = anchor_ns, (anchor_ns, anchor_ns + decode)
    else:
        before_end, decode_span = anchor_ns - decode, (anchor_ns - decode, anchor_ns)
    spans: list[Synthesized] = []
    end = before_end
    for name, duration in ((sc.SPAN_RUNTIME_PREFILL, prefill), (sc.SPAN_RUNTIME_LOAD, load),
                           (sc.SPAN_RUNTIME_QUEUE, queue)):
        if duration:
            spans.append(Synthesized(name, end - duration, end))
            end -= duration
    spans.reverse()
    if decode:
        spans.append(Synthesized(sc.SPAN_RUNTIME_DECODE, *decode_span))
    return _clip(spans, lower_ns, upper_ns)


def _clip(spans: list[Synthesized], lower: int, upper: int) -> list[Phase]:
    clipped = []
    cursor = lower
    for name, start, end in spans:
        start = max(start, cursor)
        end = min(end, upper)
        if end > start:
            clipped.append(Phase(name, start, end, True))
            cursor = end
    return clipped
