"""The observers rest while the application makes no model call: the host sampler stops and the
runtime poller slows, and the next call wakes both at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from otel_llm.observers import runtime_state
from otel_llm.observers.activity import Activity
from otel_llm.observers.poll_policy import POLL_ALL, PollPolicy
from otel_llm.observers.registry import ServerRegistry
from otel_llm.observers.runtime_state import MAX_FAILURES, RuntimeStateObserver
from otel_llm.observers.host_samples import HostSampler

from otel_llm_testing.fake_runtime import FakeRuntime, observer_fixture
from otel_llm_testing.net import LOOPBACK


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_rest_ends_on_touch_or_wake_and_not_when_busy() -> None:
    activity = Activity(idle_after=0.05)
    started = time.monotonic()
    activity.rest(5.0)  # not idle yet: returns at once
    assert time.monotonic() - started < 0.5
    time.sleep(0.1)
    assert activity.idle()
    for end in (activity.touch, activity.wake):
        time.sleep(0.1)
        done = threading.Event()
        thread = threading.Thread(target=lambda: (activity.rest(10.0), done.set()))
        thread.start()
        assert _wait_for(lambda: activity.resting)
        assert not done.wait(0.1)
        end()
        assert done.wait(2.0)
        thread.join()
        assert activity.idle() == (end == activity.wake)  # a call makes it busy; a wake-up does not


def test_sampler_rests_while_idle_and_restarts_from_a_fresh_baseline() -> None:
    activity = Activity(idle_after=0.3)
    sampler = HostSampler(interval=0.05, activity=activity)
    sampler.start()
    try:
        assert _wait_for(lambda: activity.resting)  # ~0.3 s without a call
        resting_since = time.perf_counter_ns()
        count = len(sampler.samples())
        time.sleep(0.4)
        assert len(sampler.samples()) == count  # no tick while resting
        activity.touch()
        assert _wait_for(lambda: len(sampler.samples()) >= count + 2)
        first = sampler.samples()[count]
        # the first sample after the rest covers one interval, not the rest
        assert first.since_ns > resting_since and first.t_ns - first.since_ns < 0.5e9
    finally:
        sampler.stop()
    assert sampler._thread is None


def test_sampler_stops_while_resting() -> None:
    activity = Activity(idle_after=0.0)
    sampler = HostSampler(interval=0.05, activity=activity)
    sampler.start()
    thread = sampler._thread
    assert _wait_for(lambda: activity.resting)
    started = time.monotonic()
    sampler.stop()
    assert thread is not None and not thread.is_alive() and time.monotonic() - started < 2


def test_runtime_poller_slows_while_idle_and_polls_at_the_next_call(fake: FakeRuntime,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    monkeypatch.setattr(runtime_state, "IDLE_INTERVAL", 2.0)
    fake.serve("/metrics", observer_fixture("tgi_metrics.txt"))
    registry = ServerRegistry()
    registry.note(LOOPBACK, fake.port, "tgi")
    activity = Activity(idle_after=0.3)
    observer = RuntimeStateObserver(MeterProvider().get_meter("t"), registry, interval=0.05, activity=activity,
                                    policy=PollPolicy(POLL_ALL))  # the fake runs in this process
    observer.start()
    try:
        assert _wait_for(lambda: fake.hits.get("/metrics", 0) >= 3)  # busy pace: every 0.05 s
        assert _wait_for(lambda: activity.resting)
        resting = fake.hits["/metrics"]
        time.sleep(1.0)
        assert fake.hits["/metrics"] <= resting + 1  # one poll per 2 s at most while idle
        activity.touch()
        assert _wait_for(lambda: fake.hits["/metrics"] >= resting + 3, timeout=1.5)  # awake, fast again
    finally:
        observer.stop()


def test_runtime_poller_sleeps_once_every_endpoint_has_stopped(fake: FakeRuntime) -> None:
    """A server without /metrics stops being polled after MAX_FAILURES polls: the poller then has
    nothing to do and does not wake every interval; a newly noted server wakes it."""
    from opentelemetry.sdk.metrics import MeterProvider

    registry = ServerRegistry()
    registry.note(LOOPBACK, fake.port, "tgi")  # the fake answers 404 for /metrics
    observer = RuntimeStateObserver(MeterProvider().get_meter("t"), registry, interval=0.05,
                                    policy=PollPolicy(POLL_ALL))
    polls = [0]
    poll_once = observer.poll_once

    def counted() -> None:
        polls[0] += 1
        poll_once()

    observer.poll_once = counted  # type: ignore[method-assign]
    observer.start()
    try:
        assert _wait_for(lambda: fake.hits.get("/metrics", 0) == MAX_FAILURES)
        time.sleep(0.1)
        stopped = polls[0]
        time.sleep(0.5)
        assert polls[0] == stopped and fake.hits["/metrics"] == MAX_FAILURES  # not ten polls of nothing
        registry.note("localhost", fake.port, "tgi")  # another server: due now
        assert _wait_for(lambda: fake.hits["/metrics"] == MAX_FAILURES + 1, timeout=2.0)
    finally:
        observer.stop()
    assert observer._thread is None
