"""SGLang /generate: ``meta_info`` of the finished event (seconds, tokens).

``prompt_tokens`` there is the whole prompt; the evaluated part is it minus ``cached_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, RuntimeCounters, as_dict, evaluated, fill, get, map_reasons, native_of, reasons_of, seconds, tokens,
)

__all__ = ["NAME", "NATIVE_SGLANG_META"]

NAME = "sglang"
NATIVE_SGLANG_META = "sglang.meta_info"  # ResponseInfo.native key
NATIVE_KEYS = (NATIVE_SGLANG_META,)
RESPONSE_KEYS = ("meta_info",)  # a JSON object with one of these is read by merge_object
SOURCE = (
    "`meta_info` of the finished event: prompt_tokens, cached_tokens, completion_tokens, "
    "e2e_latency and queue_time (s), finish_reason.type"
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


def _reason(meta: Mapping[str, object]) -> object:
    fr = meta.get("finish_reason")
    return as_dict(fr).get("type") if isinstance(fr, dict) else fr


# --- reading its answers (parse.response) ---------------------------------------------------
def merge_object(acc: m.Merge, o: dict[str, Any]) -> bool:
    """``meta_info``: id, finish reason (an abort's message is the error), token counts. An object
    with it is SGLang's whatever else it holds (``details``, ``text``): True, read no further."""
    meta = m.as_dict(o.get("meta_info"))
    if not meta:
        return True
    acc.info.native[NATIVE_SGLANG_META] = m.clean(meta)
    acc.info.runtime = NAME
    acc.info.response_id = acc.info.response_id or m.text(meta.get("id"))
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        acc.reason = m.text(fr.get("type")) or acc.reason
        if fr.get("type") == "abort":
            acc.info.error = m.truncate(m.text(fr.get("message"))) or acc.info.error
    elif isinstance(fr, str) and fr:
        acc.reason = fr
    acc.last("input_tokens", m.count(meta.get("prompt_tokens")))
    acc.last("output_tokens", m.count(meta.get("completion_tokens")))
    acc.last("cached_input_tokens", m.count(meta.get("cached_tokens")))
    acc.last("reasoning_output_tokens", m.count(meta.get("reasoning_tokens")))
    return True
