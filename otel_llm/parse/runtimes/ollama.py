"""Ollama /api/generate and /api/chat: the counters of the final ``done:true`` object.

Durations are integer nanoseconds; zero values are omitted by Ollama, so absent stays None.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse.response import NATIVE_OLLAMA, ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, Observed, RuntimeCounters, as_dict, fill, map_reasons, native_of, ns, reasons_of,
    tokens,
)

NAME = "ollama"
NATIVE_KEYS = (NATIVE_OLLAMA,)
SOURCE = (
    "final `done:true` object: total_duration, load_duration, prompt_eval_duration, "
    "eval_duration (ns -> s), prompt_eval_count, eval_count, done_reason"
)
OBSERVED = Observed(executables=("ollama",),  # "ollama serve" and its "ollama runner" children
                    state_paths=("/api/ps",))
REASONS: dict[str, str] = {}  # done_reason is already stop/length; load/unload kept as-is

_FIELDS: tuple[Field, ...] = (
    ("load_duration", "load_duration", ns),
    ("prompt_tokens", "prompt_eval_count", tokens),
    ("prompt_eval_duration", "prompt_eval_duration", ns),
    ("generation_tokens", "eval_count", tokens),
    ("generation_duration", "eval_duration", ns),
    ("total_duration", "total_duration", ns),
)


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Counters of an Ollama native response."""
    c = RuntimeCounters(runtime=NAME)
    fill(c, as_dict(native_of(info).get(NATIVE_OLLAMA)), _FIELDS, "ollama")
    c.finish_reasons = map_reasons(reasons_of(info), REASONS)
    return c
