"""``OtelLlmInstrumentor``: installs and removes every capture adapter's hooks.

Registered under the ``opentelemetry_instrumentor`` entry point, so ``opentelemetry-instrument``
picks it up; ``otel_llm.instrument()`` is the one-line way to call it.
"""

from __future__ import annotations

import atexit
from typing import Any, Collection, Iterator
from urllib.parse import urlsplit

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from wrapt import wrap_function_wrapper

from otel_llm._log import logger
from otel_llm.telemetry.calls import CallSettings, Telemetry
from otel_llm.capture import aiohttp, hooks, httpcore, urllib3
from otel_llm.capture.hooks import ClassAttribute, Patch
from otel_llm.config import Options, resolve
from otel_llm.export.providers import Providers, build_providers
from otel_llm.observers.manager import Observers
from otel_llm.package import _instruments

# one module per HTTP stack, each with ``patches(get_sink) -> list[Patch]``
_ADAPTERS = (httpcore, aiohttp, urllib3)
_MISSING = object()

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


def _at_exit() -> None:
    telemetry = _telemetry
    if telemetry is not None:
        hooks.flush_collected(1.0)  # garbage-collected calls still queued
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
    """Traces model calls made through httpx, httpx2, aiohttp and urllib3 (requests)."""

    _providers: Providers | None = None
    _observers: Observers | None = None
    _patched: list[tuple[Any, str]] = []
    _replaced: list[tuple[Any, str, Any]] = []

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
        self._replaced = []
        for adapter in _ADAPTERS:
            for patch in adapter.patches(current_telemetry):
                self._install(patch)
        # Registered after the providers exist: atexit runs handlers last-in first-out, so open
        # calls are finished before any provider (ours or the application's) shuts down.
        atexit.register(_at_exit)
        logger.debug("otel_llm: instrumented (%s)", providers.description)

    def _install(self, patch: Patch | ClassAttribute) -> None:
        """Install one hook; one whose library, class or method is missing (another version of
        the library) is skipped: that stack is then traced with less detail, never broken."""
        if patch.module is None:
            return
        owner_name, _, name = patch.target.rpartition(".")
        owner = getattr(patch.module, owner_name, None) if owner_name else patch.module
        if owner is None or (isinstance(patch, Patch) and not hasattr(owner, name)):
            logger.debug("otel_llm: %s.%s not found, not hooked", patch.module.__name__, patch.target)
            return
        if isinstance(patch, ClassAttribute):
            self._replaced.append((owner, name, owner.__dict__.get(name, _MISSING)))
            setattr(owner, name, patch.value)
            return
        self._patched.append((owner, name))
        patch.wrapper._otel_llm_hook = True  # type: ignore[attr-defined]
        wrap_function_wrapper(patch.module, patch.target, patch.wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        global _telemetry
        atexit.unregister(_at_exit)
        for owner, method in self._patched:
            _remove_layer(owner, method)
        self._patched = []
        for owner, name, previous in reversed(self._replaced):
            if previous is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self._replaced = []
        _telemetry = None
        if self._observers is not None:
            self._observers.stop()
            self._observers = None
        if self._providers is not None:
            self._providers.shutdown()
            self._providers = None
