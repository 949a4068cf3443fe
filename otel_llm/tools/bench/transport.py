"""The HTTP client the load core sends with: aiohttp where it is installed, else httpx.

Both are ordinary clients of the process, so otel_llm traces every request either way. aiohttp is
the default because the load generator shares the machine with the server it measures: with
otel_llm on, an aiohttp stream costs the generator about 0.6x the CPU of an httpx one (64-token
streams from the simulator, 1.1 ms against 1.9 ms per stream), and ``vllm bench serve``, whose
figures the bench's are compared with, sends with aiohttp too. A transport reads the stream and
files each failure under its kind (timeout, unreachable, broken_stream, error, http_<status>).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

__all__ = ["CLIENTS", "Transport", "open_transport", "resolve_client", "tls_verify"]

CLIENTS = ("auto", "aiohttp", "httpx")


class _Record(Protocol):
    status: int | None
    head_at: float | None  # perf-counter time the response's head arrived
    failure: str | None
    detail: str | None
    retries: int


Feed = Callable[[bytes], None]


class Transport(Protocol):
    """One client for a whole level: ``send`` POSTs ``payload`` and feeds the response's bytes as
    they arrive; it never raises for an HTTP or network failure (``record.failure`` says it)."""

    name: str

    async def send(self, url: str, payload: Any, headers: Mapping[str, str], record: _Record, feed: Feed) -> None:
        """The request, sent once more when a kept-alive connection was closed before any answer."""

    async def close(self) -> None:
        """Close the client's connections."""


def tls_verify() -> ssl.SSLContext | bool:
    """The certificates to trust: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set (a local CA), else
    the client's default. Proxy variables stay ignored (``trust_env=False``): a benchmark measures
    the path to the server it names."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if not cafile and not capath:
        return True
    return ssl.create_default_context(cafile=cafile or None, capath=capath or None)


def _error_text(body: bytes) -> str:
    return " ".join(body.decode("utf-8", "replace").split())[:200]


async def _once_more(attempt: Callable[[bool], Awaitable[None]], record: _Record,
                     closed: tuple[type[BaseException], ...], refused: type[BaseException] | None = None) -> None:
    """``attempt(False)``, made once more as ``attempt(True)`` on a new connection (counted in
    ``record.retries``) when it failed with ``closed`` before any response: a kept-alive connection
    the server closed just as the request went out on it. llama.cpp closes the connection after
    every streamed answer without saying so (no ``Connection: close``), so on a loaded machine the
    next request of a closed loop sometimes reaches a socket already half closed; after a level of
    four, the pool holds several such sockets, so the second try must not take another of them. A
    refused connection (``refused``) is not retried."""
    for again in (False, True):
        try:
            await attempt(again)
            return
        except closed as exc:
            if again or record.status is not None or (refused is not None and isinstance(exc, refused)):
                raise
            record.retries += 1


class _Httpx:
    name = "httpx"

    def __init__(self, timeout: float) -> None:
        import httpx

        self._httpx = httpx
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits,
                                         trust_env=False, verify=tls_verify())
        self._fresh: Any = None  # for a second try: keeps no connection, so it always opens one

    async def send(self, url: str, payload: Any, headers: Mapping[str, str], record: _Record, feed: Feed) -> None:
        httpx = self._httpx
        try:
            await self._send(url, payload, headers, record, feed)
        except httpx.TimeoutException as exc:
            record.failure, record.detail = "timeout", str(exc) or type(exc).__name__
        except httpx.ConnectError as exc:
            record.failure, record.detail = "unreachable", str(exc) or type(exc).__name__
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            record.failure, record.detail = "broken_stream", f"{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            record.failure, record.detail = "error", f"{type(exc).__name__}: {exc}"

    async def _send(self, url: str, payload: Any, headers: Mapping[str, str], record: _Record, feed: Feed) -> None:
        async def attempt(fresh: bool) -> None:
            client = self._fresh_client() if fresh else self._client
            async with client.stream("POST", url, json=payload, headers=dict(headers)) as response:
                record.status, record.head_at = response.status_code, time.perf_counter()
                if response.status_code >= 400:
                    record.failure = f"http_{response.status_code}"
                    record.detail = _error_text(await response.aread())
                else:
                    async for data in response.aiter_raw():
                        feed(data)

        await _once_more(attempt, record, (self._httpx.RemoteProtocolError,))

    def _fresh_client(self) -> Any:
        if self._fresh is None:
            httpx = self._httpx
            self._fresh = httpx.AsyncClient(
                timeout=self._client.timeout, limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
                trust_env=False, verify=tls_verify())
        return self._fresh

    async def close(self) -> None:
        await self._client.aclose()
        if self._fresh is not None:
            await self._fresh.aclose()


class _Aiohttp:
    name = "aiohttp"

    def __init__(self, timeout: float) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        # httpx's read timeout is a limit between bytes, not on the whole answer: sock_read is that
        self._timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=timeout)
        self._session = self._open(force_close=False)
        self._fresh: Any = None  # for a second try: closes every connection after use

    def _open(self, force_close: bool) -> Any:
        aiohttp = self._aiohttp
        connector = aiohttp.TCPConnector(limit=0, ssl=tls_verify(), force_close=force_close)
        return aiohttp.ClientSession(timeout=self._timeout, connector=connector, trust_env=False)

    async def send(self, url: str, payload: Any, headers: Mapping[str, str], record: _Record, feed: Feed) -> None:
        aiohttp = self._aiohttp
        try:
            await self._send(url, payload, headers, record, feed)
        except asyncio.TimeoutError as exc:  # aiohttp's read and connect timeouts both
            record.failure, record.detail = "timeout", str(exc) or type(exc).__name__
        except aiohttp.ClientConnectorError as exc:
            record.failure, record.detail = "unreachable", str(exc) or type(exc).__name__
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            record.failure, record.detail = "broken_stream", f"{type(exc).__name__}: {exc}"
        except aiohttp.ClientError as exc:
            record.failure, record.detail = "error", f"{type(exc).__name__}: {exc}"

    async def _send(self, url: str, payload: Any, headers: Mapping[str, str], record: _Record, feed: Feed) -> None:
        async def attempt(fresh: bool) -> None:
            if fresh and self._fresh is None:
                self._fresh = self._open(force_close=True)
            session = self._fresh if fresh else self._session
            async with session.post(url, json=payload, headers=dict(headers)) as response:
                record.status, record.head_at = response.status, time.perf_counter()
                if response.status >= 400:
                    record.failure = f"http_{response.status}"
                    record.detail = _error_text(await response.read())
                else:
                    async for data in response.content.iter_any():
                        feed(data)

        aiohttp = self._aiohttp
        await _once_more(attempt, record, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError),
                         aiohttp.ClientConnectorError)

    async def close(self) -> None:
        await self._session.close()
        if self._fresh is not None:
            await self._fresh.close()


def _aiohttp_installed() -> bool:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_client(client: str) -> str:
    """The client ``client`` names: "auto" is aiohttp when it is installed, else httpx."""
    if client not in CLIENTS:
        raise ValueError(f"unknown HTTP client {client!r}: one of {', '.join(CLIENTS)}")
    if client == "auto":
        return "aiohttp" if _aiohttp_installed() else "httpx"
    return client


def open_transport(client: str, timeout: float) -> Transport:
    """The transport ``client`` names (see ``resolve_client``), made inside the running event loop
    (aiohttp binds its session to it)."""
    return _Aiohttp(timeout) if resolve_client(client) == "aiohttp" else _Httpx(timeout)
