"""The instrumentation session (otel_llm._core): what instrument() and uninstrument() return, the sink
current_telemetry() hands out in each state, and the exit handler that ends calls still open."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from otel_llm import _core
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.capture.call import END_EXIT, CallRequest, LlmCall, open_calls
from otel_llm.parse import routes
from otel_llm.telemetry.calls import Telemetry
from otel_llm_testing.otel import Otel, make_otel

QUIET: dict[str, Any] = {"host_metrics": False, "gpu_metrics": False, "runtime_metrics": False}
CHAT = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)


@pytest.fixture
def state() -> Iterator[Otel]:
    """Start and end uninstrumented; in-memory providers to instrument with."""
    assert not _core.is_instrumented() and _core.current_telemetry() is None
    reset_log_once()
    yield make_otel()
    _core.uninstrument()


def _instrument(otel: Otel, **options: Any) -> bool:
    return _core.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                            **QUIET, **options)


def test_instrument_and_uninstrument_report_whether_they_changed_anything(state: Otel) -> None:
    assert _core.uninstrument() is False  # nothing to end
    assert _instrument(state) is True and _core.is_instrumented()
    assert _instrument(make_otel()) is False  # already running: untouched
    assert _core.uninstrument() is True and not _core.is_instrumented()
    assert _core.uninstrument() is False


def test_current_telemetry_follows_the_session(state: Otel) -> None:
    _instrument(state, capture_content=True)
    telemetry = _core.current_telemetry()
    assert isinstance(telemetry, Telemetry) and telemetry.capture_content is True
    _instrument(make_otel(), capture_content=False)
    assert _core.current_telemetry() is telemetry  # a second instrument() switches nothing
    _core.uninstrument()
    assert _core.current_telemetry() is None
    _instrument(state)
    again = _core.current_telemetry()
    assert again is not None and again is not telemetry and again.capture_content is False


def test_the_session_starts_no_observers_when_all_are_off(state: Otel) -> None:
    _instrument(state)
    assert _core._session is not None and _core._session.observers is None
    assert _core.current_telemetry().evidence is None  # type: ignore[union-attr]


def test_only_one_of_concurrent_instrument_calls_starts_the_session(state: Otel) -> None:
    barrier = threading.Barrier(6)
    results: list[bool] = []

    def start() -> None:
        barrier.wait()
        results.append(_instrument(make_otel()))

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [False] * 5 + [True]


def test_the_exit_handler_is_registered_only_while_instrumented(state: Otel,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    _instrument(state)
    assert registered == [_core._at_exit]
    _instrument(state)
    assert registered == [_core._at_exit]  # not twice
    _core.uninstrument()
    assert registered == []


def test_the_exit_handler_ends_calls_still_open(state: Otel) -> None:
    _instrument(state)
    telemetry = _core.current_telemetry()
    assert telemetry is not None
    request = CallRequest("POST", "http", "127.0.0.1", 8080, "/v1/chat/completions",
                          "http://127.0.0.1:8080/v1/chat/completions", {}, b'{"model": "m"}')
    call = LlmCall.open(telemetry, CHAT, request)
    assert state.calls() == []
    _core._at_exit()
    assert call.finished and call not in open_calls()
    span, _ = state.one_call()
    assert span.attributes[sc.LLM_CLIENT_END_REASON] == END_EXIT
    _core._at_exit()  # a second run (or one after uninstrument) finds nothing left to end
    assert len(state.calls()) == 1
