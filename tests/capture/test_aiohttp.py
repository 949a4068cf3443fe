"""The aiohttp adapter (``otel_llm.capture.aiohttp``): its helpers, what the session, tracing-signal,
response and stream-reader hooks record on a call, how each way a response ends maps to an end
reason, and that non-model requests and failures inside otel_llm leave the application alone."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web

from otel_llm.capture import aiohttp as adapter
from otel_llm.capture.call import (
    END_CANCELLED, END_CLOSED, END_EOF, END_ERROR, END_UNTRACED, CallRequest, LlmCall,
)
from otel_llm.parse import routes
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.fake_sink import CHAT, CHAT_PATH, MARK, STREAM
from otel_llm_testing.fake_sink import FakeSink as _Sink
from otel_llm_testing.model_server import ModelServer
from otel_llm_testing.net import free_port



def _run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


@asynccontextmanager
async def _web(handlers: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]) -> AsyncIterator[str]:
    """A small aiohttp server on 127.0.0.1 (POST ``path`` -> handler); yields its base URL."""
    app = web.Application()
    for path, handler in handlers.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _call(body: bytes | None) -> LlmCall:
    request = CallRequest("POST", "http", "h", None, CHAT_PATH, f"http://h{CHAT_PATH}", {}, body)
    return LlmCall.open(_Sink(), routes.match_route(CHAT_PATH), request)  # type: ignore[arg-type]


# -- helpers -------------------------------------------------------------------------------------
def test_url_path_of_strings_and_urls() -> None:
    assert adapter._url_path(f"http://h:1{CHAT_PATH}?stream=1#x") == CHAT_PATH
    assert adapter._url_path(CHAT_PATH) == CHAT_PATH  # a session with a base_url gets relative ones
    assert adapter._url_path(yarl.URL(f"https://h/api%2Fv0{CHAT_PATH}?q")) == f"/api/v0{CHAT_PATH}"
    assert adapter._url_path(None) is None and adapter._url_path(b"/v1/chat/completions") is None


def test_the_body_is_what_aiohttp_will_send() -> None:
    session = SimpleNamespace(json_serialize=lambda obj: "custom:" + json.dumps(obj, separators=(",", ":")))
    assert adapter._body(session, {"json": {"a": 1}}) == b'custom:{"a":1}'  # the session's own serializer
    assert adapter._body(session, {"data": b"raw", "json": {"a": 1}}) == b"raw"  # data wins, as in aiohttp
    assert adapter._body(session, {"data": "t\u00e9xt"}) == "t\u00e9xt".encode()
    assert adapter._body(session, {}) == b""
    assert adapter._body(session, {"json": None}) == b""

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x"

    assert adapter._body(session, {"data": aiohttp.FormData({"k": "v"})}) is None  # not read
    assert adapter._body(session, {"data": chunks()}) is None


def test_the_session_trace_configs_gain_otel_llms_only_while_a_model_call_is_set_up() -> None:
    ours = object()

    class Session:
        _trace_configs = adapter._trace_configs_attribute(ours)

    session = Session()
    assert session._trace_configs == []  # none set yet
    own = [object()]
    session._trace_configs = own
    assert session._trace_configs is own
    pending = adapter._Pending(_Sink(), routes.match_route(CHAT_PATH), b"{}", True)
    token = adapter._PENDING.set(pending)
    try:
        during = session._trace_configs
        context = adapter._Context(trace_request_ctx="app")
    finally:
        adapter._PENDING.reset(token)
    assert during == [own[0], ours] and own == [own[0]]  # a new list; the application's is untouched
    assert context.otel_llm is pending and context.trace_request_ctx == "app"
    assert session._trace_configs is own and adapter._Context().otel_llm is None


@pytest.mark.parametrize(("body", "sent_with_headers"), [(b"", True), (b"{}", False), (None, False)])
def test_the_upload_ends_with_the_headers_only_when_there_is_no_body(body: bytes | None,
                                                                    sent_with_headers: bool) -> None:
    call = _call(body)
    adapter._headers_sent(call, SimpleNamespace(), None)
    t = call.timeline()
    assert t.upload_start > 0
    if sent_with_headers:
        assert t.body_sent >= t.upload_start
    else:
        assert t.body_sent == 0  # a body chunk ends the upload later (on_request_chunk_sent)


# -- what a call records -------------------------------------------------------------------------
def test_a_streamed_call_records_each_step_in_order(model_server: ModelServer, sink: _Sink) -> None:
    url = model_server.url(f"{CHAT_PATH}?stream=1", host="localhost")

    async def run() -> bytes:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=STREAM) as response:
                assert type(response.content).__name__ == "LlmStreamReader"
                return await response.read()

    data = _run(run())
    record = sink.one()
    request = record.request
    assert (request.method, request.scheme, request.host, request.port) == ("POST", "http", "localhost",
                                                                            model_server.port)
    assert request.path == CHAT_PATH and request.url == url and sink.paths == [CHAT_PATH]
    assert request.body == json.dumps(STREAM).encode()  # aiohttp's default serializer, byte for byte
    assert model_server.requests[-1].body == request.body and model_server.requests[-1].headers[MARK] == "1"
    t = record.timeline
    steps = [t.start, t.connect_start, t.dns_start, t.dns_end, t.connect_end, t.upload_start, t.body_sent,
             t.headers, t.end]
    assert all(steps) and steps == sorted(steps), t
    assert t.tls_start == t.tls_end == 0  # aiohttp has no TLS phase of its own (it is inside connect)
    assert record.peer == ("127.0.0.1", model_server.port) and record.tls is None
    assert record.http_version == "1.1" and record.status == 200
    assert record.stream is not None and record.stream.size == len(data) and record.stream.token_events == 3
    assert record.end_reason == END_EOF and record.exception is None


def test_a_redirect_is_one_call_with_the_final_answer(sink: _Sink) -> None:
    app_events: list[str] = []

    async def moved(request: web.Request) -> web.StreamResponse:
        await request.read()
        raise web.HTTPTemporaryRedirect(f"/final{CHAT_PATH}")

    async def final(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": [], "received": len(await request.read())})

    async def on_start(session: Any, ctx: Any, params: Any) -> None:
        app_events.append(f"start {params.url.path}")

    async def on_end(session: Any, ctx: Any, params: Any) -> None:
        app_events.append(f"end {params.response.status}")

    app_config = aiohttp.TraceConfig()
    app_config.on_request_start.append(on_start)
    app_config.on_request_end.append(on_end)

    async def run() -> tuple[dict[str, Any], Any]:
        async with _web({CHAT_PATH: moved, f"/final{CHAT_PATH}": final}) as base:
            async with aiohttp.ClientSession(trace_configs=[app_config]) as session:
                async with session.post(f"{base}{CHAT_PATH}", json=CHAT) as response:
                    answer = await response.json()
                return answer, session.__dict__["_trace_configs"]

    answer, configs = _run(run())
    assert answer["received"] == len(json.dumps(CHAT))  # the body went to the final hop too
    record = sink.one()
    assert len(sink.started) == 1 and record.status == 200 and record.end_reason == END_EOF
    assert record.request.path == CHAT_PATH  # what the application asked for
    assert record.body is not None and json.loads(record.body) == answer
    assert configs == [app_config]  # the application's configs, without otel_llm's
    assert app_events == [f"start {CHAT_PATH}", "end 200"]


# -- every way a response ends -----------------------------------------------------------------
async def _read_all(response: aiohttp.ClientResponse) -> list[bytes]:
    return [await response.read()]


async def _two_lines_then_release(response: aiohttp.ClientResponse) -> list[bytes]:
    return [await response.content.readline(), await response.content.readline()]


async def _chunked(response: aiohttp.ClientResponse) -> list[bytes]:
    return [piece async for piece in response.content.iter_chunked(7)]


async def _catch(response: aiohttp.ClientResponse) -> Any:
    try:
        await response.read()
    except aiohttp.ClientPayloadError as exc:
        return exc
    return None


@pytest.mark.parametrize(("read", "headers", "reason"), [
    pytest.param(_read_all, {}, END_EOF, id="read"),
    pytest.param(_chunked, {}, END_EOF, id="iter_chunked"),
    pytest.param(_two_lines_then_release, {"x-sim-tokens": "50", "x-sim-token-interval": "0.01"}, END_CLOSED,
                 id="early-release"),
    pytest.param(_catch, {"x-sim-abort-after-tokens": "3", "x-sim-token-interval": "0"}, END_ERROR,
                 id="cut-short"),
])
def test_each_way_a_response_ends(sim: Any, sink: _Sink, read: Callable[..., Awaitable[Any]],
                                  headers: dict[str, str], reason: str) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.0, token_interval=0.0)

    async def run() -> Any:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{sim.base_url}{CHAT_PATH}", json=STREAM, headers=headers) as response:
                return await read(response)

    got = _run(run())
    record = sink.one()
    assert record.end_reason == reason and record.status == 200 and record.stream is not None
    if reason == END_ERROR:
        assert isinstance(got, aiohttp.ClientPayloadError)  # what the application got, unchanged
        assert record.exception is got and record.stream.token_events == 3
        return
    assert record.exception is None
    assert record.stream.size == sum(map(len, got))  # what the application read, not what arrived
    if read is not _read_all:
        assert record.stream.chunks == len(got)  # each piece handed to the application, once
    if reason == END_EOF:
        assert record.stream.token_events == 5


def test_a_read_cancelled_while_waiting_ends_cancelled(sim: Any, sink: _Sink) -> None:
    async def run() -> None:
        headers_in = asyncio.Event()

        async def read(session: aiohttp.ClientSession) -> None:
            async with session.post(f"{sim.base_url}{CHAT_PATH}", json=STREAM,
                                    headers={"x-sim-first-token-delay": "5"}) as response:
                headers_in.set()
                async for _ in response.content.iter_any():
                    pass

        async with aiohttp.ClientSession() as session:
            task = asyncio.ensure_future(read(session))
            await asyncio.wait_for(headers_in.wait(), 5)
            await asyncio.sleep(0.05)  # now waiting inside the reader
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    _run(run())
    record = sink.one()
    assert record.end_reason == END_CANCELLED and isinstance(record.exception, asyncio.CancelledError)
    assert record.status == 200 and record.stream is not None and record.stream.token_events == 0


def test_a_refused_connection_ends_the_call_inside_connect(sink: _Sink) -> None:
    port = free_port()

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            await session.post(f"http://127.0.0.1:{port}{CHAT_PATH}", json=CHAT)

    with pytest.raises(aiohttp.ClientConnectorError) as raised:
        _run(run())
    record = sink.one()
    assert record.end_reason == END_ERROR and record.exception is raised.value
    t = record.timeline
    assert t.connect_start > 0 and t.connect_end == t.upload_start == t.headers == 0
    assert record.status == 0 and record.peer is None


def test_an_empty_body_ends_the_call_when_the_head_arrives(sink: _Sink) -> None:
    async def empty(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, body=b"", content_type="application/json")

    async def run() -> tuple[bool, bool]:
        async with _web({CHAT_PATH: empty}) as base:
            async with aiohttp.ClientSession() as session:
                response = await session.post(f"{base}{CHAT_PATH}", json=CHAT)
                ended_unread = sink.started[0].finished  # before the application read or released it
                body = await response.read()
                response.release()
                return ended_unread, body == b""

    assert _run(run()) == (True, True)
    record = sink.one()
    assert record.end_reason == END_EOF and record.body == b"" and record.status == 200


# -- left alone --------------------------------------------------------------------------------
def test_requests_that_are_not_model_calls_are_left_alone(model_server: ModelServer, sink: _Sink) -> None:
    async def run() -> tuple[Any, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.get(model_server.url("/v1/models?limit=1")) as response:
                plain = (type(response.content), response in adapter._RESPONSES, await response.json())
            async with session.post(model_server.url(CHAT_PATH), json=CHAT) as response:
                traced = (type(response.content), response in adapter._RESPONSES, await response.json())
            return plain, traced

    plain, traced = _run(run())
    assert plain[0] is aiohttp.StreamReader and plain[1] is False and plain[2]["data"][0]["id"] == "tiny-model"
    assert traced[0] is not aiohttp.StreamReader and traced[1] is True
    assert sink.paths == ["/v1/models", CHAT_PATH]  # one path check each, without the query
    assert len(sink.started) == 1 and sink.one().request.path == CHAT_PATH
    other, model_call = model_server.requests
    assert MARK not in other.headers and model_call.headers[MARK] == "1"


# -- failures inside otel_llm ------------------------------------------------------------------
def _stream_through(url: str) -> tuple[int, bytes]:
    async def run() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=STREAM) as response:
                return response.status, await response.read()

    return _run(run())  # type: ignore[no-any-return]


@pytest.mark.parametrize("fail_in", ["route", "call_started"])
def test_a_failing_sink_never_reaches_the_application(model_server: ModelServer, sink: _Sink, fail_in: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sink.fail_in = fail_in
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        status, body = _stream_through(model_server.url(CHAT_PATH))
    assert status == 200 and body.count(b"tok") == 3 and b"[DONE]" in body
    assert sink.started == [] and sink.records == [] and MARK not in model_server.requests[-1].headers
    assert any("starting a model-call trace failed" in r.getMessage() for r in caplog.records)


def _fail(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("capture bug")


@pytest.mark.parametrize(("method", "logged"), [("headers_received", "reading a model-call response head failed"),
                                                ("response_started", "wrapping a model-call response failed")])
def test_a_failure_recording_the_response_never_reaches_the_application(
        model_server: ModelServer, sink: _Sink, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        method: str, logged: str) -> None:
    monkeypatch.setattr(LlmCall, method, _fail)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        status, body = _stream_through(model_server.url(CHAT_PATH))
    assert status == 200 and body.count(b"tok") == 3 and b"[DONE]" in body
    assert any(logged in r.getMessage() for r in caplog.records)
    if method == "headers_received":  # the head's details are lost; the rest of the call is not
        record = sink.one()
        assert record.end_reason == END_EOF and record.status == 200 and record.http_version is None
        assert record.stream is not None and record.stream.size == len(body)


@pytest.mark.parametrize("fail_at", ["response_started", "watch", "reader"])
def test_a_call_whose_response_cannot_be_wrapped_still_ends(model_server: ModelServer, sink: _Sink,
                                                            monkeypatch: pytest.MonkeyPatch, fail_at: str) -> None:
    """``_response_started`` fails at its start, or part way (after registering the response, or
    its reader): the call ends as soon as the response is handed back (``untraced``, no error of
    the application pinned on it), not at process exit; what was registered is forgotten, so
    reading and releasing record nothing; the body reaches the application untouched."""
    if fail_at == "response_started":
        monkeypatch.setattr(LlmCall, "response_started", _fail)
    elif fail_at == "watch":
        monkeypatch.setattr(adapter, "watch", _fail)
    else:
        monkeypatch.setattr(adapter, "weakref", SimpleNamespace(finalize=_fail))
    ended_before_reading: list[int] = []

    async def run() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as session:
            async with session.post(model_server.url(CHAT_PATH), json=STREAM) as response:
                ended_before_reading.append(len(sink.records))
                assert response not in adapter._RESPONSES and id(response.content) not in adapter._READERS
                return response.status, await response.read()

    status, body = _run(run())
    assert status == 200 and body.count(b"tok") == 3 and b"[DONE]" in body
    assert ended_before_reading == [1] and len(sink.started) == 1
    record = sink.one()
    assert record.end_reason == END_UNTRACED and record.exception is None
    t = record.timeline
    assert 0 < t.upload_start <= t.headers <= t.end
    assert record.status == (0 if fail_at == "response_started" else 200)  # what the call had taken in
    assert record.stream is None or record.stream.size == 0  # no byte of the body recorded
