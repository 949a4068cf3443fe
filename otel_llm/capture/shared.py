"""What every adapter shares: its patch list, the sink getter, and the garbage-collection reaper.

A response the application drops without reading or closing still ends its call: each adapter
ties the call to an object that lives as long as the response (``watch``), and when that object
is collected the call is finished by a reaper thread, never inside the collector.
"""

from __future__ import annotations

import importlib
import queue
import sys
import threading
import weakref
from types import ModuleType
from typing import Any, Callable, NamedTuple

from otel_llm.capture.call import END_GC, CallSink, LlmCall, perf_ns

__all__ = [
    "ClassAttribute", "Patch", "SinkGetter", "Stack", "body_bytes", "flush_collected", "loaded", "optional_module",
    "start_reaper", "timed_wait", "watch",
]

SinkGetter = Callable[[], "CallSink | None"]


class Patch(NamedTuple):
    """One class-level wrapper an adapter asks the instrumentor to install (wrapt)."""

    module: ModuleType | None  # None: the library is not installed, nothing to patch
    target: str  # "Class.method"
    wrapper: Callable[..., Any]


class ClassAttribute(NamedTuple):
    """A class attribute an adapter sets while instrumented (restored, or removed, after)."""

    module: ModuleType | None
    target: str  # "Class.attribute"
    value: Any


class Stack(NamedTuple):
    """An HTTP stack an adapter patches once every module in ``modules`` is imported.

    The application's own import of them triggers the patching (``capture.install``): ``patches``
    reads them with ``loaded`` and must import nothing (it runs inside that import)."""

    name: str
    modules: tuple[str, ...]
    patches: Callable[[SinkGetter], "list[Patch | ClassAttribute]"]


def body_bytes(data: Any) -> bytes | None:
    """A request body as bytes for parsing: b"" when there is none, None when it is streamed
    (a file, a generator, a form...), which is not read."""
    if data is None:
        return b""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    return None


def timed_wait(call: LlmCall, wrapped: Any, args: Any, kwargs: Any) -> Any:
    """Run a blocking wait for a pooled connection, reported to ``call`` as a pool wait."""
    start = perf_ns()
    try:
        return wrapped(*args, **kwargs)
    finally:
        call.pool_wait(start, perf_ns())


def loaded(name: str) -> ModuleType | None:
    """The module if it is imported, else None; never imports (see ``Stack``)."""
    return sys.modules.get(name)


def optional_module(name: str) -> ModuleType | None:
    """The module, imported if need be, or None when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# Calls whose response was garbage-collected unconsumed, with the time it happened; finished by
# the reaper thread. (An Event in the queue is a flush marker: set when reached.)
_collected: queue.SimpleQueue[Any] = queue.SimpleQueue()
_reaper_lock = threading.Lock()
_reaper: threading.Thread | None = None


def _finish_collected(call: LlmCall) -> None:
    # weakref.finalize callback: must not reference the watched object itself. It runs inside the
    # garbage collector, which CPython starts at any allocation, e.g. while this very thread holds
    # InFlight's lock, a span processor's or a metric aggregation's, which finishing needs: so
    # only note the time and hand the call over (SimpleQueue.put is reentrant, safe in a
    # finalizer). Most responses are collected after their call finished: waking the reaper for
    # those would cost a thread switch per call for nothing.
    if not call.finished:
        _collected.put((call, perf_ns()))


def watch(owner: object, call: LlmCall) -> None:
    """Finish ``call`` (``garbage_collected``) if ``owner`` is collected before it ended."""
    weakref.finalize(owner, _finish_collected, call)


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
