"""A runtime's own Prometheus series, re-emitted under their own names.

Parsed with ``prometheus_client.parser``; every finite numeric sample becomes an observable
instrument named after the sample, ``:`` replaced by ``.`` (a counter keeps the name as written,
without the ``_total`` the parser appends). Counters become ObservableCounters; gauges, untyped,
info and stateset ObservableGauges; histograms and summaries only their ``_sum`` and ``_count``
(buckets and quantiles would multiply series and cannot become an OTel histogram from a callback).
The first kind seen for a name is kept for the process: OpenTelemetry forbids re-creating a name
with another kind.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_llm._types import Attributes

__all__ = ["COUNTER", "GAUGE", "Point", "Reemitter", "Sample", "names_in", "otel_name", "samples"]

COUNTER, GAUGE = "counter", "gauge"
_OTEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,254}\Z")

Sample = tuple[str, str, dict[str, str], float, str]  # (sample name, kind, labels, value, help)
Point = tuple[float, Attributes]


def otel_name(prometheus_name: str) -> str | None:
    """``llamacpp:requests_processing`` -> ``llamacpp.requests_processing``; None if unusable."""
    name = prometheus_name.replace(":", ".").lstrip("_.")
    return name if _OTEL_NAME.match(name) else None


def names_in(text: str) -> set[str]:
    """The sample names as written in the exposition text."""
    return {line.split("{", 1)[0].split(None, 1)[0] for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")}


def samples(families: list[Any], written: set[str]) -> list[Sample]:
    """(sample name, kind, labels, value, help) for every series worth re-emitting. The parser
    appends ``_total`` to counter samples that lack it (TGI's); the name as written is kept."""
    cumulative = {f.name for f in families if f.type in ("counter", "histogram", "summary", "gaugehistogram")}
    out = []
    for family in families:
        if family.name.endswith("_created") and family.name[: -len("_created")] in cumulative:
            continue
        for sample in family.samples:
            kind = _kind(family.type, family.name, sample.name)
            value = sample.value
            if kind is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name = sample.name
            if family.type == "counter" and name not in written and family.name in written:
                name = family.name
            if math.isfinite(value):
                out.append((name, kind, dict(sample.labels), float(value), family.documentation))
    return out


def _kind(family_type: str, family_name: str, sample_name: str) -> str | None:
    """The OTel kind a sample is re-emitted as, or None to skip it."""
    if sample_name.endswith("_created"):
        return None
    if family_type == "counter":
        return COUNTER
    if family_type in ("histogram", "summary"):
        if sample_name != family_name and sample_name.endswith(("_sum", "_count")):
            return COUNTER
        return None
    if family_type == "gaugehistogram":
        return GAUGE if sample_name.endswith(("_gsum", "_gcount")) else None
    return GAUGE


class Reemitter:
    """The instruments of the re-emitted series, created the first time a name is seen; their
    callbacks report the points ``series_of`` gives at each collection (one mapping per server)."""

    def __init__(self, meter: Meter, series_of: Callable[[], Iterable[Mapping[str, list[Point]]]],
                 log_once: Callable[[tuple[Any, ...], str, int], None]) -> None:
        self._meter = meter
        self._series_of = series_of
        self._log_once = log_once
        self._kinds: dict[str, str] = {}  # lower-cased instrument name -> kind
        self._lock = threading.Lock()

    def reserve(self, name: str) -> None:
        """A gauge made elsewhere: a series of that name re-emits nothing of its own."""
        self._kinds[name.lower()] = GAUGE

    def series(self, found: list[Sample], attrs: Attributes, base_url: str) -> dict[str, list[Point]]:
        """Instrument key -> the points of ``found``, each with ``attrs`` added to its labels."""
        series: dict[str, list[Point]] = {}
        for name, kind, labels, value, help_text in found:
            otel = otel_name(name)
            if otel is None or not self._instrument(otel, kind, help_text, base_url):
                continue
            series.setdefault(otel.lower(), []).append((value, {**labels, **attrs}))
        return series

    def _instrument(self, name: str, kind: str, description: str, base_url: str) -> bool:
        """Make sure an instrument of this kind exists for ``name``; False if taken by another kind."""
        key = name.lower()
        with self._lock:
            known = self._kinds.get(key)
            if known is None:
                self._kinds[key] = kind
                create = (self._meter.create_observable_counter if kind == COUNTER
                          else self._meter.create_observable_gauge)
                create(name, [self._callback(key)], unit="", description=description)
                return True
        if known == kind:
            return True
        self._log_once(("kind", key, kind), f"runtime state: series {name} from {base_url} is a {kind} "
                       f"but was first seen as a {known}; dropped", logging.WARNING)
        return False

    def _callback(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda options: [Observation(value, attrs) for series in self._series_of()
                                for value, attrs in series.get(key, ())]
