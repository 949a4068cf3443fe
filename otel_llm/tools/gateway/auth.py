"""Who is calling (authentication) and what they may do (routes, models): pure functions over
the request head and body, so every rule is testable without a server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

from otel_llm.tools.gateway.settings import KeyPolicy, split_route
from otel_llm.tools.gateway.keys import match_key
from otel_llm.parse.routes import match_route

__all__ = ["Denied", "KeyStore", "check_model", "check_path", "check_route", "credentials", "default_methods"]

# A model route is called with POST; the other routes of the runtimes' APIs (model lists, state,
# show, embeddings, tokenize) with GET or POST. DELETE (Ollama's /api/delete), PUT, PATCH, TRACE,
# OPTIONS and the rest must be named in a key's route.
_MODEL_METHODS = frozenset({"POST"})
_OTHER_METHODS = frozenset({"GET", "HEAD", "POST"})
_BODYLESS = frozenset({"GET", "HEAD"})

_MAX_SECRET = 512  # longer "keys" are rejected without hashing them


class Denied(Exception):
    """A request refused before any byte reaches the runtime."""

    def __init__(self, status: int, outcome: str, message: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.outcome = outcome
        self.message = message
        self.headers = tuple(headers)


_CHALLENGE = ("www-authenticate", 'Bearer realm="otel-llm-gateway"')
_INVALID = ("www-authenticate", 'Bearer realm="otel-llm-gateway", error="invalid_token"')


def credentials(headers: Sequence[tuple[bytes, bytes]]) -> str:
    """The one secret presented (``Authorization: Bearer`` or ``x-api-key``); Denied otherwise."""
    found: set[str] = set()
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Denied(401, "unauthorized", "use 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                             [_INVALID])
            found.add(token.strip())
        elif name == b"x-api-key":
            found.add(value.decode("latin-1").strip())
    if not found:
        raise Denied(401, "unauthorized", "an API key is required", [_CHALLENGE])
    if len(found) > 1:
        raise Denied(400, "bad_request", "more than one different API key was presented")
    secret = found.pop()
    if not secret or len(secret) > _MAX_SECRET:
        raise Denied(401, "unauthorized", "invalid API key", [_INVALID])
    return secret


class KeyStore:
    """The configured keys, looked up by digest in constant time."""

    def __init__(self, policies: Sequence[KeyPolicy]) -> None:
        self._entries = [(policy.digest, policy) for policy in policies]

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, secret: str) -> KeyPolicy:
        policy = match_key(secret, self._entries)
        if policy is None:
            raise Denied(401, "unauthorized", "invalid API key", [_INVALID])
        return policy


def check_path(path: str, raw_path: bytes | None) -> None:
    """Refuse paths whose meaning an upstream could normalize differently from our glob match
    (``..``, ``.``, empty segments, backslashes, encoded slashes): no route check bypass."""
    if not path.startswith("/") or "\\" in path or "\x00" in path:
        raise Denied(400, "bad_request", "malformed request path")
    segments = path.split("/")[1:]
    if any(s in (".", "..") for s in segments) or "//" in path:
        raise Denied(400, "bad_request", "request paths must not contain '.', '..' or empty segments")
    if raw_path is not None:
        lowered = raw_path.lower()
        if b"%2f" in lowered or b"%5c" in lowered or b"%2e" in lowered or b"%00" in lowered:
            raise Denied(400, "bad_request", "encoded '/', '\\', '.' or NUL in the request path")


def default_methods(path: str) -> frozenset[str]:
    """The methods a route without named methods allows: those its API is called with."""
    return _MODEL_METHODS if match_route(path) is not None else _OTHER_METHODS


def check_route(policy: KeyPolicy, path: str, method: str = "POST") -> None:
    """The key's routes (``[METHODS ]GLOB``) allow ``method`` on ``path``; Denied (403) otherwise."""
    path_allowed = False
    for route in policy.routes:
        methods, pattern = split_route(route)
        if not fnmatchcase(path, pattern):
            continue
        path_allowed = True
        if method in (methods if methods is not None else default_methods(path)) or methods == frozenset("*"):
            return
    if path_allowed:
        raise Denied(403, "forbidden", f"this key may not use {method} on {path}")
    raise Denied(403, "forbidden", f"this key may not use {path}")


def _no_duplicate_model(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # case-insensitive: Go's encoding/json (Ollama) also binds "Model" or "MODEL" to the field
    if sum(1 for k, _ in pairs if k.lower() == "model") > 1:
        raise ValueError("duplicate 'model'")
    return dict(pairs)


def check_model(policy: KeyPolicy, body: bytes, method: str = "POST") -> str | None:
    """The requested model, when the key's models are restricted and the body names an allowed one.

    With restricted models, every request but a bodyless GET or HEAD (a model list) must be one
    JSON object naming an allowed model: an empty body, one the gateway cannot read, or one with
    two ``model`` fields (parsers disagree on which wins) is refused rather than passed to a
    runtime that might read it differently."""
    if policy.models is None:
        return None
    if method in _BODYLESS and not body:
        return None
    if not body.strip():
        raise Denied(400, "bad_request", "the request body must be one JSON object naming a model")
    try:
        data = json.loads(body, object_pairs_hook=_no_duplicate_model)
    except (ValueError, RecursionError):
        raise Denied(400, "bad_request", "the request body must be one JSON object") from None
    if not isinstance(data, dict):
        raise Denied(400, "bad_request", "the request body must be one JSON object")
    model = data.get("model")
    if not isinstance(model, str) or model not in policy.models:
        raise Denied(403, "forbidden", "this key may not use that model" if model else
                     "this key is restricted to named models; the request names none")
    return model
