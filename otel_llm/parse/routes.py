"""Map an HTTP request path to the model API it speaks.

``match_route`` runs on every outgoing HTTP request, so a miss costs one
``str.endswith`` over a tuple of suffixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "API_ANTHROPIC_MESSAGES", "API_GENERIC", "API_LLAMACPP_COMPLETION", "API_LMSTUDIO_V1_CHAT", "API_OLLAMA_CHAT",
    "API_OLLAMA_GENERATE", "API_OPENAI_CHAT", "API_OPENAI_COMPLETIONS", "API_OPENAI_RESPONSES", "API_TGI_GENERATE",
    "API_TGI_GENERATE_STREAM", "OP_CHAT", "OP_GENERATE_CONTENT", "OP_TEXT_COMPLETION", "Route", "match_route",
]

API_OPENAI_CHAT = "openai.chat"
API_OPENAI_COMPLETIONS = "openai.completions"
API_OPENAI_RESPONSES = "openai.responses"
API_ANTHROPIC_MESSAGES = "anthropic.messages"
API_OLLAMA_CHAT = "ollama.chat"
API_OLLAMA_GENERATE = "ollama.generate"
API_LLAMACPP_COMPLETION = "llamacpp.completion"
API_TGI_GENERATE = "tgi.generate"
API_TGI_GENERATE_STREAM = "tgi.generate_stream"
API_LMSTUDIO_V1_CHAT = "lmstudio.v1.chat"
API_GENERIC = "generic"

OP_CHAT = "chat"
OP_TEXT_COMPLETION = "text_completion"
OP_GENERATE_CONTENT = "generate_content"


@dataclass(frozen=True, slots=True)
class Route:
    """What a request path says about the call."""

    api: str
    operation: str
    runtime: str | None


_OPENAI_CHAT = Route(API_OPENAI_CHAT, OP_CHAT, None)
_LMSTUDIO_CHAT = Route(API_OPENAI_CHAT, OP_CHAT, "lmstudio")
_OPENAI_COMPLETIONS = Route(API_OPENAI_COMPLETIONS, OP_TEXT_COMPLETION, None)
_LMSTUDIO_COMPLETIONS = Route(API_OPENAI_COMPLETIONS, OP_TEXT_COMPLETION, "lmstudio")
_OPENAI_RESPONSES = Route(API_OPENAI_RESPONSES, OP_CHAT, None)
_ANTHROPIC = Route(API_ANTHROPIC_MESSAGES, OP_CHAT, None)
_OLLAMA_CHAT = Route(API_OLLAMA_CHAT, OP_CHAT, "ollama")
_OLLAMA_GENERATE = Route(API_OLLAMA_GENERATE, OP_TEXT_COMPLETION, "ollama")
_LLAMACPP = Route(API_LLAMACPP_COMPLETION, OP_TEXT_COMPLETION, "llama.cpp")
_TGI_GENERATE = Route(API_TGI_GENERATE, OP_TEXT_COMPLETION, None)
_TGI_STREAM = Route(API_TGI_GENERATE_STREAM, OP_TEXT_COMPLETION, "tgi")
_LMSTUDIO_V1 = Route(API_LMSTUDIO_V1_CHAT, OP_CHAT, "lmstudio")

# Every built-in route ends with one of these; anything else is a miss.
_QUICK = (
    "/completions", "/completion", "/responses", "/messages", "/chat", "/generate",
    "/generate_stream",
)


def match_route(path: str, extra_routes: Sequence[str] = ()) -> Route | None:
    """Return the Route for ``path`` (query already stripped), or None."""
    if path.__class__ is not str:
        as_str = _as_str(path)
        if as_str is None:
            return None
        path = as_str
    if path.endswith("/") and len(path) > 1:
        path = path.rstrip("/")
    if path.endswith(_QUICK):
        route = _builtin(path)
        if route is not None:
            return route
    if extra_routes:
        suffixes = _extra_suffixes(extra_routes)
        if suffixes and path.endswith(suffixes):
            return _generic(path)
    return None


def _as_str(path: object) -> str | None:
    if isinstance(path, str):
        return str(path)
    if isinstance(path, (bytes, bytearray)):
        return bytes(path).decode("latin-1")
    return None


def _builtin(p: str) -> Route | None:
    if p.endswith("/chat/completions"):
        return _LMSTUDIO_CHAT if p.endswith("/api/v0/chat/completions") else _OPENAI_CHAT
    if p.endswith("/completions"):
        return _completions(p)
    if p.endswith(("/v1/responses", "/openai/responses")):
        return _OPENAI_RESPONSES
    if p.endswith("/v1/messages"):
        return _ANTHROPIC
    if p.endswith("/api/v1/chat"):
        return _LMSTUDIO_V1
    if p.endswith("/api/chat"):
        return _OLLAMA_CHAT
    if p.endswith("/api/generate"):
        return _OLLAMA_GENERATE
    if p.endswith("/generate_stream"):
        return _TGI_STREAM
    if p.endswith("/generate"):
        return _TGI_GENERATE
    if p.endswith("/completion"):
        return _LLAMACPP
    return None


def _completions(p: str) -> Route | None:
    if p.endswith("/api/v0/completions"):
        return _LMSTUDIO_COMPLETIONS
    if p.endswith("/v1/completions") or "/deployments/" in p:
        return _OPENAI_COMPLETIONS
    if p == "/completions":  # llama.cpp alias of /completion
        return _LLAMACPP
    return None


def _extra_suffixes(extra: Sequence[str]) -> tuple[str, ...]:
    if isinstance(extra, str):
        extra = (extra,)
    try:
        return _normalize_extra(extra if isinstance(extra, tuple) else tuple(extra))
    except TypeError:  # unhashable entries
        return ()


@lru_cache(maxsize=64)
def _normalize_extra(extra: tuple[object, ...]) -> tuple[str, ...]:
    out = []
    for item in extra:
        if isinstance(item, str):
            item = item.split("?", 1)[0].rstrip("/")
            if item:
                out.append(item)
    return tuple(out)


@lru_cache(maxsize=256)
def _generic(path: str) -> Route:
    low = path.lower()
    if "generatecontent" in low:
        op = OP_GENERATE_CONTENT
    elif "chat" in low or "message" in low:
        op = OP_CHAT
    elif "complet" in low or "generate" in low:
        op = OP_TEXT_COMPLETION
    else:
        op = OP_CHAT
    return Route(API_GENERIC, op, None)
