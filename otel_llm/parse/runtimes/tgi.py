"""Hugging Face TGI: x-* timing headers of non-streamed responses and ``details``.

Header times are integer milliseconds except ``x-compute-time`` (seconds, the same total).
Streamed responses carry no timing headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, RuntimeCounters, as_dict, fill, map_reasons, ms, native_of, reasons_of, seconds, tokens,
)

__all__ = ["NAME", "NATIVE_TGI_DETAILS", "NATIVE_TGI_HEADERS", "merge_headers", "tgi_headers"]

NAME = "tgi"
NATIVE_TGI_HEADERS = "tgi.headers"  # ResponseInfo.native keys: its x-* headers
NATIVE_TGI_DETAILS = "tgi.details"  # and `details`
NATIVE_KEYS = (NATIVE_TGI_DETAILS, NATIVE_TGI_HEADERS)
RESPONSE_KEYS = ("details", "generated_text")  # a JSON object with one of these is read by merge_object
SOURCE = (
    "non-streamed response headers x-total-time, x-validation-time, x-queue-time, "
    "x-inference-time, x-time-per-token (ms -> s), x-compute-time (s, fallback total), "
    "x-prompt-tokens, x-generated-tokens; `details` finish_reason, generated_tokens, "
    "input_length"
)
REASONS = {"eos_token": "stop", "stop_sequence": "stop"}
HEADER_NAMES = (
    "x-compute-type", "x-compute-time", "x-compute-characters", "x-total-time",
    "x-validation-time", "x-queue-time", "x-inference-time", "x-time-per-token",
    "x-prompt-tokens", "x-generated-tokens",
)
_MAX_HEADERS = 1000

_HEADERS: tuple[Field, ...] = (
    ("total_duration", "x-total-time", ms),
    ("validation_duration", "x-validation-time", ms),
    ("queue_duration", "x-queue-time", ms),
    ("inference_duration", "x-inference-time", ms),
    ("time_per_output_token", "x-time-per-token", ms),
    ("prompt_tokens", "x-prompt-tokens", tokens),
    ("generation_tokens", "x-generated-tokens", tokens),
    ("total_duration", "x-compute-time", seconds),
)
_DETAILS: tuple[Field, ...] = (
    ("prompt_tokens", "input_length", tokens),
    ("generation_tokens", "generated_tokens", tokens),
)


def tgi_headers(headers: Mapping[str, str] | None) -> dict[str, object]:
    """The TGI x-* headers among ``headers``, names lower-cased; {} for anything odd."""
    if not headers or not hasattr(headers, "items"):
        return {}
    if type(headers) is dict and all(type(k) is str and k.islower() for k in headers):
        # the capture layer's lower-cased dict: look the names up instead of scanning
        return {name: headers[name] for name in HEADER_NAMES if name in headers}
    found: dict[str, object] = {}
    for n, (k, v) in enumerate(headers.items()):
        if n >= _MAX_HEADERS:
            break
        if isinstance(k, (bytes, bytearray)):
            k = bytes(k).decode("latin-1")
        if isinstance(k, str) and k.lower() in HEADER_NAMES:
            found[k.lower()] = v
    return found


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Counters of a TGI response: headers first, then ``details``."""
    native = native_of(info)
    found = {**_safe_headers(headers), **as_dict(native.get(NATIVE_TGI_HEADERS))}
    details = as_dict(native.get(NATIVE_TGI_DETAILS))
    c = RuntimeCounters(runtime=NAME)
    fill(c, found, _HEADERS, "tgi")
    fill(c, details, _DETAILS, "tgi.details")
    c.finish_reasons = map_reasons(reasons_of(info) or details.get("finish_reason"), REASONS)
    return c


def _safe_headers(headers: Mapping[str, str] | None) -> dict[str, object]:
    try:
        return tgi_headers(headers)
    except Exception:  # noqa: BLE001 - odd header containers
        return {}


# --- reading its answers (parse.response) ---------------------------------------------------
# sent on every answer, streamed or not; the token counts are what the fallbacks use
_SENTINELS = ("x-compute-type", "x-total-time", "x-generated-tokens", "x-prompt-tokens")


def merge_object(acc: m.Merge, o: dict[str, Any]) -> None:
    """``details`` (kept; reason and counts), or the bare text / token objects of its own API."""
    details = o.get("details")
    if isinstance(details, dict):
        acc.info.native[NATIVE_TGI_DETAILS] = m.clean(details)
        acc.reason = m.text(details.get("finish_reason")) or acc.reason
        acc.last("output_tokens", m.count(details.get("generated_tokens")))
        acc.last("input_tokens", m.count(details.get("input_length")))
        acc.info.runtime = NAME
    elif isinstance(o.get("generated_text"), str) or "token" in o:
        acc.info.runtime = NAME


def merge_headers(acc: m.Merge, headers: Mapping[str, str]) -> None:
    """The x-* headers, kept as strings; their token counts are fallbacks for the body's."""
    if headers.__class__ is dict and headers.keys().isdisjoint(_SENTINELS):
        return  # the common case, not TGI (the capture's headers are a plain dict): one C call
    if all(m.header(headers, name) is None for name in _SENTINELS):
        return  # four lookups instead of the whole table
    found = {name: str(v) for name in HEADER_NAMES if (v := m.header(headers, name)) is not None}
    if not found:
        return
    acc.info.native[NATIVE_TGI_HEADERS] = found
    acc.info.runtime = NAME
    acc.fb_input = m.int_str(found.get("x-prompt-tokens"))
    acc.fb_output = m.int_str(found.get("x-generated-tokens"))
