"""CPU cost of the observers: one metric collection cycle with every observer on, and one tick of
the host sampler.

CPU is ``time.process_time()`` of this process (all its threads), the median over many cycles.
The GPU and runtime-state observers are included when ``otel_llm.observers.gpu`` /
``otel_llm.observers.runtime_state`` can be imported and started; the output says which were.
With ``--llama`` a real llama-server runs and is registered, so discovery finds it by port and
its process metrics are read in every cycle.

The share of one core assumes the defaults: a sampler tick every second and one collection per
60 s export interval. At that interval every collection also re-runs runtime-process discovery
(cached for 10 s), so the share counts a cycle plus one discovery.

Those are warm costs, measured back to back. In place, each background thread wakes from a
sleep, and on a virtual machine work done after a second of idle CPU can cost ten times its warm
CPU time. So the observers' threads (host sampler; runtime-state poller reading the real
llama-server's ``/metrics`` with ``--llama``, else the simulator's Ollama ``/api/ps``) also run
in place for ``--in-place`` seconds twice: while the application calls a model every 0.5 s, then
after it went idle (``idle_after`` shortened to 2 s here); their CPU is read per thread from the
kernel.

    python benchmarks/observers.py [--cycles 200] [--ticks 1000] [--llama] [--in-place 10]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm.observers.host import HostObserver
from otel_llm.observers.processes import RuntimeProcesses
from otel_llm.observers.registry import ServerRegistry
from otel_llm.observers.host_samples import HostSampler

EXPORT_INTERVAL = 60.0
SAMPLER_INTERVAL = 1.0


def median_cpu(action: Callable[[], Any], repeats: int) -> float:
    """Median CPU seconds of one ``action()``."""
    costs = []
    for _ in range(repeats):
        before = time.process_time()
        action()
        costs.append(time.process_time() - before)
    return statistics.median(costs)


def optional_observers(meter: Any, registry: ServerRegistry) -> tuple[list[str], list[Any]]:
    """Start the GPU and runtime-state observers when they exist (as the manager does)."""
    included: list[str] = []
    started: list[Any] = []
    try:
        from otel_llm.observers.gpu import GpuObserver

        gpu = GpuObserver.create(meter)
        included.append("gpu" if gpu is not None else "gpu (no GPU found: nothing registered)")
        if gpu is not None:
            started.append(gpu)
    except Exception as exc:  # not written yet, or no driver
        included.append(f"gpu: left out ({type(exc).__name__}: {exc})")
    try:
        from otel_llm.observers.runtime_state import RuntimeStateObserver

        runtime = RuntimeStateObserver(meter, registry)
        runtime.start()
        started.append(runtime)
        included.append("runtime-state")
    except Exception as exc:
        included.append(f"runtime-state: left out ({type(exc).__name__}: {exc})")
    return included, started


def run(cycles: int, ticks: int, llama_port: int | None) -> None:
    registry = ServerRegistry()
    if llama_port is not None:
        registry.note("127.0.0.1", llama_port, "llama.cpp")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("otel_llm")
    processes = RuntimeProcesses(registry)
    HostObserver(meter, processes)
    included, started = optional_observers(meter, registry)
    try:
        reader.get_metrics_data()  # first cycle: discovery, instrument setup
        found = [(proc.pid, runtime) for proc, runtime in processes.processes()]
        cycle = median_cpu(reader.get_metrics_data, cycles)
        discovery = median_cpu(processes.refresh, max(10, cycles // 10))
    finally:
        for observer in started:
            stop = getattr(observer, "stop", None) or getattr(observer, "shutdown", None)
            if stop is not None:
                stop()
        provider.shutdown()
    sampler = HostSampler(interval=SAMPLER_INTERVAL)
    tick = median_cpu(sampler.sample_now, ticks)
    cycle_discovery = cycle + discovery
    share = (tick / SAMPLER_INTERVAL + cycle_discovery / EXPORT_INTERVAL) * 100

    print("observers: host" + "".join(f", {name}" for name in included))
    print(f"runtime processes found: {found or 'none'}")
    print(f"one collection cycle: {cycle * 1e3:.3f} ms (target <= 2 ms)")
    print(f"runtime-process discovery (at most every 10 s, when collected): {discovery * 1e3:.3f} ms")
    print(f"one collection cycle with discovery: {cycle_discovery * 1e3:.3f} ms")
    print(f"sampler tick: {tick * 1e3:.3f} ms")
    print(f"at the default 1 s interval: {share:.3f} % of one core (target <= 0.2 %)")


def observer_threads_cpu() -> float:
    """CPU seconds used so far by otel_llm's background threads: each thread's own CPU clock
    (nanoseconds) where the platform has one; psutil's per-thread times count whole clock
    ticks (10 ms on Linux), too coarse for threads that use a few ms per second."""
    threads = [t for t in threading.enumerate() if t.name.startswith("otel_llm-") and t.ident is not None]
    if not hasattr(time, "pthread_getcpuclockid"):
        ids = {t.native_id for t in threads}
        return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)
    total = 0.0
    for thread in threads:
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]
        except OSError:  # the thread ended meanwhile
            pass
    return total


@contextlib.contextmanager
def model_server(llama: bool) -> Iterator[tuple[int, str]]:
    """A server whose state the runtime poller really reads every second: the real llama-server
    (``/metrics``) with ``--llama``, else the simulator speaking Ollama (``/api/ps``)."""
    if llama:
        from otel_llm_testing import LlamaServer

        with LlamaServer() as server:
            yield server.port, "llama.cpp"
    else:
        from otel_llm.tools.sim import SimProcess

        with SimProcess(runtime="ollama") as sim:
            yield sim.port, "ollama"


def in_place(seconds: float, port: int, runtime: str) -> None:
    from otel_llm.observers.manager import Observers

    idle_after = 2.0
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    observers = Observers(provider, idle_after=idle_after)
    observers.registry.configure("127.0.0.1", port, runtime)  # named, as with the runtimes option
    try:
        shares = []
        for calling in (True, False):
            if not calling:
                time.sleep(idle_after + 1.0)
            before, started = observer_threads_cpu(), time.monotonic()
            while time.monotonic() - started < seconds:
                if calling:
                    observers.activity.touch()  # what a model call does for the observers
                time.sleep(0.5)
            shares.append((observer_threads_cpu() - before) / (time.monotonic() - started) * 100)
        polled = observers.runtime_state is not None and bool(
            observers.runtime_state.latest_state("127.0.0.1", port))
    finally:
        observers.stop()
        provider.shutdown()
    print(f"runtime state polled in place: {runtime} {'answered' if polled else 'did not answer'}")
    print(f"observer threads in place, application calling every 0.5 s: {shares[0]:.3f} % of one core")
    print(f"observer threads in place, application idle: {shares[1]:.3f} % of one core")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--ticks", type=int, default=1000)
    parser.add_argument("--llama", action="store_true", help="run and discover a real llama-server")
    parser.add_argument("--in-place", type=float, default=10.0, metavar="SECONDS",
                        help="seconds of each in-place measurement (0: skip)")
    args = parser.parse_args(argv)
    with model_server(args.llama) as (port, runtime):  # one server for both measurements
        run(args.cycles, args.ticks, port if args.llama else None)
        if args.in_place > 0:
            in_place(args.in_place, port, runtime)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
