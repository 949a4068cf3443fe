"""Ollama's ``GET /api/ps``: the models it has loaded, their memory and when it unloads them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from otel_llm.parse.runtimes import ModelInfo
from otel_llm.parse.runtimes.ollama import PS_PATH, ps_model

__all__ = ["PATH_PS", "LoadedModel", "NotItsFormat", "parse_ps"]

PATH_PS = PS_PATH


@dataclass(frozen=True)
class LoadedModel:
    name: str
    size: int | None
    size_vram: int | None
    expires_at: float | None  # epoch seconds
    info: ModelInfo | None = None  # what the entry says of the model (context, quantization, sizes)


class NotItsFormat(Exception):
    """The endpoint answered, but not in the format this runtime would use."""


def parse_ps(body: bytes) -> list[LoadedModel]:
    """Ollama's /api/ps answer; raises NotItsFormat if it is not one."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise NotItsFormat("not JSON") from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise NotItsFormat('JSON without a "models" list')
    models = []
    for entry in data["models"]:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name") or entry.get("model")
        if isinstance(name, str):
            models.append(LoadedModel(name, _int(entry.get("size")), _int(entry.get("size_vram")),
                                      _epoch(entry.get("expires_at")), ps_model(entry)))
    return models


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _epoch(value: Any) -> float | None:
    """RFC 3339 (Go writes up to 9 fractional digits; Python reads 6) -> epoch seconds."""
    if not isinstance(value, str):
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", value.strip())
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
