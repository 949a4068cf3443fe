"""Loopback model servers for the integration tests.

* ``ModelServer``: an HTTP/1.1 (optionally TLS) OpenAI-style chat server that records every
  request's headers and answers JSON or an SSE stream.
* ``PlanServer``: answers each POST with the next queued ``Plan``, any bytes and framing.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_llm_testing.net import LOOPBACK

__all__ = ["TLS_TOKENS", "ModelServer", "Plan", "PlanServer", "RecordedRequest"]

TLS_TOKENS = 4  # the tokens each answer of the suite's ``tls_server`` fixture streams

@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def _sse(obj: Any) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


class _ModelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ModelHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet."""

    def _record(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.owner.requests.append(RecordedRequest(self.command, self.path, headers, body))
        return body

    def _send_json(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._record()
        self._send_json({"object": "list", "data": [{"id": "tiny-model", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = self._record()
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        model = request.get("model", "tiny-model")
        owner = self.server.owner
        if request.get("stream"):
            self._stream(model, owner)
            return
        text = " ".join(f"tok{i}" for i in range(owner.tokens))
        self._send_json({
            "id": "chatcmpl-tiny", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": owner.tokens, "total_tokens": 3 + owner.tokens},
        })

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, model: str, owner: ModelServer) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse({"id": "chatcmpl-tiny", "object": "chat.completion.chunk", "created": 1, "model": model,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        self._chunk(frame({"role": "assistant", "content": ""}))
        time.sleep(owner.first_token_delay)
        for i in range(owner.tokens):
            if i:
                time.sleep(owner.token_interval)
            self._chunk(frame({"content": f"tok{i}" if i == 0 else f" tok{i}"}))
        self._chunk(frame({}, "stop") + _sse("[DONE]"))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _ModelHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: ModelServer, ssl_context: ssl.SSLContext | None) -> None:
        self.owner = owner
        self.ssl_context = ssl_context
        super().__init__((LOOPBACK, 0), _ModelHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(10)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.do_handshake()  # in the connection's thread, not the accept loop
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients closing mid-stream are normal here."""


class ModelServer:
    """OpenAI-style chat server on 127.0.0.1 (TLS if ``ssl_context``); use as a context manager."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, *, tokens: int = 5,
                 first_token_delay: float = 0.02, token_interval: float = 0.005) -> None:
        self.tokens = tokens
        self.first_token_delay = first_token_delay
        self.token_interval = token_interval
        self.requests: list[RecordedRequest] = []
        self._server = _ModelHTTPServer(self, ssl_context)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="model-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "", host: str = LOOPBACK) -> str:
        scheme = "https" if self._server.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)



@dataclass
class Plan:
    status: int
    headers: list[tuple[str, str]]
    chunks: list[bytes]
    chunked: bool = True
    repeat: int = 1  # send the chunks this many times (an endless stream without storing it)


class PlanServer:
    """Answers each POST with the next queued Plan, each chunk flushed on its own (raw socket,
    so any bytes and framing can be sent); anything else (an observer probing ``/metrics``) gets 404."""

    def __init__(self) -> None:
        self.plans: list[Plan] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, name="plan-server", daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            if not head.startswith(b"POST"):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            plan = self.plans.pop(0)
            lines = [f"HTTP/1.1 {plan.status} X", "connection: close", *(f"{k}: {v}" for k, v in plan.headers)]
            total = sum(map(len, plan.chunks)) * plan.repeat
            lines.append("transfer-encoding: chunked" if plan.chunked else f"content-length: {total}")
            try:
                conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                for _ in range(plan.repeat):
                    for chunk in plan.chunks:
                        if not chunk:
                            continue
                        if plan.chunked:
                            conn.sendall(b"%x\r\n" % len(chunk))
                            conn.sendall(chunk)
                            conn.sendall(b"\r\n")
                        else:
                            conn.sendall(chunk)
                if plan.chunked:
                    conn.sendall(b"0\r\n\r\n")
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
