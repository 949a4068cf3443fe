"""What the capture adapters' unit tests share: a fake CallSink (the adapters patched for real,
handing model calls to it instead of otel_llm's telemetry), the requests they send, and entries
for a fake resolver (the fixtures that install them are in ``tests/capture/conftest.py``)."""

from __future__ import annotations

import gc
import socket
from typing import Any

from otel_llm.capture.call import CallRecord, LlmCall
from otel_llm.capture.hooks import flush_collected
from otel_llm.parse import routes

__all__ = ["CHAT", "CHAT_PATH", "MARK", "NAME", "STREAM", "FakeSink", "addrinfo"]

MARK = "x-otel-llm-test"  # what the fake sink writes into a model call's request headers
CHAT_PATH = "/v1/chat/completions"
STREAM: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
NAME = "llm.test"  # resolved by the fake resolver fixture, never by a real one


class FakeSink:
    """A CallSink that keeps what the adapter hands over, and can fail on request."""

    def __init__(self) -> None:
        self.capture_content = False
        self.paths: list[str] = []
        self.started: list[LlmCall] = []
        self.records: list[CallRecord] = []
        self.fail_in: str | None = None

    def route(self, path: str) -> routes.Route | None:
        self.paths.append(path)
        if self.fail_in == "route":
            raise RuntimeError("sink bug in route")
        return routes.match_route(path)

    def call_started(self, call: LlmCall) -> None:
        if self.fail_in == "call_started":
            raise RuntimeError("sink bug in call_started")
        self.started.append(call)
        call.request.headers[MARK] = "1"

    def call_finished(self, record: CallRecord) -> None:
        self.records.append(record)

    def one(self) -> CallRecord:
        gc.collect()
        assert flush_collected(5.0)
        assert len(self.records) == 1, [r.end_reason for r in self.records]
        return self.records[0]


def addrinfo(ip: str, port: int) -> tuple[Any, ...]:
    """One ``getaddrinfo`` entry, as the real resolver gives it."""
    if ":" in ip:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
