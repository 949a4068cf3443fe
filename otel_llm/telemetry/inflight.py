"""Model calls in flight, per server: the seeds' hidden concurrency, retries and unloads.

A call is counted from its start to its finish. What the tracker answers at start:
how many other calls to the same server were already in flight, whether the call is a retry
(an ``x-stainless-retry-count`` above zero, as the OpenAI SDK sends, or a byte-identical request
body to the same server still in flight), and whether an earlier request unloaded the model
(Ollama ``keep_alive: 0``), which makes this call a cold start.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["Admission", "InFlight"]

Server = tuple[str, int]


@dataclass(slots=True)
class Admission:
    """What was true when a call started."""

    server: Server
    body_key: int | None
    concurrent: int
    retry: bool
    after_unload: bool
    relayed: bool = False  # a gateway's call whose caller recorded it too


class InFlight:
    """Thread-safe counts of calls in flight per server (also read by the active-requests metric)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_server: dict[Server, int] = {}
        self.relayed_by_server: dict[Server, int] = {}  # of those, a gateway's calls marked relayed
        self._bodies: dict[tuple[Server, int], int] = {}
        self._unloaded: set[tuple[Server, str]] = set()

    def admit(self, server: Server, body: bytes | None, headers: Any, model: str | None,
              unloads: bool, relayed: bool = False) -> Admission:
        body_key = hash(body) if body else None
        with self._lock:
            concurrent = self.by_server.get(server, 0)
            self.by_server[server] = concurrent + 1
            if relayed:
                self.relayed_by_server[server] = self.relayed_by_server.get(server, 0) + 1
            duplicate = 0
            if body_key is not None:
                duplicate = self._bodies.get((server, body_key), 0)
                self._bodies[(server, body_key)] = duplicate + 1
            after_unload = (server, model or "") in self._unloaded
            self._unloaded.discard((server, model or ""))
            if unloads:
                self._unloaded.add((server, model or ""))
        retry = duplicate > 0 or _retry_count(headers) > 0
        return Admission(server, body_key, concurrent, retry, after_unload, relayed)

    def release(self, admission: Admission) -> None:
        with self._lock:
            # kept at zero, not removed: the active-requests metric keeps reporting the server
            self.by_server[admission.server] = max(0, self.by_server.get(admission.server, 1) - 1)
            if admission.relayed:
                self.relayed_by_server[admission.server] = max(
                    0, self.relayed_by_server.get(admission.server, 1) - 1)
            if admission.body_key is not None:
                key = (admission.server, admission.body_key)
                remaining = self._bodies.get(key, 1) - 1
                if remaining > 0:
                    self._bodies[key] = remaining
                else:
                    self._bodies.pop(key, None)


def _retry_count(headers: Any) -> int:
    try:
        return int(headers.get("x-stainless-retry-count", 0))
    except (TypeError, ValueError):
        return 0
