"""LM Studio: /api/v0/* (OpenAI shape + stats) and /api/v1/chat (named SSE events)."""

from __future__ import annotations

from typing import Any

from .base import Timeline, Wire, piece, sse
from .openai import ChatWire, CompletionWire, ChunkWire

__all__ = ["V0ChatWire", "V0CompletionWire", "V1ChatWire", "models_v0", "stats_v0"]

_MODEL_INFO = {"arch": "sim", "quant": "Q4_K_M", "format": "gguf", "context_length": 4096}
_RUNTIME = {"name": "llama.cpp-sim", "version": "1.0.0", "supported_formats": ["gguf"]}


def models_v0(model: str, loaded: bool) -> dict[str, Any]:
    """GET /api/v0/models: LM Studio's listing, with quantization, state and context length."""
    entry = {"id": model, "object": "model", "type": "llm", "publisher": "otel-llm-sim", "arch": _MODEL_INFO["arch"],
             "compatibility_type": _MODEL_INFO["format"], "quantization": _MODEL_INFO["quant"],
             "state": "loaded" if loaded else "not-loaded", "max_context_length": _MODEL_INFO["context_length"]}
    return {"object": "list", "data": [entry]}


def _ttft(tl: Timeline) -> float:
    # Prediction start (slot granted, model loaded) -> first token: headers_delay + first_token_delay.
    return tl.first - tl.start


def _per_second(tl: Timeline) -> float:
    return tl.tokens / tl.decode if tl.decode > 0 else 0.0


def stats_v0(tl: Timeline) -> dict[str, Any]:
    return {
        "tokens_per_second": _per_second(tl),
        "time_to_first_token": _ttft(tl),
        "generation_time": tl.decode,
        "stop_reason": "maxPredictedTokensReached" if tl.capped else "eosFound",
    }


class _V0Wire(ChunkWire):
    """OpenAI shape; the non-streamed body adds stats, model_info and runtime."""

    flavour_name = "lmstudio"

    def unary(self) -> tuple[dict[str, str], Any]:
        headers, body = super().unary()
        return headers, {**body, "stats": stats_v0(self.tl), "model_info": _MODEL_INFO, "runtime": _RUNTIME}


class V0ChatWire(_V0Wire, ChatWire):
    """POST /api/v0/chat/completions."""


class V0CompletionWire(_V0Wire, CompletionWire):
    """POST /api/v0/completions."""


class V1ChatWire(Wire):
    """POST /api/v1/chat."""

    limit_keys = ("max_output_tokens", "max_tokens")
    opening_required = True

    def _event(self, kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    def opening(self) -> list[bytes]:
        instance = {"model_instance_id": self.model}
        frames = [self._event("chat.start", **instance)]
        if self.tl.cold:
            frames += [
                self._event("model_load.start", **instance),
                self._event("model_load.end", **instance, load_time_seconds=self.tl.load),
            ]
        return frames + [
            self._event("prompt_processing.start"),
            self._event("prompt_processing.progress", progress=1.0),
            self._event("prompt_processing.end"),
            self._event("message.start"),
        ]

    def token(self, index: int) -> list[bytes]:
        return [self._event("message.delta", content=piece(index))]

    def _result(self) -> dict[str, Any]:
        tl = self.tl
        stats: dict[str, Any] = {
            "input_tokens": tl.prompt_tokens,
            "total_output_tokens": tl.tokens,
            "reasoning_output_tokens": 0,
            "tokens_per_second": _per_second(tl),
            "time_to_first_token_seconds": _ttft(tl),
        }
        if tl.cold:
            stats["model_load_time_seconds"] = tl.load
        output = [{"type": "message", "content": self.text()}]
        return {"model_instance_id": self.model, "output": output, "stats": stats, "response_id": f"resp_sim{self.seq}"}

    def closing(self) -> list[bytes]:
        return [self._event("message.end"), self._event("chat.end", result=self._result())]

    def unary(self) -> tuple[dict[str, str], Any]:
        return {}, self._result()

    def error_body(self, status: int) -> Any:
        return {"error": {"message": f"simulated error {status}", "type": "sim_error"}}
