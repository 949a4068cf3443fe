"""Connection reuse, DNS, pool waits, options, metrics and tracers other than the SDK's."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind

import otel_llm
from otel_llm import semconv as sc
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.simulator import configure_sim

# the tests marked timing need two calls to overlap or tokens to arrive apart, on a shared 2-core
# machine: one bad scheduling moment is not a regression; the others are exact

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_localhost_gets_dns_then_reuse_skips_connection_setup(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=2, first_token_delay=0.0, token_interval=0.0)
    url = f"http://localhost:{sim.port}/v1/chat/completions"
    with httpx.Client() as client:
        client.post(url, json=CHAT)
        client.post(url, json=CHAT)
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    assert [k.name for k in otel.children(first)][:2] == [sc.SPAN_DNS, sc.SPAN_CONNECT]
    dns = otel.children(first)[0]
    assert dns.attributes[sc.DNS_QUESTION_NAME] == "localhost"
    assert first.attributes[sc.LLM_CLIENT_CONNECTION_REUSED] is False
    assert [k.name for k in otel.children(second)] == [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
    assert second.attributes[sc.LLM_CLIENT_CONNECTION_REUSED] is True


def test_ip_literal_has_no_dns_phase(sim, otel: Otel) -> None:
    with httpx.Client() as client:
        client.post(f"{sim.base_url}/v1/chat/completions", json=CHAT)
    call, kids = otel.one_call()
    assert kids[0].name == sc.SPAN_CONNECT
    assert call.attributes[sc.NETWORK_PEER_ADDRESS] == "127.0.0.1"


@pytest.mark.timing
def test_waiting_for_a_pooled_connection_is_its_own_phase(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=10, first_token_delay=0.05, token_interval=0.01)
    client = httpx.Client(limits=httpx.Limits(max_connections=1))
    body = {**CHAT, "stream": True}

    def stream() -> None:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body) as response:
            response.read()

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    waits = [k for c in otel.calls() for k in otel.children(c) if k.name == sc.SPAN_POOL_WAIT]
    assert len(waits) == 1
    assert (waits[0].end_time - waits[0].start_time) / 1e9 > 0.08  # the other call's whole stream


def test_configured_runtime_and_extra_route(sim) -> None:
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        runtimes={sim.base_url: "vllm"}, llm_routes=["/custom/infer"])
    try:
        with httpx.Client() as client:
            client.post(f"{sim.base_url}/v1/chat/completions", json=CHAT)
            client.post(f"{sim.base_url}/custom/infer", json=CHAT)  # 404 from the sim, still a model call
    finally:
        otel_llm.uninstrument()
    calls = sorted(state.calls(), key=lambda c: c.start_time)
    assert calls[0].attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"
    assert calls[0].attributes[sc.LLM_RUNTIME_NAME] == "vllm"
    assert len(calls) == 2 and calls[1].attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 404


@pytest.mark.timing  # a time per chunk needs the 4 tokens, 2 ms apart, not read at once
def test_metrics_carry_semconv_names_and_phases(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=4, first_token_delay=0.01, token_interval=0.002)
    with httpx.Client() as client:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                           json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}) as r:
            r.read()
    metrics = otel.metrics()
    for name in (sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_TO_FIRST_CHUNK,
                 sc.METRIC_TIME_PER_OUTPUT_CHUNK, sc.METRIC_PHASE_DURATION):
        assert metrics.get(name), name
    duration = metrics[sc.METRIC_OPERATION_DURATION][0]
    assert duration.attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert duration.attributes[sc.GEN_AI_REQUEST_MODEL] == "m"
    assert list(duration.explicit_bounds) == list(sc.DURATION_BUCKETS)
    token_types = {p.attributes[sc.GEN_AI_TOKEN_TYPE]: p.sum for p in metrics[sc.METRIC_TOKEN_USAGE]}
    assert token_types["output"] == 4
    phases = {p.attributes[sc.LLM_PHASE] for p in metrics[sc.METRIC_PHASE_DURATION]}
    assert phases == {sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE}


def test_streamed_content_only_when_opted_in(sim) -> None:
    configure_sim(sim, tokens=3, first_token_delay=0.0, token_interval=0.0)
    for capture in (False, True):
        state = make_otel()
        otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                            capture_content=capture)
        try:
            with httpx.Client() as client:
                with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                                   json={"model": "m", "stream": True,
                                         "messages": [{"role": "user", "content": "marker-xyz"}]}) as r:
                    r.read()
        finally:
            otel_llm.uninstrument()
        call, _ = state.one_call()
        if capture:
            assert "marker-xyz" in call.attributes[sc.GEN_AI_INPUT_MESSAGES]
            assert "tok0" in call.attributes[sc.GEN_AI_OUTPUT_MESSAGES]
        else:
            assert sc.GEN_AI_INPUT_MESSAGES not in call.attributes
            assert sc.GEN_AI_OUTPUT_MESSAGES not in call.attributes


class _WrappingTracer:
    """A tracer that is not the SDK's: otel_llm must fall back to ordinary API spans."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.start_span(*args, **kwargs)


class _WrappingProvider:
    def __init__(self, inner: TracerProvider) -> None:
        self._inner = inner

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _WrappingTracer(self._inner.get_tracer(*args, **kwargs))


def test_non_sdk_tracer_gets_the_same_tree(sim) -> None:
    exporter = InMemorySpanExporter()
    inner = TracerProvider()
    inner.add_span_processor(SimpleSpanProcessor(exporter))
    state = make_otel()
    otel_llm.instrument(tracer_provider=_WrappingProvider(inner), meter_provider=state.meter_provider)
    try:
        with httpx.Client() as client:
            client.post(f"{sim.base_url}/v1/chat/completions", json=CHAT)
    finally:
        otel_llm.uninstrument()
    spans = exporter.get_finished_spans()
    call = next(s for s in spans if s.kind == SpanKind.CLIENT)
    kids = sorted((s for s in spans if s.parent and s.parent.span_id == call.context.span_id),
                  key=lambda s: s.start_time)
    assert [k.name for k in kids] == [sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
    assert kids[0].start_time == call.start_time and kids[-1].end_time == call.end_time
    assert call.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] > 0


def test_sampler_that_drops_emits_nothing_but_still_propagates(sim) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = make_otel()
    seen: list[str] = []
    otel_llm.instrument(tracer_provider=provider, meter_provider=state.meter_provider)
    try:
        with httpx.Client(
                event_hooks={"response": [lambda r: seen.append(r.request.headers.get("traceparent", ""))]}) as client:
            client.post(f"{sim.base_url}/v1/chat/completions", json=CHAT)
    finally:
        otel_llm.uninstrument()
    assert exporter.get_finished_spans() == ()
    # not sampled (the flags' low bit clear), but the trace still crosses processes
    assert seen and not int(seen[0].rsplit("-", 1)[1], 16) & 1
    assert state.metrics().get(sc.METRIC_OPERATION_DURATION)  # metrics do not depend on sampling


@pytest.mark.timing
def test_async_pool_wait(sim, otel: Otel) -> None:
    import asyncio

    configure_sim(sim, tokens=10, first_token_delay=0.05, token_interval=0.01)

    async def run() -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
            async def one() -> None:
                async with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                                         json={**CHAT, "stream": True}) as r:
                    await r.aread()
            await asyncio.gather(one(), one())

    asyncio.run(run())
    waits = [k for c in otel.calls() for k in otel.children(c) if k.name == sc.SPAN_POOL_WAIT]
    assert len(waits) == 1 and (waits[0].end_time - waits[0].start_time) / 1e9 > 0.08


def test_the_clock_anchor_rereads_a_pair_split_by_a_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    """A (perf, epoch) pair whose two perf reads are 5 ms apart was preempted: the anchor reads
    again and keeps the tight pair, so epoch times of two processes line up."""
    from otel_llm.capture import call as call_module

    perf = iter([0, 5_000_000, 10_000_000, 10_000_300])  # first pair split by 5 ms, second tight
    epochs = iter([1_000, 2_000])
    monkeypatch.setattr(call_module, "perf_ns", lambda: next(perf))
    monkeypatch.setattr(call_module.time, "time_ns", lambda: next(epochs))
    assert call_module.clock_anchor() == (10_000_150, 2_000)
