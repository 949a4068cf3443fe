"""Put the call's trace context into the outgoing request headers.

With OpenTelemetry's default propagators (W3C trace context, optionally baggage) and no baggage
in the current context, the headers are written directly: the same ``traceparent`` and
``tracestate`` the propagator would write, without building a context for it on every call.
Any other configuration goes through the global propagator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from otel_llm.telemetry.spans import CallSpan

_DEFAULT_KINDS = (TraceContextTextMapPropagator, W3CBaggagePropagator)
_checked: tuple[Any, bool] = (None, False)  # (propagator last looked at, is it a default one)


def _is_default(textmap: Any) -> bool:
    global _checked
    if textmap is _checked[0]:
        return _checked[1]
    if isinstance(textmap, CompositePropagator):
        members = getattr(textmap, "_propagators", None)  # no public accessor
        default = isinstance(members, (list, tuple)) and any(
            type(p) is TraceContextTextMapPropagator for p in members
        ) and all(type(p) in _DEFAULT_KINDS for p in members)
    else:
        default = type(textmap) is TraceContextTextMapPropagator
    _checked = (textmap, default)
    return default


def inject_context(headers: Any, span: CallSpan) -> None:
    """Write ``traceparent`` (and ``tracestate``) for ``span`` into ``headers``."""
    context = span.context
    if span.live is None and context.is_valid and _is_default(propagate.get_global_textmap()) \
            and not baggage.get_all():
        headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        if context.trace_state:
            headers["tracestate"] = context.trace_state.to_header()
        return
    carrier = span.live if span.live is not None else trace.NonRecordingSpan(context)
    propagate.inject(headers, context=trace.set_span_in_context(carrier))
