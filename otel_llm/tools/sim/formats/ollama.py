"""Ollama native API: /api/chat and /api/generate (NDJSON), plus /api/tags, /api/ps, /api/version."""

from __future__ import annotations

import time
from typing import Any

from ..scenario import SimConfig
from .base import Timeline, Wire, ndjson, ns, piece, token_id

__all__ = ["ChatWire", "GenerateWire", "lifecycle", "metrics", "ps", "tags", "unloads_after", "VERSION"]

VERSION = "0.33.0"
_DIGEST = "sha256:" + "0" * 64
_DETAILS = {"format": "gguf", "family": "sim", "parameter_size": "1B", "quantization_level": "Q4_K_M"}


def created_at() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"


def metrics(tl: Timeline) -> dict[str, int]:
    """api.Metrics in integer ns; zero values are omitted like Go's omitempty."""
    values = {
        "total_duration": ns(tl.total),
        "load_duration": ns(tl.load),
        "prompt_eval_count": tl.prompt_tokens,
        "prompt_eval_duration": ns(tl.prefill),
        "eval_count": tl.tokens,
        "eval_duration": ns(tl.decode),
    }
    return {key: value for key, value in values.items() if value}


def unloads_after(body: dict[str, Any]) -> bool:
    """keep_alive 0 (number or duration string such as "0", "0s", "0m") unloads after the request."""
    value = body.get("keep_alive")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, str):
        return value.strip().rstrip("hms").strip() in ("0", "0.0")
    return False


class _OllamaWire(Wire):
    content_type = "application/x-ndjson"
    stream_default = True
    limit_keys = ("options.num_predict",)

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        raise NotImplementedError

    def keepalive(self) -> bytes:
        # NDJSON has no comments; an empty-content chunk is what Ollama itself sends for non-text progress.
        return ndjson(self._line("", done=False))

    def token(self, index: int) -> list[bytes]:
        return [ndjson(self._line(piece(index), done=False))]

    def _context(self) -> dict[str, Any]:
        return {}

    def _final(self, text: str) -> dict[str, Any]:
        reason = "length" if self.tl.capped else "stop"
        return {**self._line(text, done=True), "done_reason": reason, **self._context(), **metrics(self.tl)}

    def closing(self) -> list[bytes]:
        return [ndjson(self._final(""))]

    def unary(self) -> tuple[dict[str, str], Any]:
        return {}, self._final(self.text())

    def error_body(self, status: int) -> Any:
        return {"error": f"simulated error {status}"}


class ChatWire(_OllamaWire):
    """POST /api/chat."""

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {"model": self.model, "created_at": created_at(), "message": message, "done": done}


class GenerateWire(_OllamaWire):
    """POST /api/generate."""

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": created_at(), "response": text, "done": done}

    def _context(self) -> dict[str, Any]:
        if self.body.get("raw"):
            return {}
        ids = list(range(1, self.tl.prompt_tokens + 1)) + [token_id(i) for i in range(self.tl.tokens)]
        return {"context": ids}


def lifecycle(path: str, model: str, reason: str) -> dict[str, Any]:
    """Answer to an empty-prompt request: done_reason "load" or "unload"."""
    key = "message" if path == "/api/chat" else "response"
    text: Any = {"role": "assistant", "content": ""} if key == "message" else ""
    return {"model": model, "created_at": created_at(), key: text, "done": True, "done_reason": reason}


def _model_entry(cfg: SimConfig) -> dict[str, Any]:
    return {"name": cfg.model, "model": cfg.model, "size": 1 << 30, "digest": _DIGEST, "details": _DETAILS}


def tags(cfg: SimConfig) -> dict[str, Any]:
    return {"models": [{**_model_entry(cfg), "modified_at": "2026-01-01T00:00:00Z"}]}


def ps(cfg: SimConfig, loaded: bool) -> dict[str, Any]:
    if not loaded:
        return {"models": []}
    running = {"expires_at": "2100-01-01T00:00:00Z", "size_vram": int(cfg.vram_share * (1 << 30)),
               "context_length": 4096}
    return {"models": [{**_model_entry(cfg), **running}]}


# the simulated model's file metadata, as /api/show gives it (a small Llama-shaped model)
_SHAPE = {"general.architecture": "llama", "general.parameter_count": 1_000_000_000, "llama.block_count": 16,
          "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8, "llama.embedding_length": 2048,
          "llama.context_length": 131072}


def show(cfg: SimConfig, body: object) -> tuple[int, dict[str, Any]]:
    """POST /api/show: the model's details and file metadata; 404 for another model."""
    name = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if name not in (cfg.model, f"{cfg.model}:latest"):
        return 404, {"error": f"model '{name}' not found"}
    return 200, {"modelfile": "", "parameters": "num_ctx 4096", "template": "{{ .Prompt }}",
                 "details": _DETAILS, "model_info": _SHAPE, "capabilities": ["completion"]}
