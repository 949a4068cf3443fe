"""Notice a model server's runtime process restarting or going away, between host samples.

For each local server of the registry (grouped by port: ``localhost:8080`` and
``127.0.0.1:8080`` are one listener) the watch keeps the process listening there, read from
/proc as ``processes.listening_runtimes`` reads it (no request is sent). Each check costs one
liveness test of that process; only when it has exited (or was never seen) is the listening
table read again, at most once per check for all such ports and, for a port where nothing
visible listens, at most every ``RESCAN`` seconds.

On a restart (another PID listens now) or a disappearance (nothing visible listens):

* ``llm.runtime.restarts`` grows by one (``server.address``, ``server.port``,
  ``llm.runtime.name`` when known);
* one WARNING line: ``otel_llm: the model server at HOST:PORT restarted (pid OLD -> NEW)`` or
  ``... disappeared (pid OLD)``; a server coming back after it disappeared is logged at INFO and
  is not counted again (it is the same restart), and its pending event gains the new pid;
* the next call to that server that starts afterwards carries the span event
  ``llm.runtime.restarted`` (``llm.runtime.previous_pid``, and ``llm.runtime.pid`` unless nothing
  listens). Pending events live in a plain dict shared with the call path, which reads it
  without a lock: a call pays one attribute load and a truth test while nothing is pending.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from otel_llm import semconv as sc
from otel_llm._log import log_once, logger
from otel_llm._types import Attributes
from otel_llm.observers.processes import Listener, listening_runtimes
from otel_llm.observers.registry import ServerRegistry

__all__ = ["RESCAN", "RestartWatch", "listener_pid"]

# A port where no visible process listens is read again at most this often (the listening
# table costs milliseconds; a server that stays down should not cost them every second).
RESCAN = 5.0

Identify = Callable[[set[int]], Mapping[int, Listener]]
PendingEvents = dict[tuple[str, int], Attributes]


@dataclass
class _Watched:
    process: psutil.Process | None  # None: nothing visible listens (disappeared, or hidden)
    runtime: str | None
    checked_at: float
    lost: int | None = None  # the pid that went away, while nothing listens since
    event: Attributes | None = None  # that disappearance's event (completed if the server comes back)


class RestartWatch:
    """Keeps the process listening at each local server; see the module docstring."""

    def __init__(self, registry: ServerRegistry, meter: Any, pending: PendingEvents,
                 identify: Identify = listening_runtimes, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.pending = pending  # (host, port) -> event attributes; the call path pops from it
        self._identify = identify
        self._clock = clock
        self._watched: dict[int, _Watched] = {}  # port -> its listener
        self._own_pid = os.getpid()
        self.restarts = meter.create_counter(
            sc.METRIC_RUNTIME_RESTARTS, unit="{restart}",
            description="Times the runtime process of a model server changed PID or went away.")

    def on_sample(self, _sample: Any = None) -> None:
        """A host sample was taken: check (see ``check``)."""
        self.check()

    def check(self) -> None:
        """Compare each local server's listener with the last check (the host sampler's thread).
        Never raises."""
        try:
            self._check()
        except Exception:
            log_once("watching the model servers' processes for restarts failed")

    def _check(self) -> None:
        groups: dict[int, list[tuple[str, int]]] = {}
        runtimes: dict[int, str | None] = {}
        for server in self.registry.servers():
            if server.is_local:
                groups.setdefault(server.port, []).append((server.host, server.port))
                runtimes[server.port] = runtimes.get(server.port) or server.runtime
        now = self._clock()
        due = {port for port in groups if self._due(self._watched.get(port), now)}
        if not due:
            return
        found = self._identify(due)
        for port in due:
            self._update(port, sorted(groups[port]), found.get(port), runtimes[port], now)

    def _due(self, watched: _Watched | None, now: float) -> bool:
        if watched is None:
            return True
        if watched.process is None:
            return now - watched.checked_at >= RESCAN
        return not _running(watched.process)

    def _update(self, port: int, servers: list[tuple[str, int]], listener: Listener | None,
                runtime: str | None, now: float) -> None:
        process = self._primary(listener)
        runtime = (listener.runtime if listener is not None else None) or runtime
        watched = self._watched.get(port)
        self._watched[port] = _Watched(process, runtime, now)
        if watched is None:
            return  # first sight: nothing to compare with
        new = process.pid if process is not None else None
        old = watched.process.pid if watched.process is not None else None
        host = servers[0][0]
        if old is None:
            if new is not None and watched.lost is not None:  # back after it disappeared
                logger.info("otel_llm: the model server at %s:%s is back (pid %s)", host, port, new)
                if watched.event is not None:
                    # completed in place, never re-inserted: a call that already took the event
                    # (it copies it) is not given it twice, whatever the race with the call path
                    watched.event[sc.LLM_RUNTIME_PID] = new
            elif new is None:
                self._watched[port].lost, self._watched[port].event = watched.lost, watched.event  # still gone
            return
        if new == old:
            return  # the same process (a liveness test that raced its own exit)
        if new is None:
            logger.warning("otel_llm: the model server at %s:%s disappeared (pid %s)", host, port, old)
            event: Attributes = {sc.LLM_RUNTIME_PREVIOUS_PID: old}
            self._watched[port].lost, self._watched[port].event = old, event
        else:
            logger.warning("otel_llm: the model server at %s:%s restarted (pid %s -> %s)", host, port, old, new)
            event = {sc.LLM_RUNTIME_PREVIOUS_PID: old, sc.LLM_RUNTIME_PID: new}
        attrs: Attributes = {sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port}
        name = runtime or watched.runtime
        if name is not None:
            attrs[sc.LLM_RUNTIME_NAME] = name
        self.restarts.add(1, attrs)
        for key in servers:
            self.pending[key] = event

    def _primary(self, listener: Listener | None) -> psutil.Process | None:
        return primary_process(listener, self._own_pid)


def primary_process(listener: Listener | None, own_pid: int | None = None) -> psutil.Process | None:
    """The listener's process to follow: the oldest one (a pre-forking server's parent; its
    workers share the socket), never this process."""
    if listener is None:
        return None
    own = os.getpid() if own_pid is None else own_pid
    candidates = [p for p in listener.processes if p.pid != own and _running(p)]
    return min(candidates, key=_started, default=None)


def listener_pid(port: int, identify: Identify = listening_runtimes) -> int | None:
    """The PID the restart watch would follow on this host's ``port`` (None: no visible process
    other than this one listens there). Read from /proc; no request is sent."""
    process = primary_process(identify({port}).get(port))
    return process.pid if process is not None else None


def _started(proc: psutil.Process) -> tuple[float, int]:
    try:
        return proc.create_time(), proc.pid
    except (psutil.Error, OSError):
        return float("inf"), proc.pid


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a killed child its parent has not reaped still has its pid)."""
    try:
        return bool(proc.is_running()) and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


