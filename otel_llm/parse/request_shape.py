"""How big a request is, and what it is made of, without keeping any of its content.

Applications resend the system instructions, the history, retrieved documents and tool schemas
on every turn; these figures show that growth call over call. Sizes are UTF-8 bytes of the text
a part carries (tool schemas: their compact JSON), counted from the parsed body. Never raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from otel_llm import semconv as sc

__all__ = ["ROLES", "RequestShape", "request_shape"]

ROLES = sc.LLM_REQUEST_ROLES[:-1]  # the last is "other": every role not named here
_SYSTEM_ROLES = ("system", "developer")
_TEXT_PARTS = ("text", "input_text", "output_text")
_ATTACHMENT_PARTS = ("image_url", "image", "input_image", "input_audio", "audio", "file", "input_file",
                     "document", "video", "video_url")
_MAX_DEPTH = 8  # nested parts (Anthropic tool results) deeper than this are not counted


@dataclass(slots=True)
class RequestShape:
    """Counts and sizes of one request body; None when the body did not say."""

    messages: int | None = None
    by_role: dict[str, int] = field(default_factory=dict)
    system_bytes: int | None = None
    largest_message_bytes: int | None = None
    tools: int | None = None
    tools_bytes: int | None = None
    attachments: int = 0


def request_shape(doc: dict[str, Any], messages: list[Any] | None, system: object | None) -> RequestShape:
    """The shape of a parsed body, given the messages and system prompt ``parse_request`` found."""
    shape = RequestShape()
    try:
        _messages(shape, messages)
        if system is not None:
            shape.system_bytes = (shape.system_bytes or 0) + _text_bytes(system, shape, 0)
        tools = doc.get("tools")
        if not isinstance(tools, list):
            tools = doc.get("functions")
        if isinstance(tools, list) and tools:
            shape.tools = len(tools)
            shape.tools_bytes = len(json.dumps(tools, separators=(",", ":"), default=str))
        images = doc.get("images")  # Ollama /api/generate
        if isinstance(images, list):
            shape.attachments += len(images)
    except Exception:  # noqa: BLE001 - odd bodies give fewer figures, never an error
        pass
    return shape


def _messages(shape: RequestShape, messages: list[Any] | None) -> None:
    if not isinstance(messages, list):
        return
    shape.messages = len(messages)
    largest = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        key = role if role in ROLES else "other"
        shape.by_role[key] = shape.by_role.get(key, 0) + 1
        content, calls = message.get("content"), message.get("tool_calls")
        # plain ASCII text without tool calls, the usual message, without a call per message
        size = len(content) if content.__class__ is str and content.isascii() else _text_bytes(content, shape, 0)
        if calls is not None:
            size += _tool_call_bytes(calls)
        images = message.get("images")  # Ollama /api/chat
        if isinstance(images, list):
            shape.attachments += len(images)
        if role in _SYSTEM_ROLES:
            shape.system_bytes = (shape.system_bytes or 0) + size
        largest = max(largest, size)
    if messages:
        shape.largest_message_bytes = largest


def _utf8(text: str) -> int:
    # an ASCII string's length is its byte count, and CPython knows it is ASCII without a scan
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _text_bytes(content: object, shape: RequestShape, depth: int) -> int:
    """Bytes of the text in a content value (a string, a part, or a list of parts); attachment
    parts are counted, not sized."""
    if isinstance(content, str):
        return _utf8(content)
    if depth > _MAX_DEPTH:
        return 0
    if isinstance(content, list):
        return sum(_text_bytes(part, shape, depth + 1) for part in content)
    if not isinstance(content, dict):
        return 0
    kind = content.get("type")
    if kind in _ATTACHMENT_PARTS:
        shape.attachments += 1
        return 0
    if kind in _TEXT_PARTS or "text" in content:
        text = content.get("text")
        return _utf8(text) if isinstance(text, str) else 0
    if kind == "tool_use":
        return len(json.dumps(content.get("input"), separators=(",", ":"), default=str))
    return _text_bytes(content.get("content"), shape, depth + 1)  # a tool result's own content


def _tool_call_bytes(calls: object) -> int:
    """Bytes of the arguments of an assistant message's tool calls (OpenAI: JSON strings)."""
    if not isinstance(calls, list):
        return 0
    total = 0
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            total += _utf8(arguments)
        elif arguments is not None:
            total += len(json.dumps(arguments, separators=(",", ":"), default=str))
    return total
