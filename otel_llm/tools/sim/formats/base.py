"""Shared pieces of every wire format: the measured timeline, the ``Wire`` base class, framing helpers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ..scenario import SimConfig

__all__ = ["Timeline", "Wire", "count_prompt_tokens", "ms", "ndjson", "ns", "piece", "prompt_text", "sse", "token_id"]

_PROMPT_KEYS = ("messages", "prompt", "input", "inputs", "text", "system", "instructions", "content")
# Fixed per-request overhead so that an empty prompt still has a few prompt tokens (BOS, template).
PROMPT_OVERHEAD = 4
KEEPALIVE = b": keep-alive\n\n"


@dataclass
class Timeline:
    """Measured server-side instants of one generation (event-loop clock, seconds)."""

    arrival: float
    prompt_tokens: int
    cached_tokens: int
    tokens: int
    capped: bool
    cold: bool = False
    load: float = 0.0
    queue: float = 0.0
    start: float = 0.0
    headers: float = 0.0
    first: float = 0.0
    last: float = 0.0
    end: float = 0.0
    emitted: int = 0

    def mark_token(self, now: float) -> None:
        if self.emitted == 0:
            self.first = now
        self.last = self.end = now
        self.emitted += 1

    @property
    def server_wait(self) -> float:
        """headers_delay as actually spent (slot granted -> headers)."""
        return self.headers - self.start

    @property
    def prefill(self) -> float:
        """first_token_delay as actually spent (headers -> first token)."""
        return self.first - self.headers

    @property
    def decode(self) -> float:
        """First token -> last token."""
        return self.last - self.first

    @property
    def total(self) -> float:
        """Request body received -> last frame."""
        return self.end - self.arrival

    @property
    def evaluated(self) -> int:
        """Prompt tokens actually evaluated (not served from the prefix cache)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def finish_reason(self) -> str:
        return "length" if self.capped else "stop"


def piece(index: int) -> str:
    """Deterministic text of generated token ``index``: "tok0", " tok1", ..."""
    return f"tok{index}" if index == 0 else f" tok{index}"


def token_id(index: int) -> int:
    return 1000 + index


def ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def sse(obj: Any, event: str | None = None, prefix: str = "data: ") -> bytes:
    data = obj if isinstance(obj, str) else dumps(obj)
    head = f"event: {event}\n" if event else ""
    return f"{head}{prefix}{data}\n\n".encode()


def ndjson(obj: Any) -> bytes:
    return (dumps(obj) + "\n").encode()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key in _PROMPT_KEYS:
            if key in value:
                yield from _strings(value[key])


def prompt_text(body: dict[str, Any]) -> str:
    """All prompt-ish text of a request (messages, prompt, input, inputs, text, system...)."""
    return "\n".join(_strings(body))


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """Whitespace-separated words of the prompt text, plus a fixed overhead."""
    return len(prompt_text(body).split()) + PROMPT_OVERHEAD


def _lookup(body: dict[str, Any], path: str) -> Any:
    value: Any = body
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


class Wire:
    """One route's response shape. Subclasses build frames; the engine decides when they are sent."""

    content_type: ClassVar[str] = "text/event-stream"
    stream_default: ClassVar[bool] = False
    #: Dotted body paths that cap the number of generated tokens, first present wins.
    limit_keys: ClassVar[tuple[str, ...]] = ("max_tokens",)
    #: Opening frames the client needs even with role_frame off (they then go out with the first token).
    opening_required: ClassVar[bool] = False

    def __init__(self, body: dict[str, Any], cfg: SimConfig, arrival: float, seq: int) -> None:
        self.body = body
        self.cfg = cfg
        self.seq = seq
        self.model = str(body.get("model") or cfg.model)
        self.created = int(time.time())
        self.stream = self.wants_stream()
        limit = self.token_limit()
        prompt = count_prompt_tokens(body)
        tokens = cfg.tokens if limit is None else min(cfg.tokens, limit)
        cached = min(cfg.cached_tokens, prompt - 1)
        self.tl = Timeline(arrival, prompt, cached, tokens, capped=limit is not None and limit < cfg.tokens)

    def wants_stream(self) -> bool:
        return bool(self.body.get("stream", self.stream_default))

    def token_limit(self) -> int | None:
        for path in self.limit_keys:
            value = _lookup(self.body, path)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                return int(value)
        return None

    def text(self, count: int | None = None) -> str:
        return "".join(piece(i) for i in range(self.tl.tokens if count is None else count))

    # --- streaming ------------------------------------------------------------------------
    def stream_headers(self) -> dict[str, str]:
        return {"Cache-Control": "no-cache"}

    def opening(self) -> list[bytes]:
        """Metadata frames sent right after the headers (role chunk, *.start events)."""
        return []

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def token(self, index: int) -> list[bytes]:
        raise NotImplementedError

    def closing(self) -> list[bytes]:
        """Frames after the last token (finish, usage, counters, end marker)."""
        return []

    # --- non-streaming ----------------------------------------------------------------------
    def unary(self) -> tuple[dict[str, str], Any]:
        """Extra headers and the JSON body of the non-streamed answer."""
        raise NotImplementedError

    def error_body(self, status: int) -> Any:
        return {"error": {"message": f"simulated error {status}", "type": "sim_error", "param": None, "code": status}}
