"""Runtime adapters: each runtime's own counters (timings, token counts, finish reasons)
normalized to seconds, tokens and tokens/s.

``runtime_counters(info, headers)`` picks the adapter from what ``info.native``,
``info.runtime`` and the response headers prove, then fills token counts the runtime did not
report from the usage block. It never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from otel_llm.parse.response import ResponseInfo
from otel_llm.parse.runtimes import llamacpp, lmstudio, ollama, openai_compat, sglang, tgi, vllm
from otel_llm.parse.runtimes._common import Observed, RuntimeCounters, derive, log, native_of

__all__ = ["KNOWN_RUNTIMES", "OBSERVED", "SOURCES", "Observed", "RuntimeCounters", "runtime_counters"]

_ADAPTERS: tuple[ModuleType, ...] = (ollama, llamacpp, vllm, tgi, sglang, lmstudio)
# Checked in this order; the first native key found decides.
_BY_NATIVE: tuple[ModuleType, ...] = (ollama, llamacpp, sglang, lmstudio, tgi)

KNOWN_RUNTIMES: tuple[str, ...] = tuple(a.NAME for a in _ADAPTERS)
# runtime name -> what the observers know about it (each runtime's module declares it)
OBSERVED: dict[str, Observed] = {a.NAME: a.OBSERVED for a in _ADAPTERS}
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
        return adapter.read(info, headers)
    except Exception:  # noqa: BLE001
        log.debug("otel_llm: %s counters failed", adapter.__name__, exc_info=True)
        return RuntimeCounters(runtime=adapter.NAME)
