"""Runtime adapters: each runtime's own counters (timings, token counts, finish reasons)
normalized to seconds, tokens and tokens/s.

Each runtime's module owns what is known about it: how its answers are read into
``ResponseInfo`` (``RESPONSE_KEYS`` / ``merge_object``, TGI's ``merge_headers``, used by
``parse.response``), how its counters are normalized (``read``), how the observers recognize
its processes and poll its state (``OBSERVED``), and how ``diagnose`` proves it (``probe``,
where a route does).

``runtime_counters(info, headers)`` picks the adapter from what ``info.native``,
``info.runtime`` and the response headers prove, then fills token counts the runtime did not
report from the usage block. It never raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from types import ModuleType

from otel_llm.parse._merge import Merge, ResponseInfo
from otel_llm.parse.runtimes import llamacpp, lmstudio, ollama, openai_compat, sglang, tgi, vllm
from otel_llm.parse.runtimes._common import (
    STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING, ModelInfo, Observed, Proof, Routes,
    RuntimeCounters, derive, log, native_of,
)

__all__ = [
    "ADMIN_PATHS", "READY_PATHS", "HEADER_READERS", "KNOWN_RUNTIMES", "OBSERVED", "PROBES", "Proof",
    "RESPONSE_READERS", "Routes", "MODEL_RUNTIMES", "SOURCES", "STATE_KV_CACHE_USAGE", "STATE_REQUESTS_RUNNING",
    "STATE_REQUESTS_WAITING", "ModelInfo", "Observed", "RuntimeCounters", "model_info", "runtime_counters",
]

_ADAPTERS: tuple[ModuleType, ...] = (ollama, llamacpp, vllm, tgi, sglang, lmstudio)
# Checked in this order; the first native key found decides.
_BY_NATIVE: tuple[ModuleType, ...] = (ollama, llamacpp, sglang, lmstudio, tgi, vllm)

KNOWN_RUNTIMES: tuple[str, ...] = tuple(a.NAME for a in _ADAPTERS)
# runtime name -> what the observers know about it (each runtime's module declares it)
OBSERVED: dict[str, Observed] = {a.NAME: a.OBSERVED for a in _ADAPTERS}
# (keys, reader): parse.response hands each JSON object holding one of the keys to the reader, in
# this order; a reader returning True has claimed the object and the later ones skip it (SGLang's
# answers are not TGI's)
RESPONSE_READERS: tuple[tuple[tuple[str, ...], Callable[[Merge, dict[str, Any]], bool | None]], ...] = tuple(
    (a.RESPONSE_KEYS, a.merge_object) for a in (ollama, llamacpp, lmstudio, sglang, tgi, vllm)
)
# diagnose's detection, first proof wins: llama.cpp's /props first (specific to it), Ollama
# before /v1/models (it serves the OpenAI-compatible routes too), vLLM before any other
# OpenAI-compatible server
PROBES: tuple[Callable[[Routes], Proof | None], ...] = (
    llamacpp.probe, ollama.probe, vllm.probe, openai_compat.probe,
)
# the model's metadata (context length...) by proven runtime; any other OpenAI-compatible server
# is read as one
_MODEL_INFO: dict[str | None, Callable[[Routes, str | None], ModelInfo | None]] = {
    llamacpp.NAME: llamacpp.model_info, vllm.NAME: vllm.model_info, ollama.NAME: ollama.model_info,
    lmstudio.NAME: lmstudio.model_info,
}


MODEL_RUNTIMES = frozenset(r for r in _MODEL_INFO if r is not None)  # runtimes with a metadata reader


def model_info(routes: Routes, runtime: str | None, api: str | None, model: str | None) -> ModelInfo | None:
    """What the server's side-effect-free routes say about ``model``; None when none does.
    Never raises."""
    reader = _MODEL_INFO.get(runtime)
    if reader is None and api == openai_compat.API:
        reader = openai_compat.model_info
    try:
        return reader(routes, model) if reader is not None else None
    except Exception:  # noqa: BLE001 - an odd answer gives no metadata, never an error
        log.debug("otel_llm: reading model metadata failed", exc_info=True)
        return None


# diagnose's routes by request flavour (``--api``): ready once the server is up, admin to be refused
READY_PATHS: dict[str, str] = {a.API: a.READY_PATH for a in (llamacpp, ollama, openai_compat)}
ADMIN_PATHS: dict[str, str] = {a.API: a.ADMIN_PATH for a in (llamacpp, ollama, openai_compat)}
HEADER_READERS: tuple[Callable[[Merge, Mapping[str, str]], None], ...] = (tgi.merge_headers,)
SOURCES: dict[str, str] = {
    **{a.NAME: a.SOURCE for a in _ADAPTERS},
    openai_compat.SOURCE_KEY: openai_compat.SOURCE,
}


def runtime_counters(
    info: ResponseInfo, headers: Mapping[str, str] | None = None
) -> RuntimeCounters:
    """The runtime's own account of the request in ``info`` (from parse_body/parse_events);
    ``headers``: response headers (TGI timings). Never raises; bad values become None."""
    try:
        adapter = _adapter(info, headers)
        c = _read(adapter, info, headers)
        openai_compat.merge_usage(c, info)
        derive(c)
        return c
    except Exception:  # noqa: BLE001 - telemetry must never break the host app
        log.debug("otel_llm: runtime counters failed", exc_info=True)
        return RuntimeCounters()


def _adapter(info: ResponseInfo, headers: Mapping[str, str] | None) -> ModuleType:
    native = native_of(info)
    for adapter in _BY_NATIVE:
        if any(key in native for key in adapter.NATIVE_KEYS):
            return adapter
    runtime = getattr(info, "runtime", None)
    for adapter in _ADAPTERS:
        if runtime == adapter.NAME:
            return adapter
    if tgi.tgi_headers(headers):
        return tgi
    return openai_compat


def _read(
    adapter: ModuleType, info: ResponseInfo, headers: Mapping[str, str] | None
) -> RuntimeCounters:
    try:
        counters: RuntimeCounters = adapter.read(info, headers)  # a module: its read is Any to mypy
        return counters
    except Exception:  # noqa: BLE001
        log.debug("otel_llm: %s counters failed", adapter.__name__, exc_info=True)
        return RuntimeCounters(runtime=adapter.NAME)
