"""The served model, read from its runtime's metadata route once per runtime process.

The route is read whatever the state route answered (llama-server serves ``/metrics`` only with
``--metrics``), not while the server does not answer at all; it is asked at polls until it names
the model (LM Studio lists it once loaded), at most ``MAX_FAILURES`` times per process. A route
that refuses or lacks the request, refuses the connection or answers what is not JSON is not asked
again for that process; a 503 (a server still loading) or a timeout is backed off like a poll.
Ollama's model comes with each ``/api/ps`` poll instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from otel_llm.observers._runtime_schedule import MAX_FAILURES, Backoff
from otel_llm.observers._runtime_server import ServerState
from otel_llm.runtimes import MODEL_RUNTIMES, model_info, ollama

__all__ = ["READ_ONCE", "MetadataRoutes", "pending", "read"]

# runtimes whose model metadata is read once per process; Ollama's comes with every /api/ps poll
READ_ONCE = MODEL_RUNTIMES - {ollama.NAME}


class MetadataRoutes:
    """``runtimes.Routes`` over the poller's requests: each route asked once per read; a route that
    refuses or lacks the request, or answers what is not JSON, is stopped at once (``stopped``), a
    503 or a timeout backs it off like any poll's failure."""

    def __init__(self, fetch: Callable[[str], bytes | None], not_json: Callable[[str], None], backoff: Backoff,
                 clock: Callable[[], float]) -> None:
        self._fetch, self._not_json, self._backoff, self._clock = fetch, not_json, backoff, clock
        self.stopped = False  # a route was stopped: the metadata is not read again for this process
        self.asked = 0  # requests sent

    def json(self, path: str) -> Any:
        text = self.text(path)
        try:
            return json.loads(text) if text is not None else None
        except ValueError:
            self._not_json(path)
            self.stopped = True
            return None

    def text(self, path: str) -> str | None:
        retry_at = self._backoff.retry_at.get(path, 0.0)
        if self._clock() < retry_at:
            self.stopped = self.stopped or retry_at == math.inf
            return None  # backing off after a failure, as any polled route
        self.asked += 1
        body = self._fetch(path)
        if body is None and self._backoff.stopped(path):
            self.stopped = True
        return body.decode("utf-8", errors="replace") if body is not None else None


def pending(state: ServerState) -> bool:
    """A reachable server whose model metadata is still unread (and may still be asked)."""
    if state.runtime not in READ_ONCE or state.model is not None or state.unreachable:
        return False
    read = state.model_read
    return read is None or read[0] != (state.generation, state.runtime) or read[1] < MAX_FAILURES


def read(state: ServerState, generation: int, routes: Callable[[], MetadataRoutes]) -> None:
    """The metadata route, until it names the model, at most MAX_FAILURES times per runtime
    process, once if it fails for good; afresh when another process listens."""
    key = (generation, state.runtime or "")
    if state.model_read is None or state.model_read[0] != key:
        state.model_read, state.model = (key, 0), None
    tries = state.model_read[1]
    if state.model is not None or tries >= MAX_FAILURES:
        return
    asking = routes()
    state.model = model_info(asking, state.runtime, None, None)
    # a route that refused or lacks the request is not asked again for this process; a read
    # that asked nothing (its route backing off after a 503 or a timeout) is not counted
    state.model_read = (key, MAX_FAILURES if asking.stopped else tries + asking.asked)
