"""One trace, three processes: the instrumented test client, ``otel-llm gateway`` (exporting OTLP
to a receiver in this test) and the simulator behind it. The exported spans must form one tree
with correct parent links, and the client's ``llm.server_wait`` must contain the gateway's work."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest

from otel_llm import semconv as sc
from otel_llm.parse.server_timing import parse_server_timing
from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.otel import Otel
from otel_llm_testing.collectors import OtlpHttpCollector, attributes_of

KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3  # OTLP numbering
CLOCK_TOL_NS = 2_000_000  # two processes read the same clock through separate epoch anchors
MODEL = "gemma3:270m"
TOKENS = 6


@pytest.fixture(scope="module")
def upstream() -> Iterator[SimProcess]:
    with SimProcess(runtime="ollama", tokens=TOKENS, token_interval=0.02, headers_delay=0.03,
                    first_token_delay=0.04) as sim:
        yield sim


@pytest.fixture
def collector() -> Iterator[OtlpHttpCollector]:
    with OtlpHttpCollector() as receiver:
        yield receiver


def _gateway(upstream: SimProcess, collector: OtlpHttpCollector, tmp_path: Any) -> GatewayProcess:
    env = {"OTEL_LLM_ENDPOINT": collector.endpoint, "OTEL_LLM_HOST_METRICS": "false",
           "OTEL_LLM_RUNTIME_METRICS": "false", "OTEL_LLM_GPU_METRICS": "false",
           "OTEL_LLM_TRACES_FILE": str(tmp_path / "unused.jsonl")}
    return GatewayProcess(upstream.base_url, {"app": {"routes": ["/api/*"]}}, env=env)


def _by_id(spans: list[Any]) -> dict[bytes, Any]:
    return {span.span_id: span for span in spans}


def _children(spans: list[Any], parent: Any) -> list[Any]:
    return sorted((s for s in spans if s.parent_span_id == parent.span_id), key=lambda s: s.start_time_unix_nano)


def test_one_trace_spans_client_gateway_and_runtime(otel: Otel, upstream: SimProcess,
                                                    collector: OtlpHttpCollector, tmp_path: Any) -> None:
    with _gateway(upstream, collector, tmp_path) as gateway:
        client = ollama.Client(host=gateway.url, headers=gateway.headers("app"))
        text = "".join(part["message"]["content"] for part in client.chat(
            model=MODEL, messages=[{"role": "user", "content": "where did the time go"}], stream=True))
        assert text == "tok0" + "".join(f" tok{i}" for i in range(1, TOKENS))
    # the gateway flushed its spans when it stopped
    exported = [span for _, span in collector.received.spans()]
    resources = {res["service.name"] for res, _ in collector.received.spans()}
    assert resources == {"otel-llm-gateway"}

    call, phases = otel.one_call()
    # the client's own span shows the gateway's share, from the Server-Timing header
    shares = {k.rpartition(".")[2]: v for k, v in call.attributes.items() if k.startswith(sc.LLM_SERVER_TIMING_PREFIX)}
    assert set(shares) == {"auth", "queue", "upstream", "total"}
    assert 0.03 <= shares["upstream"] <= shares["total"] <= call.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE]
    trace_id = call.context.trace_id.to_bytes(16, "big")
    assert {span.trace_id for span in exported} == {trace_id}, "every gateway span joins the client's trace"

    servers = [s for s in exported if s.kind == KIND_SERVER]
    assert len(servers) == 1
    server = servers[0]
    assert server.parent_span_id == call.context.span_id.to_bytes(8, "big"), "SERVER span under the client call"
    attrs = attributes_of(server.attributes)
    assert server.name == "POST /api/chat"
    assert attrs[sc.LLM_GATEWAY_KEY_ID] == "app"
    assert attrs[sc.LLM_GATEWAY_OUTCOME] == "allowed"
    assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[sc.HTTP_ROUTE] == "/api/chat"

    kids = _children(exported, server)
    assert [k.name for k in kids] == [sc.SPAN_GATEWAY_AUTH, sc.SPAN_GATEWAY_QUEUE, f"chat {MODEL}"]
    auth, queue, upstream_call = kids
    assert upstream_call.kind == KIND_CLIENT and auth.kind == queue.kind == KIND_INTERNAL
    assert auth.end_time_unix_nano <= queue.start_time_unix_nano <= queue.end_time_unix_nano
    assert queue.end_time_unix_nano <= upstream_call.start_time_unix_nano

    # the upstream call is traced by the core: phases, the runtime's native counters, runtime.* spans
    up_attrs = attributes_of(upstream_call.attributes)
    assert up_attrs[sc.LLM_RUNTIME_NAME] == "ollama"
    assert up_attrs[sc.LLM_RUNTIME_GENERATION_TOKENS] == TOKENS
    assert up_attrs[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] > 0
    up_names = {s.name for s in _children(exported, upstream_call)}
    assert {sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE, sc.SPAN_RUNTIME_PREFILL,
            sc.SPAN_RUNTIME_DECODE} <= up_names
    assert len(_by_id(exported)) == len(exported)
    for span in exported:
        assert span is server or span.parent_span_id in _by_id(exported), f"{span.name} has a dangling parent"

    # the client's wait contains the gateway's work up to the first byte; it is counted from the
    # client's first byte sent: on a busy machine the client may note "request sent" a few ms
    # after the gateway already has the request (5 ms in one CI run)
    wait = next(p for p in phases if p.name == sc.SPAN_SERVER_WAIT)
    sent = next(p for p in phases if p.name == sc.SPAN_UPLOAD).start_time
    up_wait = next(s for s in _children(exported, upstream_call) if s.name == sc.SPAN_SERVER_WAIT)
    assert sent - CLOCK_TOL_NS <= server.start_time_unix_nano
    assert sent - CLOCK_TOL_NS <= auth.start_time_unix_nano
    for span in (auth, queue, up_wait):
        assert span.end_time_unix_nano <= wait.end_time + CLOCK_TOL_NS, span.name
    assert up_wait.start_time_unix_nano >= sent - CLOCK_TOL_NS
    # ... and most of it is the runtime's own wait (30 ms to headers here)
    assert (up_wait.end_time_unix_nano - up_wait.start_time_unix_nano) >= 0.5 * (wait.end_time - wait.start_time)
    assert server.end_time_unix_nano >= upstream_call.end_time_unix_nano - CLOCK_TOL_NS

    names = collector.received.metric_names()
    assert {sc.METRIC_GATEWAY_REQUESTS, sc.METRIC_GATEWAY_QUEUE_WAIT, sc.METRIC_HTTP_SERVER_DURATION,
            sc.METRIC_OPERATION_DURATION} <= names, names


def _server_timing(value: str) -> dict[str, float]:
    """The header's entries in milliseconds, as the gateway writes them."""
    return {name: seconds * 1000 for name, seconds in parse_server_timing(value).items()}


def test_server_timing_shows_the_gateways_share(upstream: SimProcess, collector: OtlpHttpCollector,
                                                tmp_path: Any) -> None:
    with _gateway(upstream, collector, tmp_path) as gateway, gateway.client("app", timeout=10) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}
        response = client.post("/api/chat", json=body, headers={"x-sim-headers-delay": "0.1"})
        assert response.status_code == 200
        timing = _server_timing(response.headers["server-timing"])
        assert set(timing) == {"auth", "queue", "upstream", "total"}
        # non-streamed: the head leaves with the whole answer, ~0.1 + 0.04 + 5 * 0.02 s after arrival
        assert 200 <= timing["upstream"] <= timing["total"] <= response.elapsed.total_seconds() * 1000 + 1
        assert timing["auth"] + timing["queue"] + timing["upstream"] <= timing["total"] + 0.01

        denied = httpx.post(f"{gateway.url}/api/chat", json=body, timeout=10)
        assert denied.status_code == 401
        assert set(_server_timing(denied.headers["server-timing"])) == {"auth", "total"}


def test_a_rejected_request_is_traced_without_an_upstream_call(otel: Otel, upstream: SimProcess,
                                                               collector: OtlpHttpCollector, tmp_path: Any) -> None:
    upstream.reset()
    with _gateway(upstream, collector, tmp_path) as gateway:
        response = httpx.post(f"{gateway.url}/api/chat", json={"model": MODEL, "messages": []},
                              headers={"authorization": "Bearer olk_not-a-real-key"}, timeout=10)
        assert response.status_code == 401
    exported = [span for _, span in collector.received.spans()]
    assert [s.name for s in exported if s.kind == KIND_SERVER] == ["POST /api/chat"]
    assert [s.name for s in exported if s.kind != KIND_SERVER] == [sc.SPAN_GATEWAY_AUTH]
    server = next(s for s in exported if s.kind == KIND_SERVER)
    attrs = attributes_of(server.attributes)
    assert attrs[sc.LLM_GATEWAY_OUTCOME] == "unauthorized" and attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 401
    assert sc.LLM_GATEWAY_KEY_ID not in attrs
    assert upstream.stats()["requests"] == 0


def _operation_counts(collector: OtlpHttpCollector) -> dict[bool, int]:
    """The gateway's gen_ai.client.operation.duration counts from its last (cumulative) export,
    by whether they are marked llm.gateway.relayed."""
    counts: dict[bool, int] = {}
    for request in collector.received.metrics[-1:]:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != sc.METRIC_OPERATION_DURATION:
                        continue
                    for point in metric.histogram.data_points:
                        relayed = attributes_of(point.attributes).get(sc.LLM_GATEWAY_RELAYED, False)
                        counts[relayed] = counts.get(relayed, 0) + point.count
    return counts


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs Debian's curl")
def test_a_call_is_marked_relayed_only_when_its_caller_recorded_it(otel: Otel, upstream: SimProcess,
                                                                   collector: OtlpHttpCollector, tmp_path: Any) -> None:
    """Counted once, never zero times: the instrumented client's call through the gateway is
    marked relayed by the gateway (the client recorded it, and says so in its baggage); curl's
    calls, one with an application's own baggage, are not (the gateway's record is their only one)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False})
    with _gateway(upstream, collector, tmp_path) as gateway:
        client = ollama.Client(host=gateway.url, headers={**gateway.headers("app"), "baggage": "tenant=acme"})
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        for extra in ([], ["-H", "baggage: tenant=acme"]):
            done = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                                   f"authorization: {gateway.headers('app')['authorization']}",
                                   "-H", "content-type: application/json", *extra, "--data", body,
                                   f"{gateway.url}/api/chat"], capture_output=True, text=True, timeout=30)
            assert done.stdout == "200", done.stderr
    call, _ = otel.one_call()
    assert sc.LLM_GATEWAY_RELAYED not in (call.attributes or {}), "the client's own record is the call"
    exported = [span for _, span in collector.received.spans()]
    upstream_calls = sorted((s for s in exported if s.kind == KIND_CLIENT), key=lambda s: s.start_time_unix_nano)
    assert [attributes_of(s.attributes).get(sc.LLM_GATEWAY_RELAYED) for s in upstream_calls] == [True, None, None]
    assert upstream_calls[0].trace_id == call.context.trace_id.to_bytes(16, "big")
    assert _operation_counts(collector) == {True: 1, False: 2}


def test_with_sample_rate_the_gateway_keeps_its_span_tree_with_the_call_it_relays(
        upstream: SimProcess, collector: OtlpHttpCollector, tmp_path: Any) -> None:
    """OTEL_LLM_SAMPLE_RATE=0 in the gateway: ordinary requests leave no span at all; a failed one
    is kept whole, its SERVER span and the upstream call under it, each saying why."""
    gateway = _gateway(upstream, collector, tmp_path)
    gateway.extra_env = {**gateway.extra_env, "OTEL_LLM_SAMPLE_RATE": "0"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with gateway:
        with httpx.Client(base_url=gateway.url, headers=gateway.headers("app"), timeout=30) as client:
            for _ in range(10):
                assert client.post("/api/chat", json=body).status_code == 200
            assert client.post("/api/chat", json=body, headers={"x-sim-error-status": "500"}).status_code == 500
    exported = [span for _, span in collector.received.spans()]
    kinds = sorted(s.kind for s in exported if s.kind in (KIND_SERVER, KIND_CLIENT))
    assert kinds == [KIND_SERVER, KIND_CLIENT], [s.name for s in exported]
    (server,) = [s for s in exported if s.kind == KIND_SERVER]
    (call,) = [s for s in exported if s.kind == KIND_CLIENT]
    assert call.parent_span_id == server.span_id and call.trace_id == server.trace_id
    for span in (server, call):
        attributes = attributes_of(span.attributes)
        assert list(attributes[sc.LLM_SAMPLING_REASON]) == ["failed"]
        assert attributes[sc.LLM_SAMPLING_ADJUSTED_COUNT] == 1.0


def test_with_sample_rate_an_application_s_sampled_trace_is_kept_whole_through_the_gateway(
        upstream: SimProcess, collector: OtlpHttpCollector, tmp_path: Any) -> None:
    """Client and gateway at rate 0: a call under the application's sampled span is kept by the
    client (``parent``), which says its decision is made, so the gateway keeps its tree under it;
    an unparented ordinary call goes out marked pending and neither side keeps it."""
    import otel_llm
    from otel_llm_testing.otel import make_otel

    gateway = _gateway(upstream, collector, tmp_path)
    gateway.extra_env = {**gateway.extra_env, "OTEL_LLM_SAMPLE_RATE": "0"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    state = make_otel()
    with gateway:
        otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                            host_metrics=False, gpu_metrics=False, runtime_metrics=False, console_summary=False,
                            sample_rate=0)
        try:
            with httpx.Client(base_url=gateway.url, headers=gateway.headers("app"), timeout=30) as client:
                assert client.post("/api/chat", json=body).status_code == 200  # ordinary, unparented
                with state.tracer_provider.get_tracer("app").start_as_current_span("handle request") as app:
                    assert client.post("/api/chat", json=body).status_code == 200
        finally:
            otel_llm.uninstrument()
    app_trace = app.get_span_context().trace_id
    (call,) = state.calls()
    assert call.context.trace_id == app_trace and call.attributes[sc.LLM_SAMPLING_REASON] == ("parent",)
    exported = [span for _, span in collector.received.spans()]
    assert {int.from_bytes(s.trace_id, "big") for s in exported} == {app_trace}, [s.name for s in exported]
    (server,) = [s for s in exported if s.kind == KIND_SERVER]
    (relayed,) = [s for s in exported if s.kind == KIND_CLIENT]
    assert int.from_bytes(server.parent_span_id, "big") == call.context.span_id
    assert relayed.parent_span_id == server.span_id
    for span in (server, relayed):
        assert list(attributes_of(span.attributes)[sc.LLM_SAMPLING_REASON]) == ["parent"]


def test_with_sample_rate_a_request_slow_only_outside_its_model_call_keeps_no_tree(
        upstream: SimProcess, collector: OtlpHttpCollector, tmp_path: Any) -> None:
    """OTEL_LLM_SAMPLE_RATE=0: a slow upload makes the request slow, not the model call it relays
    (which starts once the body is in). The call is dropped, and so is the SERVER span: kept alone it
    would be a tree without its model call, under a client call that was dropped too."""
    gateway = _gateway(upstream, collector, tmp_path)
    gateway.extra_env = {**gateway.extra_env, "OTEL_LLM_SAMPLE_RATE": "0"}
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()

    def trickled() -> Iterator[bytes]:
        yield body[:10]
        time.sleep(1.0)  # against about 0.2 s for the whole ordinary request
        yield body[10:]

    with gateway:
        with httpx.Client(base_url=gateway.url, headers=gateway.headers("app"), timeout=30) as client:
            for _ in range(25):  # the 20 requests a series needs before it judges anything slow, and more
                assert client.post("/api/chat", content=body).status_code == 200
            slow = client.post("/api/chat", content=trickled(), headers={"content-type": "application/json"})
            assert slow.status_code == 200 and slow.elapsed.total_seconds() >= 1.0
    assert len(gateway.access_records()) == 26 and gateway.access_records()[-1]["total_ms"] >= 1000
    exported = [span for _, span in collector.received.spans()]
    assert exported == [], [(s.name, attributes_of(s.attributes).get(sc.LLM_SAMPLING_REASON)) for s in exported]
