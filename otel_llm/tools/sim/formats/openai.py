"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/responses, /v1/models.

The chat and text routes take their quirks from the configured runtime flavour (see ``FLAVOURS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..scenario import SimConfig
from . import llamacpp, tgi
from .base import Wire, piece, sse

__all__ = ["FLAVOURS", "ChatWire", "ChunkWire", "CompletionWire", "Flavour", "ResponsesWire", "models"]


@dataclass(frozen=True)
class Flavour:
    """How one runtime deviates from the common OpenAI chunk stream."""

    name: str
    prefix: str = "data: "
    role_delta: dict[str, Any] | None = None
    role_every_delta: bool = False
    finish_on_last_token: bool = False
    blank_usage_id: bool = False
    timings: bool = False
    cached_details: bool = False
    fingerprint: str | None = None
    null_usage: bool = False


_ROLE = {"role": "assistant", "content": ""}
FLAVOURS: dict[str, Flavour] = {
    # first chunk {"role","content":""}, last content chunk carries finish_reason
    "vllm": Flavour("vllm", role_delta=_ROLE, finish_on_last_token=True),
    # content null in the role chunk; timings on the last chunk; cached_tokens always reported
    "llama.cpp": Flavour(
        "llama.cpp",
        role_delta={"role": "assistant", "content": None},
        timings=True,
        cached_details=True,
        fingerprint="b0-unknown",
    ),
    # >= v0.32.6: role chunk first, then finish chunk with an empty delta
    "ollama": Flavour("ollama", role_delta=_ROLE, fingerprint="fp_ollama"),
    # "data:" without a space, role on every delta, usage chunk with id ""
    "tgi": Flavour(
        "tgi", prefix="data:", role_every_delta=True, finish_on_last_token=True, blank_usage_id=True,
        fingerprint="3.3.6-native",
    ),
    "sglang": Flavour("sglang", role_delta=_ROLE),
    "lmstudio": Flavour("lmstudio", role_delta=_ROLE, fingerprint="lmstudio"),
    "openai": Flavour(
        "openai",
        role_delta={"role": "assistant", "content": "", "refusal": None},
        cached_details=True,
        fingerprint="fp_sim",
        null_usage=True,
    ),
}


class ChunkWire(Wire):
    """Shared chunk stream of chat and text completions."""

    object_name: ClassVar[str] = ""
    id_prefix: ClassVar[str] = ""
    flavour_name: ClassVar[str | None] = None  # None: take cfg.runtime

    def __init__(self, body: dict[str, Any], cfg: SimConfig, arrival: float, seq: int) -> None:
        super().__init__(body, cfg, arrival, seq)
        self.flavour = FLAVOURS[self.flavour_name or cfg.runtime]
        self.id = f"{self.id_prefix}sim{seq}"
        options = body.get("stream_options") or {}
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    # payload hooks -------------------------------------------------------------------------
    def _choice(self, payload: Any, finish: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def _token_payload(self, index: int) -> Any:
        raise NotImplementedError

    def _finish_payload(self) -> Any:
        raise NotImplementedError

    # frames --------------------------------------------------------------------------------
    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
        }
        if self.flavour.fingerprint:
            chunk["system_fingerprint"] = self.flavour.fingerprint
        chunk["choices"] = choices
        if self.flavour.null_usage and self.include_usage:
            chunk["usage"] = None
        chunk.update(extra)
        return chunk

    def _frame(self, obj: Any) -> bytes:
        return sse(obj, prefix=self.flavour.prefix)

    def token(self, index: int) -> list[bytes]:
        last = index == self.tl.tokens - 1
        finish = self.tl.finish_reason if last and self.flavour.finish_on_last_token else None
        return [self._frame(self._chunk([self._choice(self._token_payload(index), finish)]))]

    def closing(self) -> list[bytes]:
        tail: list[dict[str, Any]] = []
        if not self.flavour.finish_on_last_token or self.tl.emitted == 0:
            tail.append(self._chunk([self._choice(self._finish_payload(), self.tl.finish_reason)]))
        if self.include_usage:
            usage_chunk = self._chunk([], usage=self.usage())
            if self.flavour.blank_usage_id:
                usage_chunk["id"] = ""
            tail.append(usage_chunk)
        if self.flavour.timings and tail:
            tail[-1]["timings"] = llamacpp.timings(self.tl)
        return [self._frame(chunk) for chunk in tail] + [self._frame("[DONE]")]

    def usage(self) -> dict[str, Any]:
        tl = self.tl
        usage: dict[str, Any] = {
            "prompt_tokens": tl.prompt_tokens,
            "completion_tokens": tl.tokens,
            "total_tokens": tl.prompt_tokens + tl.tokens,
        }
        if self.flavour.cached_details:
            usage["prompt_tokens_details"] = {"cached_tokens": tl.cached_tokens}
        return usage

    # non-streaming -------------------------------------------------------------------------
    def _unary_choice(self) -> dict[str, Any]:
        raise NotImplementedError

    def unary(self) -> tuple[dict[str, str], Any]:
        body = self._chunk([self._unary_choice()], object=self.object_name.removesuffix(".chunk"), usage=self.usage())
        if self.flavour.timings:
            body["timings"] = llamacpp.timings(self.tl)
        headers = tgi.timing_headers(self.tl, self.body) if self.flavour.name == "tgi" else {}
        return headers, body


class ChatWire(ChunkWire):
    """/v1/chat/completions."""

    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"
    limit_keys = ("max_completion_tokens", "max_tokens")

    def _choice(self, payload: Any, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "delta": payload, "logprobs": None, "finish_reason": finish}

    def opening(self) -> list[bytes]:
        role = self.flavour.role_delta
        return [] if role is None else [self._frame(self._chunk([self._choice(dict(role), None)]))]

    def _token_payload(self, index: int) -> Any:
        delta = {"role": "assistant"} if self.flavour.role_every_delta else {}
        return {**delta, "content": piece(index)}

    def _finish_payload(self) -> Any:
        return {"role": "assistant", "content": ""} if self.flavour.role_every_delta else {}

    def _unary_choice(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": self.text()}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": self.tl.finish_reason}


class CompletionWire(ChunkWire):
    """/v1/completions (text): no role chunk in any runtime."""

    object_name = "text_completion"
    id_prefix = "cmpl-"

    def _choice(self, payload: Any, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "text": payload, "logprobs": None, "finish_reason": finish}

    def _token_payload(self, index: int) -> Any:
        return piece(index)

    def _finish_payload(self) -> Any:
        return ""

    def _unary_choice(self) -> dict[str, Any]:
        return self._choice(self.text(), self.tl.finish_reason)


class ResponsesWire(Wire):
    """/v1/responses: named SSE events, no [DONE]."""

    limit_keys = ("max_output_tokens",)
    opening_required = True

    def __init__(self, body: dict[str, Any], cfg: SimConfig, arrival: float, seq: int) -> None:
        super().__init__(body, cfg, arrival, seq)
        self.id = f"resp_sim{seq}"
        self.item_id = f"msg_sim{seq}"
        self.sequence = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        frame = sse({"type": kind, "sequence_number": self.sequence, **fields}, event=kind)
        self.sequence += 1
        return frame

    def _item(self, done: bool) -> dict[str, Any]:
        content = [self._part(self.text())] if done else []
        status = "completed" if done else "in_progress"
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _status(self) -> str:
        return "incomplete" if self.tl.capped else "completed"

    def _response(self, done: bool) -> dict[str, Any]:
        tl = self.tl
        usage = {
            "input_tokens": tl.prompt_tokens,
            "input_tokens_details": {"cached_tokens": tl.cached_tokens},
            "output_tokens": tl.tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tl.prompt_tokens + tl.tokens,
        }
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": self._status() if done else "in_progress",
            "incomplete_details": {"reason": "max_output_tokens"} if done and tl.capped else None,
            "output": [self._item(True)] if done else [], "usage": usage if done else None,
            "error": None, "instructions": None, "metadata": {}, "parallel_tool_calls": True,
            "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": [],
            "text": {"format": {"type": "text"}},
        }

    def opening(self) -> list[bytes]:
        part = {"item_id": self.item_id, "output_index": 0, "content_index": 0, "part": self._part("")}
        return [
            self._event("response.created", response=self._response(False)),
            self._event("response.in_progress", response=self._response(False)),
            self._event("response.output_item.added", output_index=0, item=self._item(False)),
            self._event("response.content_part.added", **part),
        ]

    def token(self, index: int) -> list[bytes]:
        return [self._event(
            "response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0,
            delta=piece(index), logprobs=[],
        )]

    def closing(self) -> list[bytes]:
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return [
            self._event("response.output_text.done", text=self.text(), logprobs=[], **where),
            self._event("response.content_part.done", part=self._part(self.text()), **where),
            self._event("response.output_item.done", output_index=0, item=self._item(True)),
            self._event(f"response.{self._status()}", response=self._response(True)),
        ]

    def unary(self) -> tuple[dict[str, str], Any]:
        return {}, self._response(True)


def models(cfg: SimConfig) -> dict[str, Any]:
    """GET /v1/models."""
    return {"object": "list", "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "otel-llm-sim"}]}
