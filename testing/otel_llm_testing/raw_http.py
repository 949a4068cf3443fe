"""Raw HTTP for the gateway's tests: an upstream that records every request exactly as it arrived,
a client that sends any bytes and reads the answer as they come, and the gateway child's environment."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = ["RecordingUpstream", "Reply", "Seen", "error_of", "gateway_env", "raw_request", "request_bytes"]


@dataclass
class Seen:
    """One request as it arrived at the recording upstream."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    head: bytes
    body: bytes

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n == name]


class RecordingUpstream:
    """Loopback HTTP/1.1 server recording every request (one per connection, no size limits);
    answers 200 JSON with a Set-Cookie and its own Server-Timing, after ``x-test-delay`` seconds."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._accept, name="recording-upstream", daemon=True)
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def _accept(self) -> None:
        self._sock.settimeout(0.05)  # a blocked accept() would not notice close()
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(15)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method, target, _ = lines[0].decode("latin-1").split(" ", 2)
                headers = []
                for line in lines[1:]:
                    name, _, value = line.decode("latin-1").partition(":")
                    headers.append((name.strip().lower(), value.strip()))
                fields = dict(headers)
                if fields.get("transfer-encoding", "").lower() == "chunked":
                    while not body.endswith(b"0\r\n\r\n"):
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                else:
                    length = int(fields.get("content-length") or 0)
                    while len(body) < length:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                with self._lock:
                    self.seen.append(Seen(method, target, headers, head, body))
                time.sleep(float(fields.get("x-test-delay") or 0))
                payload = json.dumps({"ok": True}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Set-Cookie: upstream-session=1\r\nServer-Timing: upstream-internal;dur=1\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(payload), payload))
            except (OSError, ValueError):
                return

    def __enter__(self) -> RecordingUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self._thread.join(5)
        self._sock.close()


@dataclass
class Reply:
    """What ``raw_request`` read: the bytes, and the status, headers and body where they parse."""

    raw: bytes
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def raw_request(url: str, data: bytes, timeout: float = 15) -> Reply:
    """Send ``data`` as is and read until the server closes the connection."""
    parts = urlsplit(url)
    received = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as conn:
        try:
            conn.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while chunk := conn.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    reply = Reply(received)
    if received.startswith(b"HTTP/1."):
        head, _, reply.body = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        reply.status = int(lines[0].split(" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            reply.headers[name.strip().lower()] = value.strip()
    return reply


def request_bytes(method: str, target: str, key: str | None, *lines: str, body: bytes = b"",
                  host: str = "gateway") -> bytes:
    """A request's bytes as written (``key``: a bearer token), ``lines`` more header lines."""
    head = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    if key is not None:
        head.append(f"Authorization: Bearer {key}")
    head += [*lines, "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def error_of(response: httpx.Response | Reply) -> dict[str, Any]:
    """The ``error`` object of a JSON error answer."""
    body = response.content if isinstance(response, httpx.Response) else response.body
    return json.loads(body)["error"]


def gateway_env(workdir: Path, name: str, **extra: str) -> dict[str, str]:
    """A gateway child's environment: no observers, its spans to ``workdir/<name>-traces.jsonl``."""
    return {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_GPU_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
            "OTEL_LLM_TRACES_FILE": str(workdir / f"{name}-traces.jsonl"), **extra}
