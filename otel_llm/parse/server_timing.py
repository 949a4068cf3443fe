"""``Server-Timing`` response headers (W3C Server Timing): what a server or gateway on the path
says it spent, e.g. ``queue;dur=12.5, upstream;desc="first byte";dur=40.1`` from otel-llm gateway.
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_METRICS", "parse_server_timing"]

MAX_METRICS = 8  # a server picks the names: keep what it can add to a span small
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


def parse_server_timing(value: str) -> dict[str, float]:
    """``{name: seconds}`` for the well-formed metrics that carry a ``dur``; the rest is ignored."""
    found: dict[str, float] = {}
    for metric in value.split(",")[: MAX_METRICS * 2]:
        name, *params = (part.strip() for part in metric.split(";"))
        if not _NAME.match(name) or name in found:
            continue
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() != "dur":
                continue
            try:
                ms = float(raw.strip().strip('"'))
            except ValueError:
                break
            if math.isfinite(ms) and 0 <= ms < 1e9:
                found[name.lower()] = ms / 1000.0
            break
        if len(found) == MAX_METRICS:
            break
    return found
