"""Anthropic Messages API: /v1/messages with named SSE events."""

from __future__ import annotations

from typing import Any

from .base import Wire, piece, sse

__all__ = ["MessagesWire"]

_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


class MessagesWire(Wire):
    """POST /v1/messages."""

    opening_required = True

    def _stop_reason(self) -> str:
        return "max_tokens" if self.tl.capped else "end_turn"

    def _usage(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.tl.evaluated,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.tl.cached_tokens,
            "output_tokens": output_tokens,
        }

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None, output_tokens: int) -> dict[str, Any]:
        return {
            "id": f"msg_sim{self.seq}", "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": self._usage(output_tokens),
        }

    def opening(self) -> list[bytes]:
        return [
            sse({"type": "message_start", "message": self._message([], None, 1)}, event="message_start"),
            sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                event="content_block_start",
            ),
            _PING,
        ]

    def keepalive(self) -> bytes:
        return _PING

    def token(self, index: int) -> list[bytes]:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece(index)}}
        return [sse(delta, event="content_block_delta")]

    def closing(self) -> list[bytes]:
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(), "stop_sequence": None},
            "usage": {"output_tokens": self.tl.tokens},
        }
        return [
            sse({"type": "content_block_stop", "index": 0}, event="content_block_stop"),
            sse(message_delta, event="message_delta"),
            sse({"type": "message_stop"}, event="message_stop"),
        ]

    def unary(self) -> tuple[dict[str, str], Any]:
        content = [{"type": "text", "text": self.text()}]
        return {}, self._message(content, self._stop_reason(), self.tl.tokens)

    def error_body(self, status: int) -> Any:
        kind = "overloaded_error" if status == 529 else "api_error"
        return {"type": "error", "error": {"type": kind, "message": f"simulated error {status}"}}
