"""Minimal HTTP/1.1 on asyncio streams: request parsing, keep-alive, chunked and buffered writes."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import zlib
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

__all__ = [
    "BadRequest", "BufferPolicy", "ChunkedStream", "ClientGone", "Request", "Responder", "read_request", "set_nodelay",
]

log = logging.getLogger("otel_llm.sim")


class ClientGone(Exception):
    """The peer closed the connection while we were answering."""


class BadRequest(Exception):
    """The request could not be parsed."""


@dataclass
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    body: bytes
    arrival: float = 0.0

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else {}


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    """Read one request; None on a clean EOF between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadRequest("truncated request head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise BadRequest("request head too large") from exc
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError as exc:
        raise BadRequest(f"bad request line {lines[0]!r}") from exc
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    path, _, query = target.partition("?")
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = await _read_body(reader, headers)
    arrival = asyncio.get_running_loop().time()
    return Request(method.upper(), path, query, version, headers, body, arrival)


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(headers.get("content-length", "0") or "0")
    return await reader.readexactly(length) if length else b""


def _head(status: int, headers: dict[str, str]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:  # an unusual injected error_status
        reason = "Status"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Responder:
    """Writes the answer to one request on a kept-alive connection."""

    def __init__(self, writer: asyncio.StreamWriter, keep_alive: bool, head_only: bool = False) -> None:
        self.writer = writer
        self.keep_alive = keep_alive
        self.head_only = head_only
        self.started = False
        self.encoding = ""  # "gzip" or "deflate": the body is sent compressed (set per answer)

    def compressor(self) -> Any:
        """A compressor for this answer's body, or None (zlib: gzip or zlib-wrapped deflate)."""
        if not self.encoding:
            return None
        return zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16 if self.encoding == "gzip" else zlib.MAX_WBITS)

    def _encoding_headers(self) -> dict[str, str]:
        return {"Content-Encoding": self.encoding, "Vary": "Accept-Encoding"} if self.encoding else {}

    def _base_headers(self) -> dict[str, str]:
        return {"Server": "otel-llm-sim", "Connection": "keep-alive" if self.keep_alive else "close"}

    async def write(self, data: bytes) -> None:
        if self.writer.transport.is_closing():
            raise ClientGone()
        self.writer.write(data)
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise ClientGone() from exc

    async def send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        """A complete response with Content-Length."""
        compressor = self.compressor()
        if compressor is not None:
            body = compressor.compress(body) + compressor.flush()
        all_headers = {**self._base_headers(), **self._encoding_headers(), "Content-Type": content_type,
                       "Content-Length": str(len(body))}
        all_headers.update(headers or {})
        self.started = True
        await self.write(_head(status, all_headers) + (b"" if self.head_only else body))

    async def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        await self.send(status, body, "application/json", headers)

    async def start_stream(
        self, status: int, content_type: str, headers: dict[str, str], buffer: BufferPolicy | None
    ) -> ChunkedStream:
        all_headers = {**self._base_headers(), **self._encoding_headers(), "Content-Type": content_type,
                       "Transfer-Encoding": "chunked"}
        all_headers.update(headers)
        self.started = True
        await self.write(_head(status, all_headers))
        return ChunkedStream(self, buffer, self.compressor())

    def abort(self) -> None:
        """Close (FIN) without finishing the response, like a runtime worker that died mid-answer."""
        self.keep_alive = False
        self.writer.transport.close()


@dataclass
class BufferPolicy:
    """Hold frames and release them every ``interval`` seconds or every ``frames`` frames (0 = never)."""

    interval: float = 0.0
    frames: int = 0


@dataclass
class ChunkedStream:
    """A chunked body; with a buffer policy it releases frames in bursts like a buffering proxy."""

    responder: Responder
    buffer: BufferPolicy | None
    compressor: Any = None  # each write is flushed (Z_SYNC_FLUSH): a client can decode it at once
    _held: list[bytes] = field(default_factory=list)
    _ticker: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        if self.buffer and self.buffer.interval > 0:
            self._ticker = asyncio.get_running_loop().create_task(self._tick(self.buffer.interval))

    async def send(self, frames: list[bytes]) -> None:
        if self.buffer is None:
            await self._write(frames)
            return
        self._held += frames
        if self.buffer.frames and len(self._held) >= self.buffer.frames:
            await self.flush()

    async def flush(self) -> None:
        held, self._held = self._held, []
        await self._write(held)

    async def finish(self) -> None:
        self._stop_ticker()
        await self.flush()
        tail = self.compressor.flush() if self.compressor is not None else b""
        await self.responder.write((b"%x\r\n%s\r\n" % (len(tail), tail) if tail else b"") + b"0\r\n\r\n")

    async def abort(self) -> None:
        """Deliver what was sent so far, then drop the connection."""
        self._stop_ticker()
        await self.flush()
        self.responder.abort()

    async def _write(self, frames: list[bytes]) -> None:
        # One write per batch: each frame becomes a chunk, all leave in one segment (TCP_NODELAY).
        # Compressed, the batch is one chunk of whatever the compressor flushed for it.
        if self.compressor is not None:
            frames = [self.compressor.compress(b"".join(frames)) + self.compressor.flush(zlib.Z_SYNC_FLUSH)]
        data = b"".join(b"%x\r\n%s\r\n" % (len(frame), frame) for frame in frames if frame)
        if data:
            await self.responder.write(data)

    async def _tick(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        try:
            while True:
                deadline += interval
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                await self.flush()
        except ClientGone:
            log.debug("client went away during a buffered flush")

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None


def set_nodelay(writer: asyncio.StreamWriter) -> None:
    """Disable Nagle so every frame leaves as soon as it is written."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
