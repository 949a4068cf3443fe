"""What the host says between a target's steps: its runtime's PID and the /proc/vmstat counters.

Read as the observers read them (``observers.restarts.listener_pid``: the process listening on
the URL's port, from /proc, no request sent; ``observers.host.read_vmstat``), and only for a
server on this host: another machine's processes and paging are out of sight. Pure data plus
one reader; the verdicts (``runtime_restarted``, ``memory_pressure``) compare the readings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from otel_llm.tools._log import log_once
from otel_llm.observers.host import VMSTAT_PATH, read_vmstat
from otel_llm.observers.registry import Server
from otel_llm.observers.restarts import listener_pid

__all__ = ["VMSTAT_KEYS", "HostReading", "read_host"]

VMSTAT_KEYS = ("pswpin", "pswpout", "pgmajfault")  # swapped-in / -out pages, major faults


@dataclass
class HostReading:
    """One reading, taken at ``step`` (``start``, ``before cold trials``, ``after cold trials``, ``end``)."""

    step: str
    pid: int | None = None  # the runtime process listening on the target's port; None: none seen
    vmstat: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_host(url: str, step: str, vmstat_path: str = VMSTAT_PATH) -> HostReading | None:
    """The reading for the server at ``url``; None when it is not on this host. Never raises."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not Server(host, 0, None).is_local:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    reading = HostReading(step)
    try:
        reading.pid = listener_pid(port)
    except Exception:
        log_once("diagnose: finding the runtime's process failed")
    try:
        reading.vmstat = read_vmstat(tuple(k.encode() for k in VMSTAT_KEYS), vmstat_path) or {}
    except Exception:
        log_once("diagnose: reading /proc/vmstat failed")
    return reading
