"""Count the kernel's OOM kills: the growth of /proc/vmstat's ``oom_kill`` between host samples.

The first reading is the baseline (kills before the session are not counted). Each growth adds
its delta to the ``llm.host.oom_kills`` counter and logs one WARNING with the delta and, when the
kernel log is readable without privileges (``dmesg``; ``kernel.dmesg_restrict`` may forbid it),
the victim of the latest ``Out of memory: Killed process PID (NAME)`` line. A failure to read
the kernel log is skipped silently: the count does not depend on it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Any

from otel_llm import semconv as sc
from otel_llm._log import log_once, logger
from otel_llm.observers.host import VMSTAT_PATH, read_vmstat

__all__ = ["OomWatch", "Victim", "dmesg_victim", "oom_victim"]

VMSTAT_OOM_KILL = "oom_kill"
_VICTIM = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)")
DMESG_TIMEOUT = 2.0

Victim = tuple[int, str]


def oom_victim(kernel_log: str) -> Victim | None:
    """(pid, name) of the latest ``Out of memory: Killed process PID (NAME)`` line, or None."""
    found = None
    for found in _VICTIM.finditer(kernel_log):
        pass
    return (int(found.group(1)), found.group(2)) if found is not None else None


def dmesg_victim() -> Victim | None:
    """The latest OOM victim from ``dmesg``; None when there is none or the log is unreadable."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, timeout=DMESG_TIMEOUT, stdin=subprocess.DEVNULL,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return oom_victim(done.stdout.decode("utf-8", "replace"))


class OomWatch:
    """The growth of the kernel's OOM-kill count; ``observe`` runs on the host sampler's thread."""

    def __init__(self, meter: Any, victim: Callable[[], Victim | None] = dmesg_victim) -> None:
        self._victim = victim
        self._previous: int | None = None
        self.kills = meter.create_counter(sc.METRIC_HOST_OOM_KILLS, unit="{kill}",
                                          description="Processes the kernel killed for lack of memory "
                                                      "(growth of /proc/vmstat oom_kill).")

    def on_sample(self, sample: Any) -> None:
        """A host sample was taken: compare its ``oom_kills`` reading with the previous one."""
        self.observe(getattr(sample, "oom_kills", None))

    def check(self, path: str = VMSTAT_PATH) -> int:
        """Read ``oom_kill`` from ``path`` (a vmstat file) and observe it; the delta found."""
        try:
            values = read_vmstat((VMSTAT_OOM_KILL.encode(),), path) or {}
        except Exception:
            log_once("reading the OOM-kill count failed")
            return 0
        return self.observe(values.get(VMSTAT_OOM_KILL))

    def observe(self, total: int | None) -> int:
        """The kills since the previous reading (0 on the first one, or with no reading); counts
        and logs them. Never raises."""
        if total is None:
            return 0
        previous, self._previous = self._previous, total
        if previous is None or total <= previous:  # the baseline (or a count that went back)
            return 0
        delta = total - previous
        try:
            self.kills.add(delta)
            victim = self._victim()
            killed = f"; the latest victim: {victim[1]} (pid {victim[0]})" if victim is not None else ""
            logger.warning("otel_llm: the kernel killed %d process(es) for lack of memory (oom_kill +%d)%s",
                           delta, delta, killed)
        except Exception:
            log_once("reporting OOM kills failed")
        return delta
