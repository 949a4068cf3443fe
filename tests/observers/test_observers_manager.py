"""The Observers object (otel_llm.observers.manager): which observers each option builds, how they
start and stop, and what a model call reads from them, with real threads, /proc and loopback servers."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.observers.gpu import GpuObserver
from otel_llm.observers.manager import Observers
from otel_llm.observers.registry import Server
from otel_llm.parse.runtimes import ModelInfo

LOOPBACK = "127.0.0.1"
SAMPLER_THREAD = "otel_llm-host-sampler"
POLLER_THREAD = "otel_llm-runtime-state"
VLLM_METRICS = (Path(__file__).parents[1] / "fixtures" / "observers" / "vllm_metrics.txt").read_text()
VLLM_MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 512}]})


def _wait_for(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _steady(read: Callable[[], tuple[int, int]], quiet: float, timeout: float = 8.0) -> tuple[int, int]:
    """``read()`` once it stays the same for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    value = read()
    while True:
        time.sleep(quiet)
        now = read()
        if now == value:
            return value
        assert time.monotonic() < deadline, f"still changing: {value} -> {now}"
        value = now


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_llm" and r.levelno >= logging.WARNING]


# --- a fake GPU observer (there is no GPU here) ------------------------------------------------------
@dataclass
class FakeGpu:
    """Stands in for GpuObserver: what the manager hands it and how it is driven."""

    pids: Callable[[], Iterable[int]] | None
    fail_sample: bool = False
    fail_shutdown: bool = False
    on_shutdown: Callable[[], None] | None = None
    samples: int = 0
    shutdowns: int = 0

    def sample(self) -> dict[str, float]:
        self.samples += 1
        if self.fail_sample:
            raise RuntimeError("NVML went away")
        return {"gpu.utilization": 0.5, "gpu.memory.usage": 1234.0}

    def shutdown(self) -> None:
        self.shutdowns += 1
        if self.on_shutdown is not None:
            self.on_shutdown()
        if self.fail_shutdown:
            raise RuntimeError("NVML shutdown failed")


@dataclass
class Rig:
    made: list[Observers] = field(default_factory=list)
    gpus: list[FakeGpu] = field(default_factory=list)
    gpu_options: dict[str, Any] = field(default_factory=dict)
    gpu_present: bool = False
    providers: list[MeterProvider] = field(default_factory=list)

    def build(self, **options: Any) -> Observers:
        provider = MeterProvider()
        self.providers.append(provider)
        observers = Observers(provider, **options)
        self.made.append(observers)
        return observers


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    """Builds Observers (GPU: none, or a FakeGpu when ``gpu_present``) and stops them all after."""
    reset_log_once()
    state = Rig()

    def create(meter: Any, pids: Callable[[], Iterable[int]] | None = None) -> FakeGpu | None:
        if not state.gpu_present:
            return None
        gpu = FakeGpu(pids, **state.gpu_options)
        state.gpus.append(gpu)
        return gpu

    monkeypatch.setattr(GpuObserver, "create", create)
    try:
        yield state
    finally:
        for observers in state.made:
            observers.stop()
        for provider in state.providers:
            provider.shutdown()


def _threads_of(build: Callable[[], Observers]) -> tuple[Observers, list[threading.Thread]]:
    """Build, and the threads that building started."""
    before = set(threading.enumerate())
    observers = build()
    return observers, [t for t in threading.enumerate() if t not in before]


# --- a listening process and a loopback model server --------------------------------------------------
_LISTEN = ("import socket, sys\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
           "print(s.getsockname()[1], flush=True)\nsys.stdin.read()\n")


@pytest.fixture
def listener() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process listening on 127.0.0.1 (it exits when its stdin closes)."""
    proc = subprocess.Popen([sys.executable, "-c", _LISTEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        yield proc, int(proc.stdout.readline())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


@dataclass
class FakeVllm:
    port: int = 0
    hits: dict[str, int] = field(default_factory=dict)


def _serve(fake: FakeVllm) -> ThreadingHTTPServer:
    routes = {"/metrics": (VLLM_METRICS, "text/plain; version=0.0.4"), "/v1/models": (VLLM_MODELS, "application/json")}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            """Quiet."""

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            fake.hits[self.path] = fake.hits.get(self.path, 0) + 1
            body, kind = routes.get(self.path, ('{"error": "not found"}', "application/json"))
            self.send_response(200 if self.path in routes else 404)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body.encode())))
            self.end_headers()
            self.wfile.write(body.encode())

    httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    httpd.daemon_threads = True
    fake.port = httpd.server_address[1]
    return httpd


@pytest.fixture
def vllm_servers() -> Iterator[Callable[[], FakeVllm]]:
    """Starts loopback servers answering vLLM's /metrics and /v1/models (recorded answers)."""
    running: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def start() -> FakeVllm:
        fake = FakeVllm()
        httpd = _serve(fake)
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        running.append((httpd, thread))
        return fake

    try:
        yield start
    finally:
        for httpd, thread in running:
            httpd.shutdown()
            httpd.server_close()
            thread.join(5)


# --- which observers each option builds ---------------------------------------------------------------
ALL = {"processes", "runtime_state", "gpu", "restarts", "oom", "sampler"}


@pytest.mark.parametrize(("host", "gpu", "runtime", "built", "threads"), [
    (False, False, False, set(), set()),
    (True, False, False, {"processes", "restarts", "oom", "sampler"}, {SAMPLER_THREAD}),
    (False, True, False, {"processes", "gpu"}, set()),  # the GPU observer needs the runtime's pids
    (False, False, True, {"runtime_state"}, {POLLER_THREAD}),
    (True, True, True, ALL, {SAMPLER_THREAD, POLLER_THREAD}),
])
def test_each_option_builds_its_observers_and_only_those(rig: Rig, host: bool, gpu: bool, runtime: bool,
                                                         built: set[str], threads: set[str]) -> None:
    rig.gpu_present = True
    observers, started = _threads_of(lambda: rig.build(host=host, gpu=gpu, runtime=runtime, interval=0.05))
    assert {name for name in ALL if getattr(observers, name) is not None} == built
    assert {t.name for t in started} == threads
    assert all(t.daemon for t in started)  # never keeps the application alive
    assert len(rig.gpus) == (1 if gpu else 0)


def test_the_host_sampler_carries_the_watches_and_the_gpu_probe(rig: Rig) -> None:
    rig.gpu_present = True
    observers = rig.build(host=True, gpu=True, runtime=False, interval=0.05)
    assert observers.sampler is not None and observers.restarts is not None and observers.oom is not None
    assert observers.sampler.watchers == [observers.restarts.on_sample, observers.oom.on_sample]
    assert observers.sampler.activity is observers.activity
    # the restart watch writes into the very dict the call path reads
    assert observers.restarts.pending is observers.pending_restarts
    (gpu,) = rig.gpus
    _wait_for(lambda: gpu.samples >= 2)  # the sampler's thread reads the GPU on every tick


def test_no_gpu_leaves_the_sampler_without_a_probe(rig: Rig) -> None:
    observers = rig.build(host=True, gpu=True, runtime=False, interval=0.05)
    assert observers.gpu is None and observers.sampler is not None and observers.sampler.probes == []


def test_configured_runtimes_are_in_the_registry_before_any_call(rig: Rig) -> None:
    observers = rig.build(host=False, gpu=False, runtime=False,
                          runtimes={("127.0.0.1", 8000, "http"): "vllm", ("gpu-box", 443, "https"): "tgi"})
    assert sorted(observers.registry.servers()) == [Server("127.0.0.1", 8000, "vllm", "http", True),
                                                    Server("gpu-box", 443, "tgi", "https", True)]


def test_the_gpu_observer_is_told_the_runtime_pids(rig: Rig, listener: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = listener
    rig.gpu_present = True
    observers = rig.build(host=False, gpu=True, runtime=False)
    (gpu,) = rig.gpus
    assert gpu.pids is not None
    observers.registry.note(LOOPBACK, port, "vllm")
    assert proc.pid in list(gpu.pids())  # read from /proc each time the GPU observer asks


# --- start and stop -----------------------------------------------------------------------------------
def test_stop_joins_every_thread_and_can_be_called_again(rig: Rig) -> None:
    rig.gpu_present = True
    observers, started = _threads_of(lambda: rig.build(interval=0.05))
    assert {t.name for t in started} == {SAMPLER_THREAD, POLLER_THREAD}
    assert all(t.is_alive() for t in started)
    observers.stop()
    assert not any(t.is_alive() for t in started)  # joined, not merely told to stop
    assert rig.gpus[0].shutdowns == 1
    observers.stop()  # a second stop does nothing (and never raises)
    assert rig.gpus[0].shutdowns == 1


def test_both_threads_rest_while_no_call_is_made_and_stop_wakes_them(
        rig: Rig, vllm_servers: Callable[[], FakeVllm]) -> None:
    """With no call for ``idle_after`` the sampler stops and the poller slows to one poll per 15 s
    (they share the session's activity); calls wake them, and stop() ends a rest at once instead
    of waiting it out."""
    fake = vllm_servers()
    observers, started = _threads_of(lambda: rig.build(host=True, gpu=False, runtime=True, interval=0.05,
                                                       idle_after=0.3,
                                                       runtimes={(LOOPBACK, fake.port, "http"): "vllm"}))
    sampler = observers.sampler
    assert sampler is not None

    def counts() -> tuple[int, int]:
        return len(sampler.samples()), fake.hits.get("/metrics", 0)

    _wait_for(lambda: observers.activity.resting)
    # resting: no sample or poll for twelve sampling and three polling intervals (once the sample
    # or poll under way when idleness began has ended)
    resting = _steady(counts, quiet=0.6)
    assert resting[1] >= 1  # polled before it went idle
    # model calls keep coming: sampling and polling resume
    def calling() -> bool:
        observers.activity.touch()
        now = counts()
        return now[0] >= resting[0] + 2 and now[1] >= resting[1] + 2

    _wait_for(calling)
    _wait_for(lambda: observers.activity.resting)  # idle again
    began = time.monotonic()
    observers.stop()
    assert not any(t.is_alive() for t in started)
    assert time.monotonic() - began < 2.5  # far below the poller's 15 s rest and its 3 s join timeout


def test_the_sampler_stops_before_the_gpu_it_reads_and_a_failing_stop_is_logged_once(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.gpu_present = True
    samplers: list[threading.Thread] = []
    observed: list[bool] = []  # was the sampler's thread alive when the GPU was shut down?
    rig.gpu_options = {"fail_shutdown": True, "on_shutdown": lambda: observed.append(samplers[-1].is_alive())}
    for _ in range(2):
        observers, started = _threads_of(lambda: rig.build(interval=0.05))
        samplers.append(next(t for t in started if t.name == SAMPLER_THREAD))
        observers.stop()  # the GPU's shutdown raises: never into the caller
        assert not any(t.is_alive() for t in started)  # the poller, stopped after the GPU, too
    assert observed == [False, False]  # no sample reads NVML after its shutdown
    assert [m for m in _messages(caplog) if "stopping an observer failed" in m] == [
        "otel_llm: stopping an observer failed (further occurrences are not logged)"]


def _broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("broken on purpose")


@pytest.mark.parametrize(("target", "what", "off"), [
    ("otel_llm.observers.restarts.RestartWatch.__init__", "restart watch", {"restarts"}),
    ("otel_llm.observers.oom.OomWatch.__init__", "OOM-kill count", {"oom"}),
    ("otel_llm.observers.runtime_state.RuntimeStateObserver.start", "runtime-state observer", {"runtime_state"}),
    ("otel_llm.observers.host.HostObserver.__init__", "host observer", {"sampler"}),
    # the host observer reports the runtime's processes: without the finder it stays off too
    ("otel_llm.observers.processes.RuntimeProcesses.__init__", "runtime process finder", {"processes", "sampler"}),
])
def test_an_observer_that_cannot_start_is_left_off_and_logged_once(
        rig: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        target: str, what: str, off: set[str]) -> None:
    monkeypatch.setattr(target, _broken)
    rig.gpu_present = True
    for _ in range(2):
        observers, started = _threads_of(lambda: rig.build(interval=0.05))
        assert {name for name in ALL if getattr(observers, name) is None} == off
        expected = {SAMPLER_THREAD, POLLER_THREAD} - ({SAMPLER_THREAD} if "sampler" in off else set()) \
            - ({POLLER_THREAD} if "runtime_state" in off else set())
        assert {t.name for t in started} == expected
    failed = [r for r in caplog.records if r.name == "otel_llm" and "could not start" in r.getMessage()]
    assert failed[0].getMessage().startswith(f"otel_llm: the {what} could not start; it stays off")
    assert failed[0].exc_info is not None and "broken on purpose" in str(failed[0].exc_info[1])
    assert len(failed) == len(off)  # one line per observer, not per session
    if "sampler" not in off:
        assert observers.sampler is not None
        assert observers.sampler.watchers == [w.on_sample for w in (observers.restarts, observers.oom)
                                              if w is not None]


def test_failures_inside_the_observer_threads_are_logged_once_and_sampling_goes_on(
        rig: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_llm.observers.restarts import RestartWatch

    monkeypatch.setattr(RestartWatch, "_check", _broken)
    rig.gpu_present = True
    rig.gpu_options = {"fail_sample": True}
    observers = rig.build(host=True, gpu=True, runtime=False, interval=0.05)
    sampler = observers.sampler
    assert sampler is not None
    _wait_for(lambda: len(sampler.samples()) >= 6)
    assert rig.gpus[0].samples >= 6
    messages = _messages(caplog)
    assert sum("FakeGpu.sample failed" in m for m in messages) == 1, messages
    assert sum("watching the model servers' processes for restarts failed" in m for m in messages) == 1, messages
    start = time.perf_counter_ns() - 10**9
    attributes = observers.call_attributes(start, time.perf_counter_ns())
    assert sc.LLM_HOST_CPU_UTILIZATION in attributes and sc.LLM_HOST_GPU_UTILIZATION not in attributes


# --- what a call reads ----------------------------------------------------------------------------------
def test_call_attributes_are_the_host_samples_around_the_call(rig: Rig) -> None:
    rig.gpu_present = True
    observers = rig.build(host=True, gpu=True, runtime=False, interval=0.05)
    sampler = observers.sampler
    assert sampler is not None
    _wait_for(lambda: len(sampler.samples()) >= 4)
    samples = sampler.samples()[:4]
    attributes = observers.call_attributes(samples[0].t_ns, samples[-1].t_ns)
    cpu = [s.cpu for s in samples if s.cpu is not None]
    assert attributes[sc.LLM_HOST_CPU_UTILIZATION] == pytest.approx(sum(cpu) / len(cpu))
    assert attributes[sc.LLM_HOST_MEMORY_UTILIZATION] == max(s.memory for s in samples if s.memory is not None)
    assert attributes[sc.LLM_HOST_GPU_UTILIZATION] == 0.5 and attributes[sc.LLM_HOST_GPU_MEMORY_USAGE] == 1234.0
    before = samples[0].since_ns - 10 * 10**9
    assert observers.call_attributes(before, before + 10**9) == {}  # long before the first sample


def test_without_observers_a_call_reads_nothing(rig: Rig) -> None:
    observers = rig.build(host=False, gpu=False, runtime=False)
    assert observers.call_attributes(0, time.perf_counter_ns()) == {}
    assert observers.runtime_at_start(LOOPBACK, 8000) == {}
    assert observers.model_attributes(LOOPBACK, 8000, "m") == {}
    assert observers.runtime_of(LOOPBACK, 8000) is None
    assert observers.take_restart(LOOPBACK, 8000) is None


def test_a_configured_server_s_state_and_model_reach_the_calls(rig: Rig,
                                                               vllm_servers: Callable[[], FakeVllm]) -> None:
    """A server named in ``runtimes`` is polled from the start: its running and waiting requests
    (summed over vLLM's engines), its runtime and its model's context length reach each call."""
    fake = vllm_servers()
    observers = rig.build(host=False, gpu=False, interval=0.05, runtimes={(LOOPBACK, fake.port, "http"): "vllm"})
    _wait_for(lambda: observers.model_attributes(LOOPBACK, fake.port))
    assert observers.runtime_at_start(LOOPBACK, fake.port) == {sc.LLM_RUNTIME_REQUESTS_RUNNING: 3,
                                                               sc.LLM_RUNTIME_REQUESTS_WAITING: 3}
    assert observers.runtime_of(LOOPBACK, fake.port) == "vllm"
    assert observers.model_attributes(LOOPBACK, fake.port) == {sc.LLM_MODEL_CONTEXT_LENGTH: 512,
                                                               sc.LLM_MODEL_NAME: "tiny"}
    assert fake.hits["/metrics"] >= 1 and fake.hits["/v1/models"] == 1
    # another port of the same host: nothing known
    assert observers.runtime_at_start(LOOPBACK, fake.port + 1) == {}
    assert observers.runtime_of(LOOPBACK, fake.port + 1) is None
    assert observers.model_attributes(LOOPBACK, fake.port + 1) == {}


def test_the_poll_option_decides_which_noted_servers_are_polled(rig: Rig,
                                                                vllm_servers: Callable[[], FakeVllm]) -> None:
    """A server a call went to, in this process (not a runtime /proc can identify): the default
    ``local`` policy leaves it alone, ``all`` polls it and recognizes vLLM from its answers."""
    left_alone, polled = vllm_servers(), vllm_servers()
    by_default = rig.build(host=False, gpu=False, interval=0.05)
    poll_all = rig.build(host=False, gpu=False, interval=0.05, poll="all")
    by_default.registry.note(LOOPBACK, left_alone.port, None)
    poll_all.registry.note(LOOPBACK, polled.port, None)
    _wait_for(lambda: polled.hits.get("/metrics", 0) >= 3)
    assert poll_all.runtime_of(LOOPBACK, polled.port) == "vllm"
    assert poll_all.runtime_at_start(LOOPBACK, polled.port)[sc.LLM_RUNTIME_REQUESTS_RUNNING] == 3
    assert left_alone.hits == {}
    assert by_default.runtime_at_start(LOOPBACK, left_alone.port) == {}
    assert by_default.runtime_of(LOOPBACK, left_alone.port) is None


@pytest.mark.parametrize(("state", "expected"), [
    ({"requests.running": 3, "requests.waiting": 0}, {"running": 3, "waiting": 0}),
    ({"requests.running": 2.0, "requests.waiting": None, "kv_cache.usage": 0.5}, {"running": 2}),
    ({"requests.running": True, "requests.waiting": "4"}, {}),  # a bool or a string is no count
    ({"requests.running": math.nan, "requests.waiting": math.inf}, {}),
    ({}, {}),  # not polled yet
])
def test_runtime_at_start_keeps_finite_counts_only(rig: Rig, monkeypatch: pytest.MonkeyPatch,
                                                   state: dict[str, Any], expected: dict[str, int]) -> None:
    observers = rig.build(host=False, gpu=False, runtime=True)
    assert observers.runtime_state is not None
    asked: list[tuple[str, int]] = []

    def latest_state(host: str, port: int) -> dict[str, Any]:
        asked.append((host, port))
        return state

    monkeypatch.setattr(observers.runtime_state, "latest_state", latest_state)
    names = {"running": sc.LLM_RUNTIME_REQUESTS_RUNNING, "waiting": sc.LLM_RUNTIME_REQUESTS_WAITING}
    found = observers.runtime_at_start("localhost", 11434)
    assert found == {names[k]: v for k, v in expected.items()}
    assert all(type(v) is int for v in found.values())
    assert asked == [("localhost", 11434)]


def test_model_attributes_leave_out_what_the_runtime_did_not_say(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    observers = rig.build(host=False, gpu=False, runtime=True)
    assert observers.runtime_state is not None
    served = {"gemma": ModelInfo("/api/ps", context_length=4096, model="gemma", size=1000, size_vram=400,
                                 parameter_size="1B", expires_at="2100-01-01T00:00:00Z"),
              "qwen": ModelInfo("/api/ps", context_length=8192, model="qwen", quantization="Q4_K_M", size=1000,
                                size_vram=1000)}
    asked: list[tuple[str, int, str | None]] = []

    def model_of(host: str, port: int, model: str | None = None) -> ModelInfo | None:
        asked.append((host, port, model))
        return served.get(model or "")

    monkeypatch.setattr(observers.runtime_state, "model_of", model_of)
    gemma = observers.model_attributes(LOOPBACK, 11434, "gemma")
    assert gemma == {sc.LLM_MODEL_CONTEXT_LENGTH: 4096, sc.LLM_MODEL_NAME: "gemma", sc.LLM_MODEL_MEMORY_TOTAL: 1000,
                     sc.LLM_MODEL_MEMORY_VRAM: 400, sc.LLM_MODEL_PARAMETER_SIZE: "1B",
                     sc.LLM_MODEL_EXPIRES_AT: "2100-01-01T00:00:00Z", sc.LLM_DIAGNOSIS_PARTIAL_OFFLOAD: True}
    qwen = observers.model_attributes(LOOPBACK, 11434, "qwen")
    assert qwen[sc.LLM_DIAGNOSIS_PARTIAL_OFFLOAD] is False and qwen[sc.LLM_MODEL_QUANTIZATION] == "Q4_K_M"
    assert sc.LLM_MODEL_SLOTS not in qwen and sc.LLM_MODEL_PARAMETER_SIZE not in qwen
    assert observers.model_attributes(LOOPBACK, 11434, "unknown") == {}
    assert asked == [(LOOPBACK, 11434, "gemma"), (LOOPBACK, 11434, "qwen"), (LOOPBACK, 11434, "unknown")]
    # equal metadata (another poll's ModelInfo) gives the same dictionary: built once, not per call
    earlier = served["gemma"]
    served["gemma"] = dataclasses.replace(earlier)
    assert served["gemma"] is not earlier and served["gemma"] == earlier
    assert observers.model_attributes(LOOPBACK, 11434, "gemma") is gemma


def test_take_restart_hands_each_pending_event_to_one_call(rig: Rig) -> None:
    observers = rig.build(host=False, gpu=False, runtime=False)
    event: dict[str, Any] = {sc.LLM_RUNTIME_PREVIOUS_PID: 41, sc.LLM_RUNTIME_PID: 42}
    observers.pending_restarts[(LOOPBACK, 8080)] = event
    observers.pending_restarts[("localhost", 8080)] = dict(event)
    assert observers.take_restart(LOOPBACK, 8081) is None
    assert observers.take_restart(LOOPBACK, 8080) is event
    assert observers.take_restart(LOOPBACK, 8080) is None  # the next call does not carry it again
    assert list(observers.pending_restarts) == [("localhost", 8080)]


def test_a_server_process_that_goes_away_is_pending_for_the_next_call(
        rig: Rig, listener: tuple[subprocess.Popen[str], int], caplog: pytest.LogCaptureFixture) -> None:
    """The restart watch rides on the host sampler's ticks; what it notices waits in
    ``pending_restarts`` until a call to that server takes it."""
    proc, port = listener
    observers = rig.build(host=True, gpu=False, runtime=False, interval=0.05)
    sampler = observers.sampler
    assert sampler is not None
    observers.registry.note(LOOPBACK, port, None)
    seen = len(sampler.samples())
    _wait_for(lambda: len(sampler.samples()) >= seen + 2)  # a whole tick saw it listening
    assert observers.pending_restarts == {}
    proc.kill()
    proc.wait()
    _wait_for(lambda: (LOOPBACK, port) in observers.pending_restarts)
    assert observers.take_restart(LOOPBACK, port) == {sc.LLM_RUNTIME_PREVIOUS_PID: proc.pid}
    assert observers.take_restart(LOOPBACK, port) is None
    assert f"otel_llm: the model server at {LOOPBACK}:{port} disappeared (pid {proc.pid})" in _messages(caplog)
