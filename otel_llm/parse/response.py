"""Read ids, finish reasons, token usage and runtime counters from model responses.

One parser serves every API: the response shapes of the supported runtimes use
distinct keys, so each JSON object is merged field by field. Never raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_llm.parse import routes as r

MAX_BODY_BYTES = 8 * 1024 * 1024  # larger bodies/events are not parsed (headers still are)
MAX_TEXT_CHARS = 64 * 1024
MAX_ERROR_CHARS = 200
_INT64_MAX = 2**63 - 1

NATIVE_OLLAMA = "ollama"
NATIVE_LLAMACPP_TIMINGS = "llamacpp.timings"
NATIVE_LLAMACPP_TRUNCATED = "llamacpp.truncated"
NATIVE_TGI_HEADERS = "tgi.headers"
NATIVE_TGI_DETAILS = "tgi.details"
NATIVE_SGLANG_META = "sglang.meta_info"
NATIVE_LMSTUDIO_STATS = "lmstudio.stats"

_OLLAMA_COUNTERS = (
    "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
    "eval_count", "eval_duration",
)
_TGI_HEADERS = (
    "x-compute-type", "x-compute-time", "x-compute-characters", "x-total-time",
    "x-validation-time", "x-queue-time", "x-inference-time", "x-time-per-token",
    "x-prompt-tokens", "x-generated-tokens",
)
_LMSTUDIO_STATS_KEYS = (
    "tokens_per_second", "time_to_first_token", "time_to_first_token_seconds",
    "generation_time", "stop_reason", "input_tokens", "total_output_tokens",
)
_LLAMACPP_STOP_FLAGS = (
    ("stopped_eos", "eos"), ("stopped_word", "word"), ("stopped_limit", "limit"),
)
_RESPONSES_DONE = ("completed", "incomplete", "failed", "cancelled")
_DONE = b"[DONE]"


@dataclass(slots=True)
class ResponseInfo:
    """What a response says about the call; None when it does not say."""

    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    error: str | None = None
    output_text: str | None = None
    native: dict[str, Any] = field(default_factory=dict)
    runtime: str | None = None


@dataclass(slots=True)
class _Acc:
    """Merge state: primary counters, fallbacks, and per-choice finish reasons."""

    api: str
    info: ResponseInfo = field(default_factory=ResponseInfo)
    choice_reasons: dict[int, str] = field(default_factory=dict)
    reason: str | None = None       # single-reason sources (Anthropic, Ollama, ...)
    alt_reason: str | None = None   # LM Studio stats.stop_reason: used only without others
    a_input: int | None = None      # Anthropic usage parts (input excludes cache)
    a_cache_read: int | None = None
    a_cache_write: int | None = None
    fb_input: int | None = None     # fallbacks: llama.cpp timings, TGI headers
    fb_output: int | None = None
    fb_cached: int | None = None


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
    acc = _Acc(api)
    _safe(_merge_headers, acc, headers)
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
    acc = _Acc(api)
    _safe(_merge_headers, acc, headers)
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


def _decode_event(event: object) -> list[tuple[str | None, dict]]:
    """JSON objects carried by one event (normally one)."""
    raw = _as_bytes(event)
    if len(raw) > MAX_BODY_BYTES:
        return []
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


def _count(v: object) -> int | None:
    """A non-negative int64 token count; integral finite floats count; bools do not."""
    if v.__class__ is float and math.isfinite(v) and v.is_integer():  # type: ignore[arg-type]
        v = int(v)  # type: ignore[arg-type]
    if v.__class__ is int and 0 <= v <= _INT64_MAX:  # type: ignore[operator]
        return v  # type: ignore[return-value]
    return None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _keep(new: int | None, old: int | None) -> int | None:
    return old if new is None else new


def _list(v: object) -> list:
    return v if isinstance(v, list) else []


def _first(*values: object) -> int | None:
    for v in values:
        n = _count(v)
        if n is not None:
            return n
    return None


def _clean(d: dict, depth: int = 0) -> dict[str, Any]:
    """Scalars and nested dicts of ``d``; lists, non-finite floats and huge ints dropped."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if v is None or isinstance(v, (str, bool)):
            out[k] = v
        elif v.__class__ is int:
            if -_INT64_MAX - 1 <= v <= _INT64_MAX:
                out[k] = v
        elif v.__class__ is float:
            if math.isfinite(v):
                out[k] = v
        elif isinstance(v, dict) and depth < 2:
            out[k] = _clean(v, depth + 1)
    return out


def _truncate(msg: str | None) -> str | None:
    return msg[:MAX_ERROR_CHARS] if msg else None


# --- merging --------------------------------------------------------------------------------


def _last(acc: _Acc, attr: str, value: int | None) -> None:
    if value is not None:
        setattr(acc.info, attr, value)


def _merge(acc: _Acc, o: dict, event: str | None) -> None:
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


def _merge_object(acc: _Acc, o: dict) -> None:
    info = acc.info
    info.response_id = info.response_id or _str(o.get("id")) or _str(o.get("response_id"))
    info.response_model = (
        info.response_model or _str(o.get("model")) or _str(o.get("model_instance_id"))
    )
    if isinstance(o.get("choices"), list):
        _merge_choices(acc, o["choices"])
    _merge_usage(acc, o.get("usage"))
    if o.get("type") == "message":  # Anthropic message body
        acc.reason = _str(o.get("stop_reason")) or acc.reason
    if o.get("object") == "response":
        _merge_responses(acc, o)
    if "done" in o:
        _merge_ollama(acc, o)
    if "stop" in o or "timings" in o:
        _merge_llamacpp(acc, o)
    if "meta_info" in o:
        _merge_sglang(acc, _dict(o.get("meta_info")))
    elif "details" in o or "generated_text" in o:
        _merge_tgi(acc, o)
    if "stats" in o or "model_info" in o or "model_instance_id" in o:
        _merge_lmstudio(acc, o)


def _merge_choices(acc: _Acc, choices: list) -> None:
    for pos, choice in enumerate(choices):
        if isinstance(choice, dict):
            reason = _str(choice.get("finish_reason"))
            if reason is not None:
                index = _count(choice.get("index"))
                acc.choice_reasons[pos if index is None else index] = reason


def _merge_usage(acc: _Acc, u: object) -> None:
    if not isinstance(u, dict):
        return
    anthropic = acc.api == r.API_ANTHROPIC_MESSAGES or (
        "cache_read_input_tokens" in u or "cache_creation_input_tokens" in u
    )
    if anthropic:
        acc.a_input = _keep(_count(u.get("input_tokens")), acc.a_input)
        acc.a_cache_read = _keep(_count(u.get("cache_read_input_tokens")), acc.a_cache_read)
        acc.a_cache_write = _keep(_count(u.get("cache_creation_input_tokens")), acc.a_cache_write)
        _last(acc, "output_tokens", _count(u.get("output_tokens")))
        return
    details = _dict(u.get("prompt_tokens_details")) or _dict(u.get("input_tokens_details"))
    out_details = (
        _dict(u.get("completion_tokens_details")) or _dict(u.get("output_tokens_details"))
    )
    _last(acc, "input_tokens", _first(u.get("prompt_tokens"), u.get("input_tokens")))
    _last(acc, "output_tokens", _first(u.get("completion_tokens"), u.get("output_tokens")))
    _last(acc, "cached_input_tokens", _count(details.get("cached_tokens")))
    _last(acc, "reasoning_output_tokens", _count(out_details.get("reasoning_tokens")))


def _merge_responses(acc: _Acc, o: dict) -> None:
    status = _str(o.get("status"))
    if status == "incomplete":
        acc.reason = _str(_dict(o.get("incomplete_details")).get("reason")) or status
    elif status in _RESPONSES_DONE:
        acc.reason = status
    err = _dict(o.get("error"))
    if err:
        acc.info.error = _truncate(_str(err.get("message")) or _str(err.get("code")) or "error")


def _merge_ollama(acc: _Acc, o: dict) -> None:
    if o.get("done") is not True:
        return
    acc.reason = _str(o.get("done_reason")) or acc.reason
    counters = {k: o[k] for k in _OLLAMA_COUNTERS if _count(o.get(k)) is not None}
    _last(acc, "input_tokens", _count(o.get("prompt_eval_count")))
    _last(acc, "output_tokens", _count(o.get("eval_count")))
    if counters:
        acc.info.native[NATIVE_OLLAMA] = counters
    if counters or "created_at" in o:
        acc.info.runtime = "ollama"


def _merge_llamacpp(acc: _Acc, o: dict) -> None:
    timings = o.get("timings")
    if isinstance(timings, dict):
        acc.info.native[NATIVE_LLAMACPP_TIMINGS] = _clean(timings)
        acc.info.runtime = "llama.cpp"
        prompt_n, cache_n = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
        if prompt_n is not None:
            acc.fb_input = _count(prompt_n + (cache_n or 0))  # the sum may leave int64
        acc.fb_output = _keep(_count(timings.get("predicted_n")), acc.fb_output)
        acc.fb_cached = _keep(cache_n, acc.fb_cached)
    if not isinstance(o.get("stop"), bool):
        return
    if isinstance(o.get("truncated"), bool):
        acc.info.native[NATIVE_LLAMACPP_TRUNCATED] = o["truncated"]
    _last(acc, "input_tokens", _count(o.get("tokens_evaluated")))
    _last(acc, "output_tokens", _count(o.get("tokens_predicted")))
    if o["stop"]:
        acc.reason = _str(o.get("stop_type")) or _llamacpp_stop_flags(o) or acc.reason


def _llamacpp_stop_flags(o: dict) -> str | None:
    """Older llama.cpp builds: stopped_eos / stopped_word / stopped_limit booleans."""
    for key, reason in _LLAMACPP_STOP_FLAGS:
        if o.get(key) is True:
            return reason
    return None


def _merge_tgi(acc: _Acc, o: dict) -> None:
    details = o.get("details")
    if isinstance(details, dict):
        acc.info.native[NATIVE_TGI_DETAILS] = _clean(details)
        acc.reason = _str(details.get("finish_reason")) or acc.reason
        _last(acc, "output_tokens", _count(details.get("generated_tokens")))
        _last(acc, "input_tokens", _count(details.get("input_length")))
        acc.info.runtime = "tgi"
    elif isinstance(o.get("generated_text"), str) or "token" in o:
        acc.info.runtime = "tgi"


def _merge_sglang(acc: _Acc, meta: dict) -> None:
    if not meta:
        return
    acc.info.native[NATIVE_SGLANG_META] = _clean(meta)
    acc.info.runtime = "sglang"
    acc.info.response_id = acc.info.response_id or _str(meta.get("id"))
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        acc.reason = _str(fr.get("type")) or acc.reason
        if fr.get("type") == "abort":
            acc.info.error = _truncate(_str(fr.get("message"))) or acc.info.error
    elif isinstance(fr, str) and fr:
        acc.reason = fr
    _last(acc, "input_tokens", _count(meta.get("prompt_tokens")))
    _last(acc, "output_tokens", _count(meta.get("completion_tokens")))
    _last(acc, "cached_input_tokens", _count(meta.get("cached_tokens")))
    _last(acc, "reasoning_output_tokens", _count(meta.get("reasoning_tokens")))


def _merge_lmstudio(acc: _Acc, o: dict) -> None:
    stats = o.get("stats")
    if isinstance(stats, dict) and any(k in stats for k in _LMSTUDIO_STATS_KEYS):
        acc.info.native[NATIVE_LMSTUDIO_STATS] = _clean(stats)
        acc.info.runtime = "lmstudio"
        acc.alt_reason = _str(stats.get("stop_reason")) or acc.alt_reason
        _last(acc, "input_tokens", _count(stats.get("input_tokens")))
        _last(acc, "output_tokens", _count(stats.get("total_output_tokens")))
        _last(acc, "reasoning_output_tokens", _count(stats.get("reasoning_output_tokens")))
    if isinstance(o.get("model_info"), dict) or isinstance(o.get("model_instance_id"), str):
        acc.info.runtime = "lmstudio"


def _merge_error(acc: _Acc, o: dict, typ: str | None) -> None:
    msg = _error_message(o, typ)
    if msg:
        acc.info.error = _truncate(msg)


def _error_message(o: dict, typ: str | None) -> str | None:
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


# TGI sends x-compute-type on every answer; the token counts are what fallbacks use.
_TGI_SENTINELS = ("x-compute-type", "x-total-time", "x-generated-tokens", "x-prompt-tokens")


def _merge_headers(acc: _Acc, headers: Mapping[str, str] | None) -> None:
    if not headers or all(_header(headers, name) is None for name in _TGI_SENTINELS):
        return  # the common case, not TGI: four lookups instead of the whole table
    found = {name: str(v) for name in _TGI_HEADERS if (v := _header(headers, name)) is not None}
    if not found:
        return
    acc.info.native[NATIVE_TGI_HEADERS] = found
    acc.info.runtime = "tgi"
    acc.fb_input = _int_str(found.get("x-prompt-tokens"))
    acc.fb_output = _int_str(found.get("x-generated-tokens"))


def _header(headers: Mapping[str, str], name: str) -> object | None:
    value = headers.get(name)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("latin-1")
    return value if isinstance(value, str) else None


def _int_str(value: str | None) -> int | None:
    if value is None or len(value) > 20:
        return None
    try:
        return _count(int(value))
    except ValueError:
        return None


# --- output text ----------------------------------------------------------------------------


def _text_of(o: dict) -> str | None:
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


def _choice_texts(choices: list) -> list[str]:
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


def _finish(acc: _Acc) -> ResponseInfo:
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
