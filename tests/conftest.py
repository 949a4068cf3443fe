"""Shared fixtures and hooks: in-memory OpenTelemetry providers around an instrumented process, the
simulator running in its own process (so client and server never share a GIL), a TLS model server.
The helpers they use are in the ``otel_llm_testing`` package; a test imports them from there, never
from a conftest (tests/project/test_test_imports.py holds the suite to that)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import otel_llm
from otel_llm._log import reset_log_once
from otel_llm_testing import markers
from otel_llm_testing.model_server import TLS_TOKENS, ModelServer
from otel_llm_testing.otel import Otel, make_otel


TIMING_RERUNS = 2  # a timing test's reruns unless its marker says: pytest.mark.timing(reruns=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Only a test marked ``timing`` (it asserts on wall-clock time on a shared 2-core machine) is
    rerun on failure; a pure logic test fails at once, so a regression cannot pass on a rerun."""
    for item in items:
        timing = item.get_closest_marker("timing")
        if timing is not None:
            rerun = getattr(pytest.mark, "flaky")  # pytest-rerunfailures' marker, named once here
            item.add_marker(rerun(reruns=int(timing.kwargs.get("reruns", TIMING_RERUNS))))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: what it may start (a real runtime or backend needs its marker)."""
    markers.allow(mark.name for mark in item.iter_markers())


@pytest.fixture(autouse=True)
def _no_open_calls_carried_over() -> Iterator[None]:
    """Capture keeps the calls not finished yet in one process-wide table; a unit test that opens a
    call and never finishes it would leave it there for the next test's "nothing left behind"."""
    from otel_llm.capture import call

    yield
    call._open.clear()


@pytest.fixture
def otel() -> Iterator[Otel]:
    """An instrumented process whose spans and metrics stay in memory."""
    reset_log_once()
    state = make_otel()
    # observers have their own tests; here they would only add background threads and probes
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    try:
        yield state
    finally:
        otel_llm.uninstrument()
        gc.collect()


@pytest.fixture(scope="session")
def sim_process() -> Iterator[Any]:
    from otel_llm.tools.sim import SimProcess

    with SimProcess() as sim:
        yield sim


@pytest.fixture
def sim(sim_process: Any) -> Iterator[Any]:
    """The simulator, reset to its start configuration before each test."""
    httpx.post(f"{sim_process.base_url}/sim/reset", timeout=10).raise_for_status()
    yield sim_process


@pytest.fixture(scope="session")
def ca() -> Any:
    """A test certificate authority (trustme)."""
    import trustme

    return trustme.CA()


@pytest.fixture(scope="session")
def tls_server(ca: Any) -> Iterator[Any]:
    """An SSE chat server on 127.0.0.1 whose certificate is valid for ``localhost``."""
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    context.set_alpn_protocols(["http/1.1"])
    with ModelServer(context, tokens=TLS_TOKENS, first_token_delay=0.02, token_interval=0.002) as server:
        yield server


@pytest.fixture
def client_context(ca: Any) -> Any:
    """A client SSL context that trusts ``ca``."""
    import ssl

    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context



@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Debian's prometheus, installed when missing; never skipped (a failed install fails the test)."""
    from otel_llm_testing.prometheus import PrometheusMissing, install_prometheus

    try:
        return install_prometheus()
    except PrometheusMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed when missing; never skipped (a failed install fails the test)."""
    from otel_llm_testing.chromium import ChromiumMissing, install_chromium

    try:
        return install_chromium()
    except ChromiumMissing as exc:
        pytest.fail(str(exc))
