"""The gateway's edge against slow, idle, huge and numerous connections, over real sockets.

Attackers connect from other loopback addresses (127.0.0.2 and up: Linux routes all of
127.0.0.0/8 to lo) so the per-address caps can be told from the legitimate caller on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm_testing.net import wait_for
from otel_llm_testing.raw_http import RecordingUpstream, Reply, gateway_env, raw_request, request_bytes

HEAD_TIMEOUT = 1.5  # the short gateway's header, body and idle timeouts (seconds)
SLACK = 6.0  # how much later than its timeout a refusal may come on a loaded machine


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def short(recorder: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Short timeouts, default connection caps."""
    keys = {"alice": {"routes": ["/v1/*"], "max_concurrency": 1}, "bob": {"models": ["m"]}}
    with GatewayProcess(recorder.url, keys, env=gateway_env(tmp_path_factory.mktemp("edge"), "short"),
                        header_timeout=HEAD_TIMEOUT, body_timeout=HEAD_TIMEOUT, idle_timeout=HEAD_TIMEOUT,
                        max_body_bytes=1000) as gw:
        yield gw


@pytest.fixture(scope="module")
def capped(recorder: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Small connection caps, long timeouts (so held connections stay open during the test)."""
    with GatewayProcess(recorder.url, {"alice": {}}, env=gateway_env(tmp_path_factory.mktemp("edge"), "capped"),
                        header_timeout=60, max_connections=12, max_connections_per_client=5) as gw:
        yield gw


def _connect(url: str, source: str = "127.0.0.1", timeout: float = 15) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout, source_address=(source, 0))


def _read_all(conn: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return received


def _status(raw: bytes) -> int | None:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.") else None


def _memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _ok(gateway: GatewayProcess, key: str = "alice") -> int:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers(key), timeout=15) as client:
        return client.get("/v1/models").status_code


# --- the request head ------------------------------------------------------------------------


def test_a_head_over_the_limit_is_431_before_the_app(short: GatewayProcess, recorder: RecordingUpstream) -> None:
    before, logged = recorder.count(), len(short.access_records())
    head = b"GET /v1/models HTTP/1.1\r\nHost: g\r\nX-Pad: " + b"a" * (33 * 1024)  # never ends
    with _connect(short.url) as conn:
        conn.sendall(head)
        raw = _read_all(conn)
    assert _status(raw) == 431 and b"connection: close" in raw.lower(), raw[:200]
    # control: a head of 31 KiB is read and answered
    reply = raw_request(short.url, request_bytes("GET", "/v1/models", short.secrets["alice"], "X-Pad: " + "a" * 31_000))
    assert reply.status == 200, reply.raw[:200]
    assert recorder.count() == before + 1
    time.sleep(0.3)
    assert len(short.access_records()) == logged + 1  # the refusal is counted, not logged per request


def test_a_64_mib_header_costs_no_memory_and_is_cut_off_early(short: GatewayProcess,
                                                              recorder: RecordingUpstream) -> None:
    """Before the edge, one such header took the gateway from about 50 to 181 MB and 7 s of CPU."""
    before = recorder.count()
    peak_before = _memory_kb(short.pid, "VmHWM")
    sent = 0
    with _connect(short.url) as conn:
        try:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: g\r\nX-Pad: ")
            piece = b"a" * 65536
            while sent < 64 * 1024 * 1024:
                conn.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        _read_all(conn)
    assert sent < 8 * 1024 * 1024, f"the gateway kept reading a header: {sent} bytes accepted"
    grown = _memory_kb(short.pid, "VmHWM") - peak_before
    assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"
    assert recorder.count() == before
    assert _ok(short) == 200


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed(short: GatewayProcess) -> None:
    with _connect(short.url, "127.0.0.2") as conn:
        started = time.monotonic()
        raw = _read_all(conn)
        waited = time.monotonic() - started
    assert raw == b""  # nobody asked anything: nothing to answer
    assert HEAD_TIMEOUT * 0.8 <= waited <= HEAD_TIMEOUT + SLACK, waited


@pytest.mark.slow
def test_half_a_request_line_is_408(short: GatewayProcess) -> None:
    with _connect(short.url, "127.0.0.2") as conn:
        conn.sendall(b"GET /v1/mod")
        started = time.monotonic()
        raw = _read_all(conn)
        waited = time.monotonic() - started
    assert _status(raw) == 408, raw[:200]
    assert HEAD_TIMEOUT * 0.8 <= waited <= HEAD_TIMEOUT + SLACK, waited


@pytest.mark.slow
def test_a_head_trickled_a_byte_at_a_time_is_408_at_its_deadline(short: GatewayProcess) -> None:
    """The deadline runs from the head's first byte: bytes that keep arriving do not extend it."""
    data = request_bytes("GET", "/v1/models", short.secrets["alice"])
    with _connect(short.url, "127.0.0.2") as conn:
        started = time.monotonic()
        raw = b""
        try:
            for byte in data[:-4]:
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
                if time.monotonic() - started > HEAD_TIMEOUT + SLACK:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = _read_all(conn)
        waited = time.monotonic() - started
    assert _status(raw) == 408, raw[:200]
    assert waited <= HEAD_TIMEOUT + SLACK, waited


@pytest.mark.slow
def test_an_idle_kept_alive_connection_is_closed(short: GatewayProcess) -> None:
    head = (f"GET /v1/models HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {short.secrets['alice']}\r\n\r\n").encode()
    with _connect(short.url) as conn:
        conn.sendall(head)
        received = b""
        while b"\r\n\r\n" not in received:
            received += conn.recv(65536)
        assert _status(received) == 200
        started = time.monotonic()
        rest = _read_all(conn)  # the body, then the close
        waited = time.monotonic() - started
    assert b'{"ok": true}' in received + rest
    assert HEAD_TIMEOUT * 0.8 <= waited <= HEAD_TIMEOUT + SLACK, waited


# --- the request body ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stalled_upload_is_408_and_holds_the_keys_concurrency(short: GatewayProcess,
                                                                recorder: RecordingUpstream) -> None:
    before, secret = recorder.count(), short.secrets["alice"]
    stalled = request_bytes("POST", "/v1/chat/completions", secret, "Content-Type: application/json",
                            "Content-Length: 100", body=b'{"model": ')
    with _connect(short.url) as conn:
        conn.sendall(stalled)
        started = time.monotonic()
        time.sleep(0.3)
        # alice's one request in flight is the stalled upload
        assert _ok(short) == 429
        raw = _read_all(conn)
        waited = time.monotonic() - started
    assert _status(raw) == 408 and b"request body not received" in raw, raw[:300]
    assert HEAD_TIMEOUT * 0.8 <= waited <= HEAD_TIMEOUT + SLACK, waited
    assert recorder.count() == before  # neither reached the runtime
    assert _ok(short) == 200  # and the key's slot is free again


# --- what a key may send ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "TRACE", "PATCH", "OPTIONS"])
def test_methods_a_route_does_not_use_are_403(short: GatewayProcess, recorder: RecordingUpstream,
                                              method: str) -> None:
    before = recorder.count()
    reply = raw_request(short.url, request_bytes(method, "/v1/chat/completions", short.secrets["alice"]))
    assert reply.status == 403 and method.encode() in reply.body, reply.raw[:300]
    assert recorder.count() == before


@pytest.mark.parametrize("body", [b"", b" ", b"\r\n\t ", b"null", b"[]"])
def test_a_model_restricted_key_needs_one_json_object(short: GatewayProcess, recorder: RecordingUpstream,
                                                      body: bytes) -> None:
    before = recorder.count()
    reply = raw_request(short.url, request_bytes("POST", "/v1/chat/completions", short.secrets["bob"],
                                                 "Content-Type: application/json", f"Content-Length: {len(body)}",
                                                 body=body))
    assert reply.status == 400, reply.raw[:300]
    assert recorder.count() == before
    # control: the same key with its model gets through
    ok = b'{"model": "m"}'
    reply = raw_request(short.url, request_bytes("POST", "/v1/chat/completions", short.secrets["bob"],
                                                 f"Content-Length: {len(ok)}", body=ok))
    assert reply.status == 200 and recorder.count() == before + 1


# --- how many connections --------------------------------------------------------------------


def _hold(url: str, source: str, count: int) -> list[socket.socket]:
    return [_connect(url, source) for _ in range(count)]


def _refused_at_once(url: str, source: str) -> Reply:
    with _connect(url, source, timeout=5) as conn:
        raw = _read_all(conn)
    reply = Reply(raw, _status(raw))
    return reply


def test_connections_per_address_are_capped(capped: GatewayProcess) -> None:
    held = _hold(capped.url, "127.0.0.3", 5)
    try:
        time.sleep(0.2)
        refused = _refused_at_once(capped.url, "127.0.0.3")
        assert refused.status == 503 and b"from this address" in refused.raw, refused.raw[:200]
        assert _ok(capped) == 200  # another address is served
    finally:
        for conn in held:
            conn.close()
    wait_for(lambda: _ok_from(capped, "127.0.0.3"), 10)


def _ok_from(gateway: GatewayProcess, source: str) -> bool:
    with _connect(gateway.url, source) as conn:
        conn.sendall(request_bytes("GET", "/v1/models", gateway.secrets["alice"]))
        return _status(_read_all(conn)) == 200


def test_open_connections_are_capped(capped: GatewayProcess) -> None:
    held = [conn for source in ("127.0.0.4", "127.0.0.5", "127.0.0.6") for conn in _hold(capped.url, source, 4)]
    try:
        time.sleep(0.2)
        refused = _refused_at_once(capped.url, "127.0.0.1")
        assert refused.status == 503 and b"too many open connections" in refused.raw, refused.raw[:200]
    finally:
        for conn in held:
            conn.close()
    wait_for(lambda: _ok(capped) == 200, 10)


@pytest.mark.slow
def test_a_200_connection_slowloris_leaves_the_gateway_serving(short: GatewayProcess) -> None:
    """200 connections from one address trickling a head: 64 (the per-address default) are held
    until their head times out, the rest refused at once; a caller elsewhere is served meanwhile
    and after."""
    statuses: list[int | None] = []
    lock = threading.Lock()

    def attack(conn: socket.socket) -> None:
        try:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nX-A: ")
            while True:
                conn.sendall(b"a")
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            with lock:
                statuses.append(_status(_read_all(conn)))
            conn.close()

    conns = [_connect(short.url, "127.0.0.7") for _ in range(200)]
    threads = [threading.Thread(target=attack, args=(c,), daemon=True) for c in conns]
    for thread in threads:
        thread.start()
    during = _ok(short)
    for thread in threads:
        thread.join(HEAD_TIMEOUT + SLACK + 10)
    after = _ok(short)
    assert during == 200 and after == 200
    assert len(statuses) == 200
    counts: dict[Any, int] = {s: statuses.count(s) for s in set(statuses)}
    assert counts.get(503, 0) >= 120, counts  # refused at once (200 - 64, less any freed meanwhile)
    assert set(counts) <= {408, 503, None}, counts


# --- a flood of refusals ---------------------------------------------------------------------


def test_a_flood_of_bad_keys_costs_a_bounded_number_of_spans_and_lines(
        recorder: RecordingUpstream, tmp_path: Path) -> None:
    """200 requests with a wrong key from one address: the first ``refusal_burst`` are answered
    401 and recorded; past the budget they are answered 429 (counted only); a valid key from the
    same address is served and recorded meanwhile."""
    traces = tmp_path / "flood-traces.jsonl"
    env = {**gateway_env(tmp_path, "flood"), "OTEL_LLM_TRACES_FILE": str(traces)}
    gateway = GatewayProcess(recorder.url, {"alice": {}}, env=env, refusal_rate=1, refusal_burst=5)
    statuses: list[int | None] = []
    with gateway:
        bad = request_bytes("GET", "/v1/models", "olk_" + "A" * 43)
        started = time.monotonic()
        for _ in range(200):
            with _connect(gateway.url, "127.0.0.9") as conn:
                conn.sendall(bad)
                statuses.append(_status(_read_all(conn)))
        flood_s = time.monotonic() - started
        assert _ok_from(gateway, "127.0.0.9")  # a valid key is never held back
        access = gateway.access_records()
    lines = traces.read_text().splitlines() if traces.exists() else []
    names = [span["name"] for line in lines if line.strip() for rs in json.loads(line).get("resourceSpans", [])
             for ss in rs["scopeSpans"] for span in ss["spans"]]
    recorded = 5 + int(flood_s * 1) + 1  # the burst, then the rate, during the flood
    assert statuses[:5] == [401] * 5, statuses[:10]
    assert statuses.count(429) >= 200 - recorded, (flood_s, statuses.count(401))
    assert set(statuses) == {401, 429}
    refused_lines = [r for r in access if r["status"] == 401]
    assert 5 <= len(refused_lines) <= recorded, (len(refused_lines), flood_s)
    assert not any(r["status"] == 429 for r in access)
    assert [r["status"] for r in access if r["key_id"] == "alice"] == [200]
    assert 5 <= names.count("GET") <= recorded + 1, names.count("GET")  # SERVER spans: refusals and alice's


def test_refusal_budget_per_address_is_a_bounded_token_bucket(caplog: pytest.LogCaptureFixture) -> None:
    from otel_llm.tools.gateway.refusals import RefusalLimiter

    now = [0.0]
    limiter = RefusalLimiter(rate=1.0, burst=3, max_addresses=2, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.allow("a") == pytest.approx(1.0)
    assert limiter.allow("b") == 0.0 and limiter.allow(None) == 0.0  # another address, no address
    now[0] = 1.0
    assert limiter.allow("a") == 0.0 and limiter.allow("a") > 0
    limiter.allow("c")  # a third address: the least recently refused one ("b") is forgotten
    assert set(limiter._buckets) == {"a", "c"}
    # the first suppression is logged at once, the later ones summarized at most once a minute
    assert [r.getMessage().split(":")[1].strip()[:20] for r in caplog.records] == ["too many refused req"]
    assert limiter.suppressed == 1
    now[0] = 30.0
    for _ in range(10):
        limiter.allow("c")
    assert len(caplog.records) == 1
    now[0] = 61.0
    for _ in range(5):
        limiter.allow("c")
    assert len(caplog.records) == 2 and "refused requests answered 429" in caplog.records[1].getMessage()


@pytest.mark.slow
def test_the_access_log_file_is_rotated_at_its_size(recorder: RecordingUpstream, tmp_path: Path) -> None:
    """About 350 bytes an access line; a 2,000-byte limit rotates it every few requests."""
    gateway = GatewayProcess(recorder.url, {"alice": {}}, env=gateway_env(tmp_path, "rotate"),
                             access_log_max_bytes=2000, access_log_backups=2)
    with gateway:
        for _ in range(30):
            assert _ok(gateway) == 200
        time.sleep(0.3)
    log = gateway.access_log_path
    files = [log, log.with_name(log.name + ".1"), log.with_name(log.name + ".2")]
    assert all(f.exists() and f.stat().st_size <= 2000 for f in files), [f.stat().st_size for f in files if f.exists()]
    assert not log.with_name(log.name + ".3").exists()
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert 10 <= len(lines) < 30 and all(r["status"] == 200 for r in lines)
