"""HTTPS through a host name: DNS, TCP connect and the TLS handshake each get their own phase
span (with TLS and DNS details), and a reused connection has none of them."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import httpx
import httpx2
import pytest

from otel_llm import semconv as sc
from otel_llm_testing.model_server import TLS_TOKENS
from otel_llm_testing.otel import Otel
from otel_llm_testing.model_server import ModelServer

NEW_CONNECTION = [sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT,
                  sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
REUSED = [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
BODY = {"model": "tls-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
TOKENS = TLS_TOKENS  # what the tls_server fixture streams


def _sync_calls(client: Any, url: str) -> None:
    for _ in range(2):
        with client.stream("POST", url, json=BODY) as response:
            assert response.status_code == 200
            assert b"tok0" in response.read()


async def _async_calls(client: Any, url: str) -> None:
    for _ in range(2):
        async with client.stream("POST", url, json=BODY) as response:
            assert response.status_code == 200
            assert b"tok0" in await response.aread()


def _run(kind: str, context: ssl.SSLContext, url: str) -> None:
    module = httpx if kind.startswith("httpx-") else httpx2
    if kind.endswith("-sync"):
        with module.Client(verify=context, timeout=10) as client:
            _sync_calls(client, url)
        return

    async def main() -> None:
        async with module.AsyncClient(verify=context, timeout=10) as client:
            await _async_calls(client, url)

    asyncio.run(main())


def _names(otel: Otel, call: Any) -> list[str]:
    # a pool wait appears only when getting a connection took over 1 ms; it is not the point here
    return [k.name for k in otel.children(call) if k.name != sc.SPAN_POOL_WAIT]


@pytest.mark.parametrize("kind", ["httpx-sync", "httpx2-sync", "httpx-async", "httpx2-async"])
def test_https_by_host_name(otel: Otel, tls_server: ModelServer, client_context: ssl.SSLContext, kind: str) -> None:
    """First call: dns, connect, tls, upload, server_wait, first_token, decode; second call reuses."""
    url = tls_server.url("/v1/chat/completions", host="localhost")
    tls_server.requests.clear()
    _run(kind, client_context, url)
    calls = sorted(otel.calls(), key=lambda s: s.start_time)
    assert len(calls) == 2
    first, second = calls

    assert _names(otel, first) == NEW_CONNECTION
    attrs = first.attributes
    assert attrs[sc.LLM_CLIENT_CONNECTION_REUSED] is False
    assert attrs[sc.SERVER_ADDRESS] == "localhost"
    assert attrs[sc.URL_FULL] == url
    assert attrs[sc.NETWORK_PEER_ADDRESS] == "127.0.0.1"
    assert attrs[sc.LLM_CLIENT_CHUNKS] == TOKENS
    kids = {k.name: k for k in otel.children(first)}
    assert kids[sc.SPAN_DNS].attributes[sc.DNS_QUESTION_NAME] == "localhost"
    tls = kids[sc.SPAN_TLS].attributes
    assert tls[sc.TLS_PROTOCOL_VERSION] in ("TLSv1.2", "TLSv1.3")
    assert tls[sc.TLS_CIPHER]
    assert tls[sc.TLS_NEXT_PROTOCOL] == "http/1.1"
    ordered = otel.children(first)
    assert ordered[0].start_time == first.start_time and ordered[-1].end_time == first.end_time
    for earlier, later in zip(ordered, ordered[1:]):
        assert earlier.end_time == later.start_time  # the phases tile the call

    assert _names(otel, second) == REUSED
    assert second.attributes[sc.LLM_CLIENT_CONNECTION_REUSED] is True
    assert len(tls_server.requests) == 2
