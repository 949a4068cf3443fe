"""What the capture tests share: a fake CallSink for the adapters (patched for real, handing model
calls to it instead of otel_llm's telemetry), the requests they send, entries for a fake resolver
(the fixtures that install them are in ``tests/capture/conftest.py``), and a sink and a request
for an ``LlmCall`` driven on its own."""

from __future__ import annotations

import gc
import socket
from typing import Any

from otel_llm.capture.call import CallRecord, CallRequest, LlmCall
from otel_llm.capture.shared import flush_collected
from otel_llm.parse import routes

__all__ = ["CHAT", "CHAT_PATH", "CHAT_ROUTE", "MARK", "NAME", "STREAM", "FakeSink", "SeamSink", "addrinfo",
           "call_request", "open_call"]

MARK = "x-otel-llm-test"  # what the fake sink writes into a model call's request headers
CHAT_PATH = "/v1/chat/completions"
STREAM: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT_ROUTE = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)
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

    def call_finished(self, record: CallRecord, state: object = None) -> None:
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


class SeamSink:
    """A CallSink for ``LlmCall`` on its own: records what the seam hands over, the calls started and
    the records finished; ``fail`` makes ``call_finished`` raise."""

    def __init__(self, capture_content: bool = False, fail: bool = False) -> None:
        self.capture_content = capture_content
        self.fail = fail
        self.started: list[LlmCall] = []
        self.finished: list[dict[str, Any]] = []
        self.records: list[CallRecord] = []

    def route(self, path: str) -> routes.Route | None:
        return routes.match_route(path)

    def call_started(self, call: LlmCall) -> None:
        self.started.append(call)
        call.request.headers["traceparent"] = "00-x"

    def call_finished(self, record: CallRecord, state: object = None) -> None:
        self.records.append(record)
        self.finished.append({"reason": record.end_reason, "exception": record.exception,
                              "t_end": record.timeline.end, "body": record.body})
        if self.fail:
            raise RuntimeError("sink bug")


def call_request(headers: dict[str, str] | None = None, body: bytes | None = b"{}") -> CallRequest:
    """A chat request to 127.0.0.1:8080, as an adapter would describe it."""
    return CallRequest("POST", "http", "127.0.0.1", 8080, "/v1/chat/completions",
                       "http://127.0.0.1:8080/v1/chat/completions?x=1", {} if headers is None else headers, body)


def open_call(sink: SeamSink | None = None, route: routes.Route = CHAT_ROUTE) -> tuple[LlmCall, SeamSink]:
    """An ``LlmCall`` opened on ``sink`` (a fresh ``SeamSink`` by default) for a chat request."""
    sink = sink or SeamSink()
    return LlmCall.open(sink, route, call_request()), sink
