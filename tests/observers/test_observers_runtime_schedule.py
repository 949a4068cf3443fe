"""Each endpoint's back-off: exponential, bounded, stopped at once where a failure is final."""

from __future__ import annotations

import math

from otel_llm.observers._runtime_schedule import MAX_FAILURES, Backoff


def test_failures_back_off_exponentially_then_stop() -> None:
    backoff = Backoff()
    waits = []
    for _ in range(MAX_FAILURES - 1):
        assert not backoff.failed("/metrics", 100.0, 1.0)
        waits.append(backoff.retry_at["/metrics"] - 100.0)
    assert waits == [1.0, 2.0, 4.0, 8.0][: MAX_FAILURES - 1]
    assert backoff.failed("/metrics", 100.0, 1.0) and backoff.stopped("/metrics")
    assert backoff.waiting("/metrics", 1e12) and backoff.failures == {"/metrics": MAX_FAILURES}


def test_a_final_failure_stops_at_once_and_each_endpoint_counts_alone() -> None:
    backoff = Backoff()
    assert backoff.failed("/props", 0.0, 1.0, at_once=True) and backoff.retry_at["/props"] == math.inf
    assert not backoff.stopped("/metrics") and not backoff.waiting("/metrics", 0.0)


def test_a_success_resets_the_count_and_due_in_is_the_soonest() -> None:
    backoff = Backoff()
    backoff.failed("/metrics", 10.0, 1.0)
    backoff.failed("/metrics", 10.0, 1.0)
    backoff.succeeded("/metrics")
    assert backoff.failures == {}
    assert not backoff.failed("/metrics", 20.0, 1.0) and backoff.retry_at["/metrics"] == 21.0
    assert backoff.due_in(["/metrics"], 20.0) == 1.0
    assert backoff.due_in(["/metrics", "/api/ps"], 20.0) == -20.0  # /api/ps never failed: due now
    assert backoff.due_in([], 20.0) == math.inf
