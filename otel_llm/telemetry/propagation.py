"""Put the call's trace context into the outgoing request headers.

With OpenTelemetry's default propagators (W3C trace context, optionally baggage) and no baggage
in the current context, the headers are written directly: the same ``traceparent`` and
``tracestate`` the propagator would write, without building a context for it on every call.
Any other configuration goes through the global propagator.

Next to ``traceparent``, the request's W3C ``baggage`` gets the entry ``otel_llm.recorded=1``: this
process records the call itself. A gateway that relays the request reads it (``recorded_by_caller``)
and marks its own record of the call relayed, so a fleet-wide sum counts the call once; a caller
without it (curl, an uninstrumented client) is counted from the gateway's record. A ``baggage``
header the request already has is kept and the entry added to it. The entry is written only where
the baggage propagator is configured (OpenTelemetry's default, ``OTEL_PROPAGATORS=tracecontext,baggage``)
and ``traceparent`` was written: ``OTEL_PROPAGATORS=tracecontext`` sends no baggage, ``none`` nothing.

When this process decides after the call whether to keep it (``sample_rate``) and has not decided
yet, the entry carries the property ``pending`` (``otel_llm.recorded=1;pending``): the sampled flag
asks the servers to record while the caller decides, it does not say the trace was kept
(``pending_at_caller``). A call under a span the application's sampler kept goes without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_llm import semconv as sc
from otel_llm._log import log_once

if TYPE_CHECKING:
    from otel_llm.telemetry.spans import CallSpan

__all__ = ["PENDING_ENTRY", "RECORDED_ENTRY", "inject_context", "pending_at_caller", "recorded_by_caller"]

RECORDED_KEY = sc.BAGGAGE_RECORDED
RECORDED_ENTRY = RECORDED_KEY + "=1"
PENDING_ENTRY = RECORDED_ENTRY + ";pending"
_MAX_BAGGAGE = 8192  # W3C baggage: at most 8192 bytes and 180 list-members in all
_MAX_MEMBERS = 180
_DEFAULT_KINDS = (TraceContextTextMapPropagator, W3CBaggagePropagator)
# (propagator last looked at, is it a default one, does it carry baggage)
_checked: tuple[Any, bool, bool] = (None, False, False)


def _kind(textmap: Any) -> tuple[bool, bool]:
    """Whether ``textmap`` is made of the default propagators only, and whether it writes baggage."""
    global _checked
    if textmap is _checked[0]:
        return _checked[1], _checked[2]
    members = getattr(textmap, "_propagators", None) if isinstance(textmap, CompositePropagator) else [textmap]
    if not isinstance(members, (list, tuple)):  # no public accessor: a changed SDK takes the general path
        members = []
    default = any(type(p) is TraceContextTextMapPropagator for p in members) \
        and all(type(p) in _DEFAULT_KINDS for p in members)
    with_baggage = any(isinstance(p, W3CBaggagePropagator) for p in members)
    _checked = (textmap, default, with_baggage)
    return default, with_baggage


def inject_context(headers: Any, span: CallSpan, pending: bool = False) -> None:
    """Write ``traceparent`` (and ``tracestate``) for ``span`` into ``headers``; ``pending``: the
    call's keep decision is still to be made (see the module docstring)."""
    context = span.context
    default, with_baggage = _kind(propagate.get_global_textmap())
    if span.live is None and context.is_valid and default and not baggage.get_all():
        headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        if context.trace_state:
            headers["tracestate"] = context.trace_state.to_header()
        if with_baggage:
            _mark_recorded(headers, pending)
        return
    carrier = span.live if span.live is not None else trace.NonRecordingSpan(context)
    propagate.inject(headers, context=trace.set_span_in_context(carrier))
    if with_baggage and headers.get("traceparent"):  # the mark travels with the W3C trace context, never alone
        _mark_recorded(headers, pending)


def _baggage(headers: Any) -> str | None:
    """Every ``baggage`` value of the request, joined (a multidict's ``get`` gives the first)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        values = getall("baggage", ())
        return ",".join(values) if values else None
    value = headers.get("baggage")
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value if isinstance(value, str) else None


def _recorded_member(value: str) -> tuple[str, list[str]] | None:
    """The value and properties of the ``otel_llm.recorded`` list-member, or None without one."""
    if RECORDED_KEY not in value:
        return None
    for member in value.split(","):
        key, _, rest = member.partition("=")
        if key.strip() == RECORDED_KEY:
            found, *properties = rest.split(";")
            return found.strip(), [p.strip() for p in properties]
    return None


def _recorded_value(value: str) -> str | None:
    """The value of the ``otel_llm.recorded`` list-member, or None without one."""
    member = _recorded_member(value)
    return member[0] if member is not None else None


def _mark_recorded(headers: Any, pending: bool = False) -> None:
    """Add ``otel_llm.recorded=1`` (``;pending``) to the request's baggage, keeping what is there."""
    entry = PENDING_ENTRY if pending else RECORDED_ENTRY
    try:
        present = _baggage(headers)
        if not present:
            headers["baggage"] = entry
        elif _recorded_value(present) is None \
                and len(present) + len(entry) + 1 <= _MAX_BAGGAGE and present.count(",") + 1 < _MAX_MEMBERS:
            # (a header already at the W3C limits is left as the application wrote it)
            headers["baggage"] = f"{present},{entry}"
    except Exception:
        log_once("adding otel_llm.recorded to the request's baggage failed")


def recorded_by_caller(headers: Any) -> bool:
    """Whether the request's baggage says its caller records the call itself (otel_llm's own
    client, or any other that sets ``otel_llm.recorded=1``)."""
    try:
        value = _baggage(headers)
    except Exception:
        return False
    return value is not None and _recorded_value(value) == "1"


def pending_at_caller(headers: Any) -> bool:
    """Whether the request's caller records the call and has not decided yet whether to keep it
    (``otel_llm.recorded=1;pending``): its sampled flag is not a kept trace."""
    try:
        value = _baggage(headers)
        member = _recorded_member(value) if value is not None else None
    except Exception:
        return False
    return member is not None and member[0] == "1" and "pending" in member[1]
