"""The model servers that observers look at: configured ones and those that calls went to."""

from __future__ import annotations

import threading
from typing import NamedTuple

__all__ = ["Server", "ServerRegistry"]


class Server(NamedTuple):
    host: str
    port: int
    runtime: str | None  # "ollama", "llama.cpp", "vllm", "tgi", "sglang", "lmstudio", or None
    scheme: str = "http"
    configured: bool = False  # named by the ``runtimes`` option (not merely seen in a call)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def is_local(self) -> bool:
        """On this host (a runtime process can only be found, and inspected, here)."""
        return self.host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or self.host.startswith("127.")


class ServerRegistry:
    """Thread-safe set of servers; ``note`` is on every model call, so its common case is a
    single dict lookup."""

    def __init__(self) -> None:
        self._servers: dict[tuple[str, int], str | None] = {}
        self._schemes: dict[tuple[str, int], str] = {}
        self._configured: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self.changed = threading.Event()  # set when a server is added or its runtime learned

    def configure(self, host: str, port: int, runtime: str, scheme: str = "http") -> None:
        """A server the user named (the ``runtimes`` option): its runtime is never overwritten
        by what a call's route implies, and it may always be polled."""
        with self._lock:
            self._servers[(host, port)] = runtime
            self._schemes[(host, port)] = scheme
            self._configured.add((host, port))
            self.changed.set()

    def note(self, host: str, port: int, runtime: str | None, scheme: str = "http") -> None:
        key = (host, port)
        known = self._servers.get(key, ...)
        if known == runtime or (known is not ... and runtime is None) or key in self._configured:
            return
        with self._lock:
            if key in self._configured:
                return
            if runtime is not None or key not in self._servers:
                self._servers[key] = runtime
                self._schemes[key] = scheme
                self.changed.set()

    def servers(self) -> list[Server]:
        with self._lock:
            return [Server(host, port, runtime, self._schemes.get((host, port), "http"),
                           (host, port) in self._configured)
                    for (host, port), runtime in self._servers.items()]
