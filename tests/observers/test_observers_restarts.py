"""Runtime restarts and the kernel's OOM kills (otel_llm.observers.restarts / .oom): the real
llama.cpp server killed and started again on its port, real listening processes that go away and
come back, and /proc/vmstat readings written to temporary files."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm import semconv as sc
from otel_llm.capture.record import Timeline
from otel_llm._log import reset_log_once
from otel_llm.observers.oom import OomWatch, dmesg_victim, oom_victim
from otel_llm.observers.registry import ServerRegistry
from otel_llm.observers.restarts import RESCAN, RestartWatch
from otel_llm.observers.host_samples import HostSampler
from otel_llm_testing.otel import make_otel
from otel_llm_testing.net import free_port

LINUX = sys.platform.startswith("linux")


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    return [p for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == name for p in m.data.data_points]


def _messages(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_llm" and r.levelno == level]


# --- the real llama.cpp server, killed and started again -----------------------------------------


def _chat(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    try:
        client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    finally:
        client.close()


@pytest.mark.runtime
@pytest.mark.timeout(600)
@pytest.mark.skipif(not LINUX, reason="the listener is read from /proc")
def test_a_killed_and_restarted_llamacpp_server(caplog: pytest.LogCaptureFixture) -> None:
    """Counted once, logged once, and the first call after it carries the span event (the call
    before it, and the one after, do not)."""
    from otel_llm.instrumentor import current_telemetry
    from otel_llm_testing import LlamaServer

    reset_log_once()
    state = make_otel()
    first = LlamaServer(slots=1).start()
    second = None
    # the sampler's own thread would tick only after an hour: the test takes each sample itself,
    # so a tick between the kill and the new start (a disappearance) cannot happen by chance
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        sample_interval=3600, gpu_metrics=False, runtime_metrics=False)
    try:
        telemetry = current_telemetry()
        assert telemetry is not None and telemetry.evidence is not None
        observers = telemetry.evidence
        _chat(first.base_url)  # the server is now known to the observers
        observers.sampler.sample_now()  # its process is followed from here
        old = first.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        first.stop()  # reaps it
        second = LlamaServer(slots=1, port=first.port).start()
        new = second.pid
        assert new is not None and new != old
        assert not _points(state.reader, sc.METRIC_RUNTIME_RESTARTS)  # nothing noticed before a sample
        observers.sampler.sample_now()
        _chat(second.base_url)
        _chat(second.base_url)
    finally:
        otel_llm.uninstrument()
        first.stop()
        if second is not None:
            second.stop()
    before, after, later = sorted(state.calls(), key=lambda c: c.start_time)
    assert before.events == () and later.events == ()
    (event,) = after.events
    assert event.name == sc.EVENT_RUNTIME_RESTARTED
    assert dict(event.attributes) == {sc.LLM_RUNTIME_PREVIOUS_PID: old, sc.LLM_RUNTIME_PID: new}
    assert after.start_time <= event.timestamp <= after.end_time
    (point,) = _points(state.reader, sc.METRIC_RUNTIME_RESTARTS)
    assert point.value == 1
    assert dict(point.attributes) == {sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: first.port,
                                      sc.LLM_RUNTIME_NAME: "llama.cpp"}
    restarts = [m for m in _messages(caplog) if "model server" in m]
    assert restarts == [f"otel_llm: the model server at 127.0.0.1:{first.port} restarted (pid {old} -> {new})"]


# --- real listening processes: disappearance, return, this process ---------------------------------


_LISTEN = ("import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\nprint('ready', flush=True)\ntime.sleep(120)\n")


def _listener(port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _LISTEN, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)



class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def watch() -> Iterator[tuple[RestartWatch, ServerRegistry, InMemoryMetricReader, _Clock]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    registry = ServerRegistry()
    clock = _Clock()
    try:
        yield RestartWatch(registry, provider.get_meter("test"), {}, clock=clock), registry, reader, clock
    finally:
        provider.shutdown()


@pytest.mark.skipif(not LINUX, reason="the listener is read from /proc")
def test_a_server_that_disappears_then_comes_back(watch: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otel_llm")
    restarts, registry, reader, clock = watch
    port = free_port()
    registry.note("127.0.0.1", port, None)
    registry.note("localhost", port, None)  # the same listener under another name: counted once
    registry.note("203.0.113.9", port, None)  # not on this host: never looked at
    first = _listener(port)
    try:
        restarts.check()  # first sight
        restarts.check()
        assert restarts.pending == {} and not _points(reader, sc.METRIC_RUNTIME_RESTARTS)
        first.kill()  # not reaped yet: a zombie still has its pid, but no longer listens
        _wait_for(lambda: psutil.Process(first.pid).status() == psutil.STATUS_ZOMBIE)
        restarts.check()
    finally:
        first.kill()
        first.wait()
    gone = {sc.LLM_RUNTIME_PREVIOUS_PID: first.pid}
    assert restarts.pending == {("127.0.0.1", port): gone, ("localhost", port): gone}
    assert _messages(caplog) == [f"otel_llm: the model server at 127.0.0.1:{port} disappeared (pid {first.pid})"]
    second = _listener(port)
    try:
        restarts.check()  # a port where nothing listened is read again only after RESCAN seconds
        assert sc.LLM_RUNTIME_PID not in restarts.pending[("127.0.0.1", port)]
        clock.now += RESCAN
        restarts.check()
    finally:
        second.kill()
        second.wait()
    # back: the pending event says where it is now; the same restart, not counted again
    back = {sc.LLM_RUNTIME_PREVIOUS_PID: first.pid, sc.LLM_RUNTIME_PID: second.pid}
    assert restarts.pending[("127.0.0.1", port)] == back and restarts.pending[("localhost", port)] == back
    assert _messages(caplog, logging.INFO) == [f"otel_llm: the model server at 127.0.0.1:{port} is back "
                                               f"(pid {second.pid})"]
    (point,) = _points(reader, sc.METRIC_RUNTIME_RESTARTS)
    assert point.value == 1 and dict(point.attributes) == {sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: port}


@pytest.mark.skipif(not LINUX, reason="the listener is read from /proc")
def test_a_listener_in_this_process_is_never_the_runtime(watch: Any) -> None:
    """The application's own listener (a test server in it) is not followed: a runtime that
    listens there later is a first sight, and its exit the first restart."""
    restarts, registry, reader, clock = watch
    own = socket.socket()
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.bind(("127.0.0.1", 0))
    own.listen()
    port = own.getsockname()[1]
    registry.note("127.0.0.1", port, None)
    restarts.check()
    own.close()
    runtime = _listener(port)
    try:
        clock.now += RESCAN
        restarts.check()
        assert restarts.pending == {} and not _points(reader, sc.METRIC_RUNTIME_RESTARTS)
        runtime.kill()
        runtime.wait()
        restarts.check()
    finally:
        runtime.kill()
        runtime.wait()
    assert restarts.pending == {("127.0.0.1", port): {sc.LLM_RUNTIME_PREVIOUS_PID: runtime.pid}}


def test_a_failing_watch_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    reset_log_once()
    registry = ServerRegistry()
    registry.note("127.0.0.1", 1, None)

    def broken(ports: set[int]) -> dict[int, Any]:
        raise RuntimeError("no /proc")

    restarts = RestartWatch(registry, MeterProvider().get_meter("test"), {}, identify=broken)
    restarts.check()
    restarts.check()
    assert len([m for m in _messages(caplog) if "restarts failed" in m]) == 1


# --- the call span's events, through both sinks ----------------------------------------------------


@pytest.mark.parametrize("sdk", [True, False])
def test_the_call_span_carries_its_events(sdk: bool) -> None:
    from opentelemetry.sdk.trace import Tracer as SdkTracer

    from otel_llm.telemetry.build import CallResult
    from otel_llm.telemetry.spans import ApiSpanSink, SdkSpanSink

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    assert type(tracer) is SdkTracer
    sink = SdkSpanSink(tracer) if sdk else ApiSpanSink(tracer)
    timeline = Timeline(0, 1_000_000_000, 2_000)
    plain = sink.start("chat m", {"a": 1}, timeline.epoch)
    marked = sink.start("chat m", {"a": 2}, timeline.epoch)
    marked.events = [(sc.EVENT_RUNTIME_RESTARTED, {sc.LLM_RUNTIME_PREVIOUS_PID: 7})]
    for span in (plain, marked):
        sink.finish(timeline, span, CallResult(span.attributes, span.events, None, [], [], [], 0.0, None, None))
    spans = {s.attributes["a"]: s for s in exporter.get_finished_spans()}
    assert spans[1].events == ()
    (event,) = spans[2].events
    assert (event.name, dict(event.attributes), event.timestamp) == (
        sc.EVENT_RUNTIME_RESTARTED, {sc.LLM_RUNTIME_PREVIOUS_PID: 7}, timeline.epoch)


# --- OOM kills from /proc/vmstat readings -------------------------------------------------------------


def _vmstat(path: Path, oom_kill: int | None, majfault: int = 10) -> str:
    lines = ["nr_free_pages 12345", f"pgmajfault {majfault}", "pswpin 0", "pswpout 0"]
    if oom_kill is not None:
        lines.append(f"oom_kill {oom_kill}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_oom_kills_are_the_growth_between_readings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    oom = OomWatch(meter, victim=lambda: (4242, "llama-server"))
    vmstat = tmp_path / "vmstat"
    assert oom.check(_vmstat(vmstat, 3)) == 0  # the baseline: kills before the session
    assert not _points(reader, sc.METRIC_HOST_OOM_KILLS) and _messages(caplog) == []
    assert oom.check(_vmstat(vmstat, 3)) == 0
    assert oom.check(_vmstat(vmstat, 5)) == 2
    assert _messages(caplog) == ["otel_llm: the kernel killed 2 process(es) for lack of memory (oom_kill +2); "
                                 "the latest victim: llama-server (pid 4242)"]
    assert oom.check(_vmstat(vmstat, None)) == 0  # a kernel without the counter
    assert oom.check(str(tmp_path / "missing")) == 0  # no /proc at all
    assert oom.check(_vmstat(vmstat, 6)) == 1
    (point,) = _points(reader, sc.METRIC_HOST_OOM_KILLS)
    assert point.value == 3


def test_oom_kills_ride_the_host_samples(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sampler reads oom_kill with its other vmstat counters and hands each sample on."""
    reader = InMemoryMetricReader()
    oom = OomWatch(MeterProvider(metric_readers=[reader]).get_meter("test"), victim=lambda: None)
    vmstat = tmp_path / "vmstat"
    sampler = HostSampler(interval=3600, vmstat_path=_vmstat(vmstat, 0), watchers=[oom.on_sample])
    assert sampler.sample_now().oom_kills == 0
    _vmstat(vmstat, 1, majfault=15)
    sample = sampler.sample_now()
    assert (sample.oom_kills, sample.major_faults) == (1, 15)
    (point,) = _points(reader, sc.METRIC_HOST_OOM_KILLS)
    assert point.value == 1
    assert _messages(caplog) == ["otel_llm: the kernel killed 1 process(es) for lack of memory (oom_kill +1)"]


def test_a_failing_watcher_does_not_stop_the_sample(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reset_log_once()

    def broken(sample: Any) -> None:
        raise RuntimeError("bug")

    seen: list[Any] = []
    sampler = HostSampler(interval=3600, vmstat_path=_vmstat(tmp_path / "vmstat", 0), watchers=[broken, seen.append])
    sample = sampler.sample_now()
    assert seen == [sample] and sampler.samples() == [sample]
    assert len([m for m in _messages(caplog) if "watcher" in m]) == 1


def test_the_oom_victim_is_the_latest_kernel_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = ("[  10.1] Out of memory: Killed process 111 (python3) total-vm:1kB, anon-rss:1kB\n"
           "[  20.2] oom_reaper: reaped process 111 (python3)\n"
           "[  30.3] Out of memory: Killed process 222 (llama-server) total-vm:2kB, anon-rss:2kB\n")
    assert oom_victim(log) == (222, "llama-server")
    assert oom_victim("[ 1.0] nothing here\n") is None
    monkeypatch.setenv("PATH", str(tmp_path))  # no dmesg to run: skipped silently
    assert dmesg_victim() is None
