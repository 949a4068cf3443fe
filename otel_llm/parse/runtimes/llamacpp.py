"""llama.cpp server: the ``timings`` object of the last event (ms, tokens/s) and the
``truncated`` flag of /completion.

``prompt_n`` counts the prompt tokens actually evaluated, ``cache_n`` the reused ones;
``tokens_cached`` (KV fill including generated tokens) is deliberately not read.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse import response
from otel_llm.parse.response import NATIVE_LLAMACPP_TIMINGS, ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, Observed, RuntimeCounters, STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING,
    STATE_REQUESTS_WAITING, as_dict, fill, flag, get, map_reasons, ms, native_of, rate, reasons_of,
    tokens,
)

# /completion `truncated` (bool); response.py must store it under this key.
NATIVE_TRUNCATED: str = response.NATIVE_LLAMACPP_TRUNCATED

NAME = "llama.cpp"
NATIVE_KEYS = (NATIVE_LLAMACPP_TIMINGS, NATIVE_TRUNCATED)
SOURCE = (
    "`timings` of the last event: prompt_n, cache_n, prompt_ms, prompt_per_second, "
    "predicted_n, predicted_ms, predicted_per_second, predicted_per_token_ms (ms -> s), "
    "draft_n, draft_n_accepted; /completion `stop_type` and `truncated`"
)
OBSERVED = Observed(
    executables=("llama-server",), python_modules=("llama_cpp",), state_paths=("/metrics",),  # needs --metrics
    metric_prefix="llamacpp:",
    normalized={STATE_REQUESTS_RUNNING: ("llamacpp:requests_processing",),
                STATE_REQUESTS_WAITING: ("llamacpp:requests_deferred",),
                STATE_KV_CACHE_USAGE: ("llamacpp:kv_cache_usage_ratio",)},
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
