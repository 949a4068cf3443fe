"""Runtime adapters: each runtime's own counters (timings, token counts, finish reasons)
normalized to seconds, tokens and tokens/s.

Each runtime's module owns how its answers are read: into ``ResponseInfo`` (``RESPONSE_KEYS`` /
``merge_object``, TGI's ``merge_headers``, used by ``parse.response``), and how its counters are
normalized (``read``). What is known of it as a server (its processes, the routes to ask) is in
``otel_llm.runtimes``: nothing here sends a request or reads a process.

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
    STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING, ModelInfo, RuntimeCounters, derive, log,
    native_of, positive_int, text_or_none,
)

__all__ = [
    "HEADER_READERS", "KNOWN_RUNTIMES", "RESPONSE_READERS", "SOURCES", "STATE_KV_CACHE_USAGE",
    "STATE_REQUESTS_RUNNING", "STATE_REQUESTS_WAITING", "ModelInfo", "RuntimeCounters", "positive_int",
    "runtime_counters", "text_or_none",
]

_ADAPTERS: tuple[ModuleType, ...] = (ollama, llamacpp, vllm, tgi, sglang, lmstudio)
# Checked in this order; the first native key found decides.
_BY_NATIVE: tuple[ModuleType, ...] = (ollama, llamacpp, sglang, lmstudio, tgi, vllm)

KNOWN_RUNTIMES: tuple[str, ...] = tuple(a.NAME for a in _ADAPTERS)
# (keys, reader): parse.response hands each JSON object holding one of the keys to the reader, in
# this order; a reader returning True has claimed the object and the later ones skip it (SGLang's
# answers are not TGI's)
RESPONSE_READERS: tuple[tuple[tuple[str, ...], Callable[[Merge, dict[str, Any]], bool | None]], ...] = tuple(
    (a.RESPONSE_KEYS, a.merge_object) for a in (ollama, llamacpp, lmstudio, sglang, tgi, vllm)
)
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
