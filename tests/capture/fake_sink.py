"""A fake CallSink for the capture adapters' unit tests: the adapters patched for real, handing
model calls to it instead of otel_llm's telemetry."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import otel_llm
from otel_llm._log import reset_log_once
from otel_llm.capture import install
from otel_llm.capture.call import CallRecord, LlmCall
from otel_llm.capture.hooks import flush_collected
from otel_llm.parse import routes

__all__ = ["MARK", "FakeSink", "sink"]

MARK = "x-otel-llm-test"  # what the fake sink writes into a model call's request headers


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
