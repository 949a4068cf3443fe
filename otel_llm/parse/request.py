"""Read the request parameters of a model call from its JSON body.

Never raises: bad input gives None fields. Bodies above ``MAX_PARSE_BYTES``
are not parsed; only ``model`` and ``stream`` are scanned for at their ends.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from otel_llm.parse import routes as r
from otel_llm.parse.request_shape import RequestShape, request_shape

__all__ = ["MAX_PARSE_BYTES", "RequestInfo", "parse_request"]

MAX_PARSE_BYTES = 256 * 1024
SCAN_WINDOW = 4 * 1024
_INT64_MAX = 2**63 - 1

_MODEL_RE = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){0,512})"')
_STREAM_RE = re.compile(rb'"stream"\s*:\s*(true|false)\b')

_OLLAMA_APIS = (r.API_OLLAMA_CHAT, r.API_OLLAMA_GENERATE)
_PARAM_BLOCKS = ("options", "parameters", "sampling_params")
_MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
_NESTED_MAX_TOKEN_KEYS = ("num_predict", "max_new_tokens", "max_tokens")

_T = TypeVar("_T")


@dataclass(slots=True)
class RequestInfo:
    """Request parameters; None when absent or unusable."""

    model: str | None = None
    stream: bool | None = None
    include_usage: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_sequences: list[str] | None = None
    messages: list[Any] | None = None
    system: object | None = None
    keep_alive: object | None = None
    body_bytes: int | None = None
    shape: RequestShape | None = None  # sizes and counts, from a parsed body


def parse_request(api: str, body: bytes | None) -> RequestInfo:
    """Parse a request body for ``api`` (an ``API_*`` constant). Never raises."""
    info = RequestInfo()
    try:
        data = _as_bytes(body)
        if data is not None:
            info.body_bytes = len(data)
        if data:
            if len(data) > MAX_PARSE_BYTES:
                _scan_large(data, info)
            else:
                doc = _loads(data)
                if isinstance(doc, dict):
                    _fill(api, doc, info)
                    info.shape = request_shape(doc, info.messages, info.system)
    except Exception:  # noqa: BLE001 - parsing must never break the host app
        pass
    _apply_defaults(api, info)
    return info


def _as_bytes(body: object) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    return None


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except Exception:  # noqa: BLE001 - ValueError, RecursionError, UnicodeDecodeError
        return None


def _apply_defaults(api: str, info: RequestInfo) -> None:
    if api == r.API_TGI_GENERATE_STREAM:
        info.stream = True
    elif info.stream is None and api in _OLLAMA_APIS:
        info.stream = True


# --- large bodies ---------------------------------------------------------------------------


def _scan_large(data: bytes, info: RequestInfo) -> None:
    """Find model/stream in the first and last SCAN_WINDOW bytes only."""
    head, tail = data[:SCAN_WINDOW], data[-SCAN_WINDOW:]
    for window in (head, tail):
        if info.model is None:
            m = _MODEL_RE.search(window)
            if m:
                info.model = _unescape(m.group(1))
        if info.stream is None:
            m = _STREAM_RE.search(window)
            if m:
                info.stream = m.group(1) == b"true"


def _unescape(raw: bytes) -> str | None:
    try:
        value = json.loads(b'"' + raw + b'"')
    except Exception:  # noqa: BLE001
        return None
    return value if isinstance(value, str) and value else None


# --- value coercion -------------------------------------------------------------------------


def _int(v: object) -> int | None:
    """An int that fits int64; integral finite floats count; bools do not."""
    if v.__class__ is int:
        return v if -_INT64_MAX - 1 <= v <= _INT64_MAX else None
    if v.__class__ is float and math.isfinite(v) and v.is_integer():
        return _int(int(v))
    return None


def _float(v: object) -> float | None:
    """A finite float from an int or float; bools do not count."""
    if v.__class__ is float:
        return v if math.isfinite(v) else None
    if v.__class__ is int:
        f = _int(v)
        return float(f) if f is not None else None
    return None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _bool(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _stops(v: object) -> list[str] | None:
    if isinstance(v, str):
        return [v] if v else None
    if isinstance(v, list):
        out = [s for s in v if isinstance(s, str)]
        return out or None
    return None


def _finite(v: object) -> object | None:
    if v.__class__ is float and not math.isfinite(v):
        return None
    return v


# --- field extraction -----------------------------------------------------------------------


def _fill(api: str, d: dict[str, Any], info: RequestInfo) -> None:
    blocks = [b for b in (d.get(k) for k in _PARAM_BLOCKS) if isinstance(b, dict)]
    info.model = _str(d.get("model"))
    info.stream = _bool(d.get("stream"))
    opts = d.get("stream_options")
    if isinstance(opts, dict):
        info.include_usage = _bool(opts.get("include_usage"))
    info.max_tokens = _max_tokens(d, blocks)
    info.temperature = _first(_float, "temperature", d, blocks)
    info.top_p = _first(_float, "top_p", d, blocks)
    info.top_k = _first(_int, "top_k", d, blocks)
    info.seed = _first(_int, "seed", d, blocks)
    info.stop_sequences = _stop_sequences(d, blocks)
    info.messages = _messages(d)
    info.system = _system(d)
    if api in _OLLAMA_APIS or api == r.API_GENERIC:
        info.keep_alive = _finite(d.get("keep_alive"))


def _first(
    conv: Callable[[object], _T | None], key: str, d: Mapping[str, object],
    blocks: Sequence[Mapping[str, object]],
) -> _T | None:
    for src in (d, *blocks):
        value = src.get(key)
        if value is not None:  # most keys are absent: no conversion call for them
            value = conv(value)
            if value is not None:
                return value
    return None


def _max_tokens(d: Mapping[str, object], blocks: Sequence[Mapping[str, object]]) -> int | None:
    candidates = [d.get(k) for k in _MAX_TOKEN_KEYS]
    candidates += [b.get(k) for b in blocks for k in _NESTED_MAX_TOKEN_KEYS]
    for value in candidates:
        if value is None:
            continue
        n = _int(value)
        if n is not None and n >= 0:  # -1 means "unlimited" in Ollama / llama.cpp
            return n
    return None


def _stop_sequences(d: Mapping[str, object], blocks: Sequence[Mapping[str, object]]) -> list[str] | None:
    for src in (d, *blocks):
        for key in ("stop_sequences", "stop"):
            value = src.get(key)
            stops = None if value is None else _stops(value)
            if stops is not None:
                return stops
    return None


def _messages(d: Mapping[str, object]) -> list[Any] | None:
    """Chat messages as sent; a prompt/input string becomes one user message."""
    messages = d.get("messages")
    if isinstance(messages, list):
        return messages
    for key in ("input", "prompt", "inputs", "text"):
        value = d.get(key)
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if isinstance(value, list):
            return value
    return None


def _system(d: Mapping[str, object]) -> object | None:
    """Anthropic ``system``, Responses ``instructions``, LM Studio ``system_prompt``."""
    for key in ("system", "instructions", "system_prompt"):
        value = d.get(key)
        if isinstance(value, (str, list, dict)) and value:
            return value
    return None
