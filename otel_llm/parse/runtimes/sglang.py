"""SGLang /generate: ``meta_info`` of the finished event (seconds, tokens).

``prompt_tokens`` there is the whole prompt; the evaluated part is it minus ``cached_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse.response import NATIVE_SGLANG_META, ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, Observed, RuntimeCounters, STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING,
    STATE_REQUESTS_WAITING, as_dict, evaluated, fill, get, map_reasons, native_of, reasons_of,
    seconds, tokens,
)

NAME = "sglang"
NATIVE_KEYS = (NATIVE_SGLANG_META,)
SOURCE = (
    "`meta_info` of the finished event: prompt_tokens, cached_tokens, completion_tokens, "
    "e2e_latency and queue_time (s), finish_reason.type"
)
OBSERVED = Observed(
    executable_names=("sglang",), python_modules=("sglang",), process_titles=("sglang::",),
    state_paths=("/metrics",), metric_prefix="sglang:",
    normalized={STATE_REQUESTS_RUNNING: ("sglang:num_running_reqs",),
                STATE_REQUESTS_WAITING: ("sglang:num_queue_reqs",),
                STATE_KV_CACHE_USAGE: ("sglang:token_usage",)},
)
REASONS: dict[str, str] = {}  # finish_reason.type is stop/length; abort kept as-is

_META: tuple[Field, ...] = (
    ("cached_tokens", "cached_tokens", tokens),
    ("generation_tokens", "completion_tokens", tokens),
    ("total_duration", "e2e_latency", seconds),
    ("queue_duration", "queue_time", seconds),
)


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Counters of an SGLang native response."""
    meta = as_dict(native_of(info).get(NATIVE_SGLANG_META))
    c = RuntimeCounters(runtime=NAME)
    fill(c, meta, _META, "sglang")
    total = tokens("sglang.prompt_tokens", get(meta, "prompt_tokens"))
    c.prompt_tokens = evaluated("sglang.prompt_tokens", total, c.cached_tokens)
    c.finish_reasons = map_reasons(reasons_of(info) or _reason(meta), REASONS)
    return c


def _reason(meta: dict) -> object:
    fr = meta.get("finish_reason")
    return as_dict(fr).get("type") if isinstance(fr, dict) else fr
