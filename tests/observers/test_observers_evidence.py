"""The Evidence protocol as Observers implements it: what the sink of model calls asks, at a
call's start and end, answered from memory and never raising."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.observers.evidence import CallEnd, CallStart, Evidence
from otel_llm.observers.manager import Observers

SERVER = ("127.0.0.1", 18080)


@pytest.fixture
def observers() -> Iterator[Observers]:
    reset_log_once()
    found = Observers(MeterProvider(), host=False, gpu=False, runtime=False)
    yield found
    found.stop()


def test_a_call_start_watches_its_server_and_takes_a_pending_restart_once(observers: Observers) -> None:
    evidence: Evidence = observers
    observers.pending_restarts[SERVER] = {sc.LLM_RUNTIME_PREVIOUS_PID: 7}
    first = evidence.call_started(SERVER, "llama.cpp", "http")
    assert first == CallStart({}, {sc.LLM_RUNTIME_PREVIOUS_PID: 7})
    assert evidence.call_started(SERVER, None, "http").restart is None  # taken by the first call
    assert [(s.host, s.port, s.runtime) for s in observers.registry.servers()] == [(*SERVER, "llama.cpp")]


def test_watch_notes_a_server_before_any_call(observers: Observers) -> None:
    observers.watch(("10.0.0.9", 8000), None, "https")
    (server,) = observers.registry.servers()
    assert (server.host, server.port, server.runtime, server.scheme) == ("10.0.0.9", 8000, None, "https")
    assert observers.runtime_at(("10.0.0.9", 8000)) is None  # no runtime-state observer: nothing recognized


def test_a_call_end_never_raises_when_an_observer_fails(observers: Observers,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> dict[str, object]:
        raise RuntimeError("observer bug")

    monkeypatch.setattr(observers, "call_attributes", broken)
    monkeypatch.setattr(observers, "model_attributes", broken)
    monkeypatch.setattr(observers, "runtime_of", broken)
    assert observers.call_ended(SERVER, 0, 10, "m") == CallEnd({}, {})
    assert observers.runtime_at(SERVER) is None
