"""``OtelLlmInstrumentor``: installs and removes the transport and DNS hooks.

Registered under the ``opentelemetry_instrumentor`` entry point, so ``opentelemetry-instrument``
picks it up; ``otel_llm.instrument()`` is the one-line way to call it.
"""

from __future__ import annotations

import importlib
from typing import Any, Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

from otel_llm._log import logger
from otel_llm.build.telemetry import CallSettings, Telemetry
from otel_llm.capture import dns, transport
from otel_llm.config import resolve
from otel_llm.export.providers import Providers, build_providers
from otel_llm.package import _instruments

# (httpx-like module, its httpcore-like module)
_CLIENT_LIBRARIES = (("httpx", "httpcore"), ("httpx2", "httpcore2"))

_telemetry: Telemetry | None = None


def current_telemetry() -> Telemetry | None:
    return _telemetry


class OtelLlmInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces model calls made through httpx and httpx2 (sync and async)."""

    _providers: Providers | None = None
    _patched: list[tuple[Any, str]] = []

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        global _telemetry
        options = resolve(kwargs)
        providers = build_providers(options)
        settings = CallSettings(options.capture_content, options.runtimes, options.llm_routes)
        _telemetry = Telemetry(providers.tracer_provider, providers.meter_provider, settings)
        self._providers = providers
        self._patched = []
        for client_name, core_name in _CLIENT_LIBRARIES:
            self._patch_library(client_name, core_name)
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
        )
        for module, name, wrapper in patches:
            owner_name, _, method = name.partition(".")
            owner = getattr(module, owner_name, None)
            if owner is None:
                continue
            wrap_function_wrapper(module, name, wrapper)
            self._patched.append((owner, method))

    def _uninstrument(self, **kwargs: Any) -> None:
        global _telemetry
        for owner, method in self._patched:
            unwrap(owner, method)
        self._patched = []
        _telemetry = None
        if self._providers is not None:
            self._providers.shutdown()
            self._providers = None
