"""The load generator watches its own reading: whether its event loop woke on time, and when it did
not, whether it was waiting for a CPU (Linux's run queue) or busy with its own work.

A stream is timed where the generator reads it, so a reader that is not running while the tokens
arrive sees them late and all at once: TTFT then includes the wait and TPOT falls to zero, though
the server wrote every token on time. Two measures tell it, both cheap and taken off the request
path:

* a tick task in the level's event loop sleeps ``TICK`` seconds at a time and records how late
  each wake came (the loop's lateness); a wake at least ``STALL`` late is a stall (a fast runtime
  writes a token every millisecond or two, so a few milliseconds already lump them), kept (bounded) so
  each request can be matched with the stalls it lived through;
* the loop thread's run-queue wait, from ``/proc/thread-self/schedstat`` (Linux's time the thread
  was runnable but not running), read at each tick and across the level: the part of a stall spent
  in the run queue is time the machine gave its CPUs to other processes (the server beside it).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoopReport", "LoopWatch", "runqueue_wait_ns"]

SCHEDSTAT = "/proc/thread-self/schedstat"
TICK = 0.01  # s between the tick task's wakes: 100 wakes per second, a few us of CPU each
STALL = 0.005  # s: a wake this late is a stall (a stream of a token every 1-2 ms is held for several)
MAX_STALLS = 10_000  # stalls kept for matching with requests; the counts go on beyond
_UNIT = 1e-4  # lateness is counted in 0.1 ms steps (bounded memory whatever the level's length)


def runqueue_wait_ns(path: str = SCHEDSTAT) -> int | None:
    """The calling thread's total run-queue wait (ns) since it started, None where Linux does not
    say (another system, or a kernel without scheduler statistics)."""
    try:
        with open(path, "rb") as stat:
            fields = stat.read().split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def _percentile(counts: Counter[int], share: float) -> float | None:
    """Nearest-rank percentile (``share`` 0..1) of lateness counted in ``_UNIT`` steps, seconds."""
    total = sum(counts.values())
    if not total:
        return None
    rank, seen = max(1, round(share * total)), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return value * _UNIT
    return max(counts) * _UNIT


@dataclass
class LoopReport:
    """What the watch saw over one level (seconds; None: not measured here)."""

    wall: float = 0.0
    ticks: int = 0
    late_p50: float | None = None
    late_p99: float | None = None
    late_max: float | None = None
    stalls: int = 0  # wakes at least STALL late
    stalled: float = 0.0  # their lateness, summed
    stalled_in_runqueue: float | None = None  # of that, run-queue wait (None: no schedstat)
    runqueue_wait: float | None = None  # the loop thread's run-queue wait over the whole level
    stall_windows: list[tuple[float, float, float]] = field(default_factory=list)  # (from, to, late), perf-counter s

    @property
    def runqueue_share(self) -> float | None:
        """The share of the level the loop thread spent waiting for a CPU."""
        if self.runqueue_wait is None or self.wall <= 0:
            return None
        return self.runqueue_wait / self.wall

    @property
    def stall_runqueue_share(self) -> float | None:
        """The share of the stalls' lateness spent waiting for a CPU (the rest: the loop was busy)."""
        if self.stalled_in_runqueue is None or self.stalled <= 0:
            return None
        return min(1.0, self.stalled_in_runqueue / self.stalled)

    def stalls_within(self, start: float, end: float) -> tuple[int, float]:
        """How many kept stalls overlap the window ``start``..``end`` (perf-counter seconds), and the
        longest one's lateness (0.0 for none)."""
        late = [stall for lo, hi, stall in self.stall_windows if lo < end and hi > start]
        return len(late), max(late, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"tick": TICK, "stall_threshold": STALL, "ticks": self.ticks, "loop_late_p50": self.late_p50,
                "loop_late_p99": self.late_p99, "loop_late_max": self.late_max, "stalls": self.stalls,
                "stalled_seconds": self.stalled, "stall_runqueue_share": self.stall_runqueue_share,
                "runqueue_wait": self.runqueue_wait, "runqueue_share": self.runqueue_share}


class LoopWatch:
    """Runs in the level's event loop between ``start()`` and ``stop()`` (which returns the report)."""

    def __init__(self, tick: float = TICK, stall: float = STALL) -> None:
        self.tick, self.stall = tick, stall
        self._late: Counter[int] = Counter()
        self._report = LoopReport()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._rq0: int | None = None

    def start(self) -> None:
        self._started = time.perf_counter()
        self._rq0 = runqueue_wait_ns()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> LoopReport:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        report = self._report
        report.wall = time.perf_counter() - self._started
        rq = runqueue_wait_ns()
        if rq is not None and self._rq0 is not None:
            report.runqueue_wait = (rq - self._rq0) * 1e-9
        report.late_p50, report.late_p99 = _percentile(self._late, 0.5), _percentile(self._late, 0.99)
        report.late_max = max(self._late) * _UNIT if self._late else None
        return report

    async def _run(self) -> None:
        clock, report = time.perf_counter, self._report
        before = self._rq0
        while True:
            due = clock() + self.tick
            await asyncio.sleep(self.tick)
            woke = clock()
            rq = runqueue_wait_ns()
            late = max(0.0, woke - due)
            report.ticks += 1
            self._late[round(late / _UNIT)] += 1
            if late >= self.stall:
                self._stalled(late, woke, None if rq is None or before is None else (rq - before) * 1e-9)
            before = rq

    def _stalled(self, late: float, woke: float, waited: float | None) -> None:
        report = self._report
        report.stalls += 1
        report.stalled += late
        if waited is not None:  # the run-queue wait since the last wake, at most the lateness
            report.stalled_in_runqueue = (report.stalled_in_runqueue or 0.0) + min(waited, late)
        if len(report.stall_windows) < MAX_STALLS:
            report.stall_windows.append((woke - late - self.tick, woke, late))
