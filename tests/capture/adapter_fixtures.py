"""What the capture adapters' unit tests share: a fake CallSink (the adapters patched for real,
handing model calls to it instead of otel_llm's telemetry), a simulator, a fake resolver."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from typing import Any

import pytest

import otel_llm
from otel_llm._log import reset_log_once
from otel_llm.capture import install
from otel_llm.capture.call import CallRecord, LlmCall
from otel_llm.capture.hooks import flush_collected
from otel_llm.parse import routes
from tests.helpers_servers import ModelServer

__all__ = ["CHAT", "CHAT_PATH", "MARK", "NAME", "STREAM", "FakeSink", "addrinfo", "model_server", "resolver", "sink"]

MARK = "x-otel-llm-test"  # what the fake sink writes into a model call's request headers
CHAT_PATH = "/v1/chat/completions"
STREAM: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
NAME = "llm.test"  # resolved by the fake resolver below, never by a real one
_real_getaddrinfo = socket.getaddrinfo


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


@pytest.fixture
def sink() -> Iterator[FakeSink]:
    """The adapters patched, handing model calls to a fake sink instead of otel_llm's telemetry."""
    assert not otel_llm.is_instrumented()
    reset_log_once()
    fake = FakeSink()
    install.activate(lambda: fake)
    try:
        yield fake
    finally:
        install.deactivate()
        # pytest keeps each test's fixture values to the end of the session: a record's exception
        # (its traceback, the response) must not outlive the test
        vars(fake).clear()


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer(tokens=3, first_token_delay=0.0, token_interval=0.0) as server:
        yield server


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names -> addresses for ``socket.getaddrinfo`` (and so for anyio's); ``[]``: the name fails.
    Every other name goes to the real resolver. ``resolver["asked"]`` lists the hosts looked up."""
    table: dict[str, list[str]] = {"asked": []}

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        table["asked"].append(name)
        if name in table:
            if not table[name]:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [addrinfo(ip, int(port)) for ip in table[name]]
        return _real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def addrinfo(ip: str, port: int) -> tuple[Any, ...]:
    """One ``getaddrinfo`` entry, as the real resolver gives it."""
    if ":" in ip:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
