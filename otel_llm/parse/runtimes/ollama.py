"""Ollama /api/generate and /api/chat: the counters of the final ``done:true`` object.

Durations are integer nanoseconds; zero values are omitted by Ollama, so absent stays None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes._common import (
    Field, ModelInfo, RuntimeCounters, as_dict, fill, map_reasons, native_of, ns, positive_int, reasons_of,
    text_or_none, tokens,
)

__all__ = ["NAME", "NATIVE_OLLAMA", "PS_PATH", "SHOW_PATH", "loaded_model", "ps_model", "show_model"]

NAME = "ollama"
NATIVE_OLLAMA = "ollama"  # ResponseInfo.native key of the done:true counters
NATIVE_KEYS = (NATIVE_OLLAMA,)
RESPONSE_KEYS = ("done",)  # a JSON object with one of these is read by merge_object
SOURCE = (
    "final `done:true` object: total_duration, load_duration, prompt_eval_duration, "
    "eval_duration (ns -> s), prompt_eval_count, eval_count, done_reason"
)
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


# --- reading its answers (parse.response) ---------------------------------------------------
_COUNTERS = (
    "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
    "eval_count", "eval_duration",
)


def merge_object(acc: m.Merge, o: dict[str, Any]) -> None:
    """The final ``done:true`` object: reason, token counts, the counters kept as they came."""
    if o.get("done") is not True:
        return
    acc.reason = m.text(o.get("done_reason")) or acc.reason
    counters = {k: o[k] for k in _COUNTERS if m.count(o.get(k)) is not None}
    acc.last("input_tokens", m.count(o.get("prompt_eval_count")))
    acc.last("output_tokens", m.count(o.get("eval_count")))
    if counters:
        acc.info.native[NATIVE_OLLAMA] = counters
    if counters or "created_at" in o:
        acc.info.runtime = NAME


# --- reading its metadata answers (the observers' /api/ps polls, diagnose's /api/show) ----------
PS_PATH = "/api/ps"


def _bytes(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def ps_model(entry: Mapping[str, Any]) -> ModelInfo | None:
    """One entry of ``GET /api/ps`` (a loaded model): its name, context length, quantization
    level, parameter size, size, size in VRAM and expiry; None without a name."""
    name = text_or_none(entry.get("name")) or text_or_none(entry.get("model"))
    if name is None:
        return None
    details = entry.get("details")
    details = details if isinstance(details, Mapping) else {}
    return ModelInfo(PS_PATH, positive_int(entry.get("context_length")), name,
                     text_or_none(details.get("quantization_level")), None,
                     _bytes(entry.get("size")), _bytes(entry.get("size_vram")),
                     parameter_size=text_or_none(details.get("parameter_size")),
                     expires_at=text_or_none(entry.get("expires_at")))


def loaded_model(models: "list[ModelInfo] | tuple[ModelInfo, ...]", model: str | None) -> ModelInfo | None:
    """The loaded model a request for ``model`` runs on: the same name, or ``model:latest`` (Ollama's
    default tag); with no name asked, the only one loaded."""
    if model:
        wanted = (model, f"{model}:latest") if ":" not in model else (model,)
        return next((m for m in models if m.model in wanted), None)
    return models[0] if len(models) == 1 else None


SHOW_PATH = "/api/show"  # POST {"model": name}: side-effect free, the model's file metadata
_F16_BYTES = 2  # Ollama's default KV cache type (OLLAMA_KV_CACHE_TYPE=f16)


def _shape_int(info: Mapping[str, object], arch: str, key: str) -> int | None:
    value = info.get(f"{arch}.{key}")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def show_model(body: object) -> ModelInfo | None:
    """``POST /api/show``'s answer: the parameter count, the trained context length, and the KV
    cache per token from the layer count and KV heads (``<arch>.block_count``,
    ``.attention.head_count_kv``, ``.attention.key_length``/``value_length`` or
    ``embedding_length / head_count``) at f16; None when it is not one."""
    if not isinstance(body, Mapping) or not isinstance(body.get("model_info"), Mapping):
        return None
    info = body["model_info"]
    arch = info.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return None
    details = body.get("details")
    quantization = text_or_none(details.get("quantization_level")) if isinstance(details, Mapping) else None
    layers, kv_heads = _shape_int(info, arch, "block_count"), _shape_int(info, arch, "attention.head_count_kv")
    key, value = _shape_int(info, arch, "attention.key_length"), _shape_int(info, arch, "attention.value_length")
    if key is None or value is None:
        width, heads = _shape_int(info, arch, "embedding_length"), _shape_int(info, arch, "attention.head_count")
        key = value = width // heads if width and heads else None
    per_token = layers * kv_heads * (key + value) * _F16_BYTES if layers and kv_heads and key and value else None
    count = info.get("general.parameter_count")
    return ModelInfo(SHOW_PATH, _shape_int(info, arch, "context_length"), None, quantization,
                     parameter_count=count if isinstance(count, int) and not isinstance(count, bool) and count > 0
                     else None, kv_bytes_per_token=per_token)
