"""A fake model runtime on loopback for the observers' tests: canned answers per path (its
``/metrics`` and the like, taken from ``tests/fixtures/observers/``), requests counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_llm_testing.net import LOOPBACK
from otel_llm_testing.subprocesses import REPO

__all__ = ["FIXTURES", "Canned", "FakeRuntime", "fake_runtime", "observer_fixture"]

FIXTURES = REPO / "tests" / "fixtures" / "observers"


def observer_fixture(name: str) -> str:
    """The text of ``tests/fixtures/observers/<name>`` (a runtime's recorded /metrics...)."""
    return (FIXTURES / name).read_text()


@dataclass
class Canned:
    """One canned answer."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; version=0.0.4"


@dataclass
class FakeRuntime:
    """Answers GET <path> with ``routes[path]`` (404 otherwise) and counts requests per path."""

    routes: dict[str, Canned] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    port: int = 0

    def serve(self, path: str, body: str | bytes, status: int = 200,
              content_type: str = "text/plain; version=0.0.4") -> None:
        self.routes[path] = Canned(status, body.encode() if isinstance(body, str) else body, content_type)


def _handler(fake: FakeRuntime) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            """Quiet."""

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            fake.hits[self.path] = fake.hits.get(self.path, 0) + 1
            self._answer(fake.routes.get(self.path, Canned(404, b'{"error":"not found"}', "application/json")))

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            """A model call: answered from ``routes["POST <path>"]``; not counted in ``hits``."""
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer(fake.routes.get(f"POST {self.path}",
                                         Canned(404, b'{"error":"not found"}', "application/json")))

        def _answer(self, canned: Canned) -> None:
            self.send_response(canned.status)
            self.send_header("Content-Type", canned.content_type)
            self.send_header("Content-Length", str(len(canned.body)))
            self.end_headers()
            self.wfile.write(canned.body)

    return Handler


@contextmanager
def fake_runtime() -> Iterator[FakeRuntime]:
    """A ``FakeRuntime`` listening on 127.0.0.1 (its ``port``) until the block ends."""
    state = FakeRuntime()
    httpd = ThreadingHTTPServer((LOOPBACK, 0), _handler(state))
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
