"""The runtime's state under common names: requests running and waiting, KV-cache usage.

Each comes from the first series present among those the runtimes declare (``OBSERVED``, in
``otel_llm.runtimes``); counts are summed over label sets (vLLM's data-parallel engines), the
KV-cache usage (0..1) is averaged.
"""

from __future__ import annotations

from otel_llm.observers._runtime_prometheus import Sample
from otel_llm.parse.runtimes import STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING
from otel_llm.runtimes import OBSERVED

__all__ = ["NORMALIZED_SOURCES", "infer_runtime", "normalize"]

NORMALIZED_SOURCES: dict[str, tuple[str, ...]] = {
    key: tuple(series for o in OBSERVED.values() for series in o.normalized.get(key, ()))
    for key in (STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING, STATE_KV_CACHE_USAGE)
}
_RUNTIME_PREFIXES = tuple((o.metric_prefix, name) for name, o in OBSERVED.items() if o.metric_prefix)


def normalize(samples: list[Sample]) -> dict[str, float | None]:
    """State key -> its value (None when the runtime does not report it)."""
    values: dict[str, list[float]] = {}
    for name, _kind_, _labels, value, _help in samples:
        values.setdefault(name, []).append(value)
    out: dict[str, float | None] = {}
    for key, sources in NORMALIZED_SOURCES.items():
        found = next((values[s] for s in sources if s in values), None)
        if found is None:
            out[key] = None
        elif key == STATE_KV_CACHE_USAGE:
            out[key] = sum(found) / len(found)
        else:
            total = sum(found)
            out[key] = int(total) if float(total).is_integer() else total
    return out


def infer_runtime(samples: list[Sample]) -> str | None:
    """The runtime whose metric prefix the first matching series carries."""
    for name, *_rest in samples:
        for prefix, runtime in _RUNTIME_PREFIXES:
            if name.startswith(prefix):
                return runtime
    return None
