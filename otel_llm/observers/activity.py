"""When the application last made a model call, so the observers' threads can rest meanwhile.

Host samples and runtime polls serve the calls: with no call for ``idle_after`` seconds, the host
sampler stops and the runtime poller slows down until the next call. Waking a thread costs far
more than its work on a virtual machine whose CPU idled for a second (around 10x the CPU time of
the same work done warm), so an idle application's observers should not tick every second.
"""

from __future__ import annotations

import threading
import time

__all__ = ["Activity", "IDLE_AFTER"]

IDLE_AFTER = 30.0


class Activity:
    """The time of the latest model call, and a way for threads to sleep until the next one."""

    def __init__(self, idle_after: float = IDLE_AFTER) -> None:
        self.idle_after = idle_after
        self.last = time.monotonic()
        self.resting = False  # read on every call: one attribute load when nobody rests
        self._resume = threading.Event()
        self._lock = threading.Lock()

    def touch(self) -> None:
        """A model call starts (the hot path: a clock read, and a wake-up only after a rest)."""
        self.last = time.monotonic()
        if self.resting:
            self.wake()

    def wake(self) -> None:
        """End every rest now (a call arrived, or an observer is stopping)."""
        with self._lock:
            self.resting = False
            self._resume.set()

    def idle(self) -> bool:
        return time.monotonic() - self.last > self.idle_after

    def rest(self, timeout: float | None) -> None:
        """Sleep until the next call, ``wake()`` or ``timeout`` seconds, whichever comes first;
        returns at once if a call came since idleness was checked."""
        with self._lock:
            if not self.idle():
                return
            self.resting = True
            self._resume.clear()
        self._resume.wait(timeout)
