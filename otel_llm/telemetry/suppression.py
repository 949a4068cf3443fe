"""What OpenTelemetry's ``suppress_instrumentation()`` means for a model call, whatever the tracer.

A model call made while instrumentation is suppressed is not recorded: no span, no metric record,
no ``traceparent`` added to the request, as with every OpenTelemetry instrumentation. The SDK's
span and metric processors suppress it while they export, and applications and instrumentations
suppress it around requests they want no telemetry for. The first call left unrecorded is logged
once, with the switch that records such calls anyway (``record_suppressed``); with it, the call is
recorded under any tracer, even one that would hand out non-recording spans while suppressed.

Suppressing only the HTTP instrumentation (``suppress_http_instrumentation()``, how an
instrumentation keeps the HTTP client's spans out from under its own) does not apply: otel_llm's
spans describe the model call, not the HTTP client.
"""

from __future__ import annotations

from opentelemetry import context
from opentelemetry.context import Context

from otel_llm._log import log_once

__all__ = ["note_suppressed", "suppressed", "unsuppressed"]

# the two spellings opentelemetry-instrumentation's suppress_instrumentation() sets
_KEYS = tuple(k for k in (getattr(context, "_SUPPRESS_INSTRUMENTATION_KEY", None), "suppress_instrumentation") if k)


def suppressed() -> bool:
    """Whether instrumentation is suppressed in the current context (what
    ``is_instrumentation_enabled()`` says, read with one lookup of the context: every call asks)."""
    current = context.get_current()
    return any(current.get(key) for key in _KEYS)


def note_suppressed() -> None:
    """Say once that a call went unrecorded, and what records it."""
    log_once("a model call made inside OpenTelemetry's suppress_instrumentation() was not recorded (the "
             "application or another instrumentation suppressed it); record_suppressed=True or "
             "OTEL_LLM_RECORD_SUPPRESSED=true records such calls", exc_info=False)


def unsuppressed(parent: Context | None = None) -> Context:
    """``parent`` (default: the current context) with instrumentation no longer suppressed."""
    ctx = parent if parent is not None else context.get_current()
    for key in _KEYS:
        ctx = context.set_value(key, False, ctx)
    return ctx
