"""The gateway's upstream client (``otel_llm.tools.gateway.upstream``) against real loopback servers.

The simulator (its own process) for real runtime answers and tracing; small asyncio servers
written here, whose answers each test scripts byte for byte, for the edge cases: chunked and
close-delimited bodies, connections the server drops, slow and huge bodies, malformed answers.
The gateway app itself is driven in-process (ASGI) where an error must become a status.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trustme
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

from otel_llm import semconv as sc
from otel_llm.tools.gateway.app import Gateway
from otel_llm.tools.gateway.settings import GatewayConfig, KeyPolicy
from otel_llm.tools.gateway.keys import digest_key, generate_key
from otel_llm.tools.gateway.server_telemetry import GatewayTelemetry
from otel_llm.tools.gateway.upstream import HIGH_WATER, Response, Upstream
from otel_llm.instrumentor import current_telemetry
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.model_server import ModelServer

CHAT = b"/v1/chat/completions"
JSON = [("content-type", "application/json")]
READ_SIZE = 256 * 1024  # the most asyncio reads from a socket at once


def no_telemetry() -> None:
    return None


def client(url: str, max_idle: int = 4, read_timeout: float = 10.0, traced: bool = False) -> Upstream:
    return Upstream(url, max_idle=max_idle, connect_timeout=5.0, read_timeout=read_timeout,
                    get_sink=current_telemetry if traced else no_telemetry)


async def read_all(response: Response) -> list[bytes]:
    try:
        return [piece async for piece in response]
    finally:
        response.close()


# -- a scripted loopback server ------------------------------------------------------------------
@dataclass
class Seen:
    connection: int
    head: bytes
    body: bytes

    def header(self, name: str) -> list[str]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        return [line.partition(":")[2].strip() for line in lines if line.partition(":")[0].lower() == name]


Answer = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter, Seen], Awaitable[bool]]


@dataclass
class Server:
    """HTTP/1.1 on loopback; ``answer`` writes each response and says whether to keep the
    connection for another request."""

    answer: Answer
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed: list[int] = field(default_factory=list)  # connections the client closed or dropped
    url: str = ""
    _server: Any = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                body = await reader.readexactly(int(length[1])) if length else b""
                seen = Seen(index, head, body)
                self.seen.append(seen)
                if not await self.answer(self, reader, writer, seen):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.append(index)
        finally:
            writer.close()


def fixed(*answers: bytes, keep: bool = True) -> Answer:
    """Answer the n-th request with ``answers[n]`` (the last one from then on)."""
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        writer.write(answers[min(len(server.seen), len(answers)) - 1])
        await writer.drain()
        return keep
    return answer


def ok(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def peer_closed(server: Server, connection: int, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while connection not in server.closed and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return connection in server.closed


# -- against the simulator ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(runtime="openai", tokens=5, token_interval=0.0, first_token_delay=0.0) as process:
        yield process


def test_sim_answers_whole_and_piece_by_piece_on_one_kept_alive_connection(sim: SimProcess) -> None:
    async def run() -> None:
        up = client(sim.base_url)
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        response = await up.request("POST", CHAT, JSON, json.dumps(chat).encode())
        assert response.status_code == 200 and response.reason == b"OK"
        answer = json.loads(b"".join(await read_all(response)))
        assert answer["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 tok4"
        (conn,) = up._idle
        response = await up.request("POST", CHAT, JSON, json.dumps({**chat, "stream": True}).encode())
        assert up._idle == []  # the same connection, in use again
        pieces = await read_all(response)
        assert up._idle == [conn]
        # each upstream chunk is its own piece, framing removed: role, 5 tokens, finish, [DONE]
        assert len(pieces) == 8 and all(p.startswith(b"data: ") and p.endswith(b"\n\n") for p in pieces)
        assert len(re.findall(rb'"content":" ?tok', b"".join(pieces))) == 5 and pieces[-1] == b"data: [DONE]\n\n"
        up.close()
        assert up._idle == []
    asyncio.run(run())


def _call_summary(otel: Otel) -> list[tuple[str, set[str], list[str], list[str]]]:
    summary = []
    for call in sorted(otel.calls(), key=lambda s: s.start_time):
        names = [s.name for s in otel.children(call)]
        synthesized = [s.name for s in otel.children(call, synthesized=True)]
        summary.append((call.name, set(call.attributes or {}), names, synthesized))
    return summary


@pytest.mark.parametrize("stream", [False, True])
def test_tracing_matches_the_httpx_hook(otel: Otel, stream: bool) -> None:
    """The same calls through httpx (traced by the core's hook) and through this client, on a new
    then a kept-alive connection: the same spans, attributes, phases and runtime spans."""
    with SimProcess(runtime="ollama", tokens=4, token_interval=0.01, first_token_delay=0.02) as ollama:
        body = json.dumps({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "a b"}]}).encode()

        async def run() -> None:
            async with httpx.AsyncClient() as http:
                await http.post(f"{ollama.base_url}/api/chat", content=body, headers=dict(JSON))  # loads the model
            otel.clear()
            async with httpx.AsyncClient() as http:
                for _ in range(2):
                    assert (await http.post(f"{ollama.base_url}/api/chat", content=body, headers=dict(JSON))).content
            up = client(ollama.base_url, traced=True)
            for _ in range(2):
                assert b"".join(await read_all(await up.request("POST", b"/api/chat", JSON, body)))
            up.close()

        asyncio.run(run())
    summary = _call_summary(otel)
    assert summary[2:] == summary[:2]
    assert summary[2][2][0] == "http.connect" and summary[3][2][0] == "http.upload"
    assert "llm.runtime.generation_tokens" in summary[2][1]
    calls = sorted(otel.calls(), key=lambda s: s.start_time)
    assert [c.attributes["llm.client.end_reason"] for c in calls] == ["eof"] * 4
    assert calls[2].attributes["network.peer.port"] == ollama.port
    assert [c.attributes["llm.client.connection_reused"] for c in calls] == [False, True] * 2


def test_trace_context_is_sent_upstream(otel: Otel) -> None:
    """A model call carries its own CLIENT span's context; any other route the current span's."""
    async def run() -> tuple[str, list[Seen]]:
        async with Server(fixed(ok(b'{"message": {"role": "assistant", "content": "x"}, "done": true}'))) as server:
            up = client(server.url, traced=True)
            await read_all(await up.request("POST", b"/api/chat", JSON, b'{"model": "m"}'))
            with otel.tracer_provider.get_tracer("test").start_as_current_span("outer") as outer:
                await read_all(await up.request("GET", b"/api/tags", [], b""))
                context = outer.get_span_context()
            up.close()
            assert format(context.span_id, "016x") in server.seen[1].header("traceparent")[0]
            return server.url, server.seen

    url, (first, second) = asyncio.run(run())
    (call,) = otel.calls()
    (traceparent,) = first.header("traceparent")
    assert traceparent.split("-")[2] == format(call.context.span_id, "016x")
    assert second.head.startswith(b"GET /api/tags HTTP/1.1\r\n") and second.header("content-length") == []
    assert first.header("content-length") == ["14"] and first.header("host") == [url.removeprefix("http://")]


def test_https_by_host_name_has_dns_connect_and_tls_phases(otel: Otel) -> None:
    """As the httpx path records them (tests/capture/test_tls.py): a new connection resolves, connects
    and shakes hands; the kept-alive one does none of it."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    body = json.dumps({"model": "tls-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]})

    async def run(url: str) -> None:
        up = Upstream(url, max_idle=2, connect_timeout=5.0, read_timeout=10.0, get_sink=current_telemetry,
                      ssl_context=client_context)
        for _ in range(2):
            assert b"tok0" in b"".join(await read_all(await up.request("POST", CHAT, JSON, body.encode())))
        up.close()

    with ModelServer(server_context, tokens=4, first_token_delay=0.02, token_interval=0.002) as server:
        asyncio.run(run(server.url(host="localhost")))
    calls = sorted(otel.calls(), key=lambda s: s.start_time)
    assert [[s.name for s in otel.children(c)] for c in calls] == [
        [sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN,
         sc.SPAN_DECODE],
        [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]]
    kids = {s.name: s for s in otel.children(calls[0])}
    assert kids[sc.SPAN_DNS].attributes[sc.DNS_QUESTION_NAME] == "localhost"
    assert kids[sc.SPAN_TLS].attributes[sc.TLS_PROTOCOL_VERSION] in ("TLSv1.2", "TLSv1.3")
    assert calls[0].attributes[sc.NETWORK_PEER_ADDRESS] == "127.0.0.1"


# -- framing --------------------------------------------------------------------------------------
def test_chunked_pieces_are_the_chunks_payloads_and_the_connection_is_reused() -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
               b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n")

    async def run() -> None:
        async with Server(fixed(chunked)) as server:
            up = client(server.url)
            for _ in range(2):
                response = await up.request("POST", CHAT, JSON, b"{}")
                assert (b"Transfer-Encoding", b"chunked") in response.headers
                assert await read_all(response) == [b"hello", b" world"]
            assert server.connections == 1 and len(server.seen) == 2
            up.close()
    asyncio.run(run())


def test_close_delimited_body_ends_at_eof_and_is_not_reused() -> None:
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"second")
        await writer.drain()
        return False  # and close

    async def run() -> None:
        async with Server(answer) as server:
            up = client(server.url)
            for _ in range(2):
                response = await up.request("GET", b"/v1/models", [], b"")
                assert b"".join(await read_all(response)) == b"first second"
                assert up._idle == []
            assert server.connections == 2
    asyncio.run(run())


def test_headers_keep_repeats_and_order() -> None:
    answer = ok(b"{}", "X-Dup: one", "Set-Cookie: a=1", "X-Dup: two")

    async def run() -> None:
        async with Server(fixed(answer)) as server:
            up = client(server.url)
            response = await up.request("GET", b"/v1/models", [("x-a", "1"), ("x-a", "2")], b"")
            assert [v for n, v in response.headers if n == b"X-Dup"] == [b"one", b"two"]
            await read_all(response)
            assert server.seen[0].header("x-a") == ["1", "2"]
            up.close()
    asyncio.run(run())


def test_head_and_interim_answers() -> None:
    answers = (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",  # HEAD: no body follows
               b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"final"))

    async def run() -> None:
        async with Server(fixed(*answers)) as server:
            up = client(server.url)
            response = await up.request("HEAD", b"/v1/models", [], b"")
            assert response.status_code == 200 and await read_all(response) == []
            response = await up.request("POST", CHAT, JSON, b"{}")
            assert response.status_code == 200 and b"".join(await read_all(response)) == b"final"
            up.close()
    asyncio.run(run())


# -- connections the server drops -----------------------------------------------------------------
def test_kept_alive_connection_closed_before_answering_is_retried_once() -> None:
    """The second request on a kept-alive connection finds it closed by the server (read, not
    answered): it is sent again on a new connection."""
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if len(server.seen) == 2:
            return False  # close without a word
        writer.write(ok(b"fine"))
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(answer) as server:
            up = client(server.url)
            for _ in range(2):
                assert b"".join(await read_all(await up.request("POST", CHAT, JSON, b"{}"))) == b"fine"
            assert server.connections == 2 and len(server.seen) == 3
            up.close()
    asyncio.run(run())


def test_idle_connection_closed_by_the_server_is_dropped_from_the_pool() -> None:
    async def run() -> None:
        async with Server(fixed(ok(b"fine"), keep=False)) as server:  # keep-alive promised, then closed
            up = client(server.url)
            for _ in range(3):
                assert b"".join(await read_all(await up.request("POST", CHAT, JSON, b"{}"))) == b"fine"
                for _ in range(50):
                    if not up._idle:
                        break
                    await asyncio.sleep(0.01)
                assert up._idle == []
            assert server.connections == 3 and len(server.seen) == 3
    asyncio.run(run())


def test_new_connection_closed_before_answering_is_an_error_not_retried() -> None:
    async def answer(server: Server, reader: Any, writer: Any, seen: Seen) -> bool:
        return False

    async def run() -> None:
        async with Server(answer) as server:
            up = client(server.url)
            with pytest.raises(httpx.RemoteProtocolError):
                await up.request("POST", CHAT, JSON, b"{}")
            assert len(server.seen) == 1
    asyncio.run(run())


def test_truncated_and_malformed_answers() -> None:
    async def run() -> None:
        async with Server(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..", keep=False)) as server:
            response = await client(server.url).request("POST", CHAT, JSON, b"{}")
            pieces = []
            with pytest.raises(httpx.RemoteProtocolError):
                async for piece in response:
                    pieces.append(piece)
            assert pieces == [b"only ten.."]
        async with Server(fixed(b"HTTP/1.1 2x0 OK\r\n\r\n")) as server:
            with pytest.raises(httpx.RemoteProtocolError):
                await client(server.url).request("POST", CHAT, JSON, b"{}")
    asyncio.run(run())


# -- time -----------------------------------------------------------------------------------------
def test_slow_body_arrives_piece_by_piece() -> None:
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for index in range(3):
            await asyncio.sleep(0.05)
            writer.write(b"1\r\n%d\r\n" % index)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        return True

    async def run() -> None:
        async with Server(answer) as server:
            response = await client(server.url).request("POST", CHAT, JSON, b"{}")
            arrivals = []
            async for piece in response:
                arrivals.append((time.monotonic(), piece))
            assert [piece for _, piece in arrivals] == [b"0", b"1", b"2"]
            gaps = [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]
            assert all(gap > 0.03 for gap in gaps), gaps
    asyncio.run(run())


def test_read_timeout_before_the_head_and_within_the_body() -> None:
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        if len(server.seen) == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.")
        await asyncio.sleep(1.0)
        return False

    async def run() -> None:
        async with Server(answer) as server:
            up = client(server.url, read_timeout=0.2)
            started = time.monotonic()
            with pytest.raises(httpx.ReadTimeout):
                await up.request("POST", CHAT, JSON, b"{}")
            assert time.monotonic() - started < 0.8
            response = await up.request("POST", CHAT, JSON, b"{}")
            with pytest.raises(httpx.ReadTimeout):
                await read_all(response)
            assert up._idle == []
    asyncio.run(run())


BIG_SIZE = 64 * 1024 * 1024  # well beyond what the kernel buffers on loopback
PATTERN = bytes(range(256)) * 4096  # 1 MiB


async def _big_answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
    """BIG_SIZE bytes of PATTERN, written as fast as the client takes them; a mark in ``seen`` once
    all of it was written."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG_SIZE)
    for _ in range(BIG_SIZE // len(PATTERN)):
        writer.write(PATTERN)
        await writer.drain()
    server.seen.append(Seen(-1, b"all written", b""))
    return True


def test_slow_reader_pauses_the_upstream_instead_of_buffering() -> None:
    size, pattern = BIG_SIZE, PATTERN

    async def run() -> None:
        async with Server(_big_answer) as server:
            up = client(server.url)
            response = await up.request("POST", CHAT, JSON, b"{}")
            conn = response._conn
            assert conn is not None
            await asyncio.sleep(0.3)  # a downstream client that does not read
            assert conn.paused and conn.buffered <= HIGH_WATER + READ_SIZE, conn.buffered
            assert len(server.seen) == 1, "the server could write everything: nothing held it back"
            received = bytearray()
            async for piece in response:
                received += piece
            assert len(received) == size and bytes(received[:len(pattern)]) == pattern
            assert received[-len(pattern):] == pattern
            assert up._idle == [conn] and not conn.paused
            up.close()
    asyncio.run(run())


# -- leaving early --------------------------------------------------------------------------------
async def _endless(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
    while True:
        frame = b'data: {"response": "tok"}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        await writer.drain()
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("how", ["iterated", "relayed"])
def test_cancelled_relay_closes_the_upstream_connection(otel: Otel, how: str) -> None:
    """Cancelled while reading the answer, piece by piece or relayed from the connection's
    callback (``Response.relay``): the upstream is closed at once and the call ends cancelled."""
    async def run() -> None:
        async with Server(_endless) as server:
            up = client(server.url, traced=True)

            async def relay() -> None:
                response = await up.request("POST", b"/api/generate", JSON, b'{"model": "m", "prompt": "x"}')
                if how == "relayed":
                    await response.relay(lambda piece: True, _no_wait)
                    return
                try:
                    async for _ in response:
                        pass
                finally:
                    response.close()

            task = asyncio.ensure_future(relay())
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await peer_closed(server, 0), "the upstream kept streaming to nobody"
            assert up._idle == []
    asyncio.run(run())
    (call,) = otel.calls()
    assert call.attributes["llm.client.end_reason"] == "cancelled"
    assert call.attributes["llm.client.chunks"] >= 3


def test_closing_an_unfinished_answer_closes_its_connection() -> None:
    async def run() -> None:
        async with Server(_endless) as server:
            up = client(server.url)
            response = await up.request("POST", CHAT, JSON, b"{}")
            async for _ in response:
                break
            response.close()
            assert up._idle == [] and await peer_closed(server, 0)
    asyncio.run(run())


def test_pool_is_bounded_and_reuses_the_last_returned_connection_first() -> None:
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        await asyncio.sleep(0.05)
        writer.write(ok(b"%d" % seen.connection))
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(answer) as server:
            up = client(server.url, max_idle=2)
            responses = await asyncio.gather(*(up.request("GET", b"/v1/models", [], b"") for _ in range(4)))
            assert server.connections == 4
            for response in responses:
                await read_all(response)
            assert len(up._idle) == 2  # two of the four were closed, not kept
            last = up._idle[-1]
            again = await up.request("GET", b"/v1/models", [], b"")
            assert again._conn is last and server.connections == 4
            await read_all(again)
            up.close()
    asyncio.run(run())


# -- errors through the gateway -------------------------------------------------------------------
async def through_gateway(upstream: str, read_timeout: float = 10.0,
                          tracer_provider: Any = None) -> list[dict[str, Any]]:
    """One chat call to an in-process gateway in front of ``upstream``: the ASGI messages sent."""
    key = generate_key()
    config = GatewayConfig(upstream=upstream, keys=(KeyPolicy("k", digest_key(key)),), access_log="off",
                           upstream_timeout=read_timeout)
    app = Gateway(config, GatewayTelemetry(tracer_provider or NoOpTracerProvider(), NoOpMeterProvider()))
    app._client = app._new_client()
    body = b'{"model": "m", "messages": []}'
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": CHAT,
             "query_string": b"", "scheme": "http", "http_version": "1.1", "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8080),
             "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-length", b"%d" % len(body))]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await never.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        await app(scope, receive, send)
    finally:
        await app.aclose()
    return sent


def _status_and_json(sent: list[dict[str, Any]]) -> tuple[int, Any]:
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_upstream_errors_become_502_and_504() -> None:
    async def silent(server: Server, reader: Any, writer: Any, seen: Seen) -> bool:
        await asyncio.sleep(1.0)
        return False

    async def run() -> None:
        async with Server(fixed(b"HTTP/1.1 2x0 OK\r\n\r\n")) as server:
            status, error = _status_and_json(await through_gateway(server.url))
            assert status == 502 and error["error"]["message"] == "the model server is unreachable"
        async with Server(fixed(b"")) as server:
            url = server.url
        status, error = _status_and_json(await through_gateway(url))  # nothing listens there any more
        assert status == 502
        async with Server(silent) as server:
            status, error = _status_and_json(await through_gateway(server.url, read_timeout=0.2))
            assert status == 504 and error["error"]["message"] == "the model server did not answer in time"
        async with Server(fixed(ok(b'{"ok": true}', "Set-Cookie: s=1"))) as server:
            sent = await through_gateway(server.url)
            assert _status_and_json(sent) == (200, {"ok": True})
            assert b"set-cookie" not in dict(sent[0]["headers"]) and sent[-1]["more_body"] is False
    asyncio.run(run())


def test_an_answer_cut_short_is_not_completed_downstream() -> None:
    """Too late for a status: the relay raises (the server then drops the connection), and never
    sends the closing message that would make the answer look complete."""
    async def run() -> None:
        async with Server(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..", keep=False)) as server:
            with pytest.raises(httpx.RemoteProtocolError):
                await through_gateway(server.url)
    asyncio.run(run())


def test_gateway_span_tree_of_a_failed_call() -> None:
    """The SERVER span and its children, built at the end for the SDK tracer: linked, timed in
    order, and an upstream failure marked as such."""
    otel = make_otel()

    async def run() -> None:
        async with Server(fixed(b"")) as server:
            url = server.url
        assert (await through_gateway(url, tracer_provider=otel.tracer_provider))[0]["status"] == 502

    asyncio.run(run())
    spans = {span.name: span for span in otel.spans()}
    assert set(spans) == {"POST /v1/chat/completions", sc.SPAN_GATEWAY_AUTH, sc.SPAN_GATEWAY_QUEUE}
    server = spans["POST /v1/chat/completions"]
    auth, queue = spans[sc.SPAN_GATEWAY_AUTH], spans[sc.SPAN_GATEWAY_QUEUE]
    assert server.kind == SpanKind.SERVER and server.parent is None
    assert auth.parent == queue.parent == server.context
    assert server.start_time <= auth.start_time <= auth.end_time <= queue.start_time <= queue.end_time
    assert queue.end_time <= server.end_time
    assert server.status.status_code == StatusCode.ERROR and server.status.description == "ConnectError"
    assert server.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 502
    assert server.attributes[sc.LLM_GATEWAY_OUTCOME] == "upstream_error"
    assert queue.attributes[sc.LLM_GATEWAY_QUEUE_DEPTH] == 0


# -- relayed from the connection's callback (Response.relay) -------------------------------------
async def _no_wait() -> None:
    return None


def _chunked(*pieces: tuple[float, bytes]) -> Answer:
    """A chunked answer: each piece after its delay (seconds), then the last chunk."""
    async def answer(server: Server, reader: Any, writer: asyncio.StreamWriter, seen: Seen) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        await writer.drain()
        for delay, piece in pieces:
            await asyncio.sleep(delay)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
    return answer


def test_relay_hands_each_piece_over_as_it_arrives_and_reuses_the_connection() -> None:
    async def run() -> None:
        async with Server(_chunked((0.0, b"a"), (0.05, b"bb"), (0.05, b"ccc"))) as server:
            up = client(server.url)
            response = await up.request("POST", CHAT, JSON, b"{}")
            conn = response._conn
            arrivals: list[tuple[float, bytes]] = []

            def write(piece: bytes) -> bool:
                arrivals.append((time.monotonic(), piece))
                return True
            waited = await response.relay(write, _no_wait)
            assert [piece for _, piece in arrivals] == [b"a", b"bb", b"ccc"] and waited == 0
            gaps = [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]
            assert all(gap > 0.03 for gap in gaps), gaps  # not gathered: each piece when it came
            assert up._idle == [conn] and conn is not None and conn.forward is None
            again = await up.request("POST", CHAT, JSON, b"{}")
            assert again._conn is conn and b"".join(await read_all(again)) == b"abbccc"
            up.close()
    asyncio.run(run())


def test_relay_times_out_on_silence_not_on_a_long_answer() -> None:
    """The read timeout is silence since the last piece: an answer longer than the timeout whose
    pieces keep coming passes; a pause longer than it fails, and the connection is not reused."""
    steady = [(0.1, b"x")] * 8  # 0.8 s in all, never 0.25 s quiet
    stall = [(0.0, b"x"), (0.6, b"late")]

    async def run() -> None:
        for pieces, fails in ((steady, False), (stall, True)):
            async with Server(_chunked(*pieces)) as server:
                up = client(server.url, read_timeout=0.25)
                response = await up.request("POST", CHAT, JSON, b"{}")
                got: list[bytes] = []
                started = time.monotonic()
                if fails:
                    with pytest.raises(httpx.ReadTimeout):
                        await response.relay(lambda piece: got.append(piece) is None, _no_wait)
                    assert got == [b"x"] and time.monotonic() - started < 0.55 and up._idle == []
                else:
                    await response.relay(lambda piece: got.append(piece) is None, _no_wait)
                    assert got == [b"x"] * 8 and len(up._idle) == 1
                up.close()
    asyncio.run(run())


def test_relay_pauses_the_upstream_while_the_caller_side_is_full() -> None:
    """``write`` saying False stops reading until ``drained()`` returns: the server cannot write
    everything meanwhile, and every byte still arrives in order; the wait is returned."""
    size, pattern = BIG_SIZE, PATTERN

    async def run() -> None:
        async with Server(_big_answer) as server:
            up = client(server.url)
            response = await up.request("POST", CHAT, JSON, b"{}")
            received = bytearray()
            full = asyncio.Event()
            stalled: list[int] = []

            def write(piece: bytes) -> bool:
                received.extend(piece)
                return full.is_set()

            async def drained() -> None:
                stalled.append(len(server.seen))  # what the server could write while we did not read
                await asyncio.sleep(0.2)
                full.set()  # from now on the caller keeps up

            waited = await response.relay(write, drained)
            assert stalled == [1], "the server could write everything: nothing held it back"
            assert len(received) == size and bytes(received[:len(pattern)]) == pattern
            assert waited >= 0.15e9
            assert len(up._idle) == 1 and not up._idle[0].congested
            up.close()
    asyncio.run(run())


def test_relay_of_an_answer_cut_short_raises_after_what_arrived() -> None:
    async def run() -> None:
        async with Server(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..", keep=False)) as server:
            up = client(server.url)
            response = await up.request("POST", CHAT, JSON, b"{}")
            got: list[bytes] = []
            with pytest.raises(httpx.RemoteProtocolError):
                await response.relay(lambda piece: got.append(piece) is None, _no_wait)
            assert got == [b"only ten.."] and up._idle == []
    asyncio.run(run())


def test_the_direct_relay_is_taken_only_behind_uvicorns_chunked_response() -> None:
    """The gateway writes a stream's pieces itself only through uvicorn's response cycle once it
    sent a chunked head; any other ``send`` (another server, a test's) gets ASGI messages. The
    names it relies on are uvicorn's own: an upgrade that renamed them would fall back, silently
    dearer, so they are checked against uvicorn's source here."""
    import inspect

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from otel_llm.tools.gateway.app import _chunked_cycle

    source = inspect.getsource(RequestResponseCycle.__init__)
    for name in ("transport", "flow", "disconnected", "chunked_encoding", "response_complete"):
        assert re.search(rf"self\.{name}\b[^=\n]*=", source), name
    assert hasattr(FlowControl, "drain") and "self.write_paused" in inspect.getsource(FlowControl.__init__)

    class Flow:
        write_paused = False

        async def drain(self) -> None:
            return None

    class Cycle:
        chunked_encoding: bool | None = True
        response_complete = False
        transport = object()
        flow = Flow()
        disconnected = False

        async def send(self, message: dict[str, Any]) -> None:
            return None

    cycle = Cycle()
    assert _chunked_cycle(cycle.send) is cycle
    cycle.chunked_encoding = None  # a Content-Length answer, or HEAD
    assert _chunked_cycle(cycle.send) is None

    async def plain_send(message: dict[str, Any]) -> None:
        return None
    assert _chunked_cycle(plain_send) is None
