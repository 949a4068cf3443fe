"""The gateway's edge: what is refused while a request head is still being read.

uvicorn's HTTP protocol (httptools) reads a whole request head into memory, however large, and
waits forever for a client that connects and sends nothing or half a request line. The
gateway's protocol is uvicorn's with limits applied as bytes arrive, before the application or
any telemetry sees the request:

* a head (request line and headers) over ``max_header_bytes`` is answered 431 and the
  connection closed: memory is bounded by the limit plus one socket read;
* a head not complete ``header_timeout`` seconds after its first byte (or after the connection
  opened) is answered 408, or the connection just closed if it sent nothing;
* beyond ``max_connections`` open connections, or ``max_connections_per_client`` from one
  address, a new connection is answered 503 and closed at once.

Idle kept-alive connections close after uvicorn's ``timeout_keep_alive`` (the ``idle_timeout``
setting), and a body that does not arrive in time is the application's to refuse (408), as it
is the one reading it. These refusals are neither traced nor logged per request (a flood must not
fill a disk): they are counted, and logged once per kind.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from otel_llm.tools._log import log_once

__all__ = ["EdgeLimits", "edge_protocol"]

_HEAD_END = b"\r\n\r\n"
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


@dataclass(frozen=True)
class EdgeLimits:
    max_header_bytes: int = 32 * 1024
    header_timeout: float = 10.0
    max_connections: int = 512
    max_connections_per_client: int = 64


class EdgeCounts:
    """Open connections by client address, and refusals by kind, for one server."""

    def __init__(self) -> None:
        self.by_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()


def edge_protocol(limits: EdgeLimits, counts: EdgeCounts | None = None) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``limits``; pass it as ``uvicorn.Config(http=...)``."""
    shared = counts or EdgeCounts()

    class EdgeProtocol(_Edge):
        _limits = limits
        _counts = shared

    return EdgeProtocol


def _response(status: int, message: str) -> bytes:
    body = ('{"error": {"message": "%s", "type": "bad_request", "code": %d}}' % (message, status)).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))) + body


class _Edge(HttpToolsProtocol):
    _limits: EdgeLimits
    _counts: EdgeCounts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None
        self._in_head = True  # reading a request head (or waiting for the next one)
        self._head_bytes = 0
        self._head_seen = False  # a byte of the current head arrived
        self._tail = b""  # the last bytes of the head so far: a terminator split across reads
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- connection ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits, counts = self._limits, self._counts
        address = self.client[0] if self.client else None
        if len(self.connections) > limits.max_connections:
            self._refuse(503, "too many open connections", "connections")
            return
        if address is not None and counts.by_client[address] >= limits.max_connections_per_client:
            self._refuse(503, "too many open connections from this address", "connections_per_client")
            return
        if address is not None:
            counts.by_client[address] += 1
            self._address = address
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._address is not None:
            by_client = self._counts.by_client
            by_client[self._address] -= 1
            if by_client[self._address] <= 0:
                del by_client[self._address]
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head and not self._within_head_limit(data):
            self._refuse(431, f"request head over {self._limits.max_header_bytes} bytes", "header_size")
            return
        super().data_received(data)

    def _within_head_limit(self, data: bytes) -> bool:
        """Count ``data`` toward the head being read; False once it cannot end within the limit."""
        if not self._head_seen:
            self._head_seen = True
            self._arm_head_timer()
        budget = self._limits.max_header_bytes - self._head_bytes
        if len(data) > budget:
            # past the limit, unless the head ends within it (a body or the next request follows)
            window = self._tail + data
            end = window.find(_HEAD_END)
            if end < 0 or end + len(_HEAD_END) - len(self._tail) > budget:
                return False
        self._head_bytes += len(data)
        self._tail = (self._tail + data)[-3:]
        return True

    # -- parser callbacks (uvicorn's, extended) --------------------------------------------------
    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes, self._head_seen, self._tail = True, 0, False, b""

    # -- refusals --------------------------------------------------------------------------------
    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self._limits.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self._refused or self.transport.is_closing():
            return
        if self._head_seen:
            self._refuse(408, f"request head not received within {self._limits.header_timeout:g} s", "header_timeout")
        else:  # connected and sent nothing: nobody to answer
            self._count("idle_before_request")
            self._refused = True
            self.transport.close()

    def _refuse(self, status: int, message: str, kind: str) -> None:
        self._refused = True
        self._cancel_head_timer()
        self._count(kind)
        try:
            self.transport.write(_response(status, message))
        finally:
            self.transport.close()

    def _count(self, kind: str) -> None:
        self._counts.refused[kind] += 1
        log_once(f"the gateway refused a connection at its edge ({kind}); such refusals are counted, not logged",
                 exc_info=False)
