"""The capture adapters' fixtures: the adapters patched with a fake sink, a model server, a fake resolver."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

import otel_llm
from otel_llm._log import reset_log_once
from otel_llm.capture import install
from otel_llm_testing.fake_sink import FakeSink, addrinfo
from otel_llm_testing.model_server import ModelServer

_real_getaddrinfo = socket.getaddrinfo


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
