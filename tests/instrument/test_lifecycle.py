"""Every call's span ends exactly once, however the application stops reading."""

from __future__ import annotations

import asyncio
import gc

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.net import free_port

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _url(sim) -> str:
    return f"{sim.base_url}/v1/chat/completions"


def test_end_of_body(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.0, token_interval=0.001)
    with httpx.Client() as client, client.stream("POST", _url(sim), json=BODY) as response:
        response.read()
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "eof"


def test_early_break_and_close(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=50, first_token_delay=0.0, token_interval=0.01)
    with httpx.Client() as client:
        with client.stream("POST", _url(sim), json=BODY) as response:
            for i, _ in enumerate(response.iter_lines()):
                if i == 6:
                    break
        call, kids = otel.one_call()
        assert call.attributes[sc.LLM_CLIENT_END_REASON] == "closed"
        assert call.status.is_ok
        assert (call.end_time - call.start_time) / 1e9 < 0.4  # ended at close, not after 50 tokens
        assert kids[-1].name == sc.SPAN_DECODE and kids[-1].end_time == call.end_time


def test_task_cancellation(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=100, first_token_delay=0.0, token_interval=0.02)

    async def consume(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", _url(sim), json=BODY) as response:
            async for _ in response.aiter_bytes():
                pass

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            task = asyncio.create_task(consume(client))
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "cancelled"
    assert call.attributes[sc.ERROR_TYPE].endswith("CancelledError")


def test_server_abort_mid_stream(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=20, first_token_delay=0.0, token_interval=0.005, abort_after_tokens=3)
    with httpx.Client() as client:
        with pytest.raises(httpx.HTTPError):
            with client.stream("POST", _url(sim), json=BODY) as response:
                for _ in response.iter_bytes():
                    pass
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "error"
    assert not call.status.is_ok
    assert call.attributes[sc.ERROR_TYPE].startswith("httpx.")
    assert call.attributes[sc.LLM_CLIENT_CHUNKS] == 3


def test_garbage_collected_unconsumed_response(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.0, token_interval=0.001)
    client = httpx.Client()
    request = client.build_request("POST", _url(sim), json=BODY)
    response = client.send(request, stream=True)
    assert otel.calls() == []
    del response
    gc.collect()
    from otel_llm.capture.shared import flush_collected
    assert flush_collected()
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_CLIENT_END_REASON] in ("garbage_collected", "closed")
    client.close()


def test_http_error_status(sim, otel: Otel) -> None:
    configure_sim(sim, error_status=503)
    with httpx.Client() as client:
        response = client.post(_url(sim), json={**BODY, "stream": False})
    assert response.status_code == 503
    call, _ = otel.one_call()
    assert call.attributes[sc.ERROR_TYPE] == "503"
    assert not call.status.is_ok


def test_connection_refused(otel: Otel) -> None:
    port = free_port()
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=BODY)
    call, kids = otel.one_call()
    assert call.attributes[sc.ERROR_TYPE] == "httpx.ConnectError"
    assert [k.name for k in kids] == [sc.SPAN_CONNECT]
    assert not kids[0].status.is_ok


def test_unknown_host_ends_inside_dns(otel: Otel) -> None:
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.post("http://no-such-host.invalid/v1/chat/completions", json=BODY)
    call, kids = otel.one_call()
    assert [k.name for k in kids] == [sc.SPAN_DNS]
    assert not kids[0].status.is_ok
