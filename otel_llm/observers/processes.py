"""Find the model runtime's process(es) on this host, so the host observer can report them.

A local server in the registry is matched by its listening port; when that finds nothing (no
local server yet, or the port's owner cannot be seen), processes are matched by known runtime
names. Results are cached and refreshed at most every ``refresh_seconds``, or at once when the
registry's servers change.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import psutil

from otel_llm._log import log_once
from otel_llm.observers.registry import Server, ServerRegistry
from otel_llm.observers.sockets import listeners
from otel_llm.runtimes import OBSERVED

__all__ = ["Listener", "RuntimeProcesses", "listening_runtimes", "runtime_for_name"]

RuntimeProcess = tuple[psutil.Process, str | None]

# What identifies each runtime's processes is declared by its module (runtimes/<rt>.py).
_NAME_PREFIXES = tuple((prefix, name) for name, o in OBSERVED.items() for prefix in o.executables)
_EXACT_NAMES = {exe: name for name, o in OBSERVED.items() for exe in o.executable_names}
# Python runtimes run as "python ... vllm ..."; match the module or script, not any argument
# that mentions the word (a test file named test_vllm.py is not vLLM).
_PYTHON_MODULES = {module: name for name, o in OBSERVED.items() for module in o.python_modules}
# Process titles some runtimes set on their workers (vLLM "VLLM::EngineCore", "sglang::scheduler").
_TITLE_PREFIXES = tuple((prefix, name) for name, o in OBSERVED.items() for prefix in o.process_titles)


def runtime_for_name(name: str, cmdline: Sequence[str] | None = None) -> str | None:
    """The runtime a process is, from its executable name (and command line for Python)."""
    lowered = name.lower()
    if lowered in _EXACT_NAMES:
        return _EXACT_NAMES[lowered]
    for prefix, runtime in _NAME_PREFIXES + _TITLE_PREFIXES:
        if lowered.startswith(prefix):
            return runtime
    if lowered.startswith("python") and cmdline:
        return _python_runtime(cmdline)
    return None


# the interpreter's options that take the next argument (python -X faulthandler -m vllm ...)
_OPTIONS_WITH_ARGUMENT = {"-X", "-W", "--check-hash-based-pycs"}


def _python_runtime(cmdline: Sequence[str]) -> str | None:
    """``python -m vllm.entrypoints...`` or ``python /usr/bin/vllm serve ...``."""
    args = iter(cmdline[1:])
    for arg in args:
        if arg.startswith("-m"):
            module = arg[2:] or next(args, "")
            return _PYTHON_MODULES.get(module.split(".")[0])
        if arg == "-c":
            return None  # a program given as a string
        if arg in _OPTIONS_WITH_ARGUMENT:
            next(args, None)
            continue
        if arg.startswith("-"):
            continue
        return _PYTHON_MODULES.get(os.path.basename(arg).removesuffix(".py"))
    return None


class RuntimeProcesses:
    """The runtime processes on this host, cached; ``processes()`` is cheap between refreshes."""

    def __init__(self, registry: ServerRegistry, refresh_seconds: float = 10.0) -> None:
        self.registry = registry
        self.refresh_seconds = refresh_seconds
        self._found: dict[int, RuntimeProcess] = {}
        self._listening: dict[int, psutil.Process] = {}  # port -> process, from the last refresh
        self._signature: tuple[Server, ...] | None = None
        self._refreshed_at: float | None = None
        self._lock = threading.Lock()
        self._own_pid = os.getpid()

    def processes(self) -> list[RuntimeProcess]:
        """(process, runtime name) for each runtime process found; refreshed when due."""
        signature = tuple(sorted(s for s in self.registry.servers() if s.is_local))
        with self._lock:
            due = self._refreshed_at is None or time.monotonic() - self._refreshed_at >= self.refresh_seconds
            if due or signature != self._signature:
                self._refresh(signature)
            return list(self._found.values())

    def refresh(self) -> list[RuntimeProcess]:
        """Discover again now, whatever the cache holds."""
        with self._lock:
            self._refreshed_at = None
        return self.processes()

    def discard(self, process: psutil.Process) -> None:
        """Forget a process that went away (the observer saw NoSuchProcess)."""
        with self._lock:
            found = self._found.get(process.pid)
            if found is not None and found[0] == process:
                del self._found[process.pid]

    def _refresh(self, signature: tuple[Server, ...]) -> None:
        self._signature = signature
        self._refreshed_at = time.monotonic()
        try:
            found = self._by_port(signature) if signature else {}
            if not found:
                found = self._by_name()
        except Exception:
            log_once("finding the runtime processes failed")
            found = {}
        self._found = {pid: (self._reuse(proc) or proc, runtime) for pid, (proc, runtime) in found.items()}

    def _reuse(self, proc: psutil.Process | None) -> psutil.Process | None:
        """Keep the same Process object across refreshes (psutil caches per object)."""
        known = self._found.get(proc.pid) if proc is not None else None
        return known[0] if known is not None and known[0] == proc else proc

    # -- by listening port ------------------------------------------------------------------------
    def _by_port(self, servers: Sequence[Server]) -> dict[int, RuntimeProcess]:
        ports: dict[int, str | None] = {}
        for server in servers:  # one server may be known by several names: a named runtime wins
            ports[server.port] = ports.get(server.port) or server.runtime
        self._listening = self._still_listening(set(ports)) or self._listeners(set(ports))
        found: dict[int, RuntimeProcess] = {}
        for port, proc in self._listening.items():
            runtime = ports[port] or _runtime_of(proc)
            found[proc.pid] = (proc, runtime)
            # Some runtimes hold the model in a child (ollama's runner, vLLM's engine core).
            for child in _children(proc):
                found.setdefault(child.pid, (child, runtime))
        found.pop(self._own_pid, None)  # this process is reported on its own
        return found

    def _still_listening(self, ports: set[int]) -> dict[int, psutil.Process] | None:
        """Last refresh's listeners while they all live: a process keeps its listening socket
        for its lifetime, and the system-wide table costs milliseconds."""
        if not self._listening or set(self._listening) != ports:
            return None
        if all(_alive(proc) for proc in self._listening.values()):
            return self._listening
        return None

    def _listeners(self, ports: set[int]) -> dict[int, psutil.Process]:
        """port -> the process listening on it, for ``ports``."""
        found: dict[int, psutil.Process] = {}
        for port, proc in _listening_sockets(ports):
            if proc is not None:
                found[port] = self._reuse(proc) or proc
        return found

    # -- by name ----------------------------------------------------------------------------------
    def _by_name(self) -> dict[int, RuntimeProcess]:
        found: dict[int, RuntimeProcess] = {}
        for pid, name in _names():
            if pid == self._own_pid or not _may_be_runtime(name):
                continue
            proc = _process(pid)
            runtime = _runtime_of(proc, name) if proc is not None else None
            if proc is not None and runtime is not None:
                found[pid] = (proc, runtime)
        return found


class Listener(NamedTuple):
    """Who listens on a port: the known runtime they all are (None: not one runtime, or an
    owner that cannot be seen) and the processes seen."""

    runtime: str | None
    processes: tuple[psutil.Process, ...]


def listening_runtimes(ports: set[int]) -> dict[int, Listener]:
    """port -> its listeners, for the ports of ``ports`` that something on this host listens on.

    Read from the kernel (sock_diag and /proc, or psutil): no request is sent to find out. A port has a runtime only
    when every process listening on it is the same known runtime and none is this process (the
    application, or a test server it runs, is never a model runtime to poll)."""
    own = os.getpid()
    owners: dict[int, list[psutil.Process | None]] = {}
    for port, proc in _listening_sockets(ports):
        owners.setdefault(port, []).append(proc)
    found = {}
    for port, procs in owners.items():
        runtimes = {None if proc is None or proc.pid == own else _runtime_of(proc) for proc in procs}
        runtime = runtimes.pop() if len(runtimes) == 1 else None
        found[port] = Listener(runtime, tuple(p for p in procs if p is not None))
    return found


def _listening_sockets(ports: set[int]) -> Iterator[tuple[int, psutil.Process | None]]:
    """(port, owner) of each listening TCP socket on ``ports``; None when the owner is hidden
    (another user's process, seen without privileges)."""
    owners = listeners(ports)  # Linux: the listening sockets alone, from the kernel
    if owners is not None:
        for port, pid in owners:
            yield port, _process(pid) if pid else None
        return
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS without root: each visible process's own sockets
        for proc in psutil.process_iter():
            for port in _listening_ports(proc) & ports:
                yield port, proc
        return
    for c in connections:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports:
            yield c.laddr.port, _process(c.pid) if c.pid else None


def _names() -> Iterator[tuple[int, str]]:
    """(pid, executable name) of every process. On Linux straight from /proc/PID/comm: a
    psutil.Process per process costs about 30 us, this about 5, and a collection runs it."""
    if not os.path.isdir("/proc/self"):
        for proc in psutil.process_iter(["name"]):
            yield proc.pid, proc.info.get("name") or ""
        return
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/comm", "rb") as comm:
                    yield int(entry.name), comm.read().decode("utf-8", "replace").strip()
            except OSError:  # gone, or not ours to read
                continue


def _may_be_runtime(name: str) -> bool:
    """A cheap first look; /proc/PID/comm is cut at 15 characters, so prefixes are compared."""
    lowered = name.lower()
    return lowered.startswith("python") or any(
        lowered.startswith(prefix[:15]) or prefix.startswith(lowered) and len(lowered) >= 15
        for prefix, _ in _NAME_PREFIXES + _TITLE_PREFIXES) or lowered in _EXACT_NAMES


def _runtime_of(proc: psutil.Process, name: str | None = None) -> str | None:
    """Match by name; read the command line only for Python processes (it costs a file read)."""
    try:
        if name is None or len(name) >= 15:  # comm is truncated: the full name decides
            name = proc.name()
        cmdline = proc.cmdline() if name.lower().startswith("python") else None
        return runtime_for_name(name, cmdline)
    except (psutil.Error, OSError):
        return None


def _listening_ports(proc: psutil.Process) -> set[int]:
    try:
        return {c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr}
    except (psutil.Error, OSError):
        return set()


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running())  # also false when the pid was reused
    except (psutil.Error, OSError):
        return False


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.Error, OSError):
        return None


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return list(proc.children(recursive=True))
    except (psutil.Error, OSError):
        return []
