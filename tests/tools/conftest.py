"""The tools' fixtures: an instrumented process whose spans and metrics stay in memory, quiet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import otel_llm
from otel_llm_testing.otel import Otel, make_otel


@pytest.fixture
def traced() -> Iterator[Otel]:
    """This process instrumented (no observers, no console summary), in-memory providers."""
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False, console_summary=False)
    try:
        yield state
    finally:
        otel_llm.uninstrument()
