"""Which servers the runtime-state poller sends requests to: by default only the runtimes the user
named and the local processes /proc identifies as runtimes, never a server because of a call's
route. Real loopback servers count every request they receive."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider

import otel_llm
from otel_llm.observers import runtime_state
from otel_llm.observers.poll_policy import POLL_ALL, POLL_CONFIGURED, POLL_LOCAL, PollPolicy
from otel_llm.observers.processes import listening_runtimes
from otel_llm.observers.registry import ServerRegistry
from otel_llm.observers.runtime_state import MAX_FAILURES, RuntimeStateObserver
from otel_llm_testing.otel import make_otel
from otel_llm_testing.net import LOOPBACK, wait_for
from otel_llm_testing.model_server import ModelServer
from otel_llm_testing.fake_runtime import FakeRuntime, observer_fixture

# A stand-in runtime in its own process: answers /metrics like llama-server and /api/ps like
# Ollama (with the status given), and appends the path of every request it receives to a file.
_FAKE = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log, metrics, status, port = sys.argv[1], open(sys.argv[2], "rb").read(), int(sys.argv[3]), int(sys.argv[4])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        with open(log, "a") as out:
            out.write(self.path + "\n")
        body = metrics if self.path == "/metrics" else b'{"models": []}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
'''


class OtherProcess:
    """A loopback server in a subprocess; ``name`` is the executable's name /proc shows."""

    def __init__(self, tmp_path: Path, name: str, status: int = 200, port: int = 0) -> None:
        self.log = tmp_path / f"{name}.requests"
        self.log.touch()
        script = tmp_path / "fake_runtime.py"
        script.write_text(_FAKE)
        metrics = tmp_path / "metrics.txt"
        metrics.write_text(observer_fixture("vllm_legacy_metrics.txt").replace("vllm:num_requests_running",
                                                                    "llamacpp:requests_processing"))
        executable = tmp_path / name
        if not executable.exists():
            executable.symlink_to(sys.executable)  # /proc/PID/comm is the name it was run by
        self._proc = subprocess.Popen([str(executable), str(script), str(self.log), str(metrics), str(status),
                                       str(port)], stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        self.port = int(self._proc.stdout.readline())

    def requests(self) -> list[str]:
        return self.log.read_text().splitlines()

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait(10)


@pytest.fixture
def llama_server_process(tmp_path: Path) -> Iterator[OtherProcess]:
    proc = OtherProcess(tmp_path, "llama-server")
    yield proc
    proc.stop()


@pytest.fixture
def plain_process(tmp_path: Path) -> Iterator[OtherProcess]:
    proc = OtherProcess(tmp_path, "python-app")
    yield proc
    proc.stop()


def _observer(registry: ServerRegistry, mode: str = POLL_LOCAL, **kwargs: object) -> RuntimeStateObserver:
    return RuntimeStateObserver(MeterProvider().get_meter("t"), registry, interval=0.05,
                                policy=PollPolicy(mode), **kwargs)  # type: ignore[arg-type]


def _run_for(observer: RuntimeStateObserver, seconds: float) -> None:
    observer.start()
    try:
        time.sleep(seconds)
    finally:
        observer.stop()


# --- identification from /proc ---------------------------------------------------------------------
def test_listeners_identified_from_proc(llama_server_process: OtherProcess, plain_process: OtherProcess,
                                        fake: FakeRuntime) -> None:
    found = listening_runtimes({llama_server_process.port, plain_process.port, fake.port})
    assert found[llama_server_process.port].runtime == "llama.cpp"
    assert found[plain_process.port].runtime is None  # a process, but not a known runtime
    assert found[fake.port].runtime is None  # this process: never a runtime to poll
    assert llama_server_process.requests() == [] and plain_process.requests() == []  # no request sent


# --- the default: local ----------------------------------------------------------------------------
def test_route_implied_runtime_is_not_enough(fake: FakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """A test server in the application's own process, called on /api/chat: never polled."""
    caplog.set_level(logging.INFO, logger="otel_llm")
    fake.serve("/api/ps", '{"models": []}', content_type="application/json")
    registry = ServerRegistry()
    registry.note(LOOPBACK, fake.port, "ollama")  # what telemetry notes for a call to /api/chat
    _run_for(_observer(registry), 1.0)
    assert fake.hits == {}
    said = [r.getMessage() for r in caplog.records if f"not polling {LOOPBACK}:{fake.port}" in r.getMessage()]
    assert len(said) == 1 and "poll_runtimes=all" in said[0]


def test_other_local_process_is_not_polled(plain_process: OtherProcess) -> None:
    registry = ServerRegistry()
    registry.note(LOOPBACK, plain_process.port, "ollama")
    registry.note("localhost", plain_process.port, None)
    _run_for(_observer(registry), 1.0)
    assert plain_process.requests() == []


def test_local_runtime_process_is_polled_as_what_it_is(llama_server_process: OtherProcess) -> None:
    """llama-server on this host: polled, as llama.cpp (its /metrics only), whatever the route
    implied; once the process is gone nothing stale is reported and nothing more is sent."""
    registry = ServerRegistry()
    registry.note(LOOPBACK, llama_server_process.port, "ollama")  # the route said Ollama
    observer = _observer(registry)
    observer.start()
    try:
        assert wait_for(lambda: len(llama_server_process.requests()) >= 3, timeout=10)
        # its /metrics at every poll, and its model metadata (/props) once
        assert set(llama_server_process.requests()) == {"/metrics", "/props"}
        assert llama_server_process.requests().count("/props") == 1
        state = observer.latest_state(LOOPBACK, llama_server_process.port)
        assert state["requests.running"] == 1
        llama_server_process.stop()
        assert wait_for(lambda: observer.latest_state(LOOPBACK, llama_server_process.port) == {}, timeout=10)
        count = len(llama_server_process.requests())
        time.sleep(0.5)
        assert len(llama_server_process.requests()) == count
    finally:
        observer.stop()


@pytest.mark.slow
def test_restarted_runtime_is_polled_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A llama-server answering 500 is polled MAX_FAILURES times, then no more (its /props, which
    fails too, once); a new llama-server process on the same port (a restart) is a new endpoint:
    polled again, its /props asked again, and it answers."""
    monkeypatch.setattr(runtime_state, "MAX_SLEEP", 1.0)  # the poller's longest sleep (60 s)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    failing = OtherProcess(tmp_path / "first", "llama-server", status=500)
    registry = ServerRegistry()
    registry.note(LOOPBACK, failing.port, None)
    observer = _observer(registry)
    observer.start()
    try:
        assert wait_for(lambda: len(failing.requests()) >= MAX_FAILURES, timeout=15)
        time.sleep(1.0)  # past the back-off the next poll would have waited
        asked = ["/metrics"] * MAX_FAILURES + ["/props"]
        assert sorted(failing.requests()) == asked
        failing.stop()
        restarted = OtherProcess(tmp_path / "second", "llama-server", port=failing.port)
        try:
            # re-identified at the poller's next wake (within MAX_SLEEP)
            assert wait_for(lambda: observer.latest_state(LOOPBACK, failing.port).get("requests.running") == 1,
                            timeout=15)
            assert sorted(failing.requests()) == asked
            assert wait_for(lambda: restarted.requests().count("/props") == 1, timeout=5)
        finally:
            restarted.stop()
    finally:
        observer.stop()


def test_configured_mode_polls_only_named_servers(llama_server_process: OtherProcess,
                                                  fake: FakeRuntime) -> None:
    fake.serve("/metrics", observer_fixture("tgi_metrics.txt"))
    registry = ServerRegistry()
    registry.note(LOOPBACK, llama_server_process.port, "llama.cpp")
    registry.configure(LOOPBACK, fake.port, "tgi")  # named: polled even in this process
    _run_for(_observer(registry, POLL_CONFIGURED), 0.5)
    assert llama_server_process.requests() == []
    assert fake.hits.get("/metrics", 0) >= 2


@pytest.mark.parametrize("mode", [POLL_CONFIGURED, POLL_LOCAL, POLL_ALL])
def test_what_each_mode_polls_of_remote_hosts(mode: str) -> None:
    """Remote and container hosts: never in the default, except those the user named."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.url.port}{request.url.path}")
        return httpx.Response(404)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    registry = ServerRegistry()
    registry.note("10.1.2.3", 8000, "vllm")
    registry.note("ollama", 11434, "ollama")
    registry.note("api.openai.com", 443, None)
    registry.configure("gpu-box", 8080, "llama.cpp")
    observer = _observer(registry, mode, client=client)
    observer.poll_once()
    observer.stop()
    client.close()
    named = ["gpu-box:8080/metrics", "gpu-box:8080/props"]  # its model metadata though /metrics is absent
    expected = {POLL_CONFIGURED: named, POLL_LOCAL: named,
                POLL_ALL: [*named, "10.1.2.3:8000/metrics", "10.1.2.3:8000/v1/models", "ollama:11434/api/ps"]}[mode]
    assert sorted(seen) == sorted(expected)


# --- through instrument() ---------------------------------------------------------------------------
def _calls_for(seconds: float, **options: object) -> list[str]:
    """Ollama-route calls to a test server in this process for ``seconds``; what it received."""
    otel = make_otel()
    with ModelServer() as server:
        otel_llm.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                            sample_interval=0.2, gpu_metrics=False, **options)
        try:
            deadline = time.monotonic() + seconds
            with httpx.Client(timeout=10) as client:
                while time.monotonic() < deadline:
                    client.post(server.url("/api/chat"), json={"model": "m", "messages": [], "stream": False})
                    time.sleep(0.1)
        finally:
            otel_llm.uninstrument()
        assert len(otel.calls()) >= 5  # really instrumented
        return [f"{r.method} {r.path}" for r in server.requests]


@pytest.mark.slow
def test_instrumented_application_sends_nothing_of_its_own_by_default() -> None:
    received = _calls_for(1.5)
    assert set(received) == {"POST /api/chat"}


@pytest.mark.slow
def test_poll_runtimes_all_restores_polling_of_any_server() -> None:
    received = _calls_for(1.5, poll_runtimes="all")
    assert "GET /api/ps" in received  # so the test above could fail


def test_environment_variable_selects_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_LLM_POLL_RUNTIMES", "all")
    assert "GET /api/ps" in _calls_for(1.0)


def test_polled_only_when_named_through_instrument() -> None:
    """The runtimes option names the test server: then it is polled, in the default mode."""
    otel = make_otel()
    with ModelServer() as server:
        otel_llm.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                            sample_interval=0.2, gpu_metrics=False, runtimes={server.url(): "ollama"})
        try:
            assert wait_for(lambda: any(r.path == "/api/ps" for r in server.requests), timeout=5)
        finally:
            otel_llm.uninstrument()

