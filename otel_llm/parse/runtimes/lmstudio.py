"""LM Studio: ``stats`` of the v0 REST body or of the v1 ``chat.end`` event (seconds)."""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse.response import NATIVE_LMSTUDIO_STATS, ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, Observed, RuntimeCounters, as_dict, fill, map_reasons, native_of, rate, reasons_of,
    seconds, tokens,
)

NAME = "lmstudio"
NATIVE_KEYS = (NATIVE_LMSTUDIO_STATS,)
SOURCE = (
    "`stats` (v0 body: tokens_per_second, time_to_first_token, generation_time, stop_reason; "
    "v1 chat.end: input_tokens, total_output_tokens, tokens_per_second, "
    "time_to_first_token_seconds, model_load_time_seconds)"
)
OBSERVED = Observed(executables=("lm studio", "lm-studio", "lmstudio"), executable_names=("lms",))
# it serves neither /metrics nor /api/ps: nothing to poll
REASONS = {
    "eosFound": "stop",
    "stopStringFound": "stop",
    "maxPredictedTokensReached": "length",
    "contextLengthReached": "length",
}

_STATS: tuple[Field, ...] = (
    ("load_duration", "model_load_time_seconds", seconds),
    ("prompt_tokens", "input_tokens", tokens),
    ("generation_tokens", "total_output_tokens", tokens),
    ("generation_duration", "generation_time", seconds),
    ("generation_rate", "tokens_per_second", rate),
    ("time_to_first_token", "time_to_first_token_seconds", seconds),
    ("time_to_first_token", "time_to_first_token", seconds),
)


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Counters of an LM Studio native response."""
    stats = as_dict(native_of(info).get(NATIVE_LMSTUDIO_STATS))
    c = RuntimeCounters(runtime=NAME)
    fill(c, stats, _STATS, "lmstudio.stats")
    c.finish_reasons = map_reasons(reasons_of(info) or stats.get("stop_reason"), REASONS)
    return c
