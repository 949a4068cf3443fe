"""otel_llm: OpenTelemetry traces that show where the time of every model call went.

    import otel_llm
    otel_llm.instrument()   # every model call (httpx, httpx2, aiohttp, requests) is now traced
"""

from __future__ import annotations

from typing import Any

from otel_llm.version import __version__

__all__ = ["__version__", "instrument", "is_instrumented", "uninstrument"]


def instrument(**options: Any) -> None:
    """Start tracing model calls. Idempotent: a second call while instrumented does nothing.

    Options (each also read from an ``OTEL_LLM_*`` environment variable, see the README):
    ``service_name``, ``endpoint``, ``protocol``, ``tracer_provider``, ``meter_provider``,
    ``capture_content``, ``runtimes``, ``llm_routes``, ``traces_file``, ``console_summary``, and
    the observers' ``host_metrics``, ``gpu_metrics``, ``runtime_metrics``, ``poll_runtimes``,
    ``sample_interval``.
    """
    from otel_llm.instrumentor import OtelLlmInstrumentor

    instrumentor = OtelLlmInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(**options)


def uninstrument() -> None:
    """Remove every hook, flush and shut down the providers otel_llm created."""
    from otel_llm.instrumentor import OtelLlmInstrumentor

    instrumentor = OtelLlmInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def is_instrumented() -> bool:
    from otel_llm.instrumentor import OtelLlmInstrumentor

    return bool(OtelLlmInstrumentor().is_instrumented_by_opentelemetry)
