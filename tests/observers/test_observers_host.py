"""Host observer and runtime-process discovery, against a real SDK MeterProvider, real psutil,
a real llama-server (found by its port) and a dummy process named like one (found by name)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm._log import reset_log_once
from otel_llm.observers import host, processes
from otel_llm.observers.host import HostObserver, read_vmstat
from otel_llm.observers.processes import RuntimeProcesses, runtime_for_name
from otel_llm.observers.registry import ServerRegistry

LINUX = sys.platform.startswith("linux")
MB = 2**20


@dataclass
class Observed:
    reader: InMemoryMetricReader
    registry: ServerRegistry
    processes: RuntimeProcesses

    def collect(self) -> dict[str, tuple[str, list[tuple[dict[str, Any], Any]]]]:
        """metric name -> (unit, [(attributes, value)])."""
        found: dict[str, tuple[str, list[tuple[dict[str, Any], Any]]]] = {}
        data = self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else []:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    points = [(dict(p.attributes or {}), getattr(p, "value", None)) for p in metric.data.data_points]
                    found[metric.name] = (metric.unit or "", points)
        return found


@pytest.fixture
def observed() -> Iterator[Observed]:
    reset_log_once()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    registry = ServerRegistry()
    processes = RuntimeProcesses(registry)
    HostObserver(provider.get_meter("test"), processes)
    try:
        yield Observed(reader, registry, processes)
    finally:
        provider.shutdown()


@pytest.fixture
def dummy_runtime(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """/bin/sleep copied to a file named llama-server, running."""
    with _dummy(tmp_path, "llama-server") as proc:
        yield proc


@contextlib.contextmanager
def _dummy(tmp_path: Path, name: str) -> Iterator[subprocess.Popen[bytes]]:
    executable = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", executable)
    proc = subprocess.Popen([str(executable), "60"])
    try:
        _wait_for(lambda: psutil.Process(proc.pid).name() == name)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _points(metrics: dict[str, Any], name: str) -> list[tuple[dict[str, Any], Any]]:
    assert name in metrics, sorted(metrics)
    points: list[tuple[dict[str, Any], Any]] = metrics[name][1]
    return points


def _by(points: list[tuple[dict[str, Any], Any]], key: str) -> dict[Any, Any]:
    return {attrs[key]: value for attrs, value in points}


def _for_pid(points: list[tuple[dict[str, Any], Any]], pid: int) -> list[tuple[dict[str, Any], Any]]:
    return [(attrs, value) for attrs, value in points if attrs.get("process.pid") == pid]


# -- every instrument ------------------------------------------------------------------------------
def test_every_instrument_with_semconv_attributes_and_sane_values(observed: Observed) -> None:
    observed.collect()
    sum(range(200_000))  # some CPU of our own between the two collections
    time.sleep(0.2)
    metrics = observed.collect()

    assert metrics["system.cpu.utilization"][0] == "1"
    cpu = _by(_points(metrics, "system.cpu.utilization"), "cpu.mode")
    assert {"user", "system", "idle", "iowait"} <= set(cpu)
    assert all(0.0 <= v <= 1.0 for v in cpu.values()) and sum(cpu.values()) == pytest.approx(1.0)

    assert metrics["system.memory.usage"][0] == "By"
    usage = _by(_points(metrics, "system.memory.usage"), "system.memory.state")
    assert usage["used"] > 0 and usage["free"] > 0
    utilization = _by(_points(metrics, "system.memory.utilization"), "system.memory.state")
    assert set(utilization) == set(usage) and all(0.0 < v < 1.0 for v in utilization.values())
    if LINUX:
        assert {"cached", "buffers"} <= set(usage)

    assert metrics["system.paging.usage"][0] == "By"
    assert set(_by(_points(metrics, "system.paging.usage"), "system.paging.state")) == {"used", "free"}
    if LINUX:
        operations = _points(metrics, "system.paging.operations")
        assert metrics["system.paging.operations"][0] == "{operation}"
        assert {(a["system.paging.direction"], a["system.paging.fault.type"]) for a, _ in operations} == {
            ("in", "major"), ("out", "major"), ("in", "minor"), ("out", "minor")}
        faults = _by(_points(metrics, "system.paging.faults"), "system.paging.fault.type")
        assert faults["minor"] > 0 and faults["major"] >= 0

    if psutil.disk_io_counters() is not None:
        assert set(_by(_points(metrics, "system.disk.io"), "disk.io.direction")) == {"read", "write"}
    network = _by(_points(metrics, "system.network.io"), "network.io.direction")
    assert set(network) == {"receive", "transmit"} and all(v >= 0 for v in network.values())


def test_this_process_is_reported(observed: Observed) -> None:
    observed.collect()
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:  # busy: a user-CPU share above zero
        # work in user space between clock reads: a loop of bare reads (system calls) spent
        # nearly all of its 0.1 s in the kernel, and once read 0 user ticks
        sum(range(20_000))
    metrics = observed.collect()

    me = os.getpid()
    name = psutil.Process().name()
    [(attrs, rss)] = _for_pid(_points(metrics, "process.memory.usage"), me)
    assert attrs == {"process.pid": me, "process.executable.name": name}
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)
    assert metrics["process.memory.usage"][0] == "By" and metrics["process.cpu.utilization"][0] == "1"
    cpu = _by(_for_pid(_points(metrics, "process.cpu.utilization"), me), "cpu.mode")
    assert set(cpu) == {"user", "system"}
    assert all(0.0 <= v <= 1.0 for v in cpu.values()) and cpu["user"] > 0


# -- runtime discovery --------------------------------------------------------------------------
@pytest.mark.runtime
def test_llama_server_is_found_by_port(observed: Observed, monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_llm_testing import LlamaServer

    name_scans: list[int] = []

    def by_name(self: RuntimeProcesses) -> dict[int, Any]:
        name_scans.append(1)
        return {}

    monkeypatch.setattr(RuntimeProcesses, "_by_name", by_name)
    with LlamaServer() as server:
        observed.registry.note("127.0.0.1", server.port, "llama.cpp")
        [(proc, runtime)] = observed.processes.processes()
        assert runtime == "llama.cpp" and not name_scans
        listening = {c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        assert server.port in listening

        metrics = observed.collect()
        [(attrs, rss)] = _for_pid(_points(metrics, "process.memory.usage"), proc.pid)
        assert attrs == {"process.pid": proc.pid, "process.executable.name": "llama-server",
                         "llm.runtime.name": "llama.cpp"}
        assert rss > 50 * MB  # it holds the model
        cpu = _for_pid(_points(metrics, "process.cpu.utilization"), proc.pid)
        assert {a["cpu.mode"] for a, _ in cpu} == {"user", "system"}
        assert all(a["llm.runtime.name"] == "llama.cpp" and 0.0 <= v <= 1.0 for a, v in cpu)

        # A refresh that finds the same listener skips the system-wide socket table ...
        monkeypatch.setattr(psutil, "net_connections", _raise(AssertionError("not needed")))
        assert observed.processes.refresh() == [(proc, "llama.cpp")]
        # ... which, when it is denied (macOS, non-root), is replaced by each process's own sockets.
        monkeypatch.setattr(psutil, "net_connections", _raise(psutil.AccessDenied()))
        denied = RuntimeProcesses(observed.registry)
        assert [(p.pid, runtime) for p, runtime in denied.processes()] == [(proc.pid, "llama.cpp")]
        assert not name_scans


def test_runtime_is_found_by_name(observed: Observed, dummy_runtime: subprocess.Popen[bytes]) -> None:
    metrics = observed.collect()
    [(attrs, rss)] = _for_pid(_points(metrics, "process.memory.usage"), dummy_runtime.pid)
    assert attrs == {"process.pid": dummy_runtime.pid, "process.executable.name": "llama-server",
                     "llm.runtime.name": "llama.cpp"}
    assert rss > 0


def test_discovery_is_cached_and_refreshed_when_the_registry_gains_a_server(tmp_path: Path) -> None:
    registry = ServerRegistry()
    processes = RuntimeProcesses(registry, refresh_seconds=3600)
    first = tmp_path / "a"
    first.mkdir()
    second = tmp_path / "b"
    second.mkdir()
    with _dummy(first, "ollama") as one:
        assert one.pid in {p.pid for p, _ in processes.processes()}
        with _dummy(second, "ollama") as two:
            assert two.pid not in {p.pid for p, _ in processes.processes()}  # cached
            registry.note("127.0.0.1", 1, "ollama")  # nothing listens there: falls back to names
            found = {p.pid: runtime for p, runtime in processes.processes()}
            assert found[one.pid] == found[two.pid] == "ollama"


def test_a_process_that_exits_is_dropped_without_a_log_line(
        observed: Observed, dummy_runtime: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture) -> None:
    assert _for_pid(_points(observed.collect(), "process.memory.usage"), dummy_runtime.pid)
    dummy_runtime.kill()
    dummy_runtime.wait()
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        metrics = observed.collect()
    assert not _for_pid(_points(metrics, "process.memory.usage"), dummy_runtime.pid)
    assert _for_pid(_points(metrics, "process.memory.usage"), os.getpid())
    assert dummy_runtime.pid not in {p.pid for p, _ in observed.processes.processes()}
    assert not caplog.records


def test_python_runtimes_are_matched_by_module_not_by_any_argument() -> None:
    assert runtime_for_name("python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"]) == "vllm"
    assert runtime_for_name("python3.11", ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"]) == "vllm"
    assert runtime_for_name("python", ["python", "-u", "-m", "sglang.launch_server"]) == "sglang"
    assert runtime_for_name("python", ["python", "-m", "text_generation_server.cli"]) == "tgi"
    assert runtime_for_name("python3", ["python3", "-m", "llama_cpp.server", "--model", "m"]) == "llama.cpp"
    assert runtime_for_name("python3", ["python3", "-m", "pytest", "tests/parse/test_runtimes_vllm.py"]) is None
    assert runtime_for_name("VLLM::EngineCore") == "vllm"
    assert runtime_for_name("text-generation-launcher") == "tgi"
    assert runtime_for_name("LM Studio") == runtime_for_name("lms") == "lmstudio"
    assert runtime_for_name("ollama") == "ollama" and runtime_for_name("sleep") is None


# -- failures ------------------------------------------------------------------------------------
def _raise(exc: BaseException, like: Any = None) -> Any:
    """A replacement that raises; ``like``'s attributes are kept (psutil's oneshot needs them)."""
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc
    return functools.wraps(like)(fail) if like is not None else fail


def test_access_denied_is_logged_once_and_the_rest_still_reported(
        observed: Observed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(psutil, "swap_memory", _raise(psutil.AccessDenied()))
    monkeypatch.setattr(psutil.Process, "memory_info", _raise(psutil.AccessDenied(), psutil.Process.memory_info))
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        for _ in range(3):
            metrics = observed.collect()
    assert "system.paging.usage" not in metrics
    assert "process.memory.usage" not in metrics
    assert _points(metrics, "system.memory.usage") and _points(metrics, "system.cpu.utilization")
    assert _for_pid(_points(metrics, "process.cpu.utilization"), os.getpid())
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # one line per kind of problem, not per collection
    assert any("system.paging.usage" in m and "AccessDenied" in m for m in messages)
    assert any("process.memory.usage" in m and "AccessDenied" in m for m in messages)


def test_one_unreadable_process_does_not_hide_the_others(
        observed: Observed, dummy_runtime: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real = psutil.Process.memory_info

    @functools.wraps(real)
    def memory_info(self: psutil.Process) -> Any:
        if self.pid == dummy_runtime.pid:
            raise psutil.AccessDenied(self.pid)
        return real(self)

    monkeypatch.setattr(psutil.Process, "memory_info", memory_info)
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        observed.collect()
        metrics = observed.collect()
    memory = _points(metrics, "process.memory.usage")
    assert _for_pid(memory, os.getpid()) and not _for_pid(memory, dummy_runtime.pid)
    assert _for_pid(_points(metrics, "process.cpu.utilization"), dummy_runtime.pid)
    assert len(caplog.records) == 1


def test_unexpected_errors_and_missing_vmstat_never_reach_the_sdk(
        observed: Observed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(psutil, "virtual_memory", _raise(RuntimeError("boom")))
    monkeypatch.setattr(psutil, "net_io_counters", _raise(psutil.NoSuchProcess(1)))
    monkeypatch.setattr(host, "read_vmstat", lambda *args, **kwargs: None)  # as off Linux
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        observed.collect()
        metrics = observed.collect()
    for gone in ("system.memory.usage", "system.memory.utilization", "system.network.io",
                 "system.paging.operations", "system.paging.faults"):
        assert gone not in metrics
    assert _points(metrics, "system.cpu.utilization") and _points(metrics, "system.paging.usage")
    # virtual_memory fails in two callbacks (usage, utilization): one line each, with a traceback
    boom = [r for r in caplog.records if r.exc_info]
    assert len(boom) == 2 and len(caplog.records) == 3
    assert read_vmstat([b"pgfault"], path="/nonexistent/vmstat") is None


def test_runtime_discovery_failure_keeps_this_process(
        observed: Observed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(processes, "listeners", lambda ports: None)  # no sock_diag: psutil is asked
    monkeypatch.setattr(psutil, "process_iter", _raise(psutil.AccessDenied()))
    monkeypatch.setattr(psutil, "net_connections", _raise(psutil.AccessDenied()))
    observed.registry.note("127.0.0.1", 1, "ollama")
    with caplog.at_level(logging.INFO, logger="otel_llm"):
        metrics = observed.collect()
    assert _for_pid(_points(metrics, "process.memory.usage"), os.getpid())
    assert len(caplog.records) == 1

