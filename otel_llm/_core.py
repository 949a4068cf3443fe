"""The process's instrumentation: at most one :class:`~otel_llm.session.Session` at a time,
behind ``otel_llm.instrument()`` and ``OtelLlmInstrumentor`` alike.

A plain module: ``otel_llm.instrument()`` needs neither ``opentelemetry.instrumentation`` (the
``BaseInstrumentor`` subclass in ``instrumentor`` delegates here) nor any HTTP library (each is
patched when the application imports it, see ``capture.install``). What only some configurations
need (OTLP exporters, Prometheus, the runtime poller's HTTP client) is imported by them, when used.
"""

from __future__ import annotations

import atexit
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_llm.session import Session
    from otel_llm.telemetry.calls import Telemetry

__all__ = ["current_session", "current_telemetry", "instrument", "is_instrumented", "uninstrument"]

# Serializes instrument() and uninstrument(); held while they import (never by import hooks,
# which take capture.install's own lock).
_lock = threading.RLock()
_session: Session | None = None


def current_session() -> Session | None:
    return _session


def current_telemetry() -> Telemetry | None:
    """The sink the capture adapters hand model calls to (None: not instrumented)."""
    session = _session
    return session.telemetry if session is not None else None


def is_instrumented() -> bool:
    return _session is not None


def instrument(**kwargs: Any) -> bool:
    """Start the session (see ``otel_llm.instrument``); False if one is already running."""
    global _session
    with _lock:
        if _session is not None:
            return False
        from otel_llm._log import logger
        from otel_llm.config import resolve
        from otel_llm.session import Session

        session = Session(resolve(kwargs))
        _session = session
        session.start()
        # Registered after the providers exist: atexit runs handlers last-in first-out, so open
        # calls are finished before any provider (ours or the application's) shuts down.
        atexit.register(_at_exit)
        logger.debug("otel_llm: instrumented (%s)", session.providers.description)
        return True


def uninstrument() -> bool:
    """Stop the session (see ``Session.stop``); False if not instrumented."""
    global _session
    with _lock:
        session = _session
        if session is None:
            return False
        atexit.unregister(_at_exit)
        _session = None
        session.stop()
        return True


def _at_exit() -> None:
    session = _session
    if session is not None:
        session.end()
