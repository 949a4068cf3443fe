"""Peak memory of the model server while a level runs: resident memory of its process tree and,
where NVML sees them, GPU memory of those processes.

The server is found as the observers find it: the process listening on the URL's port (read
from /proc, no request sent) and its children (vLLM's engine core, Ollama's runner). Only a server
on this host can be seen; one behind another machine's address is said to be out of sight. A
thread samples every ``interval`` seconds off the request path; the peak is the largest sum seen,
so a spike shorter than the interval can be missed (the report says the interval).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil

from otel_llm.tools._log import log_once
from otel_llm.observers.processes import listening_runtimes

__all__ = ["MemoryPeak", "MemoryWatch", "server_processes"]

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}  # noqa: S104 - names, not binds


@dataclass
class MemoryPeak:
    """What one level's sampling saw (bytes; None = not seen, ``why`` says why)."""

    rss: int | None = None
    gpu: int | None = None
    pids: list[int] = field(default_factory=list)
    samples: int = 0
    interval: float = 0.0
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"peak_rss_bytes": self.rss, "peak_gpu_memory_bytes": self.gpu, "pids": self.pids,
                "samples": self.samples, "interval": self.interval, "not_seen": self.why}


def server_processes(url: str) -> tuple[list[psutil.Process], str | None]:
    """The processes of the server at ``url`` on this host (listener and descendants), or [] and
    why they cannot be seen."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host not in _LOCAL_HOSTS and not host.startswith("127."):
        return [], f"the server ({host or url}) is not on this host"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    listener = listening_runtimes({port}).get(port)
    if listener is None or not listener.processes:
        return [], f"no visible process listens on port {port}"
    if any(p.pid == os.getpid() for p in listener.processes):
        return [], "the server runs inside this process"
    found: dict[int, psutil.Process] = {}
    for proc in listener.processes:
        found.setdefault(proc.pid, proc)
        try:
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
        except (psutil.Error, OSError):
            continue
    return list(found.values()), None


class MemoryWatch:
    """Samples the server's memory in a thread between ``start()`` and ``stop()``; each ``stop``
    returns that span's peak. ``gpu`` maps pids to their GPU memory (the GPU observer's read)."""

    def __init__(self, processes: Iterable[psutil.Process], why: str | None = None, interval: float = 0.1,
                 gpu: Callable[[set[int]], dict[int, int]] | None = None) -> None:
        self.processes = list(processes)
        self.why = why
        self.interval = interval
        self.gpu = gpu
        self._peak = MemoryPeak()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def of_server(cls, url: str, interval: float = 0.1) -> MemoryWatch:
        """A watch on the server at ``url`` with the GPU read where NVML sees a device."""
        try:
            processes, why = server_processes(url)
        except Exception as exc:  # the process table unreadable: the benchmark still runs
            processes, why = [], f"the process table could not be read ({type(exc).__name__})"
        return cls(processes, why, interval, _gpu_reader() if processes else None)

    def describe(self) -> str:
        """The processes watched, or why none is."""
        if not self.processes:
            return f"not seen ({self.why})" if self.why else "not seen"
        names = ", ".join(f"{_name(p)} {p.pid}" for p in self.processes)
        gpu = "; GPU memory from NVML" if self.gpu is not None else "; no GPU seen by NVML"
        return f"peak resident memory of {names} (summed, sampled every {self.interval:g} s){gpu}"

    def close(self) -> None:
        self.stop()
        closer = getattr(self.gpu, "close", None)
        if closer is not None:
            closer()

    def start(self) -> None:
        self._peak = MemoryPeak(pids=sorted(p.pid for p in self.processes), interval=self.interval, why=self.why)
        if not self.processes:
            return
        self._stop.clear()
        self._sample()  # the level's first figure, before any request
        self._thread = threading.Thread(target=self._run, name="otel_llm-bench-memory", daemon=True)
        self._thread.start()

    def stop(self) -> MemoryPeak:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None
            self._sample()  # and its last
        with self._lock:
            return self._peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        try:
            rss, alive = 0, set()
            for proc in self.processes:
                try:
                    rss += proc.memory_info().rss
                    alive.add(proc.pid)
                except (psutil.Error, OSError):  # a process that ended is no longer summed
                    continue
            gpu = sum(self.gpu(alive).values()) if self.gpu is not None and alive else None
        except Exception:  # never the reason a benchmark stops
            log_once("sampling the model server's memory failed")
            return
        with self._lock:
            peak = self._peak
            peak.samples += 1
            if alive:
                peak.rss = max(peak.rss or 0, rss)
            if gpu is not None:
                peak.gpu = max(peak.gpu or 0, gpu)


class _GpuReader:
    """The GPU observer's per-process read, with a no-op meter (bench exports no GPU metrics)."""

    def __init__(self, observer: Any) -> None:
        self.observer = observer

    def __call__(self, pids: set[int]) -> dict[int, int]:
        return dict(self.observer.process_memory(pids))

    def close(self) -> None:
        self.observer.shutdown()


def _gpu_reader() -> _GpuReader | None:
    from opentelemetry.metrics import NoOpMeter

    from otel_llm.observers.gpu import GpuObserver

    observer = GpuObserver.create(NoOpMeter("otel_llm.bench"))
    return _GpuReader(observer) if observer is not None else None


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except (psutil.Error, OSError):
        return "?"
