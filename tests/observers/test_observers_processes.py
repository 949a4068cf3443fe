"""Finding the model runtime's processes (otel_llm.observers.processes): real processes listening on
127.0.0.1 read from the real /proc, and monkeypatched failures for what cannot happen here as root."""

from __future__ import annotations

import builtins
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import psutil
import pytest

from otel_llm.observers import processes, sockets
from otel_llm.observers.processes import Listener, RuntimeProcesses, listening_runtimes, runtime_for_name
from otel_llm.observers.registry import ServerRegistry
from otel_llm_testing.net import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

LOOPBACK = "127.0.0.1"

# Listens on 127.0.0.1:PORT (0: any), optionally sharing the port (SO_REUSEPORT) and with a child
# (a shell) that has a child of its own (a sleep); prints "PORT CHILD GRANDCHILD" (0 0 without)
# and lives until its stdin closes.
_LISTEN = """\
import os, signal, socket, subprocess, sys
port, share, child = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
s = socket.socket()
if share:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("127.0.0.1", port))
s.listen()
kid = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                       start_new_session=True) if child else None
grandkid = int(kid.stdout.readline()) if kid else 0
print(s.getsockname()[1], kid.pid if kid else 0, grandkid, flush=True)
sys.stdin.read()
if kid:
    os.killpg(kid.pid, signal.SIGKILL)
    kid.wait()
"""


@dataclass
class Listening:
    proc: subprocess.Popen[str]
    port: int
    descendants: list[psutil.Process]  # its child, then that child's child

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        for descendant in self.descendants:
            if descendant.is_running():  # the listener was killed before it could end them
                descendant.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


@pytest.fixture
def listen(tmp_path: Path) -> Iterator[Callable[..., Listening]]:
    """Starts listening processes; ``script`` names the file it runs (``vllm.py``: /proc shows a
    Python process running vLLM's script)."""
    started: list[Listening] = []

    def start(script: str = "listener.py", port: int = 0, share: bool = False, child: bool = False) -> Listening:
        folder = tmp_path / str(len(started))
        folder.mkdir()
        (folder / script).write_text(_LISTEN)
        proc = subprocess.Popen([sys.executable, str(folder / script), str(port), str(int(share)), str(int(child))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        started.append(Listening(proc, int(line[0]), [psutil.Process(int(pid)) for pid in line[1:] if pid != "0"]))
        return started[-1]

    try:
        yield start
    finally:
        for listening in started:
            listening.close()


@pytest.fixture
def dummy(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Starts /bin/sleep copied under a runtime's executable name (found by name, listening nowhere)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        folder = tmp_path / f"dummy{len(started)}"
        folder.mkdir()
        shutil.copy(shutil.which("sleep") or "/bin/sleep", folder / name)
        proc = subprocess.Popen([str(folder / name), "60"])
        started.append(proc)
        _wait_for(lambda: psutil.Process(proc.pid).name() == name)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def _wait_for(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)



def _found(finder: RuntimeProcesses, fresh: bool = False) -> dict[int, str | None]:
    return {proc.pid: runtime for proc, runtime in (finder.refresh() if fresh else finder.processes())}


def _denied(kind: str = "inet") -> Any:
    raise psutil.AccessDenied()


@pytest.fixture(params=["sock_diag", "psutil", "per-process"])
def source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where listeners are read: the kernel's sock_diag (Linux), psutil's socket table where that
    is not possible, or each process's own sockets where the table is denied (macOS, non-root)."""
    if request.param == "sock_diag":
        if sockets.listeners({1}) is None:
            pytest.skip("sock_diag refused here")
        monkeypatch.setattr(psutil, "net_connections", lambda *args, **kwargs: pytest.fail("psutil asked"))
    else:
        monkeypatch.setattr(processes, "listeners", lambda ports: None)
    if request.param == "per-process":
        monkeypatch.setattr(psutil, "net_connections", _denied)
    return str(request.param)


# --- by listening port ------------------------------------------------------------------------------------
def test_the_process_listening_on_a_noted_port_is_the_runtime(listen: Callable[..., Listening], source: str) -> None:
    server = listen()
    registry = ServerRegistry()
    registry.note(LOOPBACK, server.port, "vllm")
    [(proc, runtime)] = RuntimeProcesses(registry).processes()  # by port only: no name scan added to it
    assert (proc.pid, runtime) == (server.pid, "vllm")  # the registry's runtime names it
    assert server.port in {c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_without_a_runtime_in_the_registry_the_process_names_it(listen: Callable[..., Listening]) -> None:
    vllm, other = listen("vllm.py"), listen("server.py")
    registry = ServerRegistry()
    registry.note(LOOPBACK, vllm.port, None)
    registry.note(LOOPBACK, other.port, None)
    assert _found(RuntimeProcesses(registry)) == {vllm.pid: "vllm", other.pid: None}


def test_the_listener_s_descendants_share_its_runtime_until_discarded(listen: Callable[..., Listening]) -> None:
    """Some runtimes hold the model in a child process (ollama's runner, vLLM's engine core)."""
    server = listen(child=True)
    child, grandchild = server.descendants
    registry = ServerRegistry()
    registry.note(LOOPBACK, server.port, "ollama")
    finder = RuntimeProcesses(registry, refresh_seconds=3600)
    everyone = {server.pid: "ollama", child.pid: "ollama", grandchild.pid: "ollama"}
    assert _found(finder) == everyone
    finder.discard(psutil.Process(os.getpid()))  # not one of them: nothing changes
    # a stale handle whose pid now names another process (pid reuse) is not the one found
    finder.discard(cast(psutil.Process, SimpleNamespace(pid=grandchild.pid)))
    assert _found(finder) == everyone
    finder.discard(grandchild)  # the host observer saw it vanish
    assert _found(finder) == {server.pid: "ollama", child.pid: "ollama"}
    assert _found(finder, fresh=True) == everyone  # it is still alive: found again


def _as_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process looks like vLLM from /proc (otel_llm instrumenting inside a vLLM server)."""
    real, real_name = psutil.Process.cmdline, psutil.Process.name

    def cmdline(self: psutil.Process) -> list[str]:
        return ["python3", "-m", "vllm.entrypoints.openai.api_server"] if self.pid == os.getpid() else real(self)

    def name(self: psutil.Process) -> str:  # "pytest" when run as the pytest script, not python -m pytest
        return "python3" if self.pid == os.getpid() else real_name(self)

    monkeypatch.setattr(psutil.Process, "cmdline", cmdline)
    monkeypatch.setattr(psutil.Process, "name", name)
    assert processes._runtime_of(psutil.Process()) == "vllm"


def test_this_process_is_never_one_of_the_runtime_processes(listen: Callable[..., Listening],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The application's own listener (a test server inside it) is reported on its own, not as
    the runtime, by port or by name, even where the application looks like a runtime; the port's
    other listeners still are."""
    _as_vllm(monkeypatch)
    own = socket.socket()
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    own.bind((LOOPBACK, 0))
    own.listen()
    try:
        port = own.getsockname()[1]
        registry = ServerRegistry()
        registry.note(LOOPBACK, port, "vllm")
        finder = RuntimeProcesses(registry, refresh_seconds=0)
        assert os.getpid() not in _found(finder)  # nor by name (the fallback)
        other = listen(port=port, share=True)
        found = _found(finder, fresh=True)
        assert found[other.pid] == "vllm" and os.getpid() not in found
    finally:
        own.close()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", "::1", "0.0.0.0"])
def test_every_name_of_this_host_is_matched_by_port(listen: Callable[..., Listening], host: str) -> None:
    server = listen()
    registry = ServerRegistry()
    registry.note(host, server.port, "tgi")
    assert _found(RuntimeProcesses(registry)) == {server.pid: "tgi"}


def test_a_remote_host_on_the_same_port_is_not_a_local_process(listen: Callable[..., Listening]) -> None:
    server = listen()
    registry = ServerRegistry()
    for host in ("203.0.113.9", "gpu-box.example", "2001:db8::1"):
        registry.note(host, server.port, "vllm")
    finder = RuntimeProcesses(registry, refresh_seconds=3600)
    assert server.pid not in _found(finder)
    registry.note("localhost", server.port, "vllm")  # the registry changed: looked at once
    assert _found(finder) == {server.pid: "vllm"}


def test_a_noted_port_nobody_listens_on_falls_back_to_names(
        dummy: Callable[[str], subprocess.Popen[bytes]]) -> None:
    runtime = dummy("llama-server")
    registry = ServerRegistry()
    registry.note(LOOPBACK, free_port(), "vllm")
    found = _found(RuntimeProcesses(registry))
    assert found[runtime.pid] == "llama.cpp"  # what its name says, not what the registry said
    assert os.getpid() not in found


def test_a_truncated_name_is_read_in_full_and_an_unreadable_one_is_skipped(
        dummy: Callable[[str], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """/proc/PID/comm keeps 15 characters ("text-generation"): the full name decides, and a
    process whose name cannot be read is not taken for a runtime (the others still are)."""
    launcher, ollama = dummy("text-generation-launcher"), dummy("ollama")
    with open(f"/proc/{launcher.pid}/comm") as comm:
        assert comm.read().strip() == "text-generation"
    finder = RuntimeProcesses(ServerRegistry(), refresh_seconds=0)
    found = _found(finder)
    assert (found[launcher.pid], found[ollama.pid]) == ("tgi", "ollama")
    real_name = psutil.Process.name

    def name(self: psutil.Process) -> str:
        if self.pid == launcher.pid:
            raise psutil.AccessDenied(self.pid)
        return real_name(self)

    monkeypatch.setattr(psutil.Process, "name", name)
    with caplog.at_level("DEBUG", logger="otel_llm"):
        found = _found(finder)
    assert launcher.pid not in found and found[ollama.pid] == "ollama"
    assert not caplog.records


# --- caching and processes that exit ------------------------------------------------------------------
def test_discovery_is_cached_until_refreshed_or_the_registry_changes(listen: Callable[..., Listening]) -> None:
    first, second = listen(), listen()
    registry = ServerRegistry()
    registry.note(LOOPBACK, first.port, "vllm")
    finder = RuntimeProcesses(registry, refresh_seconds=3600)
    [(proc, _)] = finder.processes()
    first.kill()
    assert finder.processes() == [(proc, "vllm")]  # cached: no /proc read between refreshes
    assert proc.pid not in _found(finder, fresh=True)  # exited: gone, and no error
    registry.note(LOOPBACK, second.port, "sglang")  # a new server: discovered at the next look
    assert _found(finder)[second.pid] == "sglang"
    uncached = RuntimeProcesses(registry, refresh_seconds=0)
    assert _found(uncached)[second.pid] == "sglang"
    second.kill()
    assert second.pid not in _found(uncached)


def test_live_listeners_are_kept_without_reading_the_sockets_again(
        listen: Callable[..., Listening], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    reads: list[set[int]] = []
    real = processes._listening_sockets

    def listening_sockets(ports: set[int]) -> Iterator[tuple[int, psutil.Process | None]]:
        reads.append(set(ports))
        return real(ports)

    monkeypatch.setattr(processes, "_listening_sockets", listening_sockets)
    server, later = listen(), listen()
    registry = ServerRegistry()
    registry.note(LOOPBACK, server.port, "vllm")
    finder = RuntimeProcesses(registry)
    [(proc, _)] = finder.processes()
    assert reads == [{server.port}]
    [(again, _)] = finder.refresh()
    assert again is proc and len(reads) == 1  # alive: not read again
    registry.note(LOOPBACK, later.port, "vllm")
    found = {p.pid: p for p, _ in finder.processes()}
    assert reads[-1] == {server.port, later.port}
    assert found[server.pid] is proc  # read again, the same Process object kept (psutil caches per object)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    with caplog.at_level("DEBUG", logger="otel_llm"):
        assert set(_found(finder, fresh=True)) == {later.pid}
    assert len(reads) == 3  # a listener died: the ports were read again
    assert not caplog.records  # a process that exits is not a problem to log


def test_processes_found_by_name_keep_their_process_object(dummy: Callable[[str], subprocess.Popen[bytes]]) -> None:
    runtime = dummy("ollama")
    finder = RuntimeProcesses(ServerRegistry(), refresh_seconds=0)
    first = {p.pid: p for p, _ in finder.processes()}[runtime.pid]
    assert {p.pid: p for p, _ in finder.processes()}[runtime.pid] is first


def test_unreadable_or_vanishing_proc_entries_are_skipped_by_the_name_scan(
        dummy: Callable[[str], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """As root every /proc/PID/comm is readable: another user's process (EACCES) and one that
    exits between the directory listing and the read (ENOENT) are simulated."""
    readable, hidden, vanished = dummy("ollama"), dummy("ollama"), dummy("ollama")
    real_open = builtins.open

    def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path == f"/proc/{hidden.pid}/comm":
            raise PermissionError(13, "Permission denied", path)
        if path == f"/proc/{vanished.pid}/comm":
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(processes, "open", fake_open, raising=False)  # the module's own open()
    with caplog.at_level("DEBUG", logger="otel_llm"):
        found = _found(RuntimeProcesses(ServerRegistry()))
    assert found[readable.pid] == "ollama"
    assert hidden.pid not in found and vanished.pid not in found
    assert not caplog.records


def test_a_failing_discovery_is_logged_once_and_finds_nothing(
        listen: Callable[..., Listening], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from otel_llm._log import reset_log_once

    reset_log_once()
    server = listen()
    registry = ServerRegistry()
    registry.note(LOOPBACK, server.port, "vllm")

    def broken(ports: set[int]) -> Any:
        raise RuntimeError("an unexpected netlink answer")

    monkeypatch.setattr(processes, "listeners", broken)
    finder = RuntimeProcesses(registry, refresh_seconds=0)
    assert finder.processes() == [] and finder.processes() == []  # never raises
    assert [r.getMessage() for r in caplog.records if r.name == "otel_llm"] == [
        "otel_llm: finding the runtime processes failed (further occurrences are not logged)"]


# --- listening_runtimes: who listens on a port, read from the kernel (no request sent) ---------------
def test_listening_runtimes_names_each_port_s_owner(listen: Callable[..., Listening], source: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    vllm, other = listen("vllm.py"), listen("server.py")
    _as_vllm(monkeypatch)  # this process is never a runtime to poll, whatever it looks like
    own = socket.socket()
    own.bind((LOOPBACK, 0))
    own.listen()
    nobody = free_port()
    try:
        found = listening_runtimes({vllm.port, other.port, own.getsockname()[1], nobody})
        owners = {port: (listener.runtime, [p.pid for p in listener.processes]) for port, listener in found.items()}
        assert owners == {vllm.port: ("vllm", [vllm.pid]), other.port: (None, [other.pid]),
                          own.getsockname()[1]: (None, [os.getpid()])}
    finally:
        own.close()


def test_a_port_shared_by_different_programs_has_no_runtime(listen: Callable[..., Listening]) -> None:
    first = listen("vllm.py", share=True)
    same = listen("vllm.py", port=first.port, share=True)
    assert listening_runtimes({first.port})[first.port].runtime == "vllm"
    sglang = listen("sglang.py", port=first.port, share=True)
    other = listen("server.py", port=first.port, share=True)
    assert listening_runtimes({first.port})[first.port].runtime is None
    other.close()
    listener = listening_runtimes({first.port})[first.port]  # vLLM and SGLang: still not one runtime
    assert listener.runtime is None
    assert sorted(p.pid for p in listener.processes) == sorted([first.pid, same.pid, sglang.pid])


@pytest.mark.parametrize("via", ["sock_diag", "psutil"])
def test_an_owner_that_is_hidden_or_gone_gives_no_runtime(
        listen: Callable[..., Listening], monkeypatch: pytest.MonkeyPatch, via: str) -> None:
    """Without privileges another user's socket shows no owner; and the owner may exit between the
    socket read and the look at it (a reaped pid stands in for it)."""
    hidden, gone = listen("vllm.py"), listen("vllm.py")
    exited = subprocess.Popen(["true"])
    exited.wait()
    stand_in = {hidden.port: None, gone.port: exited.pid}
    if via == "sock_diag":
        real = sockets.listeners

        def listeners(ports: set[int]) -> list[tuple[int, int | None]] | None:
            found = real(ports)
            if found is None:
                pytest.skip("sock_diag refused here")
            return [(port, stand_in.get(port, pid)) for port, pid in found]

        monkeypatch.setattr(processes, "listeners", listeners)
    else:
        table = psutil.net_connections

        def net_connections(kind: str = "inet") -> Any:
            return [c._replace(pid=stand_in[c.laddr.port]) if c.laddr and c.laddr.port in stand_in else c
                    for c in table(kind)]

        monkeypatch.setattr(processes, "listeners", lambda ports: None)
        monkeypatch.setattr(psutil, "net_connections", net_connections)
    assert listening_runtimes({hidden.port, gone.port}) == {hidden.port: Listener(None, ()),
                                                            gone.port: Listener(None, ())}
    registry = ServerRegistry()
    registry.note(LOOPBACK, hidden.port, "vllm")
    registry.note(LOOPBACK, gone.port, "vllm")
    found = _found(RuntimeProcesses(registry))  # nothing by port: the name scan finds them instead
    assert found[hidden.pid] == found[gone.pid] == "vllm"


# --- known problems ---------------------------------------------------------------------------------------
def test_a_configured_runtime_survives_a_call_to_another_name_of_the_server(
        listen: Callable[..., Listening]) -> None:
    server = listen()
    registry = ServerRegistry()
    registry.configure(LOOPBACK, server.port, "vllm")  # runtimes={"http://127.0.0.1:PORT": "vllm"}
    registry.note("localhost", server.port, None)  # the application calls http://localhost:PORT
    assert _found(RuntimeProcesses(registry)) == {server.pid: "vllm"}


@pytest.mark.parametrize(("cmdline", "runtime"), [
    (["python3", "-X", "faulthandler", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
    (["python3", "-W", "ignore", "-m", "sglang.launch_server"], "sglang"),
    (["python3", "-mvllm.entrypoints.openai.api_server"], "vllm"),
    (["python3", "-u", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
    (["python3", "-X", "vllm", "app.py"], None),  # an option's argument is not the program
    (["python3", "-c", "import vllm"], None),
    (["python3", "-m"], None),
])
def test_python_options_with_an_argument_do_not_hide_the_runtime(cmdline: list[str], runtime: str | None) -> None:
    assert runtime_for_name("python3", cmdline) == runtime
