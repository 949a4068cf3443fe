"""Turn a call's timeline into phases that tile the call with no gap or overlap.

Each phase starts where the previous one ended (the first at the call's start), so the tiny
slices between transport events (microseconds of Python between "connected" and "TLS started")
are attributed to the next phase instead of leaving holes. A phase that started but never
completed (connect refused, timeout waiting for headers, abort mid-body) runs to the call's end
and is the last one.
"""

from __future__ import annotations

from typing import NamedTuple

from otel_llm import semconv as sc
from otel_llm.capture.record import Timeline

__all__ = ["Phase", "compute_phases"]

# (span name, the timeline's mark that starts the phase, the mark that ends it)
_NAMED_PHASES = (
    (sc.SPAN_POOL_WAIT, "pool_start", "pool_end"),
    (sc.SPAN_DNS, "dns_start", "dns_end"),
    (sc.SPAN_CONNECT, "connect_start", "connect_end"),
    (sc.SPAN_TLS, "tls_start", "tls_end"),
    (sc.SPAN_UPLOAD, "upload_start", "body_sent"),
    (sc.SPAN_SERVER_WAIT, "body_sent", "headers"),
)
# the same by position in the tuple: one index per mark instead of an attribute lookup by name
_TRANSPORT_PHASES = tuple((name, Timeline._fields.index(start), Timeline._fields.index(end))
                          for name, start, end in _NAMED_PHASES)


class Phase(NamedTuple):
    name: str
    start_ns: int
    end_ns: int
    complete: bool  # False when the call ended inside this phase


def compute_phases(timeline: Timeline, streaming: bool, first_token_ns: int) -> list[Phase]:
    """Phases of one call in perf-counter nanoseconds, in order, tiling its timeline from start
    to end."""
    phases: list[Phase] = []
    marks = timeline
    t0, t_end = timeline.start, timeline.end
    cursor = t0
    for name, start_mark, end_mark in _TRANSPORT_PHASES:
        if not marks[start_mark]:
            continue
        end = marks[end_mark]
        if not end:
            phases.append(Phase(name, cursor, max(cursor, t_end), False))
            return phases
        end = min(max(end, cursor), t_end)
        phases.append(Phase(name, cursor, end, True))
        cursor = end
    if not timeline.headers:
        if not phases and t_end > t0:  # failed before any transport event
            phases.append(Phase(sc.SPAN_UPLOAD, t0, t_end, False))
        return phases
    if streaming and first_token_ns:
        token = min(max(first_token_ns, cursor), t_end)
        phases.append(Phase(sc.SPAN_FIRST_TOKEN, cursor, token, True))
        phases.append(Phase(sc.SPAN_DECODE, token, t_end, True))
    else:
        phases.append(Phase(sc.SPAN_DOWNLOAD, cursor, max(cursor, t_end), True))
    return phases
