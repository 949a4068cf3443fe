"""Hugging Face TGI: /generate (JSON + timing headers) and /generate_stream (``data:`` without a space)."""

from __future__ import annotations

from typing import Any

from .base import Timeline, Wire, piece, prompt_text, sse, token_id

__all__ = ["GenerateWire", "StreamWire", "timing_headers"]


def _ms(seconds: float) -> str:
    # TGI truncates (as_millis); we round so the header stays the closest integer to the truth.
    return str(max(0, round(seconds * 1000)))


def timing_headers(tl: Timeline, body: dict[str, Any]) -> dict[str, str]:
    """validation = headers_delay, queue = slot wait + cold load, inference = headers -> last token."""
    inference = tl.end - tl.headers
    return {
        "x-compute-type": "gpu+optimized",
        "x-compute-time": f"{tl.total:.6f}",
        "x-compute-characters": str(len(prompt_text(body))),
        "x-total-time": _ms(tl.total),
        "x-validation-time": _ms(tl.server_wait),
        "x-queue-time": _ms(tl.queue + tl.load),
        "x-inference-time": _ms(inference),
        "x-time-per-token": _ms(inference / tl.tokens if tl.tokens else 0.0),
        "x-prompt-tokens": str(tl.prompt_tokens),
        "x-generated-tokens": str(tl.tokens),
    }


class GenerateWire(Wire):
    """POST /generate: never streamed."""

    limit_keys = ("parameters.max_new_tokens",)

    def wants_stream(self) -> bool:
        return False

    def _details(self) -> dict[str, Any]:
        tl = self.tl
        return {
            "finish_reason": "length" if tl.capped else "eos_token",
            "generated_tokens": tl.tokens,
            "seed": None,
            "input_length": tl.prompt_tokens,
        }

    def _wants_details(self) -> bool:
        parameters = self.body.get("parameters") or {}
        return isinstance(parameters, dict) and bool(parameters.get("details"))

    def unary(self) -> tuple[dict[str, str], Any]:
        body: dict[str, Any] = {"generated_text": self.text()}
        if self._wants_details():
            tokens = [self._token(i) for i in range(self.tl.tokens)]
            body["details"] = {**self._details(), "prefill": [], "tokens": tokens}
        return timing_headers(self.tl, self.body), body

    @staticmethod
    def _token(index: int) -> dict[str, Any]:
        return {"id": token_id(index), "text": piece(index), "logprob": -0.5, "special": False}

    def error_body(self, status: int) -> Any:
        return {"error": f"simulated error {status}", "error_type": "generation"}


class StreamWire(GenerateWire):
    """POST /generate_stream: always streamed; the last token event carries generated_text."""

    def wants_stream(self) -> bool:
        return True

    def stream_headers(self) -> dict[str, str]:
        return {
            "Cache-Control": "no-cache",
            "x-compute-type": "gpu+optimized",
            "x-compute-characters": str(len(prompt_text(self.body))),
            "X-Accel-Buffering": "no",
        }

    def token(self, index: int) -> list[bytes]:
        last = index == self.tl.tokens - 1
        event = {
            "index": index + 1,
            "token": self._token(index),
            "generated_text": self.text() if last else None,
            "details": self._details() if last and self._wants_details() else None,
        }
        return [sse(event, prefix="data:")]
