"""Phases tile the call: each starts where the previous ended, the last ends with the call."""

from __future__ import annotations

from otel_llm import semconv as sc
from otel_llm.telemetry.phases import compute_phases
from otel_llm.capture.record import Timeline

MS = 1_000_000


def _marks(**values: int) -> Timeline:
    """A timeline starting at 0 with the marks given (ending at 0 until ``_until``)."""
    return Timeline(0, 0, 0, **{name.lower(): value for name, value in values.items()})


def _until(timeline: Timeline, end: int) -> Timeline:
    return timeline._replace(end=end)


def _check_tiling(phases, t0: int, t_end: int) -> None:
    assert phases[0].start_ns == t0
    assert phases[-1].end_ns == t_end
    for before, after in zip(phases, phases[1:]):
        assert before.end_ns == after.start_ns


def test_fresh_tls_connection_streaming() -> None:
    marks = _marks(CONNECT_START=10_000, DNS_START=20_000, DNS_END=2 * MS, CONNECT_END=3 * MS,
                   TLS_START=3 * MS + 5000, TLS_END=8 * MS, UPLOAD_START=8 * MS + 1000,
                   BODY_SENT=9 * MS, HEADERS=50 * MS)
    phases = compute_phases(_until(marks, 200 * MS), streaming=True, first_token_ns=120 * MS)
    assert [p.name for p in phases] == [sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS, sc.SPAN_UPLOAD,
                                        sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
    _check_tiling(phases, 0, 200 * MS)
    assert phases[4].end_ns - phases[4].start_ns == 41 * MS
    assert phases[5].end_ns == 120 * MS


def test_reused_connection_non_streaming() -> None:
    marks = _marks(UPLOAD_START=20_000, BODY_SENT=100_000, HEADERS=30 * MS)
    phases = compute_phases(_until(marks, 31 * MS), streaming=False, first_token_ns=0)
    assert [p.name for p in phases] == [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
    _check_tiling(phases, 0, 31 * MS)


def test_pool_wait_only_when_the_request_really_queued() -> None:
    marks = _marks(POOL_START=10_000, POOL_END=5 * MS, UPLOAD_START=5 * MS + 1000, BODY_SENT=6 * MS, HEADERS=10 * MS)
    phases = compute_phases(_until(marks, 11 * MS), streaming=False, first_token_ns=0)
    assert phases[0].name == sc.SPAN_POOL_WAIT and phases[0].end_ns == 5 * MS
    _check_tiling(phases, 0, 11 * MS)
    # a slow start without any queueing (a busy CPU) is not a pool wait
    slow = compute_phases(_until(_marks(UPLOAD_START=5 * MS, BODY_SENT=6 * MS, HEADERS=10 * MS), 11 * MS), False, 0)
    assert slow[0].name == sc.SPAN_UPLOAD and slow[0].start_ns == 0


def test_pool_timeout_ends_inside_pool_wait() -> None:
    phases = compute_phases(_until(_marks(POOL_START=1000), 5000 * MS), streaming=False, first_token_ns=0)
    assert [(p.name, p.complete) for p in phases] == [(sc.SPAN_POOL_WAIT, False)]


def test_connect_refused_ends_inside_connect() -> None:
    marks = _marks(CONNECT_START=1000)
    phases = compute_phases(_until(marks, 2 * MS), streaming=False, first_token_ns=0)
    assert [(p.name, p.complete) for p in phases] == [(sc.SPAN_CONNECT, False)]
    _check_tiling(phases, 0, 2 * MS)


def test_dns_failure_ends_inside_dns() -> None:
    marks = _marks(CONNECT_START=1000, DNS_START=2000)
    phases = compute_phases(_until(marks, 9 * MS), streaming=False, first_token_ns=0)
    assert [(p.name, p.complete) for p in phases] == [(sc.SPAN_DNS, False)]


def test_timeout_waiting_for_headers() -> None:
    marks = _marks(UPLOAD_START=1000, BODY_SENT=2000)
    phases = compute_phases(_until(marks, 5000 * MS), streaming=True, first_token_ns=0)
    assert phases[-1].name == sc.SPAN_SERVER_WAIT and not phases[-1].complete
    _check_tiling(phases, 0, 5000 * MS)


def test_stream_without_any_token_is_a_download() -> None:
    marks = _marks(UPLOAD_START=1000, BODY_SENT=2000, HEADERS=3 * MS)
    phases = compute_phases(_until(marks, 9 * MS), streaming=True, first_token_ns=0)
    assert phases[-1].name == sc.SPAN_DOWNLOAD
