"""Host and process metrics, read from psutil when the metric reader collects.

Every callback catches everything, logs each kind of problem once and returns what it could
read: an observer must never raise into the SDK's collection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_llm import semconv as sc
from otel_llm._log import log_once
from otel_llm._types import Attributes
from otel_llm.observers.processes import RuntimeProcesses
from otel_llm.semconv import (  # noqa: F401 - names callers import from here too
    METRIC_SYSTEM_CPU_UTILIZATION, METRIC_SYSTEM_MEMORY_USAGE, METRIC_SYSTEM_MEMORY_UTILIZATION,
    METRIC_SYSTEM_PAGING_USAGE, METRIC_SYSTEM_PAGING_OPERATIONS, METRIC_SYSTEM_PAGING_FAULTS,
    METRIC_SYSTEM_DISK_IO, METRIC_SYSTEM_NETWORK_IO, METRIC_PROCESS_CPU_UTILIZATION,
    METRIC_PROCESS_MEMORY_USAGE, CPU_MODE, SYSTEM_MEMORY_STATE, SYSTEM_PAGING_STATE,
    SYSTEM_PAGING_DIRECTION, SYSTEM_PAGING_FAULT_TYPE, DISK_IO_DIRECTION, NETWORK_IO_DIRECTION,
    PROCESS_PID, PROCESS_EXECUTABLE_NAME,
)

__all__ = ["HostObserver", "VMSTAT_PATH", "read_vmstat"]

VMSTAT_PATH = "/proc/vmstat"
# psutil cpu_times field -> cpu.mode value. guest/guest_nice are left out: Linux already counts
# them in user/nice.
_CPU_MODES = {"user": "user", "nice": "nice", "system": "system", "idle": "idle", "iowait": "iowait",
              "irq": "interrupt", "softirq": "interrupt", "steal": "steal"}
_MEMORY_STATES = ("used", "free", "cached", "buffers")
_EXPECTED = (psutil.Error, OSError)  # problems of the host, not bugs: logged without a traceback


def read_vmstat(keys: Iterable[bytes], path: str = VMSTAT_PATH) -> dict[str, int] | None:
    """The named counters of /proc/vmstat, or None where there is none (not Linux)."""
    try:
        with open(path, "rb") as file:
            text = b"\n" + file.read()
    except OSError:
        return None
    values: dict[str, int] = {}
    for key in keys:
        # a find per key is cheaper than splitting ~180 lines
        start = text.find(b"\n" + key + b" ")
        if start >= 0:
            end = text.find(b"\n", start + 1)
            values[key.decode()] = int(text[start + len(key) + 2:end if end >= 0 else None])
    return values


def _collect(what: str, observations: Iterator[Observation]) -> list[Observation]:
    """Drain a generator of observations; on failure keep those already read and log once."""
    found: list[Observation] = []
    try:
        for observation in observations:
            found.append(observation)
    except _EXPECTED as exc:
        log_once(f"host observer: reading {what} failed ({type(exc).__name__})", exc_info=False)
    except Exception:
        log_once(f"host observer: reading {what} failed")
    return found


class _CpuDelta:
    """Fractions of time per mode between two readings of cumulative CPU times."""

    def __init__(self) -> None:
        self._previous: dict[str, float] = {}
        self._fractions: dict[str, float] = {}

    def fractions(self, times: Any) -> dict[str, float]:
        current: dict[str, float] = {}
        for field, mode in _CPU_MODES.items():
            current[mode] = current.get(mode, 0.0) + getattr(times, field, 0.0)
        # The first reading covers the time since boot: a fair answer until the next one.
        delta = {mode: max(0.0, value - self._previous.get(mode, 0.0)) for mode, value in current.items()}
        total = sum(delta.values())
        if total > 0:  # else collected again within one clock tick: keep the last answer
            self._previous = current
            self._fractions = {mode: value / total for mode, value in delta.items()}
        return self._fractions


class HostObserver:
    """Registers the system.* and process.* instruments; reads happen at collection time."""

    def __init__(self, meter: Meter, processes: RuntimeProcesses) -> None:
        self.processes = processes
        self._me = psutil.Process()
        self._cpu = _CpuDelta()
        self._cpu_count = psutil.cpu_count() or 1
        # (pid, create_time) -> (user s, system s, perf_counter s) at the previous collection
        self._process_times: dict[tuple[int, float], tuple[float, float, float]] = {}
        self._names: dict[tuple[int, float], str] = {}
        self._register(meter)

    def _register(self, meter: Meter) -> None:
        gauge, updown, counter = (meter.create_observable_gauge, meter.create_observable_up_down_counter,
                                  meter.create_observable_counter)
        specs: list[tuple[Callable[..., Any], str, str, str, Callable[[], Iterator[Observation]]]] = [
            (gauge, METRIC_SYSTEM_CPU_UTILIZATION, "1", "CPU time fraction per mode since the last collection.",
             self._system_cpu),
            (updown, METRIC_SYSTEM_MEMORY_USAGE, "By", "Memory in use per state.", self._memory_usage),
            (gauge, METRIC_SYSTEM_MEMORY_UTILIZATION, "1", "Fraction of memory per state.", self._memory_utilization),
            (updown, METRIC_SYSTEM_PAGING_USAGE, "By", "Swap space used and free.", self._paging_usage),
            (counter, METRIC_SYSTEM_PAGING_OPERATIONS, "{operation}", "Pages swapped in and out.",
             self._paging_operations),
            (counter, METRIC_SYSTEM_PAGING_FAULTS, "{fault}", "Page faults (major: read from disk).",
             self._paging_faults),
            (counter, METRIC_SYSTEM_DISK_IO, "By", "Bytes read from and written to disks.", self._disk_io),
            (counter, METRIC_SYSTEM_NETWORK_IO, "By", "Bytes received and transmitted (all interfaces).",
             self._network_io),
            (gauge, METRIC_PROCESS_CPU_UTILIZATION, "1",
             "CPU time of this process and the runtime processes since the last collection, per CPU.",
             self._process_cpu),
            (updown, METRIC_PROCESS_MEMORY_USAGE, "By", "Resident memory of this process and the runtime processes.",
             self._process_memory),
        ]
        for create, name, unit, description, read in specs:
            create(name, callbacks=[self._callback(name, read)], unit=unit, description=description)

    @staticmethod
    def _callback(name: str, read: Callable[[], Iterator[Observation]]) -> Callable[[CallbackOptions],
                                                                                       list[Observation]]:
        return lambda options: _collect(name, read())

    # -- system ---------------------------------------------------------------------------------
    def _system_cpu(self) -> Iterator[Observation]:
        for mode, fraction in self._cpu.fractions(psutil.cpu_times()).items():
            yield Observation(fraction, {CPU_MODE: mode})

    def _memory_usage(self) -> Iterator[Observation]:
        memory = psutil.virtual_memory()
        for state in _MEMORY_STATES:
            if hasattr(memory, state):  # cached/buffers exist on Linux only
                yield Observation(getattr(memory, state), {SYSTEM_MEMORY_STATE: state})

    def _memory_utilization(self) -> Iterator[Observation]:
        memory = psutil.virtual_memory()
        for state in _MEMORY_STATES:
            if hasattr(memory, state) and memory.total:
                yield Observation(getattr(memory, state) / memory.total, {SYSTEM_MEMORY_STATE: state})

    def _paging_usage(self) -> Iterator[Observation]:
        swap = psutil.swap_memory()
        yield Observation(swap.used, {SYSTEM_PAGING_STATE: "used"})
        yield Observation(swap.free, {SYSTEM_PAGING_STATE: "free"})

    def _paging_operations(self) -> Iterator[Observation]:
        # As the collector's hostmetrics reports it: swapping is the "major" paging operation
        # (pswpin/pswpout pages), page-ins/outs of the page cache the "minor" one (pgpgin/pgpgout).
        vmstat = read_vmstat((b"pswpin", b"pswpout", b"pgpgin", b"pgpgout")) or {}
        for key, direction, kind in (("pswpin", "in", "major"), ("pswpout", "out", "major"),
                                     ("pgpgin", "in", "minor"), ("pgpgout", "out", "minor")):
            if key in vmstat:
                yield Observation(vmstat[key], {SYSTEM_PAGING_DIRECTION: direction, SYSTEM_PAGING_FAULT_TYPE: kind})

    def _paging_faults(self) -> Iterator[Observation]:
        vmstat = read_vmstat((b"pgfault", b"pgmajfault")) or {}
        if "pgmajfault" in vmstat:
            yield Observation(vmstat["pgmajfault"], {SYSTEM_PAGING_FAULT_TYPE: "major"})
            if "pgfault" in vmstat:  # pgfault counts every fault, major ones included
                yield Observation(max(0, vmstat["pgfault"] - vmstat["pgmajfault"]),
                                  {SYSTEM_PAGING_FAULT_TYPE: "minor"})

    def _disk_io(self) -> Iterator[Observation]:
        disk = psutil.disk_io_counters()
        if disk is not None:  # None where the host exposes no disks (some containers)
            yield Observation(disk.read_bytes, {DISK_IO_DIRECTION: "read"})
            yield Observation(disk.write_bytes, {DISK_IO_DIRECTION: "write"})

    def _network_io(self) -> Iterator[Observation]:
        net = psutil.net_io_counters()
        if net is not None:
            yield Observation(net.bytes_recv, {NETWORK_IO_DIRECTION: "receive"})
            yield Observation(net.bytes_sent, {NETWORK_IO_DIRECTION: "transmit"})

    # -- processes ------------------------------------------------------------------------------
    def _targets(self) -> list[tuple[psutil.Process, str | None]]:
        """This process first, then the runtime processes (this one only once)."""
        targets: list[tuple[psutil.Process, str | None]] = [(self._me, None)]
        try:
            runtimes = self.processes.processes()
        except Exception:
            log_once("host observer: finding the runtime processes failed")
            runtimes = []
        for proc, runtime in runtimes:
            if proc.pid == self._me.pid:
                targets[0] = (self._me, runtime)
            else:
                targets.append((proc, runtime))
        return targets

    def _process_cpu(self) -> Iterator[Observation]:
        now = time.perf_counter()
        seen: set[tuple[int, float]] = set()
        for proc, runtime in self._targets():
            read = self._per_process(METRIC_PROCESS_CPU_UTILIZATION, proc, lambda p: p.cpu_times())
            if read is None:
                continue
            key, times = read
            seen.add(key)
            attrs = self._attributes(proc, key, runtime)
            for mode, fraction in self._process_fractions(key, times, now).items():
                yield Observation(fraction, {**attrs, CPU_MODE: mode})
        for stale in set(self._process_times) - seen:  # processes that went away
            del self._process_times[stale]
            self._names.pop(stale, None)

    def _process_fractions(self, key: tuple[int, float], times: Any, now: float) -> dict[str, float]:
        previous = self._process_times.get(key)
        self._process_times[key] = (times.user, times.system, now)
        # First reading: the average since the process started.
        user0, system0, then = previous if previous is not None else (0.0, 0.0, key[1] - time.time() + now)
        elapsed = (now - then) * self._cpu_count
        if elapsed <= 0:
            return {}
        # clamped: timer jitter can push a busy process a little above one
        return {"user": min(1.0, max(0.0, (times.user - user0) / elapsed)),
                "system": min(1.0, max(0.0, (times.system - system0) / elapsed))}

    def _process_memory(self) -> Iterator[Observation]:
        for proc, runtime in self._targets():
            read = self._per_process(METRIC_PROCESS_MEMORY_USAGE, proc, lambda p: p.memory_info())
            if read is not None:
                key, memory = read
                yield Observation(memory.rss, self._attributes(proc, key, runtime))

    def _per_process(self, what: str, proc: psutil.Process,
                     read: Callable[[psutil.Process], Any]) -> tuple[tuple[int, float], Any] | None:
        """((pid, create time), read(proc)), or None when the process cannot be read."""
        try:
            return (proc.pid, proc.create_time()), read(proc)
        except psutil.NoSuchProcess:
            self.processes.discard(proc)  # it exited: expected, not worth a log line
        except _EXPECTED as exc:
            log_once(f"host observer: reading {what} of a process failed ({type(exc).__name__})",
                     exc_info=False)
        except Exception:
            log_once(f"host observer: reading {what} of a process failed")
        return None

    def _attributes(self, proc: psutil.Process, key: tuple[int, float], runtime: str | None) -> Attributes:
        name = self._names.get(key)
        if name is None:
            try:
                name = self._names[key] = proc.name()
            except _EXPECTED:
                name = ""
        attrs: Attributes = {PROCESS_PID: proc.pid}
        if name:
            attrs[PROCESS_EXECUTABLE_NAME] = name
        if runtime is not None:
            attrs[sc.LLM_RUNTIME_NAME] = runtime
        return attrs
