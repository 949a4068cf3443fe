"""What every adapter shares: request bodies as bytes, timed pool waits, optional modules, and the
reaper that finishes a call whose response was garbage-collected before the call ended."""

from __future__ import annotations

import gc
import json
import queue
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_llm.capture import shared
from otel_llm.capture.call import END_EOF, END_GC, CallRecord, CallRequest, LlmCall, perf_ns
from otel_llm.capture.shared import (
    body_bytes, flush_collected, loaded, optional_module, start_reaper, timed_wait, watch,
)
from otel_llm.parse import routes

CHAT = routes.Route(routes.API_OPENAI_CHAT, routes.OP_CHAT, None)


class _Sink:
    capture_content = False

    def __init__(self) -> None:
        self.finished: list[tuple[str, int]] = []

    def route(self, path: str) -> routes.Route | None:
        return CHAT

    def call_started(self, call: LlmCall) -> None:
        pass

    def call_finished(self, record: CallRecord, state: object = None) -> None:
        self.finished.append((record.end_reason, record.timeline.end))


def _call() -> tuple[LlmCall, _Sink]:
    sink = _Sink()
    request = CallRequest("POST", "http", "h", None, "/v1/chat/completions", "http://h/v1/chat/completions", {}, b"")
    return LlmCall.open(sink, CHAT, request), sink


class _Response:
    """Stands for an adapter's response object, the owner a call is tied to."""


class _RecordingQueue:
    """The reaper's queue, with what was put on it remembered (get still reaches the real one)."""

    def __init__(self, real: queue.SimpleQueue[Any]) -> None:
        self.real = real
        self.puts: list[Any] = []

    def put(self, item: Any) -> None:
        self.puts.append(item)
        self.real.put(item)

    def get(self) -> Any:
        return self.real.get()


@pytest.mark.parametrize(("data", "expected"), [
    (None, b""),
    (b"abc", b"abc"),
    (bytearray(b"abc"), b"abc"),
    (memoryview(b"abc"), b"abc"),
    ("héllo", "héllo".encode()),
    ("", b""),
])
def test_body_bytes_of_a_body_in_memory(data: object, expected: bytes) -> None:
    out = body_bytes(data)
    assert out == expected and type(out) is bytes


@pytest.mark.parametrize("data", [iter([b"a"]), (b"a" for _ in range(1)), {"k": "v"}, [b"a"], 42])
def test_body_bytes_of_a_streamed_body_is_none(data: object) -> None:
    assert body_bytes(data) is None


def test_body_bytes_does_not_read_a_file(tmp_path: Path) -> None:
    path = tmp_path / "upload.bin"
    path.write_bytes(b"xyz")
    with path.open("rb") as f:
        assert body_bytes(f) is None
        assert f.read() == b"xyz"  # still unread


def test_timed_wait_reports_the_wait_and_returns_its_value() -> None:
    call, _ = _call()
    seen: list[tuple[Any, ...]] = []

    def wait(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return "connection"

    before = perf_ns()
    assert timed_wait(call, wait, (1, 2), {"timeout": 3}) == "connection"
    after = perf_ns()
    assert seen == [((1, 2), {"timeout": 3})]
    assert before <= call.timeline().pool_start <= call.timeline().pool_end <= after


def test_timed_wait_reports_a_wait_that_failed() -> None:
    call, _ = _call()

    def wait() -> None:
        raise TimeoutError("pool timeout")

    with pytest.raises(TimeoutError, match="pool timeout"):
        timed_wait(call, wait, (), {})
    assert 0 < call.timeline().pool_start <= call.timeline().pool_end


def test_loaded_never_imports() -> None:
    assert loaded("json") is json
    name = "otel_llm_never_imported_module"
    assert name not in sys.modules and loaded(name) is None


def test_optional_module_imports_or_answers_none() -> None:
    assert optional_module("json") is json
    assert optional_module("otel_llm_no_such_library") is None
    assert optional_module("json.no_such_submodule") is None


def test_a_collected_response_finishes_its_call_at_collection_time(monkeypatch: pytest.MonkeyPatch) -> None:
    start_reaper()
    recording = _RecordingQueue(shared._collected)
    monkeypatch.setattr(shared, "_collected", recording)
    call, sink = _call()
    response = _Response()
    watch(response, call)
    assert not call.finished
    before = perf_ns()
    del response
    gc.collect()
    after = perf_ns()
    assert flush_collected(5.0)
    assert call.finished and call.end_reason == END_GC
    assert len(sink.finished) == 1
    assert before <= call.t_end <= after  # when it was collected, not when the reaper got to it
    assert [item for item in recording.puts if isinstance(item, tuple)] == [(call, call.t_end)]


def test_a_response_collected_after_its_call_ended_queues_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    start_reaper()
    recording = _RecordingQueue(shared._collected)
    monkeypatch.setattr(shared, "_collected", recording)
    call, sink = _call()
    response = _Response()
    watch(response, call)
    call.finish(END_EOF, at_ns=7)
    del response
    gc.collect()
    assert flush_collected(5.0)
    assert [item for item in recording.puts if isinstance(item, tuple)] == []
    assert sink.finished == [(END_EOF, 7)]


def test_watch_does_not_keep_the_response_alive() -> None:
    import weakref

    call, _ = _call()
    response = _Response()
    ref = weakref.ref(response)
    watch(response, call)
    del response
    assert ref() is None  # collected by reference counting alone: the finalizer holds only the call
    start_reaper()
    assert flush_collected(5.0) and call.end_reason == END_GC


def test_flush_waits_for_calls_collected_before_it() -> None:
    start_reaper()
    calls = [_call() for _ in range(5)]
    owners = [_Response() for _ in calls]
    for owner, (call, _) in zip(owners, calls):
        watch(owner, call)
    del owner
    owners.clear()
    assert flush_collected(5.0)
    assert [sink.finished[0][0] for _, sink in calls] == [END_GC] * 5


def test_start_reaper_twice_keeps_one_thread() -> None:
    start_reaper()
    first = shared._reaper
    start_reaper()
    assert shared._reaper is first and first is not None and first.is_alive() and first.daemon
    assert first.name == "otel_llm-collected"
