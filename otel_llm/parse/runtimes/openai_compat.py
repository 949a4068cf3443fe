"""Any OpenAI- or Anthropic-compatible server (incl. Ollama /v1, vLLM, llama.cpp /v1):
token usage and finish reasons, which ``parse_body``/``parse_events`` already merged."""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    MISSING, RuntimeCounters, evaluated, map_reasons, reasons_of, tokens,
)

__all__ = ["SOURCE", "SOURCE_KEY", "merge_usage", "read"]

NAME = None  # proves no runtime
SOURCE_KEY = "openai-compatible"
SOURCE = (
    "any other server (Ollama /v1, Anthropic /v1/messages, ...): `usage` prompt, completion "
    "and cached tokens (evaluated prompt = prompt - cached) and finish reasons only"
)
REASONS: dict[str, str] = {}  # Anthropic / Responses values live in COMMON_REASONS


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Finish reasons only; see merge_usage."""
    return RuntimeCounters(finish_reasons=map_reasons(reasons_of(info), REASONS))


def merge_usage(c: RuntimeCounters, info: ResponseInfo) -> None:
    """Fill token counts the runtime did not report from the response's usage."""
    if c.cached_tokens is None:
        c.cached_tokens = tokens("usage.cached_tokens", _field(info, "cached_input_tokens"))
    if c.generation_tokens is None:
        c.generation_tokens = tokens("usage.output_tokens", _field(info, "output_tokens"))
    if c.prompt_tokens is None:
        total = tokens("usage.input_tokens", _field(info, "input_tokens"))
        c.prompt_tokens = evaluated("usage.input_tokens", total, c.cached_tokens)


def _field(info: object, name: str) -> object:
    value = getattr(info, name, None)
    return MISSING if value is None else value
