"""The aiohttp and urllib3 (requests) adapters: TLS, pool waits, trace context, every way a call
ends, sessions made before instrument(), and nothing touched outside model calls."""

from __future__ import annotations

import asyncio
import gc
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests
import trustme
import urllib3

import otel_llm
from otel_llm import semconv as sc
from otel_llm.capture.shared import flush_collected
from otel_llm_testing.clients import TRANSPORT_PHASES, post_with_each_transport
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.model_server import ModelServer
from otel_llm_testing.net import free_port

# the tests marked timing measure durations or need two calls to overlap, on a shared 2-core machine

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}


def _names(otel: Otel, call: Any) -> list[str]:
    return [k.name for k in otel.children(call)]


def _tiles(otel: Otel, call: Any) -> None:
    kids = otel.children(call)
    assert kids[0].start_time == call.start_time and kids[-1].end_time == call.end_time
    for before, after in zip(kids, kids[1:]):
        assert before.end_time == after.start_time


def _aio(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# -- TLS ---------------------------------------------------------------------------------------
def test_aiohttp_https_connect_includes_the_handshake(otel: Otel, tls_server: ModelServer,
                                                      client_context: ssl.SSLContext) -> None:
    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.post(tls_server.url("/v1/chat/completions", host="localhost"), json=STREAM,
                                        ssl=client_context) as response:
                    assert b"tok0" in await response.read()

    _aio(run())
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    assert _names(otel, first) == [sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT,
                                   sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
    assert TRANSPORT_PHASES["aiohttp"].startswith("pool wait, DNS, connect (TLS inside it)")
    connect = next(k for k in otel.children(first) if k.name == sc.SPAN_CONNECT)
    assert connect.attributes[sc.TLS_PROTOCOL_VERSION] in ("TLSv1.2", "TLSv1.3")
    assert connect.attributes[sc.TLS_CIPHER]
    assert first.attributes[sc.NETWORK_PEER_ADDRESS] == "127.0.0.1"
    _tiles(otel, first)
    assert _names(otel, second) == [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
    assert second.attributes[sc.LLM_CLIENT_CONNECTION_REUSED] is True


def test_requests_https_has_dns_connect_and_tls(otel: Otel, tls_server: ModelServer, ca: trustme.CA,
                                                tmp_path: Any) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    with requests.Session() as session:
        for _ in range(2):
            with session.post(tls_server.url("/v1/chat/completions", host="localhost"), json=STREAM, stream=True,
                              verify=str(bundle)) as response:
                assert b"tok0" in b"".join(response.iter_content(64))
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    assert _names(otel, first) == [sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT,
                                   sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
    assert TRANSPORT_PHASES["urllib3"].startswith("pool wait, DNS, connect, TLS")
    tls = next(k for k in otel.children(first) if k.name == sc.SPAN_TLS).attributes
    assert tls[sc.TLS_PROTOCOL_VERSION] in ("TLSv1.2", "TLSv1.3") and tls[sc.TLS_CIPHER]
    _tiles(otel, first)
    assert _names(otel, second) == [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]


# -- pool waits --------------------------------------------------------------------------------
def _one_pool_wait(otel: Otel) -> None:
    waits = [k for c in otel.calls() for k in otel.children(c) if k.name == sc.SPAN_POOL_WAIT]
    assert len(otel.calls()) == 2
    assert len(waits) == 1 and (waits[0].end_time - waits[0].start_time) / 1e9 > 0.08, waits


@pytest.mark.timing
def test_aiohttp_pool_wait(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=10, first_token_delay=0.05, token_interval=0.01)

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            async def one() -> None:
                async with session.post(f"{sim.base_url}/v1/chat/completions", json=STREAM) as response:
                    await response.read()

            await asyncio.gather(one(), one())

    _aio(run())
    _one_pool_wait(otel)


@pytest.mark.timing
def test_requests_pool_wait(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=10, first_token_delay=0.05, token_interval=0.01)
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=1, pool_block=True))

    def one() -> None:
        with session.post(f"{sim.base_url}/v1/chat/completions", json=STREAM, stream=True) as response:
            _ = response.content

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    session.close()
    _one_pool_wait(otel)


def test_time_per_output_chunk_has_one_value_per_output_chunk_after_the_first(otel: Otel, sim: Any) -> None:
    """The convention's definition, through three real clients: a stream of N output events gives
    N - 1 values, from each event's arrival to the next one's (no role-only or usage event)."""
    configure_sim(sim, tokens=6, first_token_delay=0.0, token_interval=0.002)
    url = f"{sim.base_url}/v1/chat/completions"
    post_with_each_transport(url, {**STREAM, "stream_options": {"include_usage": True}})
    calls = otel.calls()
    assert [c.attributes[sc.LLM_CLIENT_CHUNKS] for c in calls] == [6, 6, 6]
    (per_chunk,) = otel.metrics()[sc.METRIC_TIME_PER_OUTPUT_CHUNK]
    assert per_chunk.count == 3 * 5
    generation = sum(c.attributes[sc.LLM_CLIENT_GENERATION_DURATION] for c in calls)
    assert per_chunk.sum == pytest.approx(generation, rel=1e-6)  # the gaps add up to each decode


def test_chunk_metric_off_records_no_per_chunk_value(sim: Any) -> None:
    configure_sim(sim, tokens=6, first_token_delay=0.0, token_interval=0.002)
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False, chunk_metric=False)
    try:
        httpx.post(f"{sim.base_url}/v1/chat/completions", json=STREAM, timeout=10).read()
    finally:
        otel_llm.uninstrument()
    metrics = state.metrics()
    assert sc.METRIC_TIME_PER_OUTPUT_CHUNK not in metrics or not metrics[sc.METRIC_TIME_PER_OUTPUT_CHUNK]
    assert [p.count for p in metrics[sc.METRIC_TIME_TO_FIRST_CHUNK]] == [1]
    assert state.calls()[0].attributes[sc.LLM_CLIENT_CHUNKS] == 6


# -- trace context, and the application's own objects ------------------------------------------
@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer(tokens=3, first_token_delay=0.0, token_interval=0.0) as server:
        yield server


def test_trace_context_reaches_the_server_and_the_app_headers_stay_its_own(otel: Otel,
                                                                           model_server: ModelServer) -> None:
    url = model_server.url("/v1/chat/completions")
    app_headers = {"x-app": "1"}

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=STREAM, headers=app_headers) as response:
                await response.read()

    _aio(run())
    with requests.post(url, json=STREAM, headers=app_headers, stream=True) as response:
        _ = response.content
        assert "traceparent" not in response.request.headers  # the app's prepared request is untouched
    urllib3.PoolManager().request("POST", url, json=STREAM, headers=app_headers)
    assert app_headers == {"x-app": "1"}
    calls = sorted(otel.calls(), key=lambda c: c.start_time)
    assert len(calls) == 3 and len(model_server.requests) == 3
    for call, received in zip(calls, model_server.requests):
        traceparent = received.headers["traceparent"]
        assert traceparent.split("-")[1:3] == [format(call.context.trace_id, "032x"),
                                               format(call.context.span_id, "016x")]
        assert received.headers["x-app"] == "1"


def test_sessions_made_before_instrument_are_traced(sim) -> None:
    state = make_otel()
    session = requests.Session()

    async def run(started: asyncio.Event, go: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as early:
            started.set()
            await go.wait()
            async with early.post(f"{sim.base_url}/v1/chat/completions", json=CHAT) as response:
                await response.json()

    async def main() -> None:
        started, go = asyncio.Event(), asyncio.Event()
        task = asyncio.ensure_future(run(started, go))
        await started.wait()
        otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                            host_metrics=False, gpu_metrics=False, runtime_metrics=False)
        go.set()
        await task

    try:
        asyncio.run(main())
        session.post(f"{sim.base_url}/v1/chat/completions", json=CHAT).json()
    finally:
        otel_llm.uninstrument()
    assert len(state.calls()) == 2


def test_other_requests_are_left_alone_and_uninstrument_removes_everything(sim, model_server: ModelServer) -> None:
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    seen: list[Any] = []

    async def run(url: str, body: Any) -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body) as response:
                seen.append((type(response.content), session.trace_configs))
                await response.read()

    try:
        _aio(run(f"{sim.base_url}/sim/config", {}))  # not a model route
        requests.get(f"{sim.base_url}/v1/models").json()
        assert state.calls() == []
        assert seen[0][0] is aiohttp.StreamReader and seen[0][1] == []
        _aio(run(f"{sim.base_url}/v1/chat/completions", CHAT))
        assert len(state.calls()) == 1 and seen[1][0] is not aiohttp.StreamReader  # the model call's reader
    finally:
        otel_llm.uninstrument()
    assert "_trace_configs" not in vars(aiohttp.ClientSession)
    _aio(run(f"{sim.base_url}/v1/chat/completions", CHAT))
    requests.post(f"{sim.base_url}/v1/chat/completions", json=CHAT).json()
    assert seen[2][0] is aiohttp.StreamReader
    assert len(state.calls()) == 1


# -- every way a call ends ---------------------------------------------------------------------
def _only(otel: Otel) -> Any:
    flush_collected()
    call, _ = otel.one_call()
    return call


@pytest.mark.slow
@pytest.mark.timing  # an early exit ends the call within 0.4 s
def test_aiohttp_early_exit_cancellation_and_garbage(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=50, first_token_delay=0.0, token_interval=0.01)
    url = f"{sim.base_url}/v1/chat/completions"

    async def early() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=STREAM) as response:
                await response.content.readline()

    _aio(early())
    call = _only(otel)
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "closed" and (call.end_time - call.start_time) / 1e9 < 0.4
    otel.clear()

    async def cancelled() -> None:
        async with aiohttp.ClientSession() as session:
            async def read() -> None:
                async with session.post(url, json=STREAM) as response:
                    async for _ in response.content:
                        pass

            task = asyncio.ensure_future(read())
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    _aio(cancelled())
    call = _only(otel)
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "cancelled"
    assert call.attributes[sc.ERROR_TYPE].endswith("CancelledError")
    otel.clear()

    configure_sim(sim, tokens=3, first_token_delay=0.0, token_interval=0.0)

    async def dropped() -> None:
        async with aiohttp.ClientSession() as session:
            response = await session.post(url, json=STREAM)
            del response
            await asyncio.sleep(0.2)  # aiohttp holds an unread answer until its body is in
            gc.collect()

    _aio(dropped())
    gc.collect()
    call = _only(otel)
    assert call.attributes[sc.LLM_CLIENT_END_REASON] in ("garbage_collected", "closed")


@pytest.mark.timing  # an early close ends the call within 0.4 s
def test_requests_early_close_and_garbage(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=50, first_token_delay=0.0, token_interval=0.01)
    url = f"{sim.base_url}/v1/chat/completions"
    with requests.post(url, json=STREAM, stream=True) as response:
        next(response.iter_lines())
    call = _only(otel)
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "closed" and (call.end_time - call.start_time) / 1e9 < 0.4
    otel.clear()
    response = requests.post(url, json=STREAM, stream=True)
    del response
    gc.collect()
    call = _only(otel)
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "closed"  # urllib3 closes a response in __del__
    assert (call.end_time - call.start_time) / 1e9 < 0.4



@pytest.mark.parametrize("client", ["aiohttp", "requests"])
def test_errors_end_the_call(sim, otel: Otel, client: str) -> None:
    url = f"{sim.base_url}/v1/chat/completions"

    def call(target: str, headers: dict[str, str] | None = None) -> str:
        if client == "requests":
            try:
                with requests.post(target, json=STREAM, headers=headers, stream=True, timeout=10) as response:
                    b"".join(response.iter_content(64))
                    return str(response.status_code)
            except requests.RequestException as exc:
                return type(exc).__name__

        async def run() -> str:
            try:
                async with aiohttp.ClientSession() as session:
                    async with session.post(target, json=STREAM, headers=headers) as response:
                        await response.read()
                        return str(response.status)
            except aiohttp.ClientError as exc:
                return type(exc).__name__

        return _aio(run())

    assert call(f"http://127.0.0.1:{free_port()}/v1/chat/completions") != "200"
    refused = _only(otel)
    assert refused.attributes[sc.LLM_CLIENT_END_REASON] == "error"
    assert not refused.status.is_ok and _names(otel, refused)[-1] == sc.SPAN_CONNECT
    otel.clear()
    assert call(url, {"x-sim-error-status": "503"}) == "503"
    assert _only(otel).attributes[sc.ERROR_TYPE] == "503"
    otel.clear()
    outcome = call(url, {"x-sim-abort-after-tokens": "3", "x-sim-token-interval": "0.01"})
    assert outcome in ("ChunkedEncodingError", "ClientPayloadError")  # a cut-short chunked body
    cut = _only(otel)
    assert cut.attributes[sc.LLM_CLIENT_END_REASON] == "error"
    assert cut.attributes[sc.ERROR_TYPE] in ("urllib3.ProtocolError", "aiohttp.ClientPayloadError")
    assert cut.attributes[sc.LLM_CLIENT_CHUNKS] == 3


# -- every way an application reads, and nothing left behind -----------------------------------
def _requests_reads(url: str) -> list[bytes]:
    def raw_read(response: Any) -> bytes:
        out = b""
        while block := response.raw.read(100):
            out += block
        return out

    readers = [lambda r: b"\n".join(r.iter_lines()) + b"\n", lambda r: b"".join(r.iter_content(7)),
               lambda r: b"".join(r.iter_content(None)), raw_read, lambda r: r.content,
               lambda r: b"".join(r.raw.stream(50))]
    results = []
    for reader in readers:
        with requests.post(url, json=STREAM, stream=True) as response:
            results.append(reader(response))
    return results


def _aiohttp_reads(url: str) -> list[bytes]:
    async def read_n(content: Any) -> bytes:
        out = b""
        while block := await content.read(33):
            out += block
        return out

    async def exactly(content: Any) -> bytes:
        head = await content.readexactly(20)
        return head + await content.read()

    readers = [lambda c: c.read(), read_n, exactly, lambda c: c.readany(),
               lambda c: _join(c.iter_chunked(9)), lambda c: _join(c.iter_any()), lambda c: _join(c),
               lambda c: _join_chunks(c.iter_chunks())]

    async def run() -> list[bytes]:
        results = []
        async with aiohttp.ClientSession() as session:
            for reader in readers:
                async with session.post(url, json=STREAM) as response:
                    data = await reader(response.content)
                    results.append(data + await response.content.read())  # readany: the rest
        return results

    return _aio(run())


async def _join(iterator: Any) -> bytes:
    return b"".join([piece async for piece in iterator])


async def _join_chunks(iterator: Any) -> bytes:
    return b"".join([piece async for piece, _ in iterator])


@pytest.mark.parametrize("client", ["requests", "aiohttp"])
def test_every_read_style_gets_the_bytes_and_one_complete_call(sim, otel: Otel, client: str) -> None:
    configure_sim(sim, tokens=6, first_token_delay=0.02, token_interval=0.002, runtime="llama.cpp")
    url = f"{sim.base_url}/v1/chat/completions"
    expected = httpx.post(url, json=STREAM).text.encode()
    otel.clear()
    results = _requests_reads(url) if client == "requests" else _aiohttp_reads(url)
    for data in results:  # the same answer each time, but for its ids and timestamps
        assert data.count(b"data: ") == expected.count(b"data: ") and b" tok5" in data
    calls = sorted(otel.calls(), key=lambda c: c.start_time)
    assert len(calls) == len(results)
    for index, call in enumerate(calls):
        attrs = call.attributes
        assert attrs[sc.LLM_CLIENT_END_REASON] == "eof", index
        assert attrs[sc.LLM_CLIENT_CHUNKS] == 6, index
        assert attrs[sc.LLM_CLIENT_RESPONSE_BYTES] == len(results[index]), index
        assert attrs[sc.LLM_RUNTIME_NAME] == "llama.cpp", index


@pytest.mark.slow
def test_adapters_leave_nothing_behind(sim) -> None:
    """Many calls ended every way: no call, reader or response is kept afterwards."""
    import httpx as _httpx  # noqa: F401 - imported by the fixtures' clients too

    from otel_llm.capture import aiohttp as aiohttp_adapter
    from otel_llm.capture import urllib3 as urllib3_adapter
    from otel_llm.instrumentor import current_telemetry
    from otel_llm.capture.call import open_calls

    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    configure_sim(sim, tokens=20, first_token_delay=0.0, token_interval=0.001)
    url = f"{sim.base_url}/v1/chat/completions"

    async def aio(round_: int) -> None:
        async with aiohttp.ClientSession() as session:
            for index in range(40):
                async with session.post(url, json=STREAM) as response:
                    if (index + round_) % 3:
                        await response.read()
                    else:
                        await response.content.readline()  # early exit

    try:
        for round_ in range(3):
            _aio(aio(round_))
            with requests.Session() as session:
                for index in range(40):
                    response = session.post(url, json=STREAM, stream=True)
                    if index % 3 == 0:
                        next(response.iter_lines())
                        response.close()
                    elif index % 3 == 1:
                        del response  # dropped unread
                    else:
                        _ = response.content
                response = None  # the application's last reference
        gc.collect()
        flush_collected()
        telemetry = current_telemetry()
        assert telemetry is not None
        assert len(open_calls()) == 0
        assert not aiohttp_adapter._READERS and not list(aiohttp_adapter._RESPONSES.keys())
        assert not [o for o in gc.get_objects() if isinstance(o, urllib3.HTTPResponse)
                    and urllib3_adapter._CALL in vars(o)]
        assert len(state.calls()) == 240
    finally:
        otel_llm.uninstrument()


def _causes(exc: BaseException | None) -> list[str]:
    names = []
    while exc is not None and len(names) < 5:
        names.append(type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    return names


def test_a_read_that_fails_because_this_side_closed_is_an_early_close(sim, otel: Otel) -> None:
    """openai's async client drains the rest of a stream after [DONE] for at most 100 ms and then
    closes it: on a busy machine the pending read then fails with anyio's ClosedResourceError
    under httpx's ReadError. The client gave up on the body; the call ends ``closed``, no error.
    Here the application closes its own connection under a pending read, which fails the same way."""
    configure_sim(sim, tokens=50, first_token_delay=0.0, token_interval=0.02)

    async def run() -> str:
        async with httpx.AsyncClient() as client:
            async with client.stream("POST", f"{sim.base_url}/v1/chat/completions", json=STREAM) as response:
                stream = response.extensions["network_stream"]
                chunks = response.aiter_raw()
                await chunks.__anext__()
                asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(stream.aclose()))
                try:
                    async for _ in chunks:
                        pass
                except httpx.ReadError as exc:
                    return _causes(exc)
        return "no error"

    assert "ClosedResourceError" in _aio(run())
    call = _only(otel)
    assert call.attributes[sc.LLM_CLIENT_END_REASON] == "closed"
    assert sc.ERROR_TYPE not in call.attributes and call.status.is_ok
