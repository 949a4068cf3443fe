"""The generated text of a streamed response, for opt-in content capture only.

Off by default (``capture_content``); when on, the capture layer keeps up to
``CAPTURE_BYTES`` of the stream and this module joins the text deltas once at the end.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from otel_llm.parse import routes
from otel_llm.parse.response import parse_sse_event

__all__ = ["CAPTURE_BYTES", "MAX_TEXT_CHARS", "event_text", "stream_text"]

CAPTURE_BYTES = 256 * 1024
MAX_TEXT_CHARS = 65536


def _openai_chat(o: dict[str, Any]) -> str | None:
    choices = o.get("choices") or []
    delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
    return delta.get("content") if isinstance(delta, dict) else None


def _openai_completions(o: dict[str, Any]) -> str | None:
    choices = o.get("choices") or []
    return choices[0].get("text") if choices and isinstance(choices[0], dict) else None


def _responses(o: dict[str, Any]) -> str | None:
    return o.get("delta") if o.get("type") == "response.output_text.delta" else None


def _anthropic(o: dict[str, Any]) -> str | None:
    delta = o.get("delta")
    return delta.get("text") if isinstance(delta, dict) and delta.get("type") == "text_delta" else None


def _ollama_chat(o: dict[str, Any]) -> str | None:
    message = o.get("message")
    return message.get("content") if isinstance(message, dict) else None


def _tgi(o: dict[str, Any]) -> str | None:
    token = o.get("token")
    if isinstance(token, dict) and not token.get("special"):
        return token.get("text")
    return None


_DELTA: dict[str, Callable[[dict[str, Any]], object]] = {  # the value as sent: callers check it
    routes.API_OPENAI_CHAT: _openai_chat,
    routes.API_OPENAI_COMPLETIONS: _openai_completions,
    routes.API_OPENAI_RESPONSES: _responses,
    routes.API_ANTHROPIC_MESSAGES: _anthropic,
    routes.API_OLLAMA_CHAT: _ollama_chat,
    routes.API_OLLAMA_GENERATE: lambda o: o.get("response"),
    routes.API_LLAMACPP_COMPLETION: lambda o: o.get("content"),
    routes.API_TGI_GENERATE_STREAM: _tgi,
    routes.API_LMSTUDIO_V1_CHAT: lambda o: o.get("content"),
}


def _objects(data: bytes, ndjson: bool) -> list[dict[str, Any]]:
    blocks = data.replace(b"\r\n", b"\n").split(b"\n" if ndjson else b"\n\n")
    found = []
    for block in blocks:
        payload = block if ndjson else parse_sse_event(block)[1]
        if not payload or payload.strip() == b"[DONE]":
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def event_text(api: str, obj: dict[str, Any]) -> str | None:
    """The generated text one decoded stream event of ``api`` carries (None: a role-only, usage or
    other frame without output). SGLang's cumulative ``text`` counts as text too."""
    if api == routes.API_TGI_GENERATE:
        text = obj.get("text")
        return text if isinstance(text, str) and text else None
    try:
        piece = _DELTA.get(api, _openai_chat)(obj)
    except (AttributeError, TypeError, LookupError):  # any JSON shape: no text, never an error
        return None
    return piece if isinstance(piece, str) and piece else None


def stream_text(api: str, data: bytes, ndjson: bool) -> str | None:
    """Joined generated text of a captured stream; SGLang's cumulative text is taken last-wins."""
    objects = _objects(data, ndjson)
    if api == routes.API_TGI_GENERATE:  # SGLang /generate: each event repeats the text so far
        texts = [text for o in objects if isinstance(text := o.get("text"), str)]
        return texts[-1][:MAX_TEXT_CHARS] if texts else None
    delta = _DELTA.get(api, _openai_chat)
    parts = []
    for obj in objects:
        try:
            piece = delta(obj)
        except (AttributeError, TypeError, LookupError):  # any JSON shape: no text, never an error
            continue
        if isinstance(piece, str):
            parts.append(piece)
    return "".join(parts)[:MAX_TEXT_CHARS] if parts else None
