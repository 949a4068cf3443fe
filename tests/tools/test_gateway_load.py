"""The gateway under load and in time: streams pass through unbuffered and unaltered, admission
limits hold with 200 concurrent clients, and a client that leaves stops the runtime's work.

Everything runs as real processes on loopback: the simulator (``SimProcess``), the gateway
(``GatewayProcess``, the real CLI on uvicorn) and this test as the client. The simulator's text is
deterministic ("tok0", " tok1", ...), so every stream's exact content is known in advance.

Timing is judged relative to the same calls made directly to the simulator, side by side with
the calls through the gateway, by a raw-socket client (no HTTP library between the wire and the
clock). Tolerances are for a shared, noisy 2-core machine; speed goals live in
``benchmarks/gateway.py``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm.tools.sim import SimProcess

# Every test here judges time, overlap or a deadline (the module is about the gateway in time), so
# all are timing (rerun on failure): on a shared 2-core machine one bad scheduling moment is not a
# regression.
pytestmark = pytest.mark.timing

CHAT = "/v1/chat/completions"
PROMPT = [{"role": "user", "content": "one two three"}]


def piece(index: int) -> str:
    """The simulator's token ``index``: "tok0", " tok1", " tok2", ..."""
    return f"tok{index}" if index == 0 else f" tok{index}"


def expected_text(tokens: int) -> str:
    return "".join(piece(i) for i in range(tokens))


# -- a raw HTTP/1.1 client that timestamps every chunk ------------------------------------------
@dataclass
class Answer:
    """One response as it arrived; times are seconds after the request was written."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    head_at: float = 0.0  # first byte of the response
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (arrived, payload) per HTTP chunk
    end_at: float = 0.0  # the response was complete

    @property
    def body(self) -> bytes:
        return b"".join(payload for _, payload in self.chunks)


class RawConnection:
    """One kept-alive connection (TCP_NODELAY); chunked bodies are parsed chunk by chunk, so chunk
    boundaries are the sender's, whatever TCP did to the segments."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.extra = dict(headers or {})
        self.sock = socket.create_connection((self.host, self.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, body: dict[str, Any], headers: dict[str, str] | None = None, path: str = CHAT) -> float:
        payload = json.dumps(body).encode()
        fields = {"host": f"{self.host}:{self.port}", "content-type": "application/json",
                  "content-length": str(len(payload)), **self.extra, **(headers or {})}
        head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
        self.sock.sendall(head.encode() + payload)
        return time.perf_counter()

    def _fill(self, sent: float) -> float:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data
        return time.perf_counter() - sent

    def events(self, sent: float) -> Iterator[tuple[str, float, Any]]:
        """("head", t, (status, headers)), then ("chunk", t, payload)..., then ("end", t, None)."""
        now = self._fill(sent)
        first = now
        while b"\r\n\r\n" not in self.buf:
            now = self._fill(sent)
        raw_head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        yield "head", first, (int(lines[0].split()[1]), headers)
        if "chunked" not in headers.get("transfer-encoding", ""):
            length = int(headers.get("content-length", "0"))
            while len(self.buf) < length:
                now = self._fill(sent)
            body, self.buf = self.buf[:length], self.buf[length:]
            if body:
                yield "chunk", now, body
            yield "end", now, None
            return
        while True:
            while (end := self.buf.find(b"\r\n")) < 0:
                now = self._fill(sent)
            size = int(self.buf[:end].split(b";")[0], 16)
            need = end + 2 + size + 2  # size line, data, CRLF (the last chunk: no trailers here)
            while len(self.buf) < need:
                now = self._fill(sent)
            payload, self.buf = self.buf[end + 2:end + 2 + size], self.buf[need:]
            if size == 0:
                yield "end", now, None
                return
            yield "chunk", now, payload

    def request(self, body: dict[str, Any], headers: dict[str, str] | None = None, path: str = CHAT) -> Answer:
        sent = self.send(body, headers, path)
        answer = Answer()
        for kind, at, value in self.events(sent):
            if kind == "head":
                answer.head_at, (answer.status, answer.headers) = at, value
            elif kind == "chunk":
                answer.chunks.append((at, value))
            else:
                answer.end_at = at
        return answer


# -- the stream's content -------------------------------------------------------------------------
def sse_frames(data: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body; anything else (a torn frame) fails."""
    text = data.decode("utf-8")
    assert text.endswith("\n\n"), f"the stream does not end with a complete frame: {text[-80:]!r}"
    frames = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, f"malformed frame {block[:120]!r}"
        frames.append(block[len("data: "):])
    return frames


def check_chat_stream(data: bytes, tokens: int) -> None:
    """Exactly the simulator's OpenAI stream of ``tokens`` tokens: role, tokens, finish, [DONE]."""
    frames = sse_frames(data)
    assert frames[-1] == "[DONE]", frames[-3:]
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert len({chunk["id"] for chunk in chunks}) == 1, "frames of different streams mixed"
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0].get("role") == "assistant" and not deltas[0].get("content")
    content = [delta.get("content") for delta in deltas[1:-1]]
    assert content == [piece(i) for i in range(tokens)]
    assert "".join(content) == expected_text(tokens)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and deltas[-1] == {}


def token_times(answer: Answer) -> list[float]:
    """Arrival time of each chunk that carries a generated token (one frame per chunk)."""
    times = []
    for at, payload in answer.chunks:
        for frame in sse_frames(payload):
            if frame != "[DONE]" and json.loads(frame)["choices"][0]["delta"].get("content"):
                times.append(at)
    return times


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def _sim() -> Iterator[SimProcess]:
    with SimProcess(runtime="openai") as sim:
        yield sim


@pytest.fixture
def sim(_sim: SimProcess) -> SimProcess:
    _sim.reset()
    return _sim


@pytest.fixture
def start_gateway(sim: SimProcess, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """``start_gateway(**settings)``: a gateway in front of the simulator, stopped after the test."""
    started: list[GatewayProcess] = []
    env = {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
           "OTEL_LLM_TRACES_FILE": str(tmp_path / "traces.jsonl")}

    def start(**settings: Any) -> GatewayProcess:
        gateway = GatewayProcess(sim.base_url, env=env, **settings).start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


def access_records(gateway: GatewayProcess, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The access log once it has ``count`` lines (lines are written when a request ends)."""
    records = wait_for(lambda: len(gateway.access_records()) >= count, timeout) and gateway.access_records()
    assert records and len(records) == count, gateway.access_records()
    return records


def wait_for(condition: Callable[[], Any], timeout: float, step: float = 0.02) -> Any:
    """Poll until ``condition()`` is truthy; its last value (falsy on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


# -- a. timing through the gateway equals timing without it ---------------------------------------
TOKENS, INTERVAL = 12, 0.04


def side_by_side(sim: SimProcess, gateway: GatewayProcess, body: dict[str, Any],
                 rounds: int) -> dict[str, list[Answer]]:
    """``rounds`` pairs of the same call, one directly and one through the gateway, started
    together (each over its own kept-alive connection, after a warm-up pair).

    Side by side rather than one after the other: on this VM, code that runs after its process
    slept runs many times slower, the longer the sleep the slower (~2 ms for 50 us of Python after
    40 ms asleep, ~15 ms after 500 ms). One after the other, each call would start after the
    other path's whole stream asleep; run together, both paths see the same machine."""
    connections = {"direct": RawConnection(sim.base_url), "gateway": RawConnection(gateway.url, gateway.headers())}
    calls: dict[str, list[Answer]] = {"direct": [], "gateway": []}
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for index in range(rounds + 1):
                start = threading.Barrier(2)

                def call(connection: RawConnection, start: threading.Barrier = start) -> Answer:
                    start.wait(10)
                    return connection.request(body)

                futures = {name: pool.submit(call, connection) for name, connection in connections.items()}
                for name, future in futures.items():
                    answer = future.result(60)
                    if index:
                        calls[name].append(answer)
    finally:
        for connection in connections.values():
            connection.close()
    return calls


def timing_figures(calls: dict[str, list[Answer]]) -> dict[str, Any]:
    """Token-frame gaps per call, and the added delay (ms) of first byte, first token and
    completion through the gateway (median over the pairs)."""
    gaps = {name: [[b - a for a, b in zip(times, times[1:])] for times in map(token_times, answers)]
            for name, answers in calls.items()}

    def added_ms(moment: Callable[[Answer], float]) -> float:  # median over the pairs
        return statistics.median(moment(g) - moment(d) for g, d in zip(calls["gateway"], calls["direct"])) * 1e3

    return {
        "gaps": gaps,
        "gap_differences": [abs(g - d) for gw_gaps, d_gaps in zip(gaps["gateway"], gaps["direct"])
                            for g, d in zip(gw_gaps, d_gaps)],
        "first_byte": added_ms(lambda a: a.head_at),
        "first_token": added_ms(lambda a: token_times(a)[0]),
        "complete": added_ms(lambda a: a.end_at),
    }


@pytest.mark.slow
def test_chunk_timing_matches_direct(sim: SimProcess, start_gateway: Callable[..., GatewayProcess]) -> None:
    sim.configure(tokens=TOKENS, token_interval=INTERVAL, first_token_delay=0.02)
    gateway = start_gateway()
    calls = side_by_side(sim, gateway, {"model": "sim-model", "stream": True, "messages": PROMPT}, rounds=6)

    for name, answers in calls.items():
        for answer in answers:
            assert answer.status == 200, name
            check_chat_stream(answer.body, TOKENS)
    # Each upstream chunk is its own chunk downstream: role + tokens + finish + [DONE].
    counts = {name: [len(a.chunks) for a in answers] for name, answers in calls.items()}
    assert counts["direct"] == [TOKENS + 3] * len(counts["direct"]), counts
    assert counts["gateway"] == counts["direct"], counts

    figures = timing_figures(calls)
    assert statistics.median(figures["gap_differences"]) < 0.005, figures["gap_differences"]
    through = [gap for per_call in figures["gaps"]["gateway"] for gap in per_call]
    assert abs(statistics.median(through) - INTERVAL) < 0.005, through
    # Buffering shows as frames sent 40 ms apart arriving together; a stall of the machine may
    # bunch one pair now and then, a buffer would bunch most.
    bunched = [gap for gap in through if gap < 0.001]
    assert len(bunched) <= len(through) // 10, through
    # Loose bounds: between frames 40 ms apart the processes sleep, and this VM runs code that
    # follows a sleep many times slower (50 us of Python takes ~2 ms after 40 ms asleep). The
    # gateway runs more code per frame than the simulator, so here it is ~10 ms late at the head
    # and ~20 ms at the end of a stream even when it is sound. A buffering relay is a whole
    # stream late; the tight bound on the gateway's own delay is in the next test, warm.
    for moment, limit_ms in (("first_byte", 25.0), ("first_token", 25.0), ("complete", 50.0)):
        assert figures[moment] < limit_ms, f"{moment}: {figures[moment]:.1f} ms later through the gateway"
    # the gateway says what it did, in the header and the access log
    last = calls["gateway"][-1]
    record = access_records(gateway, 7)[-1]  # the warm-up call and 6 more
    assert record["status"] == 200 and record["outcome"] == "allowed" and record["bytes"] == len(last.body)
    assert last.headers["x-accel-buffering"] == "no"
    assert "upstream;desc=" in last.headers["server-timing"]


def test_calls_in_a_loop_answer_as_fast_as_direct(sim: SimProcess,
                                                   start_gateway: Callable[..., GatewayProcess]) -> None:
    """Quick calls, one right after the other on a kept-alive connection (an agent, an SDK in a
    loop), alternating direct and through the gateway so that no process sleeps long: the
    gateway's own delay, to the first byte and to the complete answer.

    The answer must not be complete a delayed-ACK timeout (40 ms) late because the gateway's
    writes wait for acknowledgements: Nagle's algorithm is on unless TCP_NODELAY is set, and
    asyncio sets it only on sockets accepted from a listening socket whose ``proto`` is
    IPPROTO_TCP (``socket.socket(family, SOCK_STREAM)`` has proto 0)."""
    sim.configure(tokens=4, token_interval=0.0, first_token_delay=0.0)
    gateway = start_gateway()
    direct, via = RawConnection(sim.base_url), RawConnection(gateway.url, gateway.headers())
    try:
        for stream in (False, True):
            kind = "streamed" if stream else "non-streamed"
            body = {"model": "sim-model", "stream": stream, "messages": PROMPT}
            for _ in range(3):
                direct.request(body)
                via.request(body)
            answers: dict[str, list[Answer]] = {"direct": [], "gateway": []}
            for _ in range(20):
                for name, connection in (("direct", direct), ("gateway", via)):
                    answers[name].append(connection.request(body))
                    assert answers[name][-1].status == 200
            # ~2 ms on a quiet machine, ~6 ms with both cores busy elsewhere; a stall is >= 40 ms
            for moment, limit_ms in (("end_at", 15.0), ("head_at", 10.0)):
                added = [(getattr(g, moment) - getattr(d, moment)) * 1e3
                         for g, d in zip(answers["gateway"], answers["direct"])]
                what = "first byte" if moment == "head_at" else "complete"
                assert statistics.median(added) < limit_ms, (
                    f"{kind} answers: {what} {statistics.median(added):.1f} ms later through the gateway "
                    f"(ms: {sorted(round(a, 1) for a in added)})")
    finally:
        direct.close()
        via.close()


# -- b. 200 concurrent streams --------------------------------------------------------------------
CLIENTS = 200


async def _streams(gateway: GatewayProcess, clients: int) -> list[tuple[int, int, httpx.Headers, bytes]]:
    """``clients`` streamed calls at once; each asks for 12..20 tokens (so a mixed-up stream
    shows). (tokens, status, headers, body) each."""
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    timeout = httpx.Timeout(60.0, connect=30.0, pool=60.0)
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(), limits=limits,
                                 timeout=timeout, trust_env=False) as client:
        async def one(index: int) -> tuple[int, int, httpx.Headers, bytes]:
            tokens = 12 + index % 9
            body = {"model": "sim-model", "stream": True, "messages": PROMPT}
            async with client.stream("POST", CHAT, json=body, headers={"x-sim-tokens": str(tokens)}) as response:
                data = b"".join([chunk async for chunk in response.aiter_raw()])
                return tokens, response.status_code, response.headers, data

        return await asyncio.gather(*(one(i) for i in range(clients)))


@pytest.mark.slow
def test_200_concurrent_streams_all_complete_and_exact(sim: SimProcess,
                                                      start_gateway: Callable[..., GatewayProcess]) -> None:
    sim.configure(token_interval=0.04, first_token_delay=0.05)
    # 200 connections from one address: more than the per-address default (64) lets in
    gateway = start_gateway(max_concurrency=64, max_queue=300, max_queue_wait=60, max_connections_per_client=CLIENTS)
    results = asyncio.run(_streams(gateway, CLIENTS))

    assert [status for _, status, _, _ in results] == [200] * CLIENTS
    for tokens, _, _, data in results:
        check_chat_stream(data, tokens)
    stats = sim.stats()
    assert stats["generations"] == CLIENTS and stats["disconnects"] == 0 and stats["aborted"] == 0
    assert stats["in_flight"] == 0
    assert 48 <= stats["max_in_flight"] <= 64, stats  # the slots were used, and never exceeded
    records = access_records(gateway, CLIENTS)
    assert all(r["status"] == 200 and r["outcome"] == "allowed" for r in records)
    assert max(r["queue_depth"] for r in records) <= 300
    waited = [r for r in records if r["queue_ms"] > 100]
    assert len(waited) >= 50, sorted(r["queue_ms"] for r in records)[-10:]  # 200 clients, 64 slots


@pytest.mark.slow
def test_200_concurrent_streams_over_capacity(sim: SimProcess, start_gateway: Callable[..., GatewayProcess]) -> None:
    sim.configure(token_interval=0.04, first_token_delay=0.05)
    gateway = start_gateway(max_concurrency=20, max_queue=30, max_queue_wait=60, max_connections_per_client=CLIENTS)
    results = asyncio.run(_streams(gateway, CLIENTS))

    served = [(tokens, data) for tokens, status, _, data in results if status == 200]
    refused = [(headers, data) for _, status, headers, data in results if status == 503]
    assert len(served) + len(refused) == CLIENTS, sorted({status for _, status, _, _ in results})
    assert len(served) >= 50  # 20 slots + 30 queue places: the first 50 arrivals at least
    for tokens, data in served:
        check_chat_stream(data, tokens)
    for headers, data in refused:
        assert int(headers["retry-after"]) >= 1
        assert json.loads(data)["error"]["type"] == "overloaded"
    stats = sim.stats()
    assert stats["generations"] == len(served)  # a refused request never reaches the runtime
    assert stats["max_in_flight"] <= 20, stats
    records = access_records(gateway, CLIENTS)
    assert max(r["queue_depth"] for r in records) <= 30
    assert sum(r["outcome"] == "overloaded" and r["status"] == 503 for r in records) == len(refused)
    assert sum(r["outcome"] == "allowed" and r["status"] == 200 for r in records) == len(served)


# -- c. a client that leaves stops the work -------------------------------------------------------
def test_client_disconnect_cancels_upstream(sim: SimProcess, start_gateway: Callable[..., GatewayProcess]) -> None:
    sim.configure(tokens=200, token_interval=0.02, first_token_delay=0.02)  # 4 s when read to the end
    gateway = start_gateway()
    connection = RawConnection(gateway.url, gateway.headers())
    events = connection.events(connection.send({"model": "sim-model", "stream": True, "messages": PROMPT}))
    received = b""
    for kind, _, value in events:
        if kind == "chunk":
            received += value
        if received.count(b'"content":" tok') >= 3 or kind == "end":
            break
    assert sim.stats()["in_flight"] == 1
    connection.close()
    closed = time.monotonic()

    assert wait_for(lambda: sim.stats()["in_flight"] == 0, 2.0), "the runtime kept generating"
    stopped = time.monotonic() - closed
    stats = sim.stats()
    assert stats["disconnects"] == 1, stats  # the gateway closed its upstream connection
    assert stopped < 2.0
    records = wait_for(gateway.access_records, 2.0)
    assert len(records) == 1
    assert records[0]["outcome"] == "client_closed" and records[0]["status"] == 200
    assert records[0]["total_ms"] < 3000
    # the gateway is still in shape: the next call goes through whole
    sim.configure(tokens=5)
    with gateway.client(timeout=10) as client:
        response = client.post(CHAT, json={"model": "sim-model", "stream": True, "messages": PROMPT})
    assert response.status_code == 200
    check_chat_stream(response.content, 5)


@pytest.mark.slow
def test_client_disconnect_while_queued(sim: SimProcess, start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway(max_concurrency=1, max_queue=1)
    body = {"model": "sim-model", "stream": True, "messages": PROMPT}
    # A holds the only upstream slot for ~2 s
    holder = RawConnection(gateway.url, gateway.headers())
    holder_events = holder.events(holder.send(body, {"x-sim-tokens": "100", "x-sim-token-interval": "0.02"}))
    assert next(holder_events)[0] == "head"
    assert sim.stats()["in_flight"] == 1
    # B waits in the queue (its only place), then leaves
    leaver = RawConnection(gateway.url, gateway.headers())
    leaver.send(body, {"x-sim-tokens": "3"})
    time.sleep(0.5)
    with gateway.client(timeout=5) as client:  # the queue is full while B is in it
        assert client.post(CHAT, json=body, headers={"x-sim-tokens": "3"}).status_code == 503
    leaver.close()
    left = wait_for(lambda: [r for r in gateway.access_records() if r["outcome"] == "client_closed"], 2.0)
    assert left and left[0]["status"] == 499 and left[0]["upstream_first_byte_ms"] is None
    assert left[0]["queue_ms"] >= 250
    # B's place is free again: C is queued (not refused) and served once A is done
    follower = RawConnection(gateway.url, gateway.headers())
    follower_sent = follower.send(body, {"x-sim-tokens": "3"})
    assert sim.stats()["in_flight"] == 1  # A is still going: C waits
    rest = [value for kind, _, value in holder_events if kind == "chunk"]
    check_chat_stream(b"".join(rest), 100)
    answer = Answer()
    for kind, _, value in follower.events(follower_sent):
        if kind == "head":
            answer.status = value[0]
        elif kind == "chunk":
            answer.chunks.append((0.0, value))
    holder.close()
    follower.close()
    assert answer.status == 200
    check_chat_stream(answer.body, 3)

    stats = sim.stats()
    assert stats["generations"] == 2, stats  # A and C: neither B nor the refused probe got there
    assert stats["max_in_flight"] == 1
    records = access_records(gateway, 4)
    assert sorted((r["status"], r["outcome"]) for r in records) == [
        (200, "allowed"), (200, "allowed"), (499, "client_closed"), (503, "overloaded")]
    follower_record = max((r for r in records if r["status"] == 200), key=lambda r: r["queue_ms"])
    assert follower_record["status"] == 200 and follower_record["queue_depth"] == 0
    assert follower_record["queue_ms"] > 100
