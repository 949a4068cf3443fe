"""Admission control: per-key rate and concurrency limits, and the gateway's bounded queue.

Everything runs on the server's single event loop, so plain counters need no locks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

__all__ = ["Admission", "KeyLimits", "Rejected", "TokenBucket"]


class Rejected(Exception):
    """Not admitted: ``reason`` is the outcome, ``retry_after`` whole seconds for the client."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def _seconds(value: float) -> int:
    return max(1, min(3600, math.ceil(value)))


class TokenBucket:
    """``rate`` requests per second sustained, ``burst`` at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> float:
        """0 when a request may go now (and it is counted), else seconds until one may."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


class KeyLimits:
    """One key's rate bucket and in-flight count."""

    def __init__(self, rate: float | None, burst: int | None, max_concurrency: int | None) -> None:
        self.bucket = TokenBucket(rate, burst or 1) if rate else None
        self.max_concurrency = max_concurrency
        self.in_flight = 0

    def enter(self) -> None:
        """Count a request in, or raise ``Rejected("rate_limited")``."""
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            raise Rejected("rate_limited", 1)
        if self.bucket is not None:
            wait = self.bucket.take()
            if wait > 0:
                raise Rejected("rate_limited", _seconds(wait))
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


class Admission:
    """At most ``slots`` requests upstream, at most ``max_queue`` waiting (FIFO) for at most
    ``max_wait`` seconds; anything beyond is rejected at once with an estimated Retry-After."""

    def __init__(self, slots: int, max_queue: int, max_wait: float) -> None:
        self.slots = slots
        self.max_queue = max_queue
        self.max_wait = max_wait
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._service_s = 1.0  # moving average of how long a slot is held

    @property
    def depth(self) -> int:
        return len(self._waiters)

    def retry_after(self) -> int:
        """Seconds until the queue has likely moved by its current length."""
        return _seconds(self._service_s * (self.depth + 1) / self.slots)

    async def acquire(self) -> None:
        """Take a slot, waiting in line if needed; raises ``Rejected("overloaded")``."""
        if self.active < self.slots and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise Rejected("overloaded", self.retry_after())
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait((waiter,), timeout=self.max_wait)
        except BaseException:  # cancelled: the client left while queued
            self._abandon(waiter)
            raise
        if not waiter.done():
            self._abandon(waiter)
            raise Rejected("overloaded", self.retry_after())

    def _abandon(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.release()  # the slot was handed over just as we gave up: pass it on
            return
        waiter.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def release(self, held_s: float | None = None) -> None:
        """Give the slot to the next in line (it stays counted as active), else free it."""
        if held_s is not None:
            self._service_s += 0.2 * (held_s - self._service_s)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1
