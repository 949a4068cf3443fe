"""The prompt-size sweep: time to first token and native prompt evaluation against prompt tokens,
with the output limit fixed, and the prefill rate fitted from them (least squares)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .trials import Trial

SIZES = (2, 20, 80)  # sentences of about 12 tokens: ~40, ~260, ~1,000 prompt tokens
QUICK_SIZES = (2, 30)


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
