"""What a response says about a call (``ResponseInfo``), the state its objects are merged into,
and the value checks that merging shares with each runtime's reader.

A leaf: ``parse.response`` and the runtime modules both import it, so that each runtime's
module can own how its answers are read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Merge", "ResponseInfo"]

MAX_ERROR_CHARS = 200
INT64_MAX = 2**63 - 1


@dataclass(slots=True)
class ResponseInfo:
    """What a response says about the call; None when it does not say."""

    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    error: str | None = None
    output_text: str | None = None
    native: dict[str, Any] = field(default_factory=dict)
    runtime: str | None = None


@dataclass(slots=True)
class Merge:
    """Merge state: primary counters, fallbacks, and per-choice finish reasons."""

    api: str
    info: ResponseInfo = field(default_factory=ResponseInfo)
    choice_reasons: dict[int, str] = field(default_factory=dict)
    reason: str | None = None       # single-reason sources (Anthropic, Ollama, ...)
    alt_reason: str | None = None   # LM Studio stats.stop_reason: used only without others
    a_input: int | None = None      # Anthropic usage parts (input excludes cache)
    a_cache_read: int | None = None
    a_cache_write: int | None = None
    fb_input: int | None = None     # fallbacks: llama.cpp timings, TGI headers
    fb_output: int | None = None
    fb_cached: int | None = None

    def last(self, attr: str, value: int | None) -> None:
        """A later object's count replaces an earlier one's; None leaves it."""
        if value is not None:
            setattr(self.info, attr, value)


def count(v: object) -> int | None:
    """A non-negative int64 token count; integral finite floats count; bools do not."""
    if v.__class__ is int:  # the common case first
        return v if 0 <= v <= INT64_MAX else None
    if v.__class__ is float and math.isfinite(v) and v.is_integer():
        return count(int(v))
    return None


def text(v: object) -> str | None:
    """A non-empty string, else None."""
    return v if isinstance(v, str) and v else None


def as_dict(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def keep(new: int | None, old: int | None) -> int | None:
    return old if new is None else new


def clean(d: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """Scalars and nested dicts of ``d``; lists, non-finite floats and huge ints dropped."""
    out: dict[str, Any] = {}
    isfinite = math.isfinite
    for k, v in d.items():
        cls = v.__class__  # the common JSON types by identity first: runtimes send many numbers
        if cls is float:
            if isfinite(v):
                out[k] = v
        elif cls is int:
            if -INT64_MAX - 1 <= v <= INT64_MAX:
                out[k] = v
        elif v is None or isinstance(v, (str, bool)):
            out[k] = v
        elif isinstance(v, dict) and depth < 2:
            out[k] = clean(v, depth + 1)
    return out


def truncate(msg: str | None) -> str | None:
    return msg[:MAX_ERROR_CHARS] if msg else None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """One header's value as a string (bytes decoded as latin-1), None when absent or odd."""
    value: object = headers.get(name)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("latin-1")
    return value if isinstance(value, str) else None


def int_str(value: str | None) -> int | None:
    """A count written as a decimal string."""
    if value is None or len(value) > 20:
        return None
    try:
        return count(int(value))
    except ValueError:
        return None
