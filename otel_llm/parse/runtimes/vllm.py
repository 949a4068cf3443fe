"""vLLM OpenAI server: the ``metrics`` object of a server run with ``--enable-per-request-metrics``
(ms, tokens/s), else usage and finish reasons only.

Since vLLM 0.25 a server started with ``--enable-per-request-metrics`` adds a top-level ``metrics``
object to each answer of one sequence (n = 1; ``null`` or absent for n > 1): to a non-streamed body,
and on a stream to the final ``choices: []`` usage chunk, so only with
``stream_options.include_usage`` (or the server's ``--enable-force-include-usage``). No request
field asks for it: the server's flag alone decides (vLLM 0.32 ignores an ``include_metrics``
field). Its fields, from vLLM's ``build_per_request_timing_metrics``
(vllm/entrypoints/generate/base/serving.py), all from the engine's timestamps:

* ``queue_time_ms``: queued -> scheduled;
* ``time_to_first_token_ms``: scheduled -> first token, so *without* the queue: it is vLLM's
  prefill (its own span's ``gen_ai.latency.time_in_model_prefill``, not that span's
  ``time_to_first_token``, which counts from the request's arrival), read as the prefill here;
* ``generation_time_ms``: first -> last token (decode only), the generation duration;
* ``mean_itl_ms``: generation_time / (tokens - 1), the time per output token; its reciprocal is
  the decode rate (``generation_rate``: the tokens over the generation duration would count one
  token too many);
* ``tokens_per_second``: all tokens over scheduled -> last token (prefill included): not a
  decode rate, not read.

``speculative_decoding`` (experimental; ``--per-request-spec-decode-metrics``) sits in the same
object: ``num_draft_tokens`` and ``num_accepted_draft_tokens`` are read as draft tokens and
accepted ones. The object's field names are vLLM's own, so it proves vLLM; without it no response
field does, and this adapter runs when ``info.runtime == "vllm"`` (e.g. the caller copied a
configured runtime name into it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, RuntimeCounters, as_dict, fill, map_reasons, ms, native_of, reasons_of, tokens,
)

__all__ = ["NAME", "NATIVE_VLLM_METRICS"]

NAME = "vllm"
NATIVE_VLLM_METRICS = "vllm.metrics"  # ResponseInfo.native key: the answer's `metrics` object
NATIVE_KEYS = (NATIVE_VLLM_METRICS,)
RESPONSE_KEYS = ("metrics",)  # a JSON object with this key is read by merge_object
SOURCE = (
    "`metrics` (with --enable-per-request-metrics; on a stream the usage chunk): queue_time_ms, "
    "time_to_first_token_ms (scheduled -> first token: the prefill), generation_time_ms, mean_itl_ms "
    "(ms -> s; its reciprocal the generation rate), speculative_decoding.num_draft_tokens and "
    ".num_accepted_draft_tokens; OpenAI `usage` (prompt_tokens, completion_tokens, "
    "prompt_tokens_details.cached_tokens with --enable-prompt-tokens-details) and finish_reason"
)
REASONS: dict[str, str] = {}  # already OpenAI-style; "abort" kept as-is

_METRICS: tuple[Field, ...] = (
    ("queue_duration", "queue_time_ms", ms),
    ("prompt_eval_duration", "time_to_first_token_ms", ms),  # scheduled -> first token (see above)
    ("generation_duration", "generation_time_ms", ms),
    ("time_per_output_token", "mean_itl_ms", ms),
)
_SPECULATIVE: tuple[Field, ...] = (
    ("draft_tokens", "num_draft_tokens", tokens),
    ("draft_tokens_accepted", "num_accepted_draft_tokens", tokens),
)
# a `metrics` object is vLLM's when it holds one of these
_METRICS_KEYS = frozenset(key for _, key, _ in _METRICS) | {"tokens_per_second", "speculative_decoding"}


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """The ``metrics`` object's counters when the answer has one, and the finish reasons; usage is
    merged by the caller."""
    c = RuntimeCounters(runtime=NAME, finish_reasons=map_reasons(reasons_of(info), REASONS))
    metrics = as_dict(native_of(info).get(NATIVE_VLLM_METRICS))
    if metrics:
        fill(c, metrics, _METRICS, "vllm.metrics")
        fill(c, as_dict(metrics.get("speculative_decoding")), _SPECULATIVE, "vllm.metrics.speculative_decoding")
        if c.time_per_output_token:  # 0 (one token per step at once) gives no rate
            c.generation_rate = 1.0 / c.time_per_output_token
    return c


# --- reading its answers (parse.response) ---------------------------------------------------
def merge_object(acc: m.Merge, o: dict[str, Any]) -> None:
    """``metrics``: kept when it is vLLM's object (null for n > 1 is not)."""
    metrics = o.get("metrics")
    if isinstance(metrics, dict) and not _METRICS_KEYS.isdisjoint(metrics):
        acc.info.native[NATIVE_VLLM_METRICS] = m.clean(metrics)
        acc.info.runtime = NAME
