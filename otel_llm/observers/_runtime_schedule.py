"""When the runtime-state poller polls: its pace, and each endpoint's back-off after failures."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["IDLE_INTERVAL", "MAX_FAILURES", "MAX_SLEEP", "Backoff"]

MAX_FAILURES = 5  # consecutive failures of an endpoint before it is no longer polled
MAX_SLEEP = 60.0  # the poller wakes at least this often (a server noted meanwhile wakes it too)
IDLE_INTERVAL = 15.0  # between polls while the application makes no model call (a scrape's pace)


@dataclass
class Backoff:
    """The endpoints (paths) of one server, each backing off on its own: after a failure the next
    poll waits one interval, then twice as long after each further consecutive failure; at
    ``MAX_FAILURES``, or at once where the failure is final, it is stopped. Never an immediate
    retry; a success resets the count."""

    retry_at: dict[str, float] = field(default_factory=dict)  # path -> monotonic time (inf: stopped)
    failures: dict[str, int] = field(default_factory=dict)  # path -> consecutive failures

    def waiting(self, path: str, now: float) -> bool:
        """Not due yet (backing off, or stopped)."""
        return now < self.retry_at.get(path, 0.0)

    def stopped(self, path: str) -> bool:
        return self.retry_at.get(path, 0.0) == math.inf

    def due_in(self, paths: Iterable[str], now: float) -> float:
        """Seconds until the first of ``paths`` is due (0 or less: now)."""
        return min((self.retry_at.get(path, 0.0) - now for path in paths), default=math.inf)

    def failed(self, path: str, now: float, interval: float, at_once: bool = False) -> bool:
        """Count a failure; True when it stopped the endpoint."""
        failures = self.failures[path] = self.failures.get(path, 0) + 1
        if at_once or failures >= MAX_FAILURES:
            self.retry_at[path] = math.inf
            return True
        self.retry_at[path] = now + interval * 2 ** (failures - 1)
        return False

    def succeeded(self, path: str) -> None:
        self.failures.pop(path, None)
