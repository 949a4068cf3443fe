"""The reference table of ``otel_llm/semconv.py`` (``otel_llm/semconv_reference.py``): one entry
per name, each with a valid kind, type, status and a word on when it is set, statuses that follow
the semantic conventions, and for each metric the instrument and unit the code really creates.
The page generated from it is tested in ``test_docs.py``."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from otel_llm import semconv
from otel_llm import semconv_reference as ref


def test_the_constants_that_name_nothing_are_the_known_ones() -> None:
    """Every public string constant of semconv is in the reference but these three, on purpose:
    ENV_CAPTURE_CONTENT is an environment variable (configuration, documented with the options),
    VLLM_LATENCY_PREFIX only recognizes vLLM's span (each gen_ai.latency.* name it covers has its own
    entry), and BAGGAGE_RECORDED is a baggage entry on the request (documented with the gateway).
    The other helpers are not strings, so not names: the bucket boundaries (*_BUCKETS) and
    LLM_REQUEST_ROLES (the roles that complete llm.request.messages.<role>). The two prefixes that
    begin an emitted family are in the reference, as llm.server_timing.<name> and
    llm.request.messages.<role>."""
    assert set(ref.NOT_NAMES) == {"ENV_CAPTURE_CONTENT", "VLLM_LATENCY_PREFIX", "BAGGAGE_RECORDED", "TRACESTATE_OT"}
    not_strings = {name for name, value in vars(semconv).items() if name.isupper() and not isinstance(value, str)}
    assert not_strings == {"DURATION_BUCKETS", "TOKEN_BUCKETS", "PHASE_BUCKETS", "SERVER_TTFT_BUCKETS",
                           "SERVER_TPOT_BUCKETS", "RATE_BUCKETS", "QUEUE_WAIT_BUCKETS", "LLM_REQUEST_ROLES"}


def test_each_entry_has_a_kind_a_status_and_says_when() -> None:
    assert ref.check() == []
    for name, entry in ref.entries():
        assert entry.kind in ref.KINDS and entry.status in ref.STATUSES and entry.when, name
    kinds = {entry.kind for _, entry in ref.entries()}
    assert kinds == set(ref.KINDS)


@pytest.mark.parametrize("bad, complaint", [
    ({"status": "experimental"}, "unknown status 'experimental'"),
    ({"kind": "log"}, "unknown kind 'log'"),
    ({"type": "float"}, "'float' is not one of"),
    ({"status": "development"}, "an llm.* name is otel_llm's own"),
    ({"when": ""}, "says nothing about when it is set"),
])
def test_an_entry_without_a_valid_kind_status_or_type_fails_the_check(bad: dict[str, str], complaint: str) -> None:
    table = tuple(replace(e, **bad) if e.constants == ("LLM_API",) else e for e in ref.ENTRIES)
    with pytest.raises(ValueError, match=re.escape(complaint)):
        ref.entries(semconv, table)


def test_statuses_follow_the_namespaces() -> None:
    """As of the semantic conventions the table names (v1.41.0, checked against its model/ YAML): GenAI
    is Development throughout, span names are otel_llm's own, five names in semconv namespaces are
    not defined there, and four names have a status of their own in their namespace."""
    others = {"http.request.body.size": "development", "http.server.request.duration": "stable",
              "http.server.active_requests": "development", "otel.metric.overflow": "specification"}
    own_in_semconv_namespaces = {"hw.gpu.clock.frequency", "hw.gpu.throttle", "hw.gpu.clock.domain",
                                 "hw.gpu.throttle.reason", "process.gpu.memory.usage"}
    for name, entry in ref.entries():
        if entry.kind in ("span", "event", "scope") or name.startswith("llm."):
            assert entry.status == "otel_llm", name
        elif name.startswith("gen_ai.latency."):
            assert entry.status == "runtime" and not entry.emitted, name
        elif name.startswith("gen_ai."):
            assert entry.status == ("development" if entry.emitted else "deprecated"), name
        elif name in own_in_semconv_namespaces:
            assert entry.status == "otel_llm", name
        elif name.startswith(("system.", "process.", "hw.", "cpu.", "disk.", "tls.", "dns.", "network.io.")):
            assert entry.status == "development", name
        elif name.startswith(("server.", "client.", "url.", "network.peer.", "network.protocol.", "error.",
                              "user_agent.", "http.route", "http.request.method", "http.response.")):
            assert entry.status == "stable", name
        else:
            assert entry.status == others.pop(name), name
    assert not others


class _Recorder:
    """A meter provider and meter that note each instrument created: name -> (instrument, unit)."""

    def __init__(self) -> None:
        self.made: dict[str, tuple[str, str]] = {}

    def get_meter(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self

    def _create(self, instrument: str, name: str, unit: str) -> Any:
        assert name not in self.made or self.made[name] == (instrument, unit), name
        self.made[name] = (instrument, unit)
        return _NoInstrument()

    def create_histogram(self, name: str, *args: Any, unit: str = "", **kwargs: Any) -> Any:
        return self._create("histogram", name, unit)

    def create_counter(self, name: str, *args: Any, unit: str = "", **kwargs: Any) -> Any:
        return self._create("counter", name, unit)

    def create_observable_counter(self, name: str, *args: Any, unit: str = "", **kwargs: Any) -> Any:
        return self._create("observable counter", name, unit)

    def create_observable_up_down_counter(self, name: str, *args: Any, unit: str = "", **kwargs: Any) -> Any:
        return self._create("observable updowncounter", name, unit)

    def create_observable_gauge(self, name: str, *args: Any, unit: str = "", **kwargs: Any) -> Any:
        return self._create("observable gauge", name, unit)


class _NoInstrument:
    def add(self, *args: Any, **kwargs: Any) -> None: ...

    def record(self, *args: Any, **kwargs: Any) -> None: ...


def test_every_metric_has_the_instrument_and_unit_the_code_creates() -> None:
    """Each part that creates instruments, built against a recording meter: the call metrics (in
    the OTEL_SEMCONV_STABILITY_OPT_IN mode that creates both name sets), the host, GPU and
    runtime-state observers, the restart and OOM watches, and the gateway."""
    from opentelemetry.trace import NoOpTracerProvider

    from otel_llm.observers.gpu import GpuObserver
    from otel_llm.observers.host import HostObserver
    from otel_llm.observers.oom import OomWatch
    from otel_llm.observers.processes import RuntimeProcesses
    from otel_llm.observers.registry import ServerRegistry
    from otel_llm.observers.restarts import RestartWatch
    from otel_llm.observers.runtime_state import RuntimeStateObserver
    from otel_llm.telemetry.inflight import InFlight
    from otel_llm.config import GENAI_DUP
    from otel_llm.telemetry.metrics import call_metrics
    from otel_llm.tools.gateway.server_telemetry import GatewayTelemetry

    meter: Any = _Recorder()
    registry = ServerRegistry()
    call_metrics(meter, InFlight(), GENAI_DUP)  # both the default and the semantic-conventions-genai names
    HostObserver(meter, RuntimeProcesses(registry))
    GpuObserver(None, [], pids=lambda: [])._register(meter)  # what create() registers once NVML answers
    RuntimeStateObserver(meter, registry)
    RestartWatch(registry, meter, {})
    OomWatch(meter)
    GatewayTelemetry(NoOpTracerProvider(), meter, queue_depth=lambda: 0)
    documented = {name: (entry.type, entry.unit) for name, entry in ref.entries()
                  if entry.kind == "metric" and entry.emitted}
    assert meter.made == documented
