"""LM Studio: ``stats`` of the v0 REST body or of the v1 ``chat.end`` event (seconds)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, RuntimeCounters, as_dict, fill, map_reasons, native_of, rate, reasons_of, seconds, tokens,
)

__all__ = ["NAME", "NATIVE_LMSTUDIO_STATS"]

NAME = "lmstudio"
NATIVE_LMSTUDIO_STATS = "lmstudio.stats"  # ResponseInfo.native key
NATIVE_KEYS = (NATIVE_LMSTUDIO_STATS,)
# a JSON object with one of these is read by merge_object
RESPONSE_KEYS = ("stats", "model_info", "model_instance_id")
SOURCE = (
    "`stats` (v0 body: tokens_per_second, time_to_first_token, generation_time, stop_reason; "
    "v1 chat.end: input_tokens, total_output_tokens, tokens_per_second, "
    "time_to_first_token_seconds, model_load_time_seconds)"
)
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


# --- reading its answers (parse.response) ---------------------------------------------------
_STATS_KEYS = (
    "tokens_per_second", "time_to_first_token", "time_to_first_token_seconds",
    "generation_time", "stop_reason", "input_tokens", "total_output_tokens",
)


def merge_object(acc: m.Merge, o: dict[str, Any]) -> None:
    """``stats`` (kept, its stop reason only a fallback) and the v1 model fields."""
    acc.info.response_model = acc.info.response_model or m.text(o.get("model_instance_id"))
    stats = o.get("stats")
    if isinstance(stats, dict) and any(k in stats for k in _STATS_KEYS):
        acc.info.native[NATIVE_LMSTUDIO_STATS] = m.clean(stats)
        acc.info.runtime = NAME
        acc.alt_reason = m.text(stats.get("stop_reason")) or acc.alt_reason
        acc.last("input_tokens", m.count(stats.get("input_tokens")))
        acc.last("output_tokens", m.count(stats.get("total_output_tokens")))
        acc.last("reasoning_output_tokens", m.count(stats.get("reasoning_output_tokens")))
    if isinstance(o.get("model_info"), dict) or isinstance(o.get("model_instance_id"), str):
        acc.info.runtime = NAME
