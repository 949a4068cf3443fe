"""A ring buffer of host samples, so each model call can carry the host's state while it ran.

A daemon thread takes one ``Sample`` every ``interval`` seconds. ``window_attributes`` turns the
samples around a call into ``llm.host.*`` span attributes without touching psutil.

Window rule (times are ``time.perf_counter_ns()``, the clock of the call timeline):

- a sample taken at ``t_ns`` covers ``(since_ns, t_ns]``, where ``since_ns`` is the previous
  sample's time (so ``t_ns - interval`` in steady state): its CPU value is the mean over that span;
- a call ``[start_ns, end_ns]`` uses every sample whose span overlaps it;
- a call that ended after the newest sample (the usual case when it is asked at the call's end,
  and always for a call shorter than the interval that fell after the last tick) also uses the
  newest sample, if that is at most two intervals older than the call's start: it describes the
  moments just before the call, the freshest evidence there is;
- otherwise (no samples, a call older than the buffer, or a stopped sampler) the result is empty.

CPU and GPU utilization are means over the samples used, memory utilization and GPU memory are
maxima. Cumulative counters (major faults, swap-in/out pages) are deltas from the sample before
the first sample used (or, when the buffer holds none, the first one used) to the last sample
used, never negative; they are left out when that leaves a single sample.

After each sample the ``watchers`` run on the sampler's thread with it (the restart watch and
the OOM-kill count, see ``restarts`` and ``oom``); one that fails is logged once and skipped.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from otel_llm._log import log_once
from otel_llm._types import Attributes
from otel_llm.observers.activity import Activity
from otel_llm.observers.host import VMSTAT_PATH, read_vmstat
from otel_llm.semconv import (  # noqa: F401 - names callers import from here too
    LLM_HOST_CPU_UTILIZATION, LLM_HOST_MEMORY_UTILIZATION, LLM_HOST_PAGING_MAJOR_FAULTS,
    LLM_HOST_SWAP_IN, LLM_HOST_SWAP_OUT, LLM_HOST_GPU_UTILIZATION, LLM_HOST_GPU_MEMORY_USAGE,
)

__all__ = ["HostSampler", "Sample"]

# probe keys the window turns into attributes
PROBE_GPU_UTILIZATION = "gpu.utilization"
PROBE_GPU_MEMORY_USAGE = "gpu.memory.usage"

Probe = Callable[[], Mapping[str, "float | int | None"]]
Watcher = Callable[["Sample"], None]
_VMSTAT_KEYS = (b"pgmajfault", b"pswpin", b"pswpout", b"oom_kill")
# iowait is idle time spent waiting for disks: not busy (psutil.cpu_percent counts it the same)
_IDLE_FIELDS = ("idle", "iowait")
_GUEST_FIELDS = ("guest", "guest_nice")  # already inside user/nice on Linux
_PROC_STAT = "/proc/stat"
_PROC_MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class Sample:
    """The host over ``(since_ns, t_ns]``; cumulative counters are as read at ``t_ns``."""

    t_ns: int
    since_ns: int
    cpu: float | None  # busy fraction of all CPUs over the span, 0..1
    memory: float | None  # (total - available) / total at t_ns, 0..1
    major_faults: int | None = None
    swap_in: int | None = None  # pages, cumulative
    swap_out: int | None = None
    probes: Mapping[str, float | int | None] = field(default_factory=dict)
    oom_kills: int | None = None  # the kernel's OOM kills since boot (vmstat oom_kill)


class HostSampler:
    """Samples the host every ``interval`` seconds into a ``window``-second ring buffer."""

    def __init__(self, interval: float = 1.0, window: float = 300.0, probes: Sequence[Probe] = (),
                 activity: Activity | None = None, watchers: Sequence[Watcher] = (),
                 vmstat_path: str = VMSTAT_PATH) -> None:
        self.interval = interval
        self.activity = activity  # when given, sampling pauses while the application makes no call
        self.interval_ns = int(interval * 1e9)
        self.probes = list(probes)
        self.watchers = list(watchers)
        self.vmstat_path = vmstat_path
        self._samples: collections.deque[Sample] = collections.deque(maxlen=max(1, int(window / interval)))
        self._lock = threading.Lock()  # window_attributes iterates while the thread appends
        self._sampling = threading.Lock()  # sample_now from a test and the thread: keep time order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_ns = time.perf_counter_ns()
        self._previous_cpu = _cpu_busy_total()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling thread (no-op when running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="otel_llm-host-sampler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; returns as soon as it wakes (at most one sample's time)."""
        self._stop.set()
        if self.activity is not None:
            self.activity.wake()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self, stop: threading.Event) -> None:
        deadline = time.monotonic()
        while True:
            # fixed-rate schedule: a slow tick does not shift all later ones
            deadline = max(deadline + self.interval, time.monotonic())
            if stop.wait(deadline - time.monotonic()):
                return
            if self.activity is not None and self.activity.idle():
                # no call will read samples taken now: rest until the next one, then start over
                # from a fresh baseline, so no sample averages over the whole rest
                self.activity.rest(None)
                if stop.is_set():
                    return
                self._restart()
                deadline = time.monotonic()
                continue
            try:
                self.sample_now()
            except Exception:
                log_once("host sampler: taking a sample failed")

    def _restart(self) -> None:
        with self._sampling:
            self._previous_ns = time.perf_counter_ns()
            self._previous_cpu = _cpu_busy_total()

    # -- sampling -------------------------------------------------------------------------------
    def sample_now(self) -> Sample:
        """Take one sample now, append it to the buffer and return it."""
        with self._sampling:
            now = time.perf_counter_ns()
            cpu = self._cpu_since_previous()
            memory = _memory_utilization()
            vmstat = _vmstat(self.vmstat_path)
            sample = Sample(now, self._previous_ns, cpu, memory, vmstat.get("pgmajfault"), vmstat.get("pswpin"),
                            vmstat.get("pswpout"), self._read_probes(), vmstat.get("oom_kill"))
            self._previous_ns = now
            self.append(sample)
            for watcher in self.watchers:
                try:
                    watcher(sample)
                except Exception:
                    log_once(f"host sampler: watcher {getattr(watcher, '__qualname__', watcher)!s} failed")
        return sample

    def append(self, sample: Sample) -> None:
        """Add a sample (newer than those held: the buffer is kept in time order)."""
        with self._lock:
            self._samples.append(sample)

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def _cpu_since_previous(self) -> float | None:
        current = _cpu_busy_total()
        previous, self._previous_cpu = self._previous_cpu, current
        if current is None or previous is None:
            return None
        busy, total = current[0] - previous[0], current[1] - previous[1]
        return min(1.0, max(0.0, busy / total)) if total > 0 else None

    def _read_probes(self) -> dict[str, float | int | None]:
        values: dict[str, float | int | None] = {}
        for probe in self.probes:
            try:
                values.update(probe())
            except Exception:
                log_once(f"host sampler: probe {getattr(probe, '__qualname__', probe)!s} failed")
        return values

    # -- per call -------------------------------------------------------------------------------
    def latest(self, key: str) -> Any:
        """The newest sample's value for a probe key (None when it did not report it)."""
        with self._lock:
            return self._samples[-1].probes.get(key) if self._samples else None

    def window_attributes(self, start_ns: int, end_ns: int) -> Attributes:
        """The llm.host.* attributes of a call that ran in [start_ns, end_ns] (module docstring)."""
        used, before = self._window(start_ns, end_ns)
        return _attributes(used, before) if used else {}

    def _window(self, start_ns: int, end_ns: int) -> tuple[list[Sample], Sample | None]:
        """The samples used, oldest first, and the sample just before them (if held)."""
        used: list[Sample] = []
        with self._lock:
            if not self._samples:
                return used, None
            newest = self._samples[-1]
            for sample in reversed(self._samples):  # newest first, stop at the first before the call
                if sample.t_ns < start_ns:  # entirely before the call
                    if used:
                        return used[::-1], sample
                    if sample is not newest or sample.t_ns < start_ns - 2 * self.interval_ns:
                        return used, None  # a gap in the samples, or a stale buffer
                    used.append(sample)  # the call fell after the last tick: the freshest evidence
                elif sample.since_ns < end_ns:  # overlaps; otherwise entirely after the call
                    used.append(sample)
        return used[::-1], None


def _attributes(used: list[Sample], before: Sample | None) -> Attributes:
    attrs: Attributes = {}
    cpu = [s.cpu for s in used if s.cpu is not None]
    if cpu:
        attrs[LLM_HOST_CPU_UTILIZATION] = sum(cpu) / len(cpu)
    memory = [s.memory for s in used if s.memory is not None]
    if memory:
        attrs[LLM_HOST_MEMORY_UTILIZATION] = max(memory)
    base = before if before is not None else (used[0] if len(used) > 1 else None)
    if base is not None:
        last = used[-1]
        for key, first_value, last_value in ((LLM_HOST_PAGING_MAJOR_FAULTS, base.major_faults, last.major_faults),
                                             (LLM_HOST_SWAP_IN, base.swap_in, last.swap_in),
                                             (LLM_HOST_SWAP_OUT, base.swap_out, last.swap_out)):
            if first_value is not None and last_value is not None:
                attrs[key] = max(0, last_value - first_value)
    gpu = [v for s in used if isinstance(v := s.probes.get(PROBE_GPU_UTILIZATION), (int, float))]
    if gpu:
        attrs[LLM_HOST_GPU_UTILIZATION] = sum(gpu) / len(gpu)
    gpu_memory = [v for s in used if isinstance(v := s.probes.get(PROBE_GPU_MEMORY_USAGE), (int, float))]
    if gpu_memory:
        attrs[LLM_HOST_GPU_MEMORY_USAGE] = max(gpu_memory)
    return attrs


def _cpu_busy_total() -> tuple[float, float] | None:
    """(busy, total) CPU time of all CPUs since boot, in any one unit (only their ratio is used)."""
    try:
        fields = _proc_cpu_fields()
        if fields is not None:
            return fields
        times = psutil.cpu_times()
    except Exception:
        log_once("host sampler: reading CPU times failed")
        return None
    total = sum(times) - sum(getattr(times, f, 0.0) for f in _GUEST_FIELDS)
    return total - sum(getattr(times, f, 0.0) for f in _IDLE_FIELDS), total


def _proc_cpu_fields() -> tuple[float, float] | None:
    """From /proc/stat's first line (user nice system idle iowait irq softirq steal guest ...):
    what psutil would give, without its parsing of every CPU. None where there is no /proc."""
    first = _read_head(_PROC_STAT)
    if first is None:
        return None
    ticks = [int(v) for v in first.split(b"\n", 1)[0].split()[1:9]]
    total = float(sum(ticks))  # guest time is already inside user and nice
    return total - ticks[3] - ticks[4], total


def _memory_utilization() -> float | None:
    # total - available, not "used": memory the kernel could not hand out without reclaiming
    try:
        meminfo = _read_head(_PROC_MEMINFO)
        if meminfo is not None:
            total, available = _meminfo_kib(meminfo, b"MemTotal:"), _meminfo_kib(meminfo, b"MemAvailable:")
            if total and available is not None:
                return (total - available) / total
        memory = psutil.virtual_memory()
    except Exception:
        log_once("host sampler: reading memory failed")
        return None
    return (memory.total - memory.available) / memory.total if memory.total else None


def _meminfo_kib(text: bytes, key: bytes) -> int | None:
    start = text.find(key)
    if start < 0:
        return None
    return int(text[start + len(key):text.find(b"kB", start)])


def _read_head(path: str) -> bytes | None:
    """The first 4 KiB of a /proc file, in one read; None where it does not exist.

    The sampler runs once a second, and work done after a second of sleep costs several times
    its warm CPU time on a virtual machine: psutil's readers cost ~10 ms per sample then, these
    reads ~3 ms (measured on the 2-core VM this is developed on)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _vmstat(path: str = VMSTAT_PATH) -> dict[str, int]:
    try:
        return read_vmstat(_VMSTAT_KEYS, path) or {}
    except Exception:
        log_once("host sampler: reading /proc/vmstat failed")
        return {}
