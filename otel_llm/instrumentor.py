"""``OtelLlmInstrumentor``: the ``BaseInstrumentor`` face of otel_llm's instrumentation session.

Registered under the ``opentelemetry_instrumentor`` entry point, so ``opentelemetry-instrument``
picks it up; ``otel_llm.instrument()`` is the one-line way and does not import this module (nor
``opentelemetry.instrumentation``). Both drive the same session in ``otel_llm._core``, so either
sees what the other did.
"""

from __future__ import annotations

from typing import Any, Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_llm import _core
from otel_llm._core import current_telemetry
from otel_llm.package import _instruments

__all__ = ["OtelLlmInstrumentor", "current_telemetry"]


class OtelLlmInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces model calls made through httpx, httpx2, aiohttp and urllib3 (requests)."""

    # BaseInstrumentor keeps its own flag; the session's state is the one truth, so that
    # otel_llm.instrument()/uninstrument() and this class never disagree.
    @property
    def _is_instrumented_by_opentelemetry(self) -> bool:
        return _core.is_instrumented()

    @_is_instrumented_by_opentelemetry.setter
    def _is_instrumented_by_opentelemetry(self, value: bool) -> None:
        """BaseInstrumentor sets it after ``_instrument``/``_uninstrument``: already true."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        _core.instrument(**kwargs)

    def _uninstrument(self, **kwargs: Any) -> None:
        _core.uninstrument()
