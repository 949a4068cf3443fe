"""Forwarding: which headers cross the gateway, and the streaming pass-through upstream.

Bytes are relayed as they arrive (the payload as ``upstream.Upstream`` yields it: no decoding, no
re-chunking, no buffering).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

__all__ = ["FORWARDING", "HOP_BY_HOP", "request_headers", "response_headers"]

Send = Callable[[dict[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1 connection-specific headers, plus what the gateway sets itself
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
# never forwarded upstream: the caller's credentials are for the gateway, not for the runtime
_CREDENTIALS = frozenset({"authorization", "x-api-key", "cookie"})
# what a proxy says about the request (who sent it, to which host and URL, by which method): from a
# caller they are claims, and a runtime or framework that trusts them could log, rate-limit or route
# by a forged address, or run another method or path than the one the gateway authorized
FORWARDING = frozenset({
    "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
    "x-forwarded-prefix", "x-forwarded-server", "x-forwarded-scheme", "x-forwarded-ssl", "x-real-ip",
    "x-client-ip", "true-client-ip", "cf-connecting-ip", "x-cluster-client-ip", "x-original-url",
    "x-original-uri", "x-rewrite-url", "x-original-host", "x-original-method", "x-http-method-override",
    "x-http-method", "x-method-override",
})
_REQUEST_DROP_UNAUTHENTICATED = (HOP_BY_HOP | FORWARDING
                                 | {"host", "content-length", "expect", "traceparent", "tracestate"})
_REQUEST_DROP = _REQUEST_DROP_UNAUTHENTICATED | _CREDENTIALS
_RESPONSE_DROP = HOP_BY_HOP | {"set-cookie", "server-timing", "x-accel-buffering"}


def _named_by_connection(headers: Iterable[tuple[str, str]]) -> set[str]:
    named: set[str] = set()
    for name, value in headers:
        if name == "connection":
            named.update(token.strip().lower() for token in value.split(","))
    return named


def request_headers(headers: Sequence[tuple[bytes, bytes]], client: tuple[str, int] | None,
                    scheme: str, upstream_key: str | None, authenticated: bool = True) -> list[tuple[str, str]]:
    """The caller's headers as the runtime should see them. ``authenticated=False`` (the proxy
    without keys): the caller's credentials are the runtime's, and pass (unless ``upstream_key``)."""
    decoded = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers]
    drop = (_REQUEST_DROP if authenticated or upstream_key else _REQUEST_DROP_UNAUTHENTICATED) \
        | _named_by_connection(decoded)
    # "X_Forwarded_For" too: CGI-style servers (WSGI, PHP) read "_" and "-" alike
    out = [(n, v) for n, v in decoded if n not in drop and n.replace("_", "-") not in drop]
    if client:
        out.append(("x-forwarded-for", client[0]))
        host = f'"[{client[0]}]"' if ":" in client[0] else client[0]
        out.append(("forwarded", f"for={host};proto={scheme}"))
    else:
        out.append(("forwarded", f"proto={scheme}"))
    out.append(("x-forwarded-proto", scheme))
    if upstream_key:
        out.append(("authorization", f"Bearer {upstream_key}"))
    return out


def response_headers(headers: Iterable[tuple[bytes, bytes]], server_timing: str) -> list[tuple[bytes, bytes]]:
    """The runtime's headers as the caller should see them, plus the gateway's own."""
    pairs = list(headers)
    named = _named_by_connection((n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in pairs)
    drop = _RESPONSE_DROP | named
    out = [(n.lower(), v) for n, v in pairs if n.decode("latin-1").lower() not in drop]
    out.append((b"x-accel-buffering", b"no"))
    out.append((b"server-timing", server_timing.encode("ascii")))
    return out
