"""``Server-Timing`` headers become ``llm.server_timing.*`` seconds on the client's call span."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_llm.parse.server_timing import MAX_METRICS, parse_server_timing


def test_gateway_header_parses_to_seconds() -> None:
    value = 'auth;dur=0.05, queue;dur=12.5, upstream;desc="first byte";dur=40.1, total;dur=53'
    parsed = parse_server_timing(value)
    assert parsed == pytest.approx({"auth": 0.00005, "queue": 0.0125, "upstream": 0.0401, "total": 0.053})


def test_entries_without_a_usable_duration_are_dropped() -> None:
    value = 'miss, db;dur=abc, cpu;dur=-1, inf;dur=inf, nan;dur=nan, b@d;dur=1, app;desc="x";dur="2.5", app;dur=9'
    assert parse_server_timing(value) == {"app": 0.0025}


def test_a_server_cannot_add_unbounded_attributes() -> None:
    value = ", ".join(f"m{i};dur={i}" for i in range(100))
    parsed = parse_server_timing(value)
    assert len(parsed) == MAX_METRICS and parsed["m0"] == 0.0


@given(st.text(max_size=300))
def test_never_raises(value: str) -> None:
    for name, seconds in parse_server_timing(value).items():
        assert 0 <= seconds < 1e6 and len(name) <= 32
