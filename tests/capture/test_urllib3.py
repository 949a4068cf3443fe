"""The urllib3/requests adapter (``otel_llm.capture.urllib3``): its helpers, what the pool,
connection, http.client and response hooks record on a call, how each way a body ends maps to an
end reason, and that non-model requests and failures inside otel_llm leave the application alone."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import urllib3
from urllib3.util import Retry

from otel_llm.capture import install
from otel_llm.capture import urllib3 as adapter
from otel_llm.capture.call import (
    CURRENT_CALL, END_CLOSED, END_EOF, END_ERROR, END_UNTRACED, CallRequest, LlmCall,
)
from otel_llm.capture.shared import flush_collected
from otel_llm.capture.record import TlsInfo
from otel_llm.parse import routes
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.fake_sink import CHAT, CHAT_PATH, MARK, NAME, STREAM
from otel_llm_testing.fake_sink import FakeSink as _Sink
from otel_llm_testing.model_server import ModelServer, Plan, PlanServer
from otel_llm_testing.net import free_port

SSE = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n',
       b"data: [DONE]\n\n"]


@pytest.fixture
def plan_server() -> Iterator[PlanServer]:
    server = PlanServer()
    yield server
    server.close()


def _call() -> LlmCall:
    request = CallRequest("POST", "http", NAME, None, CHAT_PATH, f"http://{NAME}{CHAT_PATH}", {}, b"{}")
    return LlmCall.open(_Sink(), routes.match_route(CHAT_PATH), request)  # type: ignore[arg-type]


@contextlib.contextmanager
def _current(call: LlmCall | None) -> Iterator[None]:
    token = CURRENT_CALL.set(call)
    try:
        yield
    finally:
        CURRENT_CALL.reset(token)


def _serve_once(answer: bytes) -> int:
    """A server on 127.0.0.1 that reads one request, writes ``answer`` verbatim and closes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)

    def serve() -> None:
        with server, contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=serve, name="serve-once", daemon=True).start()
    return int(server.getsockname()[1])



# -- helpers -------------------------------------------------------------------------------------
def test_open_builds_the_request_from_the_pool_and_copies_the_headers() -> None:
    sink = _Sink()
    app_headers = {"x-app": "1"}
    kwargs: dict[str, Any] = {"headers": app_headers, "preload_content": False}
    pool = urllib3.HTTPConnectionPool("::1", 8080)
    call = adapter._open(sink, pool, f"{CHAT_PATH}?api-version=2", ("post", f"{CHAT_PATH}?api-version=2", b"{}"),
                         kwargs, urllib3.HTTPHeaderDict)
    assert call is not None and sink.started == [call]
    request = call.request
    assert (request.method, request.scheme, request.host, request.port) == ("POST", "http", "::1", 8080)
    assert request.path == CHAT_PATH and request.url == f"http://[::1]:8080{CHAT_PATH}?api-version=2"
    assert request.body == b"{}"
    assert app_headers == {"x-app": "1"}  # the application's own dict is not touched
    assert isinstance(kwargs["headers"], urllib3.HTTPHeaderDict) and id(kwargs["headers"]) == id(request.headers)
    assert dict(kwargs["headers"]) == {"x-app": "1", MARK: "1"}
    assert (kwargs["method"], kwargs["url"], kwargs["body"]) == ("post", f"{CHAT_PATH}?api-version=2", b"{}")
    assert kwargs["preload_content"] is False  # what the caller named stays

    default_port = adapter._open(sink, urllib3.HTTPConnectionPool("example.test", 80), CHAT_PATH, (),
                                 {"method": "GET"}, urllib3.HTTPHeaderDict)
    assert default_port is not None and default_port.request.port is None
    assert default_port.request.url == f"http://example.test{CHAT_PATH}" and default_port.request.body == b""
    untouched: dict[str, Any] = {"headers": app_headers}
    assert adapter._open(sink, pool, "/v1/models", ("GET", "/v1/models"), untouched, urllib3.HTTPHeaderDict) is None
    assert untouched == {"headers": app_headers} and len(sink.started) == 2


def test_the_end_of_a_body_and_the_traced_response_class() -> None:
    assert adapter._at_end(SimpleNamespace(chunked=True, chunk_left=0))
    assert not adapter._at_end(SimpleNamespace(chunked=True, chunk_left=None))  # no chunk read yet
    assert not adapter._at_end(SimpleNamespace(chunked=True, chunk_left=12))
    assert adapter._at_end(SimpleNamespace(chunked=False, length_remaining=0))
    assert not adapter._at_end(SimpleNamespace(chunked=False, length_remaining=5))
    assert not adapter._at_end(SimpleNamespace(chunked=False, length_remaining=None))  # until the server closes

    class AppResponse(urllib3.HTTPResponse):
        pass

    traced = adapter._traced_class(AppResponse)
    assert adapter._traced_class(AppResponse) is traced  # made once per class
    assert issubclass(traced, AppResponse) and traced.__name__ == "AppResponse"
    assert traced.__mro__[1] is adapter._TracedResponse  # its reads are reached before urllib3's


def test_a_pool_wait_is_timed_only_when_a_blocking_pool_is_empty() -> None:
    def get_conn(timeout: float | None = None) -> str:
        return "connection"

    def timed(pool: urllib3.HTTPConnectionPool, call: LlmCall) -> bool:
        with _current(call):
            assert adapter._pool_wait(get_conn, pool, (), {"timeout": 1}) == "connection"
        t = call.timeline()
        return 0 < t.pool_start <= t.pool_end

    blocking = urllib3.HTTPConnectionPool("127.0.0.1", 1, maxsize=1, block=True)
    non_blocking = urllib3.HTTPConnectionPool("127.0.0.1", 1, maxsize=1, block=False)
    assert not timed(blocking, _call()) and not timed(non_blocking, _call())  # a connection slot is free
    assert blocking.pool is not None and non_blocking.pool is not None
    blocking.pool.get()
    non_blocking.pool.get()
    assert timed(blocking, _call())  # every slot taken: get_conn blocks until one comes back
    assert not timed(non_blocking, _call())  # a non-blocking pool makes a new connection at once


def test_create_connection_resolves_apart_and_tries_each_address(resolver: dict[str, list[str]]) -> None:
    attempts: list[Any] = []
    failures = {"10.0.0.7": socket.timeout("timed out"), "10.0.0.8": ConnectionRefusedError("refused")}

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> str:
        attempts.append((address, args, kwargs))
        if address[0] in failures:
            raise failures[address[0]]
        return f"socket to {address[0]}"

    resolver[NAME] = ["10.0.0.7", "10.0.0.7", "10.0.0.8", "127.0.0.1"]
    call = _call()
    with _current(call):
        result = adapter._create_connection(create_connection, None, ((NAME, 80), 2.0), {"socket_options": []})
    assert result == "socket to 127.0.0.1"  # a timeout and a refusal each move on, as urllib3 does
    assert attempts == [(("10.0.0.7", 80), (2.0,), {"socket_options": []}),
                        (("10.0.0.8", 80), (2.0,), {"socket_options": []}),
                        (("127.0.0.1", 80), (2.0,), {"socket_options": []})]
    assert resolver["asked"] == [NAME] and 0 < call.timeline().dns_start <= call.timeline().dns_end

    resolver[NAME] = ["10.0.0.7", "10.0.0.8"]
    with _current(_call()), pytest.raises(ConnectionRefusedError):  # the last address's error
        adapter._create_connection(create_connection, None, (), {"address": (NAME, 80), "timeout": 1})

    attempts.clear()
    resolver["asked"].clear()
    literal = _call()
    with _current(literal):
        adapter._create_connection(create_connection, None, (("[::1]", 80),), {})
    with _current(None):
        adapter._create_connection(create_connection, None, ((NAME, 80),), {})
    assert attempts == [(("[::1]", 80), (), {}), ((NAME, 80), (), {})]  # passed through as they came
    assert resolver["asked"] == [] and literal.timeline().dns_start == 0


def test_the_tls_handshake_is_marked_even_without_its_details() -> None:
    class SslSocket:
        def version(self) -> str:
            return "TLSv1.3"

        def cipher(self) -> tuple[str, str, int]:
            return ("TLS_AES_128_GCM_SHA256", "TLSv1.3", 128)

        def selected_alpn_protocol(self) -> str | None:
            return None

    call = _call()
    adapter._tls_done(call, SimpleNamespace(socket=SslSocket()))
    assert call.tls == TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", None) and call.timeline().tls_end > 0
    blind = _call()
    adapter._tls_done(blind, SimpleNamespace())  # a result without the socket urllib3 normally returns
    assert blind.tls == TlsInfo(None, None, None) and blind.timeline().tls_end > 0


# -- what a call records -------------------------------------------------------------------------
def test_a_streamed_call_records_each_step_in_order(model_server: ModelServer, sink: _Sink) -> None:
    url = model_server.url(f"{CHAT_PATH}?stream=1", host="localhost")
    with requests.post(url, json=STREAM, stream=True) as response:
        assert response.raw.__class__ is not urllib3.HTTPResponse
        assert adapter._CALL in vars(response.raw)
        pieces = list(response.iter_content(None))
        assert adapter._CALL not in vars(response.raw)  # ended: later reads record nothing
    record = sink.one()
    request = record.request
    assert (request.method, request.scheme, request.host, request.port) == ("POST", "http", "localhost",
                                                                            model_server.port)
    assert request.path == CHAT_PATH and request.url == url and sink.paths == [CHAT_PATH]
    assert request.body is not None and json.loads(request.body) == STREAM
    assert model_server.requests[-1].headers[MARK] == "1"
    assert MARK not in response.request.headers  # the application's prepared request is its own
    t = record.timeline
    # plain HTTP connects lazily, inside the request write: DNS and connect fall inside the upload
    steps = [t.start, t.upload_start, t.connect_start, t.dns_start, t.dns_end, t.connect_end, t.body_sent,
             t.headers, t.end]
    assert all(steps) and steps == sorted(steps), t
    assert t.tls_start == t.tls_end == t.pool_start == 0
    assert record.peer == ("127.0.0.1", model_server.port) and record.tls is None
    assert record.http_version == "1.1" and record.status == 200
    assert record.stream is not None and record.body is None
    assert record.stream.size == sum(map(len, pieces)) and record.stream.chunks == len(pieces)
    assert record.stream.token_events == 3 and record.end_reason == END_EOF


def test_the_pools_own_default_headers_are_copied(model_server: ModelServer, sink: _Sink) -> None:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", model_server.port, headers={"x-pool": "p"})
    response = pool.urlopen("POST", CHAT_PATH, body=json.dumps(CHAT).encode())
    assert response.status == 200 and json.loads(response.data)["choices"]
    assert dict(pool.headers) == {"x-pool": "p"}
    received = model_server.requests[-1].headers
    assert received["x-pool"] == "p" and received[MARK] == "1"
    record = sink.one()
    assert record.body is not None and json.loads(record.body) == json.loads(response.data)


# -- every way a body ends ---------------------------------------------------------------------
def _chunked_stream(url: str, plan_server: PlanServer) -> Any:
    plan_server.plans.append(Plan(200, [("content-type", "text/event-stream")], SSE))
    response = urllib3.request("POST", url.replace("PORT", str(plan_server.port)), json=STREAM,
                               preload_content=False)
    return list(response.stream(None))


def _preloaded(url: str, plan_server: PlanServer) -> Any:
    plan_server.plans.append(Plan(200, [("content-type", "application/json")], [b'{"choices": [],', b' "n": 1}'],
                                  chunked=False))
    return [urllib3.request("POST", url.replace("PORT", str(plan_server.port)), json=CHAT).data]


def _close_delimited(url: str, plan_server: PlanServer) -> Any:
    port = _serve_once(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                       + b"".join(SSE))
    response = urllib3.request("POST", url.replace("PORT", str(port)), json=STREAM, preload_content=False)
    return [block for block in iter(lambda: response.read(40), b"")]


def _released_early(url: str, plan_server: PlanServer) -> Any:
    plan_server.plans.append(Plan(200, [("content-type", "text/event-stream")], SSE * 20))
    response = urllib3.request("POST", url.replace("PORT", str(plan_server.port)), json=STREAM,
                               preload_content=False)
    first = response.read(10)
    response.release_conn()
    return [first]


@pytest.mark.parametrize(("read", "reason"), [
    pytest.param(_chunked_stream, END_EOF, id="chunked-stream"),
    pytest.param(_preloaded, END_EOF, id="preloaded-content-length"),
    pytest.param(_close_delimited, END_EOF, id="close-delimited"),
    pytest.param(_released_early, END_CLOSED, id="released-early"),
])
def test_each_way_a_body_ends(sink: _Sink, plan_server: PlanServer, read: Any, reason: str) -> None:
    got = read(f"http://127.0.0.1:PORT{CHAT_PATH}", plan_server)
    record = sink.one()
    assert record.end_reason == reason and record.exception is None and record.status == 200
    if record.stream is None:  # a whole answer: kept for parsing, as the application got it
        assert record.body == b"".join(got) == b'{"choices": [], "n": 1}'
        return
    assert record.stream.size == sum(map(len, got))  # what the application read, not what arrived
    if reason == END_EOF:
        assert b"".join(got) == b"".join(SSE) and record.stream.token_events == 2


def test_a_body_cut_short_ends_the_call_with_the_applications_error(sim: Any, sink: _Sink) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.0, token_interval=0.0)
    response = urllib3.request("POST", f"{sim.base_url}{CHAT_PATH}", json=STREAM, preload_content=False,
                               headers={"x-sim-abort-after-tokens": "3"})
    with pytest.raises(urllib3.exceptions.ProtocolError) as raised:
        for _ in response.stream(None):
            pass
    record = sink.one()
    assert record.end_reason == END_ERROR and record.exception is raised.value
    assert record.stream is not None and record.stream.token_events == 3


def test_retries_inside_urlopen_belong_to_one_call(sink: _Sink) -> None:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", free_port(), retries=Retry(connect=2, backoff_factor=0))
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        pool.urlopen("POST", CHAT_PATH, body=b"{}")
    assert len(sink.started) == 1 and sink.paths == [CHAT_PATH]  # three attempts, one path check
    record = sink.one()
    assert record.end_reason == END_ERROR and record.exception is raised.value
    assert record.timeline.connect_start > 0 and record.timeline.connect_end == record.timeline.headers == 0


# -- left alone --------------------------------------------------------------------------------
def test_requests_that_are_not_model_calls_are_left_alone(model_server: ModelServer, sink: _Sink) -> None:
    with requests.Session() as session:
        other = session.get(model_server.url("/v1/models?limit=1"))
        model_call = session.post(model_server.url(CHAT_PATH), json=CHAT)
    assert other.raw.__class__ is urllib3.HTTPResponse and adapter._CALL not in vars(other.raw)
    assert other.json()["data"][0]["id"] == "tiny-model"
    assert issubclass(model_call.raw.__class__, adapter._TracedResponse)
    assert sink.paths == ["/v1/models", CHAT_PATH]  # one path check each, without the query
    assert len(sink.started) == 1 and sink.one().request.path == CHAT_PATH
    assert MARK not in model_server.requests[0].headers and model_server.requests[1].headers[MARK] == "1"


# -- failures inside otel_llm ------------------------------------------------------------------
@pytest.mark.parametrize("fail_in", ["route", "call_started"])
def test_a_failing_sink_never_reaches_the_application(model_server: ModelServer, sink: _Sink, fail_in: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sink.fail_in = fail_in
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        response = requests.post(model_server.url(CHAT_PATH), json=STREAM)
    assert response.status_code == 200 and response.content.count(b"tok") == 3
    assert response.raw.__class__ is urllib3.HTTPResponse
    assert sink.started == [] and sink.records == [] and MARK not in model_server.requests[-1].headers
    assert any("starting a model-call trace failed" in r.getMessage() for r in caplog.records)


def _fail(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("capture bug")


def test_a_failure_recording_the_response_head_never_reaches_the_application(
        model_server: ModelServer, sink: _Sink, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(LlmCall, "response_started", _fail)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        response = requests.post(model_server.url(CHAT_PATH), json=STREAM)
        requests.post(model_server.url(CHAT_PATH), json=STREAM)
    assert response.status_code == 200 and response.content.count(b"tok") == 3
    logged = [r for r in caplog.records if "reading a model-call response head failed" in r.getMessage()]
    assert len(logged) == 1  # once, however often it fails
    assert len(sink.started) == 2
    gc.collect()
    assert flush_collected(5.0)
    # the head's details are lost; the call still ends with its body, not left in flight
    assert [(r.end_reason, r.exception) for r in sink.records] == [(END_EOF, None)] * 2


@pytest.mark.parametrize(("method", "logged"), [
    ("connect_started", "recording a model-call connection failed"),
    ("connected", "recording a model-call connection failed"),
    ("dns_started", "recording a model-call DNS lookup failed"),
    ("dns_done", "recording a model-call DNS lookup failed"),
    ("request_started", "recording a model-call request upload failed"),
    ("request_sent", "recording a model-call request upload failed"),
])
def test_a_failure_timing_a_phase_never_reaches_the_application(
        model_server: ModelServer, sink: _Sink, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        method: str, logged: str) -> None:
    monkeypatch.setattr(LlmCall, method, _fail)
    install.deactivate()  # patched again: the hooks hold the methods they call from the start
    install.activate(lambda: sink)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        response = requests.post(model_server.url(CHAT_PATH, host="localhost"), json=STREAM)
    assert response.status_code == 200 and response.content.count(b"tok") == 3
    assert any(logged in r.getMessage() for r in caplog.records)
    record = sink.one()  # the phase's mark is lost; the rest of the call is not
    assert record.end_reason == END_EOF and record.status == 200 and record.exception is None
    assert record.stream is not None and record.stream.token_events == 3


def test_a_response_whose_body_cannot_be_traced_still_ends_its_call(
        model_server: ModelServer, sink: _Sink, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(adapter, "_traced_class", _fail)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        response = requests.post(model_server.url(CHAT_PATH), json=STREAM)
    assert response.status_code == 200 and response.content.count(b"tok") == 3
    assert response.raw.__class__ is urllib3.HTTPResponse
    assert any("tracing a urllib3 response body failed" in r.getMessage() for r in caplog.records)
    record = sink.one()  # ended when urlopen returned it: nothing would end it later
    assert record.end_reason == END_UNTRACED and record.status == 200 and record.exception is None


# -- retries and redirects inside urlopen --------------------------------------------------------
_BUSY = Plan(503, [("content-type", "application/json")], [b'{"error": "busy"}'], chunked=False)
_STREAMED = Plan(200, [("content-type", "text/event-stream")], SSE)


def _assert_final_answer(sink: _Sink, body: bytes) -> None:
    assert body == b"".join(SSE)  # what the application got
    assert len(sink.started) == 1 and sink.paths == [CHAT_PATH]
    record = sink.one()
    assert record.status == 200 and record.response_headers["content-type"] == "text/event-stream"
    assert record.stream is not None and record.stream.token_events == 2 and record.stream.size == len(body)
    assert record.body is None and record.end_reason == END_EOF and record.exception is None
    t = record.timeline
    assert t.start < t.upload_start <= t.body_sent <= t.headers <= t.end  # the last attempt's


def test_a_status_retry_is_one_call_with_the_final_answer(plan_server: PlanServer, sink: _Sink) -> None:
    plan_server.plans += [_BUSY, _STREAMED]
    retry = Retry(total=2, status_forcelist=[503], allowed_methods=None, backoff_factor=0)
    with requests.Session() as session:
        session.mount("http://", requests.adapters.HTTPAdapter(max_retries=retry))
        response = session.post(plan_server.url(CHAT_PATH), json=STREAM)
    assert response.status_code == 200
    _assert_final_answer(sink, response.content)


def test_a_preloaded_status_retry_is_one_call_with_the_final_answer(plan_server: PlanServer, sink: _Sink) -> None:
    # urllib3 reads the 503's body in HTTPResponse.__init__, before urlopen decides to retry
    plan_server.plans += [_BUSY, _STREAMED]
    pool = urllib3.HTTPConnectionPool("127.0.0.1", plan_server.port)
    retry = Retry(total=2, status_forcelist=[503], allowed_methods=None, backoff_factor=0)
    response = pool.urlopen("POST", CHAT_PATH, body=json.dumps(STREAM).encode(), retries=retry)
    assert response.status == 200
    _assert_final_answer(sink, response.data)


def test_an_exhausted_status_retry_records_the_answer_returned(plan_server: PlanServer, sink: _Sink) -> None:
    plan_server.plans += [_BUSY, _BUSY]
    pool = urllib3.HTTPConnectionPool("127.0.0.1", plan_server.port)
    retry = Retry(total=1, status_forcelist=[503], allowed_methods=None, backoff_factor=0, raise_on_status=False)
    response = pool.urlopen("POST", CHAT_PATH, body=b"{}", retries=retry)
    assert response.status == 503 and response.data == b'{"error": "busy"}'
    record = sink.one()
    assert record.status == 503 and record.body == b'{"error": "busy"}' and record.end_reason == END_EOF

    plan_server.plans += [_BUSY, _BUSY]
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        pool.urlopen("POST", CHAT_PATH, body=b"{}", retries=Retry(total=1, status_forcelist=[503],
                                                                 allowed_methods=None, backoff_factor=0))
    record = sink.records[-1]
    assert len(sink.records) == 2 and record.end_reason == END_ERROR and record.exception is raised.value


@pytest.mark.parametrize("preload", [True, False], ids=["preloaded", "streamed"])
def test_a_redirect_followed_inside_urlopen_is_one_call_with_the_final_answer(
        plan_server: PlanServer, sink: _Sink, preload: bool) -> None:
    plan_server.plans += [Plan(307, [("location", CHAT_PATH), ("content-type", "text/html")], [b"<p>moved</p>"],
                               chunked=False), _STREAMED]
    pool = urllib3.HTTPConnectionPool("127.0.0.1", plan_server.port)
    response = pool.urlopen("POST", CHAT_PATH, body=json.dumps(STREAM).encode(), preload_content=preload)
    assert response.status == 200
    _assert_final_answer(sink, response.data)


def test_an_invalid_host_name_fails_as_it_does_without_instrumentation(sink: _Sink) -> None:
    with pytest.raises(urllib3.exceptions.LocationParseError) as raised:  # what urllib3 raises when not instrumented
        urllib3.request("POST", f"http://a..b{CHAT_PATH}", body=b"{}", retries=False)
    assert str(raised.value) == "Failed to parse: 'a..b', label empty or too long"
    record = sink.one()
    assert record.end_reason == END_ERROR and record.exception is raised.value
