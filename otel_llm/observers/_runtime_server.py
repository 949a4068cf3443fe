"""What the latest polls of one model server found, and the attributes its series carry."""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_llm import semconv as sc
from otel_llm._types import Attributes
from otel_llm.observers._ollama_ps import LoadedModel
from otel_llm.observers._runtime_prometheus import Point
from otel_llm.observers._runtime_schedule import Backoff
from otel_llm.observers.registry import Server
from otel_llm.parse.runtimes import ModelInfo

__all__ = ["ServerState", "server_attrs"]


@dataclass
class ServerState:
    """One server's state (each field is replaced, never mutated, so collections read it whole)."""

    runtime: str | None = None
    series: dict[str, list[Point]] = field(default_factory=dict)  # instrument key -> points
    normalized: dict[str, float | None] = field(default_factory=dict)
    models: tuple[LoadedModel, ...] = ()
    latest: Attributes = field(default_factory=dict)
    backoff: Backoff = field(default_factory=Backoff)
    generation: int = 0  # the policy's generation of the server when last polled
    model: ModelInfo | None = None  # from the runtime's metadata route
    model_read: tuple[tuple[int, str], int] | None = None  # ((generation, runtime), reads so far)
    unreachable: bool = False  # the latest state-route request got no HTTP answer (refused, timed out)


def server_attrs(server: Server, runtime: str | None) -> Attributes:
    attrs: Attributes = {sc.SERVER_ADDRESS: server.host, sc.SERVER_PORT: server.port}
    if runtime is not None:
        attrs[sc.LLM_RUNTIME_NAME] = runtime
    return attrs
