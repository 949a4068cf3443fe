"""Shared fixtures: in-memory OpenTelemetry providers around an instrumented process, and the
simulator running in its own process (so client and server never share a GIL)."""

from __future__ import annotations

import gc
import json
import socket
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import otel_llm
from otel_llm._log import reset_log_once
from otel_llm_testing import markers


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


@dataclass
class Otel:
    """What an instrumented test can look at."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def calls(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.kind == SpanKind.CLIENT]

    def children(self, call: ReadableSpan, synthesized: bool = False) -> list[ReadableSpan]:
        """The call's phase spans in time order (or its synthesized runtime spans)."""
        kids = [s for s in self.spans() if s.parent is not None and s.parent.span_id == call.context.span_id
                and bool((s.attributes or {}).get("llm.synthesized")) == synthesized]
        return sorted(kids, key=lambda s: s.start_time)

    def one_call(self) -> tuple[ReadableSpan, list[ReadableSpan]]:
        calls = self.calls()
        assert len(calls) == 1, [c.name for c in calls]
        return calls[0], self.children(calls[0])

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource_metrics in data.resource_metrics if data else []:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def clear(self) -> None:
        self.exporter.clear()


def make_otel() -> Otel:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return Otel(exporter, reader, tracer_provider, MeterProvider(metric_readers=[reader]))


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

    from tests.helpers_servers import ModelServer

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


TLS_TOKENS = 4


def configure_sim(sim: Any, **fields: Any) -> None:
    httpx.post(f"{sim.base_url}/sim/config", json=fields, timeout=10).raise_for_status()


def sim_stats(sim: Any) -> dict[str, Any]:
    return httpx.get(f"{sim.base_url}/sim/stats", timeout=10).json()


def raw_timeline(sim: Any, body: dict, calls: int = 9, path: str = "/v1/chat/completions",
                 spread: list[float] | None = None) -> tuple[float, float, float]:
    """What the simulator actually did: median (first byte, first token, last token) times after
    the request was sent, seen by a raw socket client with no httpx and no otel_llm in the path.
    On a busy machine the simulator's wake-ups run late; accuracy is judged against this."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{sim.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    samples = []
    for _ in range(calls):
        with socket.create_connection(("127.0.0.1", sim.port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(head.encode() + payload)
            sent = time.perf_counter()
            data, first_byte, tokens = b"", None, []
            while True:
                chunk = conn.recv(65536)
                now = time.perf_counter() - sent
                if not chunk:
                    break
                first_byte = now if first_byte is None else first_byte
                tokens += [now] * chunk.count(b'"content": "tok') + [now] * chunk.count(b'"content":"tok') \
                    + [now] * chunk.count(b'"content": " tok') + [now] * chunk.count(b'"content":" tok')
                data += chunk
        samples.append((first_byte, tokens[0], tokens[-1]))
    if spread is not None:  # how far single answers stray from the median: the simulator's own jitter
        spread.extend(abs(s[0] - statistics.median(x[0] for x in samples)) for s in samples)
    return tuple(statistics.median(s[i] for s in samples) for i in range(3))  # type: ignore[return-value]
