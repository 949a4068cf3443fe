"""The instrumentation session: one per process, behind ``otel_llm.instrument()`` and
``OtelLlmInstrumentor`` alike.

A plain module: ``otel_llm.instrument()`` needs neither ``opentelemetry.instrumentation`` (the
``BaseInstrumentor`` subclass in ``instrumentor`` delegates here) nor any HTTP library (each is
patched when the application imports it, see ``capture.install``). What only some configurations
need (OTLP exporters, Prometheus, the runtime poller's HTTP client) is imported by them, when used.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_llm.config import Options
    from otel_llm.export.providers import Providers
    from otel_llm.observers.manager import Observers
    from otel_llm.telemetry.calls import Telemetry

__all__ = ["current_telemetry", "instrument", "is_instrumented", "uninstrument"]


@dataclass
class _Session:
    providers: Providers
    observers: Observers | None


# Serializes instrument() and uninstrument(); held while they import (never by import hooks,
# which take capture.install's own lock).
_lock = threading.RLock()
_session: _Session | None = None
_telemetry: Telemetry | None = None


def current_telemetry() -> Telemetry | None:
    """The sink the capture adapters hand model calls to (None: not instrumented)."""
    return _telemetry


def is_instrumented() -> bool:
    return _session is not None


def _start_observers(options: Options, meter_provider: Any) -> Observers | None:
    if not (options.host_metrics or options.gpu_metrics or options.runtime_metrics):
        return None
    from urllib.parse import urlsplit

    from otel_llm.observers.manager import Observers

    runtimes = {}
    for base, name in options.runtimes.items():
        parts = urlsplit(base)
        if parts.hostname:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            runtimes[(parts.hostname, port, parts.scheme or "http")] = name
    return Observers(meter_provider, host=options.host_metrics, gpu=options.gpu_metrics,
                     runtime=options.runtime_metrics, interval=options.sample_interval, runtimes=runtimes,
                     poll=options.poll_runtimes)


def instrument(**kwargs: Any) -> bool:
    """Start the session (see ``otel_llm.instrument``); False if one is already running."""
    global _session, _telemetry
    with _lock:
        if _session is not None:
            return False
        from otel_llm._log import logger
        from otel_llm.capture import install
        from otel_llm.config import genai_semconv, resolve
        from otel_llm.export.providers import build_providers
        from otel_llm.telemetry.calls import CallSettings, Telemetry

        options = resolve(kwargs)
        providers = build_providers(options)
        settings = CallSettings(options.capture_content, options.runtimes, options.llm_routes, genai_semconv())
        observers = _start_observers(options, providers.meter_provider)
        _telemetry = Telemetry(providers.tracer_provider, providers.meter_provider, settings, observers)
        _session = _Session(providers, observers)
        install.activate(current_telemetry)
        # Registered after the providers exist: atexit runs handlers last-in first-out, so open
        # calls are finished before any provider (ours or the application's) shuts down.
        atexit.register(_at_exit)
        logger.debug("otel_llm: instrumented (%s)", providers.description)
        return True


def uninstrument() -> bool:
    """Remove every hook, stop the observers, flush and shut down otel_llm's own providers;
    False if not instrumented."""
    global _session, _telemetry
    with _lock:
        session = _session
        if session is None:
            return False
        from otel_llm.capture import install

        atexit.unregister(_at_exit)
        install.deactivate()
        _telemetry = None
        _session = None
        if session.observers is not None:
            session.observers.stop()
        session.providers.shutdown()
        return True


def _at_exit() -> None:
    from otel_llm.capture import hooks

    telemetry, session = _telemetry, _session
    if telemetry is not None:
        hooks.flush_collected(1.0)  # garbage-collected calls still queued
        telemetry.finish_live_calls()
    if session is not None:
        session.providers.shutdown()
