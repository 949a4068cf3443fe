"""Recorded runtime responses (``tests/fixtures/runtimes/<runtime>/``) run through the real parse
pipeline, as the per-runtime tests of ``otel_llm.parse.runtimes`` share them."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import RuntimeCounters, runtime_counters
from otel_llm_testing.subprocesses import REPO

__all__ = ["FIELDS", "FIXTURES", "expect", "from_body", "from_stream", "load", "load_json", "split_events", "stream",
           "window"]

FIXTURES = REPO / "tests" / "fixtures" / "runtimes"
FIELDS = [f.name for f in dataclasses.fields(RuntimeCounters)]


def load(runtime: str, name: str) -> bytes:
    """The recorded fixture ``runtime/name``."""
    return (FIXTURES / runtime / name).read_bytes()


def load_json(runtime: str, name: str) -> Any:
    return json.loads(load(runtime, name))


def split_events(raw: bytes, ndjson: bool = False) -> list[bytes]:
    """Frame a captured stream the way the capture layer does."""
    parts = raw.splitlines(keepends=True) if ndjson else re.split(rb"(?<=\n)\r?\n", raw)
    return [p for p in parts if p.strip()]


def window(events: list[bytes]) -> list[bytes]:
    """What the caller hands to parse_events: the first event and the last (<= 6)."""
    return events[:1] + events[max(1, len(events) - 6):]


def stream(runtime: str, name: str) -> list[bytes]:
    return split_events(load(runtime, name), ndjson=name.endswith(".ndjson"))


def from_stream(
    api: str, runtime: str, name: str, headers: Mapping[str, str] | None = None
) -> tuple[ResponseInfo, RuntimeCounters]:
    """The real pipeline on a stream fixture: window -> parse_events -> runtime_counters."""
    info = parse_events(api, window(stream(runtime, name)), headers)
    return info, runtime_counters(info, headers)


def from_body(
    api: str, runtime: str, name: str, headers: Mapping[str, str] | None = None
) -> tuple[ResponseInfo, RuntimeCounters]:
    """The real pipeline on a body fixture: parse_body -> runtime_counters."""
    info = parse_body(api, load(runtime, name), headers)
    return info, runtime_counters(info, headers)


def expect(actual: RuntimeCounters, **expected: Any) -> None:
    """Every field equals ``expected`` (floats to 1e-12 relative), every other field is None."""
    unknown = set(expected) - set(FIELDS)
    assert not unknown, unknown
    for name in FIELDS:
        got, want = getattr(actual, name), expected.get(name)
        if isinstance(want, float):
            assert isinstance(got, float), (name, got, want)
            assert got == pytest.approx(want, rel=1e-12, abs=0), (name, got, want)
        else:
            assert got == want and type(got) is type(want), (name, got, want)
