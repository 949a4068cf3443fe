"""The httpx/httpcore adapter (``otel_llm.capture.httpcore``): its helpers, what the wrapped
transports and the trace extension record on a call, how each way a response ends maps to an end
reason, and that non-model requests and failures inside otel_llm leave the application alone."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from typing import Any

import anyio
import httpcore
import httpx
import pytest

from otel_llm.capture import httpcore as adapter
from otel_llm.capture.call import (
    END_CANCELLED, END_CLOSED, END_EOF, END_ERROR, END_GC, END_UNTRACED, LlmCall,
)
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.fake_sink import CHAT, CHAT_PATH, MARK, STREAM
from otel_llm_testing.fake_sink import FakeSink as _Sink
from otel_llm_testing.model_server import ModelServer
from otel_llm_testing.net import free_port




def _inner_stream(response: httpx.Response) -> Any:
    """The transport's response stream, under the client's ``BoundSyncStream``."""
    return getattr(response.stream, "_stream", response.stream)


# -- helpers -------------------------------------------------------------------------------------
class _Stream:
    def __init__(self, **extra: Any) -> None:
        self.extra = extra

    def get_extra_info(self, name: str) -> Any:
        value = self.extra.get(name)
        if isinstance(value, BaseException):
            raise value
        return value


class _SslObject:
    def __init__(self, cipher: Any = ("TLS_AES_256_GCM_SHA384", "TLSv1.3", 256), fail: bool = False) -> None:
        self._cipher, self._fail = cipher, fail

    def version(self) -> str:
        if self._fail:
            raise OSError("socket closed")
        return "TLSv1.3"

    def cipher(self) -> Any:
        return self._cipher

    def selected_alpn_protocol(self) -> str:
        return "h2"


def test_peer_and_tls_details_are_read_from_the_stream_and_never_raise() -> None:
    assert adapter._peer_address(_Stream(server_addr=("127.0.0.1", 8080))) == ("127.0.0.1", 8080)
    assert adapter._peer_address(_Stream(server_addr=("::1", "443", 0, 0))) == ("::1", 443)  # IPv6: 4-tuple
    assert adapter._peer_address(_Stream()) is None  # a stream that does not know
    assert adapter._peer_address(_Stream(server_addr=OSError("closed"))) is None
    assert adapter._peer_address(None) is None

    assert adapter._tls_details(_Stream(ssl_object=_SslObject())) == ("TLSv1.3", "TLS_AES_256_GCM_SHA384", "h2")
    assert adapter._tls_details(_Stream(ssl_object=_SslObject(cipher=None))) == ("TLSv1.3", None, "h2")
    assert adapter._tls_details(_Stream()) == (None, None, None)  # plain TCP
    assert adapter._tls_details(_Stream(ssl_object=_SslObject(fail=True))) == (None, None, None)


def _chain(*excs: BaseException, context: bool = False) -> BaseException:
    """``excs[0]`` raised from ``excs[1]``, raised from ``excs[2]``..."""
    for outer, inner in zip(excs, excs[1:]):
        if context:
            outer.__context__ = inner
        else:
            outer.__cause__ = inner
    return excs[0]


def test_closed_here_finds_a_closed_resource_up_to_four_causes_deep() -> None:
    closed = anyio.ClosedResourceError
    assert adapter._closed_here(_chain(httpx.ReadError("r"), httpcore.ReadError("r"), closed()))
    assert adapter._closed_here(_chain(httpcore.ReadError("r"), closed(), context=True))
    assert adapter._closed_here(closed())
    assert not adapter._closed_here(_chain(httpx.ReadError("r"), httpcore.ReadError("r"), ConnectionResetError()))
    too_deep = _chain(*[httpx.ReadError(str(i)) for i in range(4)], closed())  # the fifth in the chain
    assert not adapter._closed_here(too_deep)


# -- what a call records -------------------------------------------------------------------------
def test_a_streamed_call_records_each_step_in_order(sim: Any, sink: _Sink) -> None:
    configure_sim(sim, tokens=4, first_token_delay=0.0, token_interval=0.0)
    sink.paths.clear()  # configuring the simulator went through httpx too
    with httpx.Client() as client:
        with client.stream("POST", f"{sim.base_url}{CHAT_PATH}?api-version=1", json=STREAM) as response:
            assert type(_inner_stream(response)).__name__ == "SyncLlmStream"
            pieces = list(response.iter_raw())
    record = sink.one()
    request = record.request
    assert (request.method, request.scheme, request.host, request.port) == ("POST", "http", "127.0.0.1", sim.port)
    assert request.path == CHAT_PATH and request.url.endswith("?api-version=1")
    assert sink.paths == [CHAT_PATH]  # one path check, without the query
    assert request.body is not None and json.loads(request.body) == STREAM
    t = record.timeline
    steps = [t.start, t.connect_start, t.connect_end, t.upload_start, t.body_sent, t.headers, t.end]
    assert all(steps) and steps == sorted(steps), t
    assert t.dns_start == t.dns_end == t.tls_start == t.tls_end == 0  # an IP literal over plain TCP
    assert record.peer == ("127.0.0.1", sim.port) and record.tls is None
    assert record.http_version == "HTTP/1.1" and record.status == 200
    assert record.response_headers["content-type"].startswith("text/event-stream")
    assert record.stream is not None and record.body is None
    assert record.stream.chunks == len(pieces) and record.stream.size == sum(map(len, pieces))
    assert record.stream.token_events == 4
    assert record.end_reason == END_EOF and record.exception is None


def test_an_answer_that_is_not_streamed_keeps_its_whole_body_async(sim: Any, sink: _Sink) -> None:
    configure_sim(sim, tokens=3, first_token_delay=0.0, token_interval=0.0)

    async def run() -> bytes:
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{sim.base_url}{CHAT_PATH}", json=CHAT)
            return response.content

    content = asyncio.run(run())
    record = sink.one()
    assert record.stream is None and record.body == content and b"usage" in content
    assert record.end_reason == END_EOF and record.status == 200
    t = record.timeline
    assert 0 < t.connect_start <= t.connect_end <= t.upload_start <= t.body_sent <= t.headers <= t.end


def test_the_header_the_sink_sets_is_sent_with_the_request(model_server: ModelServer, sink: _Sink) -> None:
    app_headers = {"x-app": "1"}
    with httpx.Client() as client:
        client.post(model_server.url(CHAT_PATH), json=CHAT, headers=app_headers)
        client.get(model_server.url("/v1/models"), headers=app_headers)
    model_call, other = model_server.requests
    assert model_call.headers[MARK] == "1" and model_call.headers["x-app"] == "1"
    assert MARK not in other.headers
    assert app_headers == {"x-app": "1"}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_application_trace_callback_still_gets_every_event(model_server: ModelServer, sink: _Sink,
                                                              is_async: bool) -> None:
    seen: list[str] = []
    url = model_server.url(CHAT_PATH)
    if is_async:
        async def trace_async(name: str, info: dict[str, Any]) -> None:
            seen.append(name)

        async def run() -> None:
            async with httpx.AsyncClient() as client:
                await client.post(url, json=STREAM, extensions={"trace": trace_async})

        asyncio.run(run())
    else:
        with httpx.Client() as client:
            client.post(url, json=STREAM, extensions={"trace": lambda name, info: seen.append(name)})
    for name in ("connection.connect_tcp.complete", "http11.send_request_headers.started",
                 "http11.receive_response_headers.complete", "http11.response_closed.complete"):
        assert name in seen, seen
    record = sink.one()
    t = record.timeline
    assert t.connect_end and t.upload_start and t.body_sent and t.headers  # the adapter's own hooks too
    assert record.stream is not None and record.stream.token_events == 3


def test_requests_that_are_not_model_calls_are_left_alone(model_server: ModelServer, sink: _Sink) -> None:
    with httpx.Client() as client:
        response = client.get(model_server.url("/v1/models"))
        assert "trace" not in response.request.extensions
        assert type(_inner_stream(response)).__name__ != "SyncLlmStream"
        assert response.json()["data"][0]["id"] == "tiny-model"
        traced = client.post(model_server.url(CHAT_PATH), json=CHAT)
        assert "trace" in traced.request.extensions
    assert sink.paths == ["/v1/models", CHAT_PATH]
    assert len(sink.started) == 1 and sink.one().request.path == CHAT_PATH


# -- every way a response ends -----------------------------------------------------------------
def _read_all(client: httpx.Client, url: str, headers: dict[str, str]) -> Any:
    with client.stream("POST", url, json=STREAM, headers=headers) as response:
        return list(response.iter_raw())


def _read_one_then_close(client: httpx.Client, url: str, headers: dict[str, str]) -> Any:
    with client.stream("POST", url, json=STREAM, headers=headers) as response:
        return [next(response.iter_raw())]


def _drop_unread(client: httpx.Client, url: str, headers: dict[str, str]) -> Any:
    response = client.send(client.build_request("POST", url, json=STREAM, headers=headers), stream=True)
    del response
    gc.collect()
    return []


def _catch(client: httpx.Client, url: str, headers: dict[str, str]) -> Any:
    try:
        return _read_all(client, url, headers)
    except httpx.HTTPError as exc:
        return exc


@pytest.mark.parametrize(("read", "headers", "reason"), [
    pytest.param(_read_all, {}, END_EOF, id="eof"),
    pytest.param(_read_one_then_close, {"x-sim-tokens": "50", "x-sim-token-interval": "0.01"}, END_CLOSED,
                 id="early-close"),
    pytest.param(_drop_unread, {"x-sim-tokens": "50", "x-sim-token-interval": "0.01"}, END_GC, id="dropped"),
    pytest.param(_catch, {"x-sim-abort-after-tokens": "3", "x-sim-token-interval": "0"}, END_ERROR, id="cut-short"),
])
def test_each_way_a_sync_response_ends(sim: Any, sink: _Sink, read: Any, headers: dict[str, str],
                                       reason: str) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.0, token_interval=0.0)
    with httpx.Client() as client:
        got = read(client, f"{sim.base_url}{CHAT_PATH}", headers)
    record = sink.one()
    assert record.end_reason == reason and record.status == 200
    if reason == END_ERROR:
        assert isinstance(got, httpx.RemoteProtocolError)  # what the application got, unchanged
        assert record.exception is got and record.stream is not None and record.stream.token_events == 3
        return
    assert record.exception is None and record.stream is not None
    assert record.stream.chunks == len(got)  # what the application pulled, not what arrived
    assert record.stream.size == sum(map(len, got))
    if reason == END_EOF:
        assert record.stream.token_events == 5


def test_a_refused_connection_ends_the_call_inside_connect(sink: _Sink) -> None:
    with httpx.Client() as client, pytest.raises(httpx.ConnectError) as raised:
        client.post(f"http://127.0.0.1:{free_port()}{CHAT_PATH}", json=CHAT)
    record = sink.one()
    assert record.end_reason == END_ERROR and record.exception is raised.value
    t = record.timeline
    assert t.connect_start > 0 and t.connect_end == t.upload_start == t.headers == 0
    assert record.status == 0 and record.peer is None


def test_an_async_read_cancelled_while_waiting_ends_cancelled(sim: Any, sink: _Sink) -> None:
    async def run() -> None:
        headers_in = asyncio.Event()

        async def read(client: httpx.AsyncClient) -> None:
            async with client.stream("POST", f"{sim.base_url}{CHAT_PATH}", json=STREAM,
                                     headers={"x-sim-first-token-delay": "5"}) as response:
                headers_in.set()
                async for _ in response.aiter_raw():
                    pass

        async with httpx.AsyncClient() as client:
            task = asyncio.ensure_future(read(client))
            await asyncio.wait_for(headers_in.wait(), 5)
            await asyncio.sleep(0.05)  # now waiting inside the stream's read
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    record = sink.one()
    assert record.end_reason == END_CANCELLED and isinstance(record.exception, asyncio.CancelledError)
    assert record.status == 200 and record.stream is not None and record.stream.token_events == 0


# -- failures inside otel_llm ------------------------------------------------------------------
@pytest.mark.parametrize("fail_in", ["route", "call_started"])
def test_a_failing_sink_never_reaches_the_application(model_server: ModelServer, sink: _Sink, fail_in: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sink.fail_in = fail_in
    with caplog.at_level(logging.WARNING, logger="otel_llm"), httpx.Client() as client:
        with client.stream("POST", model_server.url(CHAT_PATH), json=STREAM) as response:
            body = response.read()
    assert response.status_code == 200 and body.count(b"tok") == 3 and b"[DONE]" in body
    assert sink.started == [] and sink.records == []
    assert MARK not in model_server.requests[-1].headers
    assert any("starting a model-call trace failed" in r.getMessage() for r in caplog.records)


def _fail(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("capture bug")


def test_a_response_that_cannot_be_wrapped_still_reaches_the_application(
        model_server: ModelServer, sink: _Sink, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(LlmCall, "response_started", _fail)
    with caplog.at_level(logging.WARNING, logger="otel_llm"), httpx.Client() as client:
        with client.stream("POST", model_server.url(CHAT_PATH), json=STREAM) as response:
            assert type(_inner_stream(response)).__name__ != "SyncLlmStream"  # left as it was
            body = response.read()
    assert body.count(b"tok") == 3 and b"[DONE]" in body
    assert any("wrapping a model-call response failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fail_at", ["response_started", "stream"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_call_whose_response_cannot_be_wrapped_still_ends(model_server: ModelServer, sink: _Sink,
                                                            monkeypatch: pytest.MonkeyPatch, is_async: bool,
                                                            fail_at: str) -> None:
    """Wrapping fails before the call reads the head, or after (building the traced stream): the
    call ends as soon as the response is handed back (``untraced``, no error of the application
    pinned on it), not at process exit; the body reaches the application untouched."""
    if fail_at == "response_started":
        monkeypatch.setattr(LlmCall, "response_started", _fail)
    else:
        monkeypatch.setattr(adapter, "watch", _fail)  # the traced stream's constructor fails
    ended_before_reading: list[int] = []

    def before_reading(response: httpx.Response) -> None:
        ended_before_reading.append(len(sink.records))
        assert type(_inner_stream(response)).__name__ not in ("SyncLlmStream", "AsyncLlmStream")

    if is_async:
        async def run() -> bytes:
            async with httpx.AsyncClient() as client:
                async with client.stream("POST", model_server.url(CHAT_PATH), json=STREAM) as response:
                    before_reading(response)
                    return await response.aread()

        body = asyncio.run(run())
    else:
        with httpx.Client() as client:
            with client.stream("POST", model_server.url(CHAT_PATH), json=STREAM) as response:
                before_reading(response)
                body = response.read()
    assert body.count(b"tok") == 3 and b"[DONE]" in body
    assert ended_before_reading == [1] and len(sink.started) == 1
    record = sink.one()
    assert record.end_reason == END_UNTRACED and record.exception is None
    t = record.timeline
    assert 0 < t.upload_start <= t.headers <= t.end
    assert record.status == (200 if fail_at == "stream" else 0)  # what the call had taken in
    assert record.stream is None or record.stream.size == 0  # no byte of the body recorded

