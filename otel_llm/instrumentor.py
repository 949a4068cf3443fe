"""``OtelLlmInstrumentor``: installs and removes the transport and DNS hooks.

Registered under the ``opentelemetry_instrumentor`` entry point, so ``opentelemetry-instrument``
picks it up; ``otel_llm.instrument()`` is the one-line way to call it.
"""

from __future__ import annotations

import atexit
import importlib
from typing import Any, Collection, Iterator
from urllib.parse import urlsplit

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from wrapt import wrap_function_wrapper

from otel_llm._log import logger
from otel_llm.build.telemetry import CallSettings, Telemetry
from otel_llm.capture import dns, streams, transport
from otel_llm.config import Options, resolve
from otel_llm.export.providers import Providers, build_providers
from otel_llm.observers.manager import Observers
from otel_llm.package import _instruments

# (httpx-like module, its httpcore-like module)
_CLIENT_LIBRARIES = (("httpx", "httpcore"), ("httpx2", "httpcore2"))

_telemetry: Telemetry | None = None


def current_telemetry() -> Telemetry | None:
    return _telemetry


def _start_observers(options: Options, meter_provider: Any) -> Observers | None:
    if not (options.host_metrics or options.gpu_metrics or options.runtime_metrics):
        return None
    runtimes = {}
    for base, name in options.runtimes.items():
        parts = urlsplit(base)
        if parts.hostname:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            runtimes[(parts.hostname, port, parts.scheme or "http")] = name
    return Observers(meter_provider, host=options.host_metrics, gpu=options.gpu_metrics,
                     runtime=options.runtime_metrics, interval=options.sample_interval, runtimes=runtimes,
                     poll=options.poll_runtimes)


def _optional_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _at_exit() -> None:
    telemetry = _telemetry
    if telemetry is not None:
        streams.flush_collected(1.0)  # garbage-collected calls still queued
        telemetry.finish_live_calls()
    providers = OtelLlmInstrumentor()._providers
    if providers is not None:
        providers.shutdown()


def _is_ours(layer: Any) -> bool:
    return bool(getattr(getattr(layer, "_self_wrapper", None), "_otel_llm_hook", False))


def _layers(owner: Any, method: str) -> Iterator[Any]:
    """The wrapt layers on ``owner.method``, outermost first."""
    layer = owner.__dict__.get(method)
    while layer is not None and hasattr(layer, "_self_wrapper"):
        yield layer
        layer = getattr(layer, "__wrapped__", None)


def _remove_layer(owner: Any, method: str) -> None:
    """Take otel_llm's wrapper out of ``owner.method``, leaving layers added after it in place
    (e.g. opentelemetry-instrumentation-httpx when both were loaded by opentelemetry-instrument)."""
    above: Any = None
    for layer in _layers(owner, method):
        if _is_ours(layer):
            if above is None:
                setattr(owner, method, layer.__wrapped__)
            else:
                above.__wrapped__ = layer.__wrapped__
            return
        above = layer


class OtelLlmInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces model calls made through httpx and httpx2 (sync and async)."""

    _providers: Providers | None = None
    _observers: Observers | None = None
    _patched: list[tuple[Any, str]] = []

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        global _telemetry
        options = resolve(kwargs)
        providers = build_providers(options)
        settings = CallSettings(options.capture_content, options.runtimes, options.llm_routes)
        self._observers = _start_observers(options, providers.meter_provider)
        _telemetry = Telemetry(providers.tracer_provider, providers.meter_provider, settings, self._observers)
        self._providers = providers
        self._patched = []
        for client_name, core_name in _CLIENT_LIBRARIES:
            self._patch_library(client_name, core_name)
        # Registered after the providers exist: atexit runs handlers last-in first-out, so open
        # calls are finished before any provider (ours or the application's) shuts down.
        atexit.register(_at_exit)
        logger.debug("otel_llm: instrumented (%s)", providers.description)

    def _patch_library(self, client_name: str, core_name: str) -> None:
        try:
            client = importlib.import_module(client_name)
            core = importlib.import_module(core_name)
        except ImportError:
            return
        patches = (
            (client, "HTTPTransport.handle_request", transport.sync_send_wrapper(current_telemetry, client)),
            (client, "AsyncHTTPTransport.handle_async_request", transport.async_send_wrapper(current_telemetry, client)),
            (core, "SyncBackend.connect_tcp", dns.sync_connect_wrapper(core)),
            (core, "AnyIOBackend.connect_tcp", dns.async_connect_wrapper(core)),
            # private modules: pool waits are simply not timed where they differ
            (_optional_module(f"{core_name}._sync.connection_pool"), "PoolRequest.wait_for_connection",
             dns.sync_pool_wait_wrapper),
            (_optional_module(f"{core_name}._async.connection_pool"), "AsyncPoolRequest.wait_for_connection",
             dns.async_pool_wait_wrapper),
        )
        for module, name, wrapper in patches:
            owner_name, _, method = name.partition(".")
            owner = getattr(module, owner_name, None) if module is not None else None
            if owner is None:
                continue
            self._patched.append((owner, method))
            wrapper._otel_llm_hook = True  # type: ignore[attr-defined,union-attr]
            wrap_function_wrapper(module, name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        global _telemetry
        atexit.unregister(_at_exit)
        for owner, method in self._patched:
            _remove_layer(owner, method)
        self._patched = []
        _telemetry = None
        if self._observers is not None:
            self._observers.stop()
            self._observers = None
        if self._providers is not None:
            self._providers.shutdown()
            self._providers = None
