"""otel_llm: OpenTelemetry traces that show where the time of every model call went.

    import otel_llm
    otel_llm.instrument()   # every model call (httpx, httpx2, aiohttp, requests) is now traced
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from otel_llm.version import __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from otel_llm.session import Session

__all__ = ["__version__", "current_session", "instrument", "is_instrumented", "uninstrument"]


def instrument(
    *,
    service_name: str | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    capture_content: bool | None = None,
    runtimes: Mapping[str, str] | str | None = None,
    llm_routes: Sequence[str] | str | None = None,
    traces_file: str | None = None,
    traces_file_max_bytes: int | None = None,
    traces_file_backups: int | None = None,
    console_summary: bool | None = None,
    host_metrics: bool | None = None,
    gpu_metrics: bool | None = None,
    runtime_metrics: bool | None = None,
    poll_runtimes: str | None = None,
    sample_interval: float | None = None,
    sample_rate: float | None = None,
    sample_keep: Sequence[str] | str | None = None,
    slow_ttft: float | None = None,
    slow_duration: float | None = None,
    record_suppressed: bool | None = None,
    chunk_metric: bool | None = None,
    beside_genai: bool | None = None,
) -> None:
    """Start tracing model calls. Idempotent: a second call while instrumented does nothing.

    Every option left at None is read from its ``OTEL_LLM_*`` environment variable, else takes
    its default (the README's Options table lists them). A misspelt option is a ``TypeError``; a
    bad value is logged once and replaced by the default, never raised.

    HTTP libraries are not imported here: each is patched when the application imports it (at
    once if it already has).
    """
    given = dict(locals())  # first: nothing but the parameters is bound yet
    from otel_llm import _core

    _core.instrument(**{name: value for name, value in given.items() if value is not None})


def uninstrument() -> None:
    """Remove every hook, flush and shut down the providers otel_llm created."""
    from otel_llm import _core

    _core.uninstrument()


def is_instrumented() -> bool:
    from otel_llm import _core

    return _core.is_instrumented()


def current_session() -> Session | None:
    """The running instrumentation session (providers, observers, the sink of model calls), or
    None when not instrumented; see ``otel_llm.session.Session``."""
    from otel_llm import _core

    return _core.current_session()
