"""Telemetry after the answers: the end of each request's record, run when the relay has a moment.

A call's spans, metrics and summary line cost about a millisecond each, the relay's per-piece
work a few microseconds. Run where the request ends, a burst of requests ending together (a batch
a runtime finished at once) holds up, for tens of milliseconds, the pieces and response heads the
gateway owes every other caller. So the gateway ends its records here instead: in the order they
ended (a model call's record before its SERVER span's, which sampling relies on), one per turn of
the event loop, so the sockets that became ready in between are served first. Every timestamp
was taken when the thing happened; only the building and emitting wait.

Bounded: past ``limit`` records waiting the next one runs at once (the relay slows, memory does
not grow). Off the loop's thread (a call ended by the garbage collector or at exit), or once
``flush`` ran at shutdown, a record runs at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_llm.capture.call import CallRecord, CallSink, LlmCall
from otel_llm.parse.routes import Route
from otel_llm.tools._log import log_once

__all__ = ["Backlog", "DeferredSink"]

DEFAULT_LIMIT = 8192  # records waiting (a few kilobytes each) before one runs at once


class Backlog:
    """Work run one piece per loop turn, in submission order (see the module docstring)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._work: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._scheduled = False
        self.ran_at_once = 0  # records run where submitted because the backlog was full

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Defer from now on, on ``loop`` (the server's, at its lifespan startup)."""
        self._loop, self._thread = loop, threading.get_ident()

    def __len__(self) -> int:
        return len(self._work)

    def submit(self, work: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or threading.get_ident() != self._thread or loop.is_closed():
            _run(work, args)
            return
        if len(self._work) >= self.limit:
            self.ran_at_once += 1
            _run(work, args)
            return
        self._work.append((work, args))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._step)

    def _step(self) -> None:
        work = self._work
        if work:
            _run(*work.popleft())
        if work and self._loop is not None:
            self._loop.call_soon(self._step)  # the next turn: the sockets ready by then go first
        else:
            self._scheduled = False

    def flush(self) -> None:
        """Run everything waiting now, and anything submitted later at once (shutdown)."""
        self._loop = None
        work = self._work
        while work:
            _run(*work.popleft())


def _run(work: Callable[..., None], args: tuple[Any, ...]) -> None:
    try:
        work(*args)
    except Exception:
        log_once("recording a relayed request failed")


class DeferredSink:
    """A call sink whose finished calls are built and emitted through ``backlog``; the rest
    (which requests are model calls, the call's start and its trace context) stays immediate."""

    __slots__ = ("_sink", "_backlog", "capture_content")

    def __init__(self, sink: CallSink, backlog: Backlog) -> None:
        self._sink, self._backlog = sink, backlog
        self.capture_content = sink.capture_content  # a session's, fixed while it lasts

    @property
    def wrapped(self) -> CallSink:
        return self._sink

    def route(self, path: str) -> Route | None:
        return self._sink.route(path)

    def call_started(self, call: LlmCall) -> object:
        return self._sink.call_started(call)

    def call_finished(self, record: CallRecord, state: object) -> None:
        self._backlog.submit(self._sink.call_finished, record, state)
