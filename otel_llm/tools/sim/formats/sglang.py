"""SGLang native /generate: SSE with cumulative ``text`` and ``meta_info``, then ``data: [DONE]``."""

from __future__ import annotations

from typing import Any

from .base import Wire, sse, token_id

__all__ = ["GenerateWire"]

_EOS_ID = 2


class GenerateWire(Wire):
    """POST /generate when the runtime flavour is "sglang"."""

    limit_keys = ("sampling_params.max_new_tokens",)

    def _event(self, count: int, finished: bool) -> dict[str, Any]:
        tl = self.tl
        meta: dict[str, Any] = {
            "id": f"sim{self.seq}",
            "finish_reason": self._finish_reason() if finished else None,
            "prompt_tokens": tl.prompt_tokens,
            "completion_tokens": count,
            "cached_tokens": tl.cached_tokens,
        }
        if finished:
            # e2e_latency = request received -> last token; queue_time = wait for the slot.
            meta["e2e_latency"] = tl.total
            meta["queue_time"] = tl.queue
        return {"text": self.text(count), "output_ids": [token_id(i) for i in range(count)], "meta_info": meta}

    def _finish_reason(self) -> dict[str, Any]:
        if self.tl.capped:
            return {"type": "length", "length": self.tl.tokens}
        return {"type": "stop", "matched": _EOS_ID}

    def token(self, index: int) -> list[bytes]:
        return [sse(self._event(index + 1, finished=index == self.tl.tokens - 1))]

    def closing(self) -> list[bytes]:
        final = [] if self.tl.emitted else [sse(self._event(0, finished=True))]
        return final + [sse("[DONE]")]

    def unary(self) -> tuple[dict[str, str], Any]:
        return {}, self._event(self.tl.tokens, finished=True)

    def error_body(self, status: int) -> Any:
        return {"error": {"message": f"simulated error {status}"}}
