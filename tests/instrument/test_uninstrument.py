"""Installing and removing the hooks: idempotent instrument(), exact restoration on uninstrument(),
traceparent only on model requests, and clients created before instrument() are covered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpcore
import httpcore2
import httpx
import httpx2
import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.simulator import sim_stats
from otel_llm_testing.model_server import ModelServer

# (owner class, attribute) of every hook otel_llm installs
HOOKS: list[tuple[type, str]] = [
    (httpx.HTTPTransport, "handle_request"),
    (httpx.AsyncHTTPTransport, "handle_async_request"),
    (httpx2.HTTPTransport, "handle_request"),
    (httpx2.AsyncHTTPTransport, "handle_async_request"),
    (httpcore.SyncBackend, "connect_tcp"),
    (httpcore.AnyIOBackend, "connect_tcp"),
    (httpcore2.SyncBackend, "connect_tcp"),
    (httpcore2.AnyIOBackend, "connect_tcp"),
]
CHAT = {"model": "hook-model", "messages": [{"role": "user", "content": "hi"}]}


def _originals() -> list[Any]:
    return [owner.__dict__[name] for owner, name in HOOKS]


@pytest.fixture
def uninstrumented() -> Iterator[list[Any]]:
    """Start and end uninstrumented; yields the original hook functions."""
    assert not otel_llm.is_instrumented()
    reset_log_once()
    originals = _originals()
    yield originals
    otel_llm.uninstrument()


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as model_server:
        yield model_server


def _chat(client: httpx.Client | httpx2.Client, server: ModelServer) -> None:
    assert client.post(server.url("/v1/chat/completions"), json=CHAT).status_code == 200


def test_instrument_twice_is_idempotent(uninstrumented: list[Any], server: ModelServer) -> None:
    """A second instrument() neither re-wraps nor switches providers: one span tree per call."""
    first, second = make_otel(), make_otel()
    otel_llm.instrument(tracer_provider=first.tracer_provider, meter_provider=first.meter_provider)
    wrapped_once = _originals()
    otel_llm.instrument(tracer_provider=second.tracer_provider, meter_provider=second.meter_provider)
    assert _originals() == wrapped_once
    for (owner, name), original in zip(HOOKS, uninstrumented):
        assert owner.__dict__[name].__wrapped__ is original  # one layer, not two
    with httpx.Client(timeout=10) as client:
        _chat(client, server)
    call, children = first.one_call()
    names = [c.name for c in children]
    assert len(names) == len(set(names)) and sc.SPAN_DOWNLOAD in names
    assert len(first.spans()) == 1 + len(children)
    assert second.spans() == []
    assert len(server.requests[-1].headers.get("traceparent", "").split("-")) == 4


def test_uninstrument_restores_originals(uninstrumented: list[Any], server: ModelServer) -> None:
    """Every hook is the identical original function again; nothing is traced or injected afterwards."""
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider)
    assert all(now is not before for now, before in zip(_originals(), uninstrumented))
    otel_llm.uninstrument()
    assert not otel_llm.is_instrumented()
    for (owner, name), original, now in zip(HOOKS, uninstrumented, _originals()):
        assert now is original, f"{owner.__module__}.{owner.__qualname__}.{name} not restored"

    with httpx.Client(timeout=10) as client, httpx2.Client(timeout=10) as client2:
        _chat(client, server)
        _chat(client2, server)
    assert state.spans() == []
    assert all("traceparent" not in r.headers for r in server.requests)

    again = make_otel()
    otel_llm.instrument(tracer_provider=again.tracer_provider, meter_provider=again.meter_provider)
    with httpx.Client(timeout=10) as client:
        _chat(client, server)
    again.one_call()
    assert state.spans() == []


def test_traceparent_matches_call_span(otel: Otel, server: ModelServer) -> None:
    """Model requests carry the call span's W3C traceparent; other requests carry none and make no span."""
    with httpx.Client(timeout=10) as client:
        assert client.get(server.url("/v1/models")).status_code == 200
        assert client.get(server.url("/sim/stats")).status_code == 200
        _chat(client, server)
    models, stats, chat = server.requests
    assert [models.path, stats.path] == ["/v1/models", "/sim/stats"]
    assert "traceparent" not in models.headers and "traceparent" not in stats.headers
    call, _ = otel.one_call()
    context = call.get_span_context()
    version, trace_id, span_id, flags = chat.headers["traceparent"].split("-")
    assert version == "00" and flags == format(context.trace_flags, "02x") and context.trace_flags.sampled
    assert trace_id == format(context.trace_id, "032x")
    assert span_id == format(context.span_id, "016x")


def test_non_model_requests_make_no_span(otel: Otel, sim: Any) -> None:
    """GET /v1/models and /sim/stats on the simulator are passed through untouched."""
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{sim.base_url}/v1/models").status_code == 200
    assert sim_stats(sim)["requests"] == 1

    async def async_get() -> None:
        async with httpx2.AsyncClient(timeout=10) as client:
            assert (await client.get(f"{sim.base_url}/v1/models")).status_code == 200

    asyncio.run(async_get())
    assert otel.spans() == []


def test_client_created_before_instrument_is_traced(uninstrumented: list[Any], server: ModelServer) -> None:
    """Hooks are class-level: clients (sync and async, httpx and httpx2) built earlier are covered."""
    sync_clients = [httpx.Client(timeout=10), httpx2.Client(timeout=10)]
    async_clients = [httpx.AsyncClient(timeout=10), httpx2.AsyncClient(timeout=10)]
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider)
    for client in sync_clients:
        with client:
            _chat(client, server)

    async def async_calls() -> None:
        for client in async_clients:
            async with client:
                response = await client.post(server.url("/v1/chat/completions"), json=CHAT)
                assert response.status_code == 200

    asyncio.run(async_calls())
    calls = state.calls()
    assert len(calls) == 4
    assert all(call.name == "chat hook-model" and state.children(call) for call in calls)
    assert all("traceparent" in r.headers for r in server.requests)


def test_uninstrument_leaves_later_instrumentation_alone(uninstrumented: list[Any], server: ModelServer) -> None:
    """otel_llm.uninstrument() removes only its own layer when httpx's instrumentation wrapped on top."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    state = make_otel()
    httpx_instrumentor = HTTPXClientInstrumentor()
    try:
        otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider)
        httpx_instrumentor.instrument(tracer_provider=state.tracer_provider)
        with httpx.Client(timeout=10) as client:
            assert client.get(server.url("/v1/models")).status_code == 200
        assert [s.name for s in state.spans()] == ["GET"]  # the httpx instrumentation is active
        state.clear()
        otel_llm.uninstrument()
        with httpx.Client(timeout=10) as client:
            assert client.get(server.url("/v1/models")).status_code == 200
        assert [s.name for s in state.spans()] == ["GET"], "httpx instrumentation was removed"
        wrapper = httpx.HTTPTransport.__dict__["handle_request"]
        assert getattr(wrapper, "__wrapped__", None) is uninstrumented[0], "otel_llm's layer is still installed"
    finally:
        httpx_instrumentor.uninstrument()
        for (owner, name), original in zip(HOOKS, uninstrumented):
            if owner.__dict__[name] is not original:
                setattr(owner, name, original)  # never leak a broken state into other tests
