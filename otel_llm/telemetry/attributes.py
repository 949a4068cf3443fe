"""Span attributes of a model call, from the request, the response and the recorded timeline."""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from otel_llm import semconv as sc
from otel_llm._types import Attributes

if TYPE_CHECKING:
    from otel_llm.capture.call import CallRequest
    from otel_llm.parse.request import RequestInfo
    from otel_llm.parse.request_shape import RequestShape
    from otel_llm.parse.response import ResponseInfo
    from otel_llm.parse.routes import Route

__all__ = [
    "REDACTED", "endpoint_attributes", "provider_name", "request_attributes", "response_attributes", "sanitize_url",
    "span_name",
]

_SECRET_QUERY_KEY = re.compile(
    r"(?i)(key|token|secret|password|passwd|pwd|auth|signature|sig|credential|session|code)"
)
REDACTED = "REDACTED"

_HOSTED_PROVIDERS = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "api.mistral.ai": "mistral_ai",
    "api.groq.com": "groq",
    "api.deepseek.com": "deepseek",
    "api.x.ai": "x_ai",
}


@functools.lru_cache(maxsize=256)  # an application calls the same few URLs over and over
def sanitize_url(url: str) -> str:
    """``url`` without user info and with secret-looking query values redacted."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    if not parts.query:
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(
        f"{quote(k, safe='')}={REDACTED if _SECRET_QUERY_KEY.search(k) else quote(v, safe='')}"
        for k, v in pairs
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def provider_name(runtime: str | None, host: str, api: str) -> str:
    """``gen_ai.provider.name``: the runtime when known, else the hosted vendor, else the API family."""
    if runtime:
        return runtime
    hosted = _HOSTED_PROVIDERS.get(host)
    if hosted:
        return hosted
    if api.startswith("anthropic"):
        return "anthropic"
    return "openai_compatible" if api.startswith("openai") else "_OTHER"


def span_name(operation: str, model: str | None) -> str:
    return f"{operation} {model}" if model else operation


def _put_all(attrs: Attributes, keys: tuple[str, ...], values: tuple[Any, ...]) -> None:
    """``_put`` of each pair; plain ints and ASCII strings (most of them) without a call."""
    for key, value in zip(keys, values):
        cls = value.__class__
        if cls is int or (cls is str and value.isascii()):
            attrs[key] = value
        elif value is not None:
            _put(attrs, key, value)


def _put(attrs: Attributes, key: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        return
    attrs[key] = _utf8(value) if isinstance(value, str) else value


def _utf8(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (JSON allows ``"\\ud800"``) would make the OTLP
    encoder drop the attribute with a traceback per span."""
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def endpoint_attributes(route: Route, request: CallRequest, runtime: str | None,
                        provider: str) -> Attributes:
    """Attributes that depend only on where the call goes (cached per URL by the caller)."""
    attrs: Attributes = {
        sc.GEN_AI_OPERATION_NAME: route.operation,
        sc.GEN_AI_PROVIDER_NAME: provider,
        sc.LLM_API: route.api,
        sc.HTTP_REQUEST_METHOD: request.method,
        sc.SERVER_ADDRESS: request.host,
        sc.URL_FULL: sanitize_url(request.url),
    }
    _put(attrs, sc.SERVER_PORT, request.port or (443 if request.scheme == "https" else 80))
    _put(attrs, sc.LLM_RUNTIME_NAME, runtime)
    return attrs


_REQUEST_KEYS = (sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_REQUEST_MAX_TOKENS, sc.GEN_AI_REQUEST_TEMPERATURE,
                 sc.GEN_AI_REQUEST_TOP_P, sc.GEN_AI_REQUEST_TOP_K, sc.GEN_AI_REQUEST_SEED)
_request_values = operator.attrgetter("model", "max_tokens", "temperature", "top_p", "top_k", "seed")


def request_attributes(endpoint: Attributes, info: RequestInfo, capture_content: bool) -> Attributes:
    """Attributes known when the request starts (samplers see these): the endpoint's, then the
    request body's."""
    attrs = dict(endpoint)
    _put_all(attrs, _REQUEST_KEYS, _request_values(info))
    if info.stop_sequences:
        attrs[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = list(info.stop_sequences)
    if info.stream:
        attrs[sc.GEN_AI_REQUEST_STREAM] = True
    _put(attrs, sc.HTTP_REQUEST_BODY_SIZE, info.body_bytes)
    if info.shape is not None:
        _shape_attributes(info.shape, attrs)
    if capture_content:
        _put(attrs, sc.GEN_AI_INPUT_MESSAGES, _json(info.messages))
        _put(attrs, sc.GEN_AI_SYSTEM_INSTRUCTIONS, _json(info.system))
    return attrs


_SHAPE_KEYS = (sc.LLM_REQUEST_SYSTEM_BYTES, sc.LLM_REQUEST_LARGEST_MESSAGE_BYTES, sc.LLM_REQUEST_TOOLS,
               sc.LLM_REQUEST_TOOLS_BYTES)
_shape_values = operator.attrgetter("system_bytes", "largest_message_bytes", "tools", "tools_bytes")


def _shape_attributes(shape: RequestShape, attrs: Attributes) -> None:
    """What the request is made of (counts and byte sizes; never its content)."""
    if shape.messages is not None:
        attrs[sc.LLM_REQUEST_MESSAGES] = shape.messages
        for role, count in shape.by_role.items():
            attrs[sc.LLM_REQUEST_MESSAGES_PREFIX + role] = count
    for key, value in zip(_SHAPE_KEYS, _shape_values(shape)):
        if value is not None:  # counts and sizes: ints, nothing to clean
            attrs[key] = value
    if shape.attachments:
        attrs[sc.LLM_REQUEST_ATTACHMENTS] = shape.attachments


def _json(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, default=str)[:65536]
    except (TypeError, ValueError):
        return None


_RESPONSE_KEYS = (sc.GEN_AI_RESPONSE_ID, sc.GEN_AI_RESPONSE_MODEL, sc.GEN_AI_USAGE_INPUT_TOKENS,
                  sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                  sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS)
_response_values = operator.attrgetter("response_id", "response_model", "input_tokens", "output_tokens",
                                       "cached_input_tokens", "reasoning_output_tokens")


def response_attributes(response: ResponseInfo | None, attrs: Attributes, capture_content: bool) -> None:
    """Add what the response body/stream carried."""
    if response is None:
        return
    _put_all(attrs, _RESPONSE_KEYS, _response_values(response))
    if response.finish_reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [_utf8(r) for r in response.finish_reasons]
    if capture_content and response.output_text:
        attrs[sc.GEN_AI_OUTPUT_MESSAGES] = _json(
            [{"role": "assistant", "parts": [{"type": "text", "content": response.output_text}]}]
        )
