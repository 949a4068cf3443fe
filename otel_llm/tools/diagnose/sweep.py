"""The prompt-size sweep: time to first token and native prompt evaluation against prompt tokens,
with the output limit fixed, and the prefill rate fitted from them (least squares)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .trials import Trial

SIZES = (2, 20, 80)  # sentences of about 12 tokens: ~40, ~260, ~1,000 prompt tokens
QUICK_SIZES = (2, 30)
# The largest prompt plus the output limit stays within this share of the context length the
# runtime reported: a prompt over it would be refused (vLLM answers 400) or truncated.
CONTEXT_SHARE = 0.8
_TOKENS_PER_SENTENCE = 13  # a little over the ~12 measured, before a size of this run says better
_FIXED_TOKENS = 48  # the question, the nonce and the chat template around them


def _room(context: int, max_tokens: int) -> float:
    return CONTEXT_SHARE * context - max_tokens - _FIXED_TOKENS


def within_context(sizes: Sequence[int], context: int | None, max_tokens: int) -> tuple[int, ...]:
    """``sizes`` (sentences), the larger ones brought within the context length and spread
    evenly up to the largest that fits; unchanged when the context length is unknown or roomy."""
    sizes = tuple(sizes)
    if not context:
        return sizes
    largest = max(1, int(_room(context, max_tokens) // _TOKENS_PER_SENTENCE))
    if largest >= max(sizes):
        return sizes
    low = min(min(sizes), largest)
    count = len(sizes)
    spread = [round(low + (largest - low) * i / (count - 1)) for i in range(count)] if count > 1 else [largest]
    return tuple(sorted(set(spread)))


def refit(sentences: int, done: Sequence[Trial], context: int, max_tokens: int) -> int:
    """``sentences``, lowered if the sizes measured so far say it would not fit within the
    context length: from the largest measured prompt, at the measured tokens per sentence (the
    slope between two sizes; after one, the larger of the estimate and what that one cost; the
    tiny vLLM test model spends about 28 tokens on a sentence that costs Gemma 12)."""
    # a prompt trial's index is its number of sentences
    sized = ((t.index, _tokens(t)) for t in done if t.ok and t.index > 0)
    measured = sorted((index, tokens) for index, tokens in sized if tokens)
    if not measured:
        return sentences
    (low, low_tokens), (high, high_tokens) = measured[0], measured[-1]
    if high > low:
        per_sentence = (high_tokens - low_tokens) / (high - low)
    else:  # one size so far: what it cost beyond the fixed part, if a tokenizer makes that more
        per_sentence = max(_TOKENS_PER_SENTENCE, (high_tokens - _FIXED_TOKENS) / high)
    per_sentence = max(per_sentence, 1.0)
    largest = high + int((CONTEXT_SHARE * context - max_tokens - high_tokens) // per_sentence)
    return max(1, min(sentences, largest))


def _tokens(trial: Trial) -> int | None:
    return trial.input_tokens if trial.input_tokens is not None else trial.prompt_tokens


def _slope(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line, or None without two distinct x values."""
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread <= 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return slope, mean_y - slope * mean_x


def fit(trials: Sequence[Trial]) -> dict[str, Any]:
    """Seconds per prompt token and tokens/s, from native prompt evaluation (when every trial
    reports it) and from the client's time to first token; None where it cannot be fitted."""
    ok = [t for t in trials if t.ok and _tokens(t) is not None]
    result: dict[str, Any] = {"points": [
        {"prompt_tokens": _tokens(t), "request_bytes": t.request_bytes, "ttft_s": t.ttft,
         "native_prompt_eval_s": t.prompt_eval} for t in ok]}
    for label, values in (("native", [t.prompt_eval for t in ok]), ("client", [t.ttft for t in ok])):
        if any(v is None for v in values):
            result[label] = None
            continue
        line = _slope([(float(_tokens(t) or 0), float(v)) for t, v in zip(ok, values) if v is not None])
        if line is None or line[0] <= 0:
            result[label] = None
            continue
        result[label] = {"seconds_per_token": line[0], "fixed_s": line[1], "tokens_per_second": 1.0 / line[0]}
    return result
