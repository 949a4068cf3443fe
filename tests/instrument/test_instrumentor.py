"""OtelLlmInstrumentor (otel_llm.instrumentor): the BaseInstrumentor face of the one session, which
agrees with otel_llm.instrument()/uninstrument() whichever of the two started it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import otel_llm
from otel_llm import _core
from otel_llm.instrumentor import OtelLlmInstrumentor, current_telemetry
from otel_llm.package import _instruments
from otel_llm_testing.otel import Otel, make_otel

QUIET: dict[str, Any] = {"host_metrics": False, "gpu_metrics": False, "runtime_metrics": False}


@pytest.fixture
def state() -> Iterator[Otel]:
    assert not otel_llm.is_instrumented()
    yield make_otel()
    otel_llm.uninstrument()


def test_instrument_starts_the_session_with_the_given_options(state: Otel) -> None:
    instrumentor = OtelLlmInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry
    instrumentor.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                            capture_content=True, **QUIET)
    assert otel_llm.is_instrumented() and instrumentor.is_instrumented_by_opentelemetry
    telemetry = current_telemetry()
    assert telemetry is not None and telemetry is _core.current_telemetry() and telemetry.capture_content
    instrumentor.uninstrument()
    assert not otel_llm.is_instrumented() and not instrumentor.is_instrumented_by_opentelemetry
    assert current_telemetry() is None


def test_the_instrumentor_sees_a_session_it_did_not_start(state: Otel) -> None:
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider, **QUIET)
    instrumentor = OtelLlmInstrumentor()
    assert instrumentor.is_instrumented_by_opentelemetry
    telemetry = current_telemetry()
    other = make_otel()
    instrumentor.instrument(tracer_provider=other.tracer_provider, meter_provider=other.meter_provider, **QUIET)
    assert current_telemetry() is telemetry  # already instrumented: nothing replaced
    instrumentor.uninstrument()  # ends the session otel_llm.instrument() started
    assert not otel_llm.is_instrumented()
    instrumentor.uninstrument()  # and a second time does nothing
    assert not instrumentor.is_instrumented_by_opentelemetry


def test_base_instrumentor_cannot_set_its_own_flag(state: Otel) -> None:
    instrumentor = OtelLlmInstrumentor()
    instrumentor._is_instrumented_by_opentelemetry = True
    assert not instrumentor.is_instrumented_by_opentelemetry  # the session is the one truth
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider, **QUIET)
    instrumentor._is_instrumented_by_opentelemetry = False
    assert instrumentor.is_instrumented_by_opentelemetry


def test_dependencies_are_the_packages_list() -> None:
    assert OtelLlmInstrumentor().instrumentation_dependencies() == _instruments
    assert OtelLlmInstrumentor() is OtelLlmInstrumentor()  # BaseInstrumentor's singleton
