"""Response body wrappers: the same bytes objects, unbuffered, plus an arrival timestamp each.

One pair of classes is made per httpx-like module (httpx, httpx2) so that each subclasses that
module's own ``SyncByteStream`` / ``AsyncByteStream``. The call ends exactly once, on the first
of: end of body, ``close()``/``aclose()``, an exception (``GeneratorExit`` is an early stop,
``CancelledError`` a cancellation), or garbage collection of an unconsumed response.
"""

from __future__ import annotations

import queue
import threading
import weakref
from types import ModuleType
from typing import Any

from otel_llm.capture.call import END_CLOSED, END_EOF, END_GC, FOLD_BYTES, LlmCall, perf_ns

# Calls whose response was garbage-collected unconsumed, with the time it happened; finished by
# the reaper thread. (An Event in the queue is a flush marker: set when reached.)
_collected: queue.SimpleQueue[Any] = queue.SimpleQueue()
_reaper_lock = threading.Lock()
_reaper: threading.Thread | None = None


def _finish_collected(call: LlmCall) -> None:
    # weakref.finalize callback: must not reference the stream itself. It runs inside the garbage
    # collector, which CPython starts at any allocation, e.g. while this very thread holds
    # InFlight's lock, a span processor's or a metric aggregation's, which finishing needs: so only
    # note the time and hand the call over (SimpleQueue.put is reentrant, safe in a finalizer).
    # Most streams are collected after their call finished: waking the reaper for those would
    # cost a thread switch per call for nothing.
    if not call.finished:
        _collected.put((call, perf_ns()))


def _reap() -> None:
    while True:
        item = _collected.get()
        if isinstance(item, threading.Event):
            item.set()
        else:
            item[0].finish(END_GC, at_ns=item[1])
        del item  # waiting for the next one must not keep this call alive


def start_reaper() -> None:
    """Start the thread that finishes garbage-collected calls (at instrument(), never in a finalizer)."""
    global _reaper
    with _reaper_lock:
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, name="otel_llm-collected", daemon=True)
            _reaper.start()


def flush_collected(timeout: float = 5.0) -> bool:
    """Wait until the calls collected so far are finished (tests, process exit)."""
    marker = threading.Event()
    _collected.put(marker)
    return marker.wait(timeout)


def make_stream_classes(httpx_module: ModuleType) -> tuple[type, type]:
    """Return (sync, async) stream wrapper classes built on ``httpx_module``'s byte streams."""
    start_reaper()

    class SyncLlmStream(httpx_module.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner = inner
            self._call = call
            weakref.finalize(self, _finish_collected, call)

        def __iter__(self) -> Any:
            call = self._call
            times, chunks = call.times, call.chunks
            try:
                for chunk in self._inner:
                    times.append(perf_ns())
                    chunks.append(chunk)
                    call.pending += len(chunk)
                    if call.pending > FOLD_BYTES:
                        call.fold()
                    yield chunk
            except BaseException as exc:
                call.finish_from_exception(exc)
                raise
            call.finish(END_EOF)

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._call.finish(END_CLOSED)

    class AsyncLlmStream(httpx_module.AsyncByteStream):  # type: ignore[name-defined,misc]
        # A plain async iterator, not an async generator: abandoned async generators are
        # finalized by the event loop's hooks, possibly after the loop is gone.

        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner = inner
            self._call = call
            self._iterator: Any = None
            weakref.finalize(self, _finish_collected, call)

        def __aiter__(self) -> AsyncLlmStream:
            self._iterator = self._inner.__aiter__()
            return self

        async def __anext__(self) -> bytes:
            call = self._call
            try:
                chunk = await self._iterator.__anext__()
            except StopAsyncIteration:
                call.finish(END_EOF)
                raise
            except BaseException as exc:
                call.finish_from_exception(exc)
                raise
            call.times.append(perf_ns())
            call.chunks.append(chunk)
            call.pending += len(chunk)
            if call.pending > FOLD_BYTES:
                call.fold()
            return chunk

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._call.finish(END_CLOSED)

    return SyncLlmStream, AsyncLlmStream
