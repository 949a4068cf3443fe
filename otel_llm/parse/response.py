"""Read ids, finish reasons, token usage and runtime counters from model responses.

One parser serves every API: the response shapes of the supported runtimes use
distinct keys, so each JSON object is merged field by field. The common shapes (OpenAI chat,
completions and Responses, Anthropic Messages, errors) are read here; each runtime's own fields
and headers by its module in ``parse.runtimes``. Never raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_llm.parse import routes as r
from otel_llm.parse._merge import (
    MAX_ERROR_CHARS, Merge, ResponseInfo, as_dict as _dict, count as _count, keep as _keep,
    text as _str, truncate as _truncate,
)
from otel_llm.parse.runtimes import HEADER_READERS, RESPONSE_READERS
# where each runtime's own fields are kept in ResponseInfo.native (owned by its module)
from otel_llm.parse.runtimes.llamacpp import NATIVE_LLAMACPP_TIMINGS, NATIVE_TRUNCATED as NATIVE_LLAMACPP_TRUNCATED
from otel_llm.parse.runtimes.lmstudio import NATIVE_LMSTUDIO_STATS
from otel_llm.parse.runtimes.ollama import NATIVE_OLLAMA
from otel_llm.parse.runtimes.sglang import NATIVE_SGLANG_META
from otel_llm.parse.runtimes.tgi import NATIVE_TGI_DETAILS, NATIVE_TGI_HEADERS
from otel_llm.parse.runtimes.vllm import NATIVE_VLLM_METRICS

__all__ = [
    "MAX_BODY_BYTES", "MAX_ERROR_CHARS", "MAX_TEXT_CHARS", "NATIVE_LLAMACPP_TIMINGS",
    "NATIVE_LLAMACPP_TRUNCATED", "NATIVE_LMSTUDIO_STATS", "NATIVE_OLLAMA", "NATIVE_SGLANG_META",
    "NATIVE_TGI_DETAILS", "NATIVE_TGI_HEADERS", "NATIVE_VLLM_METRICS", "ResponseInfo", "parse_body",
    "parse_events", "parse_sse_event",
]

MAX_BODY_BYTES = 8 * 1024 * 1024  # larger bodies/events are not parsed (headers still are)
MAX_TEXT_CHARS = 64 * 1024

_RESPONSES_DONE = ("completed", "incomplete", "failed", "cancelled")
_DONE = b"[DONE]"

# --- public API -----------------------------------------------------------------------------


def parse_sse_event(block: bytes) -> tuple[str | None, bytes | None]:
    """Split one SSE event block into (event name, data lines joined by LF)."""
    name: str | None = None
    data: list[bytes] = []
    try:
        for line in _as_bytes(block).splitlines():
            if not line or line[:1] == b":":
                continue
            key, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if key == b"data":
                data.append(value)
            elif key == b"event":
                name = value.decode("utf-8", "replace").strip() or None
            elif key == b"error":  # older llama.cpp: `error: {...}`
                name = name or "error"
                data.append(value)
    except Exception:  # noqa: BLE001
        return None, None
    return name, (b"\n".join(data) if data else None)


def parse_body(
    api: str, body: bytes, headers: Mapping[str, str] | None = None, want_text: bool = False
) -> ResponseInfo:
    """A complete non-streamed response body (JSON object). headers: lower-cased response
    headers (TGI puts counters in x-* headers)."""
    acc = Merge(api)
    if headers:
        for read in HEADER_READERS:
            _safe(read, acc, headers)
    try:
        data = _as_bytes(body)
        doc = _loads(data) if 0 < len(data) <= MAX_BODY_BYTES else None
        if isinstance(doc, list) and len(doc) == 1:
            doc = doc[0]
        if isinstance(doc, dict):
            _safe(_merge, acc, doc, None)
            if want_text:
                acc.info.output_text = _safe(_text_of, doc)
    except Exception:  # noqa: BLE001
        pass
    return _finish(acc)


def parse_events(
    api: str, events: Sequence[bytes], headers: Mapping[str, str] | None = None
) -> ResponseInfo:
    """The FIRST event and the LAST few (<= 6) events of a streamed response, raw bytes of
    each event as framed on the wire (an SSE event block or one NDJSON line). Merges what
    they carry: id/model from the first, finish reasons / usage / counters / errors from
    the last ones. `data: [DONE]` and comments are ignored."""
    acc = Merge(api)
    if headers:
        for read in HEADER_READERS:
            _safe(read, acc, headers)
    try:
        for event in _iter(events):
            for name, doc in _safe(_decode_event, event) or ():
                _safe(_merge, acc, doc, name)
    except Exception:  # noqa: BLE001
        pass
    return _finish(acc)


# --- input handling -------------------------------------------------------------------------


def _safe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - parsing must never break the host app
        return None


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    return b""


def _iter(events: object) -> Iterable[Any]:
    if events is None or isinstance(events, (bytes, bytearray, str)):
        return (events,) if events else ()
    return events  # type: ignore[return-value]


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except Exception:  # noqa: BLE001 - ValueError, RecursionError, UnicodeDecodeError
        return None


def _decode_event(event: object) -> list[tuple[str | None, dict[str, Any]]]:
    """JSON objects carried by one event (normally one)."""
    raw = _as_bytes(event)
    if len(raw) > MAX_BODY_BYTES:
        return []
    name: str | None
    data: bytes | None
    if raw.lstrip()[:1] in (b"{", b"["):  # NDJSON line
        name, data, lines = None, raw, raw.split(b"\n")
    else:
        name, data = parse_sse_event(raw)
        if data is None:
            return []
        lines = data.split(b"\n")
    if data.strip() == _DONE:
        return []
    doc = _loads(data)
    if isinstance(doc, dict):
        return [(name, doc)]
    if doc is None and len(lines) > 1:  # several JSON values on separate data lines
        docs = (_loads(line) for line in lines if line.strip() and line.strip() != _DONE)
        return [(name, d) for d in docs if isinstance(d, dict)]
    return []


# --- value coercion -------------------------------------------------------------------------


def _list(v: object) -> list[Any]:
    return v if isinstance(v, list) else []


def _first(*values: object) -> int | None:
    for v in values:
        n = _count(v)
        if n is not None:
            return n
    return None


# --- merging --------------------------------------------------------------------------------


def _merge(acc: Merge, o: dict[str, Any], event: str | None) -> None:
    """Merge one JSON object (a body, chunk, NDJSON line or SSE event payload)."""
    typ = _str(o.get("type")) or event
    _merge_error(acc, o, "error" if event == "error" else typ)
    if typ == "message_start":
        _merge_object(acc, _dict(o.get("message")))
    elif typ == "message_delta":
        acc.reason = _str(_dict(o.get("delta")).get("stop_reason")) or acc.reason
        _merge_usage(acc, o.get("usage"))
    elif typ is not None and typ.startswith("response.") and isinstance(o.get("response"), dict):
        _merge_object(acc, o["response"])
    elif typ == "chat.end":
        _merge_object(acc, _dict(o.get("result")))
    else:
        _merge_object(acc, o)


def _merge_object(acc: Merge, o: dict[str, Any]) -> None:
    info = acc.info
    info.response_id = info.response_id or _str(o.get("id")) or _str(o.get("response_id"))
    info.response_model = info.response_model or _str(o.get("model"))
    if isinstance(o.get("choices"), list):
        _merge_choices(acc, o["choices"])
    _merge_usage(acc, o.get("usage"))
    if o.get("type") == "message":  # Anthropic message body
        acc.reason = _str(o.get("stop_reason")) or acc.reason
    if o.get("object") == "response":
        _merge_responses(acc, o)
    for keys, read in RESPONSE_READERS:  # each runtime's own fields, read by its module
        for key in keys:
            if key in o:
                if read(acc, o):
                    return
                break


def _merge_choices(acc: Merge, choices: Sequence[object]) -> None:
    for pos, choice in enumerate(choices):
        if isinstance(choice, dict):
            reason = _str(choice.get("finish_reason"))
            if reason is not None:
                index = _count(choice.get("index"))
                acc.choice_reasons[pos if index is None else index] = reason


def _merge_usage(acc: Merge, u: object) -> None:
    if not isinstance(u, dict):
        return
    anthropic = acc.api == r.API_ANTHROPIC_MESSAGES or (
        "cache_read_input_tokens" in u or "cache_creation_input_tokens" in u
    )
    if anthropic:
        acc.a_input = _keep(_count(u.get("input_tokens")), acc.a_input)
        acc.a_cache_read = _keep(_count(u.get("cache_read_input_tokens")), acc.a_cache_read)
        acc.a_cache_write = _keep(_count(u.get("cache_creation_input_tokens")), acc.a_cache_write)
        acc.last("output_tokens", _count(u.get("output_tokens")))
        return
    # what acc.last() does, spelled out: four calls per answer otherwise
    info = acc.info
    value = _first(u.get("prompt_tokens"), u.get("input_tokens"))
    if value is not None:
        info.input_tokens = value
    value = _first(u.get("completion_tokens"), u.get("output_tokens"))
    if value is not None:
        info.output_tokens = value
    value = _count(_details(u, "prompt_tokens_details", "input_tokens_details").get("cached_tokens"))
    if value is not None:
        info.cached_input_tokens = value
    value = _count(_details(u, "completion_tokens_details", "output_tokens_details").get("reasoning_tokens"))
    if value is not None:
        info.reasoning_output_tokens = value


def _details(u: Mapping[str, object], name: str, other: str) -> dict[str, Any]:
    """``u[name]`` if it is a non-empty dict, else ``u[other]`` if a dict, else empty."""
    details = u.get(name)
    if isinstance(details, dict) and details:
        return details
    details = u.get(other)
    return details if isinstance(details, dict) else {}


def _merge_responses(acc: Merge, o: Mapping[str, Any]) -> None:
    status = _str(o.get("status"))
    if status == "incomplete":
        acc.reason = _str(_dict(o.get("incomplete_details")).get("reason")) or status
    elif status in _RESPONSES_DONE:
        acc.reason = status
    err = _dict(o.get("error"))
    if err:
        acc.info.error = _truncate(_str(err.get("message")) or _str(err.get("code")) or "error")


def _merge_error(acc: Merge, o: Mapping[str, Any], typ: str | None) -> None:
    msg = _error_message(o, typ)
    if msg:
        acc.info.error = _truncate(msg)


def _error_message(o: Mapping[str, Any], typ: str | None) -> str | None:
    err = o.get("error")
    if isinstance(err, str):
        return err or None
    if isinstance(err, dict):
        return (
            _str(err.get("message")) or _str(err.get("type")) or _str(err.get("code"))
            or "error"
        )
    if typ == "error" or o.get("object") == "error":
        return _str(o.get("message")) or _str(o.get("code")) or "error"
    if isinstance(o.get("detail"), str) and len(o) <= 2:  # FastAPI HTTPException body
        return o["detail"] or None
    return None


# --- output text ----------------------------------------------------------------------------


def _text_of(o: Mapping[str, Any]) -> str | None:
    """The generated text of a complete response body, bounded to MAX_TEXT_CHARS."""
    parts = ["\n".join(_choice_texts(_list(o.get("choices"))))]
    for key in ("response", "generated_text", "text"):
        if isinstance(o.get(key), str):
            parts.append(o[key])
    message = o.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        parts.append(message["content"])
    content = o.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):  # Anthropic content blocks
        parts.extend(_block_texts(content, "text"))
    for item in _list(o.get("output")):  # Responses API / LM Studio v1
        if isinstance(item, dict) and item.get("type") == "message":
            c = item.get("content")
            parts.extend([c] if isinstance(c, str) else _block_texts(c, "output_text"))
    text = "".join(p for p in parts if p)
    return text[:MAX_TEXT_CHARS] if text else None


def _choice_texts(choices: Iterable[object]) -> list[str]:
    texts = []
    for c in choices:
        if isinstance(c, dict):
            text = _str(_dict(c.get("message")).get("content")) or _str(c.get("text"))
            if text:
                texts.append(text)
    return texts


def _block_texts(blocks: object, kind: str) -> list[str]:
    if not isinstance(blocks, list):
        return []
    return [
        b["text"] for b in blocks
        if isinstance(b, dict) and b.get("type") == kind and isinstance(b.get("text"), str)
    ]


# --- finalize -------------------------------------------------------------------------------


def _finish(acc: Merge) -> ResponseInfo:
    info = acc.info
    try:
        if acc.choice_reasons:
            info.finish_reasons = [acc.choice_reasons[k] for k in sorted(acc.choice_reasons)]
        elif acc.reason or acc.alt_reason:
            info.finish_reasons = [acc.reason or acc.alt_reason]  # type: ignore[list-item]
        anthropic = (acc.a_input, acc.a_cache_read, acc.a_cache_write)
        if any(v is not None for v in anthropic):
            info.input_tokens = _count(sum(v for v in anthropic if v is not None))  # may leave int64
            if info.cached_input_tokens is None:
                info.cached_input_tokens = acc.a_cache_read
        if info.input_tokens is None:
            info.input_tokens = acc.fb_input
        if info.output_tokens is None:
            info.output_tokens = acc.fb_output
        if info.cached_input_tokens is None:
            info.cached_input_tokens = acc.fb_cached
    except Exception:  # noqa: BLE001
        pass
    return info
