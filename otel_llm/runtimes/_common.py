"""What the runtime modules declare: ``Observed`` for the observers, ``Proof`` for ``diagnose``,
and ``Routes``, the GET access to a server that their probes and metadata readers ask through."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

__all__ = ["Observed", "Proof", "Routes"]


class Observed(NamedTuple):
    """What the observers know about a runtime, declared by its module: how to recognize its
    processes (observers.processes) and which of its routes and series tell its state
    (observers.runtime_state)."""

    executables: tuple[str, ...] = ()  # prefixes of its executables' names, lower case
    executable_names: tuple[str, ...] = ()  # exact executable names (too short to be prefixes)
    python_modules: tuple[str, ...] = ()  # `python -m MODULE` or a script of that name
    process_titles: tuple[str, ...] = ()  # prefixes of the titles its processes set, lower case
    state_paths: tuple[str, ...] = ()  # side-effect-free routes polled for its state
    metric_prefix: str | None = None  # its Prometheus series' names start with this
    normalized: Mapping[str, tuple[str, ...]] = {}  # state key -> its series (first present wins)


class Proof(NamedTuple):
    """What a side-effect-free route proved about a server (``diagnose``'s detection)."""

    api: str  # the request flavour it speaks: "llamacpp" | "ollama" | "openai"
    runtime: str | None  # the runtime's name, None when only the flavour is proven
    version: str | None = None


class Routes(Protocol):
    """GET access to a server's routes for a probe; each path is fetched once."""

    def json(self, path: str) -> Any:
        """The JSON body of a 200 answer to ``GET path``; None for anything else."""

    def text(self, path: str) -> str | None:
        """The text of a 200 answer to ``GET path``; None for anything else."""
