"""llama.cpp server: the ``timings`` object of the last event (ms, tokens/s) and the
``truncated`` flag of /completion.

``prompt_n`` counts the prompt tokens actually evaluated, ``cache_n`` the reused ones;
``tokens_cached`` (KV fill including generated tokens) is deliberately not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, RuntimeCounters, as_dict, fill, flag, get, map_reasons, ms, native_of, rate, reasons_of, tokens,
)

__all__ = ["NAME", "NATIVE_LLAMACPP_TIMINGS", "NATIVE_TRUNCATED"]

NAME = "llama.cpp"
NATIVE_LLAMACPP_TIMINGS = "llamacpp.timings"  # ResponseInfo.native keys: `timings`
NATIVE_TRUNCATED = "llamacpp.truncated"  # and /completion's `truncated` (bool)
RESPONSE_KEYS = ("stop", "timings")  # a JSON object with one of these is read by merge_object
NATIVE_KEYS = (NATIVE_LLAMACPP_TIMINGS, NATIVE_TRUNCATED)
SOURCE = (
    "`timings` of the last event: prompt_n, cache_n, prompt_ms, prompt_per_second, "
    "predicted_n, predicted_ms, predicted_per_second, predicted_per_token_ms (ms -> s), "
    "draft_n, draft_n_accepted; /completion `stop_type` and `truncated`"
)
REASONS = {"eos": "stop", "word": "stop", "limit": "length"}

_TIMINGS: tuple[Field, ...] = (
    ("prompt_tokens", "prompt_n", tokens),
    ("prompt_eval_duration", "prompt_ms", ms),
    ("prompt_eval_rate", "prompt_per_second", rate),
    ("cached_tokens", "cache_n", tokens),
    ("generation_tokens", "predicted_n", tokens),
    ("generation_duration", "predicted_ms", ms),
    ("generation_rate", "predicted_per_second", rate),
    ("time_per_output_token", "predicted_per_token_ms", ms),
    ("draft_tokens", "draft_n", tokens),
    ("draft_tokens_accepted", "draft_n_accepted", tokens),
)


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Counters of a llama.cpp response (native /completion or OpenAI-compatible)."""
    native = native_of(info)
    c = RuntimeCounters(runtime=NAME)
    fill(c, as_dict(native.get(NATIVE_LLAMACPP_TIMINGS)), _TIMINGS, "llamacpp.timings")
    c.truncated = flag("llamacpp.truncated", get(native, NATIVE_TRUNCATED))
    c.finish_reasons = map_reasons(reasons_of(info), REASONS)
    return c


# --- reading its answers (parse.response) ---------------------------------------------------
_STOP_FLAGS = (("stopped_eos", "eos"), ("stopped_word", "word"), ("stopped_limit", "limit"))


def merge_object(acc: m.Merge, o: dict[str, Any]) -> None:
    """``timings`` (any API) and /completion's stop, truncated and token fields."""
    timings = o.get("timings")
    if isinstance(timings, dict):
        acc.info.native[NATIVE_LLAMACPP_TIMINGS] = m.clean(timings)
        acc.info.runtime = NAME
        prompt_n, cache_n = m.count(timings.get("prompt_n")), m.count(timings.get("cache_n"))
        if prompt_n is not None:
            acc.fb_input = m.count(prompt_n + (cache_n or 0))  # the sum may leave int64
        acc.fb_output = m.keep(m.count(timings.get("predicted_n")), acc.fb_output)
        acc.fb_cached = m.keep(cache_n, acc.fb_cached)
    if not isinstance(o.get("stop"), bool):
        return
    if isinstance(o.get("truncated"), bool):
        acc.info.native[NATIVE_TRUNCATED] = o["truncated"]
    acc.last("input_tokens", m.count(o.get("tokens_evaluated")))
    acc.last("output_tokens", m.count(o.get("tokens_predicted")))
    if o["stop"]:
        acc.reason = m.text(o.get("stop_type")) or _stop_flags(o) or acc.reason


def _stop_flags(o: Mapping[str, object]) -> str | None:
    """Older llama.cpp builds: stopped_eos / stopped_word / stopped_limit booleans."""
    for key, reason in _STOP_FLAGS:
        if o.get(key) is True:
            return reason
    return None
