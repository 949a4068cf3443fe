"""What the observers offer the telemetry of a model call: one protocol, answered from memory.

The sink of model calls (``otel_llm.telemetry.calls``) knows the observers only through
:class:`Evidence`, which ``observers.manager.Observers`` implements: what a call gets when it
starts, what it gets when it ends, which runtime a server runs, and a server to watch before any
call to it. Nothing here imports an observer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

__all__ = ["CallEnd", "CallStart", "Evidence", "Server"]

Server = tuple[str, int]  # (host, port)


class CallStart(NamedTuple):
    """What a call gets at its start."""

    attributes: Mapping[str, Any]  # the runtime's queue at its latest poll (llm.runtime.requests.*)
    restart: Mapping[str, Any] | None  # a restart of the server's runtime noticed since the previous call


class CallEnd(NamedTuple):
    """What a call gets at its end: host and GPU evidence over its time, and the served model."""

    attributes: Mapping[str, Any]  # llm.host.* / llm.gpu.* over the call's window
    model: Mapping[str, Any]  # llm.model.* of the model the runtime reported serving


class Evidence(Protocol):
    """The observers as the sink sees them. Implementations answer from memory and never raise."""

    def call_started(self, server: Server, runtime: str | None, scheme: str) -> CallStart:
        """A call to ``server`` starts: watch that server (``runtime`` when the user or the route
        named it), and say what its runtime had queued and whether it restarted."""

    def call_ended(self, server: Server, start_ns: int, end_ns: int, model: str | None) -> CallEnd:
        """A call to ``server`` ran from ``start_ns`` to ``end_ns`` (perf-counter ns) asking for
        ``model``."""

    def runtime_at(self, server: Server) -> str | None:
        """The runtime recognized at ``server`` (its process or its metrics), if any."""

    def watch(self, server: Server, runtime: str | None, scheme: str) -> None:
        """Watch ``server`` before any call to it (a gateway's upstream)."""
