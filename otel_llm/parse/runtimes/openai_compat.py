"""Any OpenAI- or Anthropic-compatible server (incl. Ollama /v1, vLLM, llama.cpp /v1):
token usage and finish reasons, which ``parse_body``/``parse_events`` already merged."""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    MISSING, ModelInfo, Proof, Routes, RuntimeCounters, evaluated, map_reasons, positive_int, reasons_of,
    text_or_none, tokens,
)

NAME = None  # proves no runtime
SOURCE_KEY = "openai-compatible"
SOURCE = (
    "any other server (Ollama /v1, Anthropic /v1/messages, ...): `usage` prompt, completion "
    "and cached tokens (evaluated prompt = prompt - cached) and finish reasons only"
)
# for diagnose, by the request flavour: the route that answers once it is up, and an admin route
# an authenticating gateway should refuse
API = "openai"
READY_PATH = "/v1/models"
ADMIN_PATH = "/metrics"
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


# --- proving the flavour (diagnose) ---------------------------------------------------------
def probe(routes: Routes) -> Proof | None:
    """``GET /v1/models`` answering a ``data`` list: an OpenAI-compatible server, runtime unknown."""
    models = routes.json("/v1/models")
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        return Proof("openai", None)
    return None


# where OpenAI-compatible servers put a model's context length in ``GET /v1/models`` (vLLM and
# SGLang: max_model_len)
_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length")


def model_info(routes: Routes, model: str | None) -> ModelInfo | None:
    """``GET /v1/models``: the entry of ``model`` (else the only one), and its context length."""
    models = routes.json("/v1/models")
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    chosen = next((e for e in entries if model is not None and e.get("id") == model), None)
    if chosen is None and len(entries) == 1:
        chosen = entries[0]
    if chosen is None:
        return None
    context = next((n for n in (positive_int(chosen.get(k)) for k in _CONTEXT_KEYS) if n is not None), None)
    return ModelInfo("/v1/models", context, text_or_none(chosen.get("id")))
