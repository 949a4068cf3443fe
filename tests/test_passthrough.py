"""Property: whatever bytes a server streams, in whatever chunks, the application reads exactly
those bytes, no exception from otel_llm reaches it, and exactly one call span ends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Otel

ROUTES = ["/v1/chat/completions", "/api/chat", "/completion", "/generate_stream", "/api/v1/chat", "/v1/messages"]
CONTENT_TYPES = ["text/event-stream", "application/x-ndjson", "application/json"]
_TOKENISH = st.sampled_from([b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', b"\n\n", b"\n", b"data:", b'"content":"',
                             b'{"done":true}\n', b"data: [DONE]\n\n", b"event: message.delta\n", b'"text":"y"'])


class ChunkServer:
    """Answers each request with the next queued (content type, chunks), chunked and flushed."""

    def __init__(self) -> None:
        self.plans: list[tuple[str, list[bytes]]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            if not head.startswith(b"POST"):  # e.g. an observer probing /metrics: not ours to answer
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            content_type, chunks = self.plans.pop(0)
            conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".encode())
            for chunk in chunks:
                if chunk:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[ChunkServer]:
    srv = ChunkServer()
    yield srv
    srv.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.one_of(st.binary(max_size=300), _TOKENISH), max_size=25),
       route=st.sampled_from(ROUTES), content_type=st.sampled_from(CONTENT_TYPES), stream=st.booleans())
def test_bytes_pass_through_unchanged(server: ChunkServer, otel: Otel, chunks: list[bytes], route: str,
                                      content_type: str, stream: bool) -> None:
    otel.clear()
    server.plans.append((content_type, chunks))
    with httpx.Client() as client:
        if stream:
            with client.stream("POST", f"http://127.0.0.1:{server.port}{route}", json={"model": "m", "stream": True}) as r:
                received = b"".join(r.iter_raw())
        else:
            received = client.post(f"http://127.0.0.1:{server.port}{route}", json={"model": "m"}).content
    assert received == b"".join(chunks)
    assert len(otel.calls()) == 1
