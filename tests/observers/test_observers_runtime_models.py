"""The served model's metadata: read once per runtime process, a route failing for good not again."""

from __future__ import annotations

import json
import math

from otel_llm.observers._runtime_models import READ_ONCE, MetadataRoutes, pending, read
from otel_llm.observers._runtime_schedule import MAX_FAILURES, Backoff
from otel_llm.observers._runtime_server import ServerState

PROPS = json.dumps({"default_generation_settings": {"n_ctx": 4096}, "model_path": "m.gguf", "total_slots": 2})


class _Server:
    """Answers by path; None is a failure the back-off has already counted (as the poller's fetch)."""

    def __init__(self, answers: dict[str, str | None], backoff: Backoff, final: bool = False) -> None:
        self.answers, self.backoff, self.final = answers, backoff, final
        self.asked: list[str] = []
        self.not_json: list[str] = []

    def fetch(self, path: str) -> bytes | None:
        self.asked.append(path)
        body = self.answers.get(path)
        if body is None:
            self.backoff.failed(path, 0.0, 1.0, at_once=self.final)
        return body.encode() if body is not None else None

    def routes(self) -> MetadataRoutes:
        return MetadataRoutes(self.fetch, self.not_json.append, self.backoff, lambda: 0.0)


def test_the_model_is_read_once_per_runtime_process() -> None:
    state = ServerState(runtime="llama.cpp")
    server = _Server({"/props": PROPS}, state.backoff)
    assert "llama.cpp" in READ_ONCE and "ollama" not in READ_ONCE
    assert pending(state)
    read(state, 0, server.routes)
    assert state.model is not None and (state.model.context_length, state.model.slots) == (4096, 2)
    assert not pending(state)
    read(state, 0, server.routes)
    assert server.asked == ["/props"]
    state.generation = 1  # another process listens there now
    read(state, 1, server.routes)
    assert server.asked == ["/props", "/props"]


def test_a_route_failing_for_good_is_asked_once() -> None:
    state = ServerState(runtime="llama.cpp")
    server = _Server({}, state.backoff, final=True)
    read(state, 0, server.routes)
    read(state, 0, server.routes)
    assert server.asked == ["/props"] and state.model is None
    assert state.model_read == ((0, "llama.cpp"), MAX_FAILURES) and not pending(state)


def test_a_route_backing_off_is_not_asked_nor_counted() -> None:
    state = ServerState(runtime="vllm")
    state.backoff.retry_at["/v1/models"] = 5.0
    server = _Server({"/v1/models": "{}"}, state.backoff)
    read(state, 0, server.routes)
    assert server.asked == [] and state.model_read == ((0, "vllm"), 0)


def test_an_answer_that_is_not_json_stops_the_route() -> None:
    backoff = Backoff()
    server = _Server({"/props": "<html>"}, backoff)
    routes = server.routes()
    assert routes.json("/props") is None
    assert routes.stopped and server.not_json == ["/props"] and routes.asked == 1
    backoff.retry_at["/props"] = math.inf
    again = server.routes()
    assert again.text("/props") is None and again.stopped and again.asked == 0


def test_an_unreachable_server_is_not_pending() -> None:
    assert not pending(ServerState(runtime="llama.cpp", unreachable=True))
    assert not pending(ServerState(runtime="ollama"))
