"""Turn a call's recorded marks into phases that tile the call with no gap or overlap.

Each phase starts where the previous one ended (the first at the call's start), so the tiny
slices between transport events (microseconds of Python between "connected" and "TLS started")
are attributed to the next phase instead of leaving holes. A phase that started but never
completed (connect refused, timeout waiting for headers, abort mid-body) runs to the call's end
and is the last one.
"""

from __future__ import annotations

from typing import NamedTuple

from otel_llm import semconv as sc
from otel_llm.capture.call import (
    BODY_SENT, CONNECT_END, CONNECT_START, DNS_END, DNS_START, HEADERS, POOL_END, POOL_START, TLS_END,
    TLS_START, UPLOAD_START,
)

# (span name, mark that starts the phase, mark that ends it)
_TRANSPORT_PHASES = (
    (sc.SPAN_POOL_WAIT, POOL_START, POOL_END),
    (sc.SPAN_DNS, DNS_START, DNS_END),
    (sc.SPAN_CONNECT, CONNECT_START, CONNECT_END),
    (sc.SPAN_TLS, TLS_START, TLS_END),
    (sc.SPAN_UPLOAD, UPLOAD_START, BODY_SENT),
    (sc.SPAN_SERVER_WAIT, BODY_SENT, HEADERS),
)


class Phase(NamedTuple):
    name: str
    start_ns: int
    end_ns: int
    complete: bool  # False when the call ended inside this phase


def compute_phases(
    marks: list[int], t0: int, t_end: int, streaming: bool, first_token_ns: int,
) -> list[Phase]:
    """Phases of one call in perf-counter nanoseconds, in order, tiling ``[t0, t_end]``."""
    phases: list[Phase] = []
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
    if not marks[HEADERS]:
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
