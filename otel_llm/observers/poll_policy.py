"""Which model servers the runtime-state poller may send its own requests to.

A request the application did not make changes what the application's server sees: a test
server with ordered expectations fails, a gateway counts it against a key's rate limit, a
billing proxy or an access log records it. So by default otel_llm polls only servers it knows to
be model runtimes the user runs. The ``poll_runtimes`` option says which:

* ``configured``: only the servers under a base URL of the ``runtimes`` option;
* ``local`` (the default): those, and servers on this host whose listening port belongs to a
  process that /proc identifies as a known runtime (llama-server, ollama, vLLM, TGI, SGLang,
  LM Studio; see ``processes.runtime_for_name``). A call's route is no evidence (any server can
  answer ``/api/chat``), and no request is sent to find out. A port owned by any other process
  (a test server, a proxy, a container's port forwarder, the application itself) or by a process
  that cannot be seen, and every remote host, are left alone;
* ``all``: every server that calls went to, as before this policy existed (servers of unknown
  runtime only when they look self-hosted: loopback, a private IP or a single-label host name,
  never port 443).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from otel_llm._log import logger
from otel_llm.config import POLL_MODES
from otel_llm.observers.processes import Listener, _alive, listening_runtimes
from otel_llm.observers.registry import Server

__all__ = ["POLL_ALL", "POLL_CONFIGURED", "POLL_LOCAL", "PollPolicy"]

POLL_CONFIGURED, POLL_LOCAL, POLL_ALL = POLL_MODES
# A local port whose owner is not a known runtime is looked at again this often (a runtime may
# start there later); the look reads /proc only, at most once per period for all such ports.
RECHECK = 30.0

Identify = Callable[[set[int]], dict[int, Listener]]


class _Verdict(NamedTuple):
    runtime: str | None  # the runtime identified from /proc; None: not to be polled
    listener: Listener | None
    checked_at: float


class PollPolicy:
    """Picks the servers to poll; identification is cached, so ``pollable`` is cheap."""

    def __init__(self, mode: str = POLL_LOCAL, identify: Identify = listening_runtimes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mode = mode if mode in POLL_MODES else POLL_LOCAL
        self._identify = identify
        self._clock = clock
        self._verdicts: dict[tuple[str, int], _Verdict] = {}
        # bumped when another runtime process now listens at a server: a new endpoint in effect,
        # so the poller starts its failure count afresh (a restarted runtime is polled again)
        self._generations: dict[tuple[str, int], int] = {}
        self._own_addresses: frozenset[str] | None = None
        self._logged: set[tuple[str, int, bool]] = set()

    def pollable(self, servers: Iterable[Server]) -> list[Server]:
        """The servers that may be polled, each with the runtime to poll it as."""
        servers = list(servers)
        if self.mode == POLL_ALL:
            return [s for s in servers if s.configured or looks_self_hosted(s)]
        chosen = [s for s in servers if s.configured]
        if self.mode == POLL_LOCAL:
            chosen += self._local_runtimes([s for s in servers if not s.configured])
        return chosen

    def generation(self, host: str, port: int) -> int:
        """Changes whenever a different runtime process is found listening at host:port."""
        return self._generations.get((host, port), 0)

    # -- local runtimes -------------------------------------------------------------------------
    def _local_runtimes(self, servers: list[Server]) -> list[Server]:
        local = [s for s in servers if self._on_this_host(s.host)]
        due = {s.port for s in local if not self._still_valid(self._verdicts.get((s.host, s.port)))}
        if due:
            self._look(due, [s for s in local if s.port in due])
        chosen = []
        for server in local:
            verdict = self._verdicts[(server.host, server.port)]
            if verdict.runtime is not None:
                # what the process is beats what the route implied
                chosen.append(server._replace(runtime=verdict.runtime))
        return chosen

    def _look(self, ports: set[int], servers: list[Server]) -> None:
        """Identify the owners of ``ports`` from /proc, once for all of them."""
        try:
            found = self._identify(ports)
        except Exception:  # an unreadable /proc must never lead to polling
            logger.debug("otel_llm: runtime state: identifying local listeners failed", exc_info=True)
            found = {}
        now = self._clock()
        for server in servers:
            key = (server.host, server.port)
            listener = found.get(server.port)
            runtime = listener.runtime if listener is not None else None
            previous = self._verdicts.get(key)
            if runtime is not None and (previous is None or _pids(previous.listener) != _pids(listener)):
                self._generations[key] = self._generations.get(key, 0) + 1
            self._verdicts[key] = _Verdict(runtime, listener, now)
            self._log_verdict(server, listener)

    def _still_valid(self, verdict: _Verdict | None) -> bool:
        """A runtime verdict holds while its processes live (a process keeps its listening
        socket for its lifetime); a negative one for RECHECK seconds."""
        if verdict is None:
            return False
        if verdict.runtime is None:
            return self._clock() - verdict.checked_at < RECHECK
        return verdict.listener is not None and all(_alive(p) for p in verdict.listener.processes)

    def _on_this_host(self, host: str) -> bool:
        if Server(host, 0, None).is_local:
            return True
        if self._own_addresses is None:
            self._own_addresses = _own_addresses()
        return host.lower() in self._own_addresses

    def _log_verdict(self, server: Server, listener: Listener | None) -> None:
        """Once per server and verdict (a runtime that starts later is logged again)."""
        polled = listener is not None and listener.runtime is not None
        key = (server.host, server.port, polled)
        if key in self._logged:
            return
        self._logged.add(key)
        address = f"{server.host}:{server.port}"
        if listener is not None and listener.runtime is not None:
            pids = ", ".join(str(p.pid) for p in listener.processes)
            logger.debug("otel_llm: runtime state: polling %s, a %s process (pid %s)", address,
                         listener.runtime, pids)
        else:
            owner = ("nothing listens there" if listener is None
                     else "its listening process is not a known runtime, or cannot be seen")
            logger.info("otel_llm: runtime state: not polling %s (%s); name it in the runtimes option "
                        "or set poll_runtimes=all to poll it", address, owner)


def _pids(listener: Listener | None) -> frozenset[int]:
    return frozenset(p.pid for p in listener.processes) if listener is not None else frozenset()


def looks_self_hosted(server: Server) -> bool:
    """Known runtimes always; unknown ones only when the host looks self-hosted (not port 443)."""
    if server.runtime is not None:
        return True
    if server.port == 443:
        return False
    if server.is_local or ("." not in server.host and ":" not in server.host):
        return True
    try:
        return ipaddress.ip_address(server.host).is_private
    except ValueError:
        return False


def _own_addresses() -> frozenset[str]:
    """This host's interface addresses and name, read locally (no DNS)."""
    names = {socket.gethostname().lower()}
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            names.update(a.address.split("%", 1)[0].lower() for a in addresses
                         if a.family in (socket.AF_INET, socket.AF_INET6))
    except Exception:
        logger.debug("otel_llm: runtime state: reading interface addresses failed", exc_info=True)
    return frozenset(names)

