"""Start, correlate and stop the observers for one instrumentation session.

Each observer is optional (``host_metrics``, ``gpu_metrics``, ``runtime_metrics``) and any one
that fails to start is logged once and left off: observers never stop ``instrument()``.
What a model call gets from them is read from memory only (the sampler's ring buffer and the
runtime poller's latest state), so the per-call cost is a few dictionary lookups.
Riding on the host sampler's ticks (so only with ``host_metrics``), the restart watch notices a
local server's runtime process changing PID or going away, and the kernel's OOM kills are
counted (``restarts``, ``oom``); a restart pending for a server is one attribute load per call.
With no model call for ``idle_after`` seconds (30 s) the host sampler rests and the runtime poller
slows to one poll per 15 s, until the next call (see ``activity``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry.metrics import Meter, MeterProvider

from otel_llm import semconv as sc
from otel_llm._log import log_once
from otel_llm._types import Attributes
from otel_llm.observers.activity import IDLE_AFTER, Activity
from otel_llm.observers.evidence import CallEnd, CallStart, Server
from otel_llm.observers.poll_policy import POLL_LOCAL
from otel_llm.observers.registry import ServerRegistry
from otel_llm.parse.runtimes import ModelInfo
from otel_llm.version import __version__

if TYPE_CHECKING:  # each observer's module is imported only when that observer starts
    from otel_llm.observers.gpu import GpuObserver
    from otel_llm.observers.host_samples import HostSampler
    from otel_llm.observers.oom import OomWatch
    from otel_llm.observers.processes import RuntimeProcesses
    from otel_llm.observers.restarts import RestartWatch
    from otel_llm.observers.runtime_state import RuntimeStateObserver

__all__ = ["Observers"]

_T = TypeVar("_T")


class _Stops(Protocol):
    def stop(self) -> None: ...


class _ShutsDown(Protocol):
    def shutdown(self) -> None: ...


_NO_ATTRIBUTES: Attributes = {}  # never mutated: callers only read what model_attributes returns


@functools.lru_cache(maxsize=64)
def _model_attributes(info: ModelInfo) -> Attributes:
    """Built once per distinct model metadata (a frozen ModelInfo), not once per call."""
    found = {sc.LLM_MODEL_CONTEXT_LENGTH: info.context_length, sc.LLM_MODEL_NAME: info.model,
             sc.LLM_MODEL_QUANTIZATION: info.quantization, sc.LLM_MODEL_SLOTS: info.slots,
             sc.LLM_MODEL_MEMORY_TOTAL: info.size, sc.LLM_MODEL_MEMORY_VRAM: info.size_vram,
             sc.LLM_MODEL_PARAMETER_SIZE: info.parameter_size, sc.LLM_MODEL_EXPIRES_AT: info.expires_at,
             sc.LLM_DIAGNOSIS_PARTIAL_OFFLOAD: info.partial_offload}
    return {key: value for key, value in found.items() if value is not None}


class Observers:
    """The observers of one session and the per-call evidence they provide."""

    def __init__(self, meter_provider: MeterProvider, host: bool = True, gpu: bool = True, runtime: bool = True,
                 interval: float = 1.0, runtimes: dict[tuple[str, int, str], str] | None = None,
                 idle_after: float = IDLE_AFTER, poll: str = POLL_LOCAL) -> None:
        self.registry = ServerRegistry()
        self._poll = poll  # which servers the runtime-state observer may poll (poll_policy)
        self.activity = Activity(idle_after)
        for (address, port, scheme), name in (runtimes or {}).items():
            self.registry.configure(address, port, name, scheme)
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_NAME, __version__)
        self._interval = interval
        self._stoppable: list[_Stops | _ShutsDown] = []
        # (host, port) -> the llm.runtime.restarted event its next call carries; the restart
        # watch adds, the call path pops, neither locks (single dict operations)
        self.pending_restarts: dict[tuple[str, int], Attributes] = {}
        self.processes = _try("runtime process finder", self._processes) if (host or gpu) else None
        self.runtime_state = _try("runtime-state observer", self._runtime, meter) if runtime else None
        self.gpu = _try("GPU observer", self._gpu, meter) if gpu else None
        self.restarts = _try("restart watch", self._restarts, meter) if host else None
        self.oom = _try("OOM-kill count", self._oom, meter) if host else None
        self.sampler = _try("host observer", self._host, meter, interval) if host else None

    def _restarts(self, meter: Meter) -> RestartWatch:
        from otel_llm.observers.restarts import RestartWatch

        return RestartWatch(self.registry, meter, self.pending_restarts)

    def _oom(self, meter: Meter) -> OomWatch:
        from otel_llm.observers.oom import OomWatch

        return OomWatch(meter)

    def _runtime(self, meter: Meter) -> RuntimeStateObserver:
        from otel_llm.observers.poll_policy import PollPolicy
        from otel_llm.observers.runtime_state import RuntimeStateObserver

        observer = RuntimeStateObserver(meter, self.registry, interval=max(self._interval, 0.2),
                                        activity=self.activity, policy=PollPolicy(self._poll))
        observer.start()
        self._stoppable.append(observer)
        return observer

    def _processes(self) -> RuntimeProcesses:
        from otel_llm.observers.processes import RuntimeProcesses

        return RuntimeProcesses(self.registry)

    def _runtime_pids(self) -> list[int]:
        return [process.pid for process, _ in self.processes.processes()] if self.processes else []

    def _gpu(self, meter: Meter) -> GpuObserver | None:
        from otel_llm.observers.gpu import GpuObserver

        observer = GpuObserver.create(meter, pids=self._runtime_pids)
        if observer is not None:
            self._stoppable.append(observer)
        return observer

    def _host(self, meter: Meter, interval: float) -> HostSampler:
        from otel_llm.observers.host import HostObserver
        from otel_llm.observers.host_samples import HostSampler

        if self.processes is None:
            raise RuntimeError("the runtime process finder did not start")
        HostObserver(meter, self.processes)
        probes = [self.gpu.sample] if self.gpu is not None else []
        watchers = [watch.on_sample for watch in (self.restarts, self.oom) if watch is not None]
        sampler = HostSampler(interval=interval, probes=probes, activity=self.activity, watchers=watchers)
        sampler.start()
        self._stoppable.append(sampler)
        return sampler

    # -- the Evidence protocol (observers.evidence): what the sink of model calls asks ------------
    def call_started(self, server: Server, runtime: str | None, scheme: str) -> CallStart:
        host, port = server
        self.activity.touch()
        self.registry.note(host, port, runtime, scheme)
        restart = None
        if self.pending_restarts:  # almost always empty: one attribute load and a truth test
            restart = self.take_restart(host, port)
        return CallStart(self.runtime_at_start(host, port), restart)

    def call_ended(self, server: Server, start_ns: int, end_ns: int, model: str | None) -> CallEnd:
        window = model_attrs = _NO_ATTRIBUTES
        try:
            window = self.call_attributes(start_ns, end_ns)
        except Exception:
            log_once("reading the host evidence of a call failed")
        try:
            model_attrs = self.model_attributes(*server, model)
        except Exception:
            log_once("reading the runtime's model metadata failed")
        return CallEnd(window, model_attrs)

    def runtime_at(self, server: Server) -> str | None:
        try:
            return self.runtime_of(*server)
        except Exception:
            log_once("reading the recognized runtime failed")
            return None

    def watch(self, server: Server, runtime: str | None, scheme: str) -> None:
        self.registry.note(server[0], server[1], runtime, scheme)

    # -- per call --------------------------------------------------------------------------------
    def runtime_at_start(self, host: str, port: int) -> dict[str, int]:
        """Requests the runtime reported running and waiting at its latest poll before this call."""
        if self.runtime_state is None:
            return {}
        state = self.runtime_state.latest_state(host, port)
        found = {}
        for key, attribute in (("requests.running", sc.LLM_RUNTIME_REQUESTS_RUNNING),
                               ("requests.waiting", sc.LLM_RUNTIME_REQUESTS_WAITING)):
            value = state.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                found[attribute] = int(value)
        return found

    def take_restart(self, host: str, port: int) -> Attributes | None:
        """The restart event pending for host:port, removed: the call starting now carries it.
        Callers test ``pending_restarts`` first (empty: nothing to take)."""
        return self.pending_restarts.pop((host, port), None)

    def model_attributes(self, host: str, port: int, model: str | None = None) -> Attributes:
        """The ``llm.model.*`` attributes of the model the runtime at host:port reported serving
        (``model``: the one the call asked for, where the runtime loads several); the same
        dictionary for the same metadata, to be read, never changed."""
        info = self.runtime_state.model_of(host, port, model) if self.runtime_state is not None else None
        return _model_attributes(info) if info is not None else _NO_ATTRIBUTES

    def runtime_of(self, host: str, port: int) -> str | None:
        """The runtime the observers recognized at host:port (see ``RuntimeStateObserver.runtime_of``)."""
        return self.runtime_state.runtime_of(host, port) if self.runtime_state is not None else None

    def call_attributes(self, start_ns: int, end_ns: int) -> Attributes:
        """The llm.host.* evidence for a call that ran in [start_ns, end_ns] (perf-counter ns)."""
        if self.sampler is None:
            return {}
        attributes: Attributes = self.sampler.window_attributes(start_ns, end_ns)
        return attributes

    def stop(self) -> None:
        for observer in reversed(self._stoppable):
            method = getattr(observer, "stop", None) or getattr(observer, "shutdown", None)
            try:
                if method is not None:
                    method()
            except Exception:
                log_once("stopping an observer failed")
        self._stoppable.clear()


def _try(what: str, start: Callable[..., _T], *args: Any) -> _T | None:
    try:
        return start(*args)
    except Exception:
        log_once(f"the {what} could not start; it stays off")
        return None
