"""The runtime-state instruments of fixed name: the normalized state (requests running and waiting,
KV-cache usage) and Ollama's loaded models (loaded, memory, time until unloaded)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_llm import semconv as sc
from otel_llm.observers._ollama_ps import LoadedModel
from otel_llm.observers._runtime_prometheus import Reemitter
from otel_llm.observers._runtime_server import ServerState, server_attrs
from otel_llm.observers.registry import Server
from otel_llm.parse.runtimes import STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING

__all__ = ["register"]

States = Callable[[], list[tuple[tuple[str, int], ServerState]]]


def register(meter: Meter, states: States, reemitter: Reemitter) -> None:
    """Create the instruments; their callbacks read ``states()`` at each collection."""
    fixed: tuple[tuple[str, str, str, Callable[[], Iterable[Observation]]], ...] = (
        (sc.METRIC_RUNTIME_REQUESTS_RUNNING, "{request}", "Requests the runtime is processing.",
         lambda: _normalized(states, STATE_REQUESTS_RUNNING)),
        (sc.METRIC_RUNTIME_REQUESTS_WAITING, "{request}", "Requests queued in the runtime.",
         lambda: _normalized(states, STATE_REQUESTS_WAITING)),
        (sc.METRIC_RUNTIME_KV_CACHE_USAGE, "1", "Fraction of the runtime's KV cache in use.",
         lambda: _normalized(states, STATE_KV_CACHE_USAGE)),
        (sc.METRIC_RUNTIME_MODEL_LOADED, "1", "1 for each model the runtime has loaded.", lambda: _loaded(states)),
        (sc.METRIC_RUNTIME_MODEL_MEMORY, "By", "Memory of a loaded model (total, and its VRAM share).",
         lambda: _model_memory(states)),
        (sc.METRIC_RUNTIME_MODEL_EXPIRES_IN, "s", "Time until the runtime unloads an idle model.",
         lambda: _expires_in(states)),
    )
    for name, unit, description, observe in fixed:
        reemitter.reserve(name)
        meter.create_observable_gauge(name, [_callback(observe)], unit=unit, description=description)


def _callback(observe: Callable[[], Iterable[Observation]]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """An OpenTelemetry callback that reports what ``observe`` yields at each collection."""
    return lambda options: list(observe())


def _normalized(states: States, key: str) -> Iterator[Observation]:
    for (host, port), state in states():
        value = state.normalized.get(key)
        if value is not None:
            yield Observation(value, server_attrs(Server(host, port, None), state.runtime))


def _models(states: States) -> Iterator[tuple[LoadedModel, dict[str, Any]]]:
    for (host, port), state in states():
        attrs = server_attrs(Server(host, port, None), state.runtime)
        for model in state.models:
            yield model, {**attrs, sc.GEN_AI_REQUEST_MODEL: model.name}


def _loaded(states: States) -> Iterator[Observation]:
    for _model, attrs in _models(states):
        yield Observation(1, attrs)


def _model_memory(states: States) -> Iterator[Observation]:
    for model, attrs in _models(states):
        for location, size in (("total", model.size), ("vram", model.size_vram)):
            if size is not None:
                yield Observation(size, {**attrs, sc.LLM_RUNTIME_MEMORY_LOCATION: location})


def _expires_in(states: States) -> Iterator[Observation]:
    now = time.time()
    for model, attrs in _models(states):
        if model.expires_at is not None:
            yield Observation(max(0.0, model.expires_at - now), attrs)
