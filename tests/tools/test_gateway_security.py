"""The gateway's security promises, checked against a real ``otel-llm gateway`` process.

Three gateways (each started once per module):

* ``gateway``: in front of the simulator, whose ``/sim/stats`` counts every request that reached it;
* ``rec_gateway``: in front of :class:`RecordingUpstream`, a raw-socket server with no limits of
  its own that records every request head byte for byte (what exactly crossed the gateway);
* ``traced``: in front of the simulator, exporting to an OTLP collector; a fixed series of
  requests is sent, the gateway is stopped with SIGTERM, then logs and spans are searched.

Malformed HTTP is sent over raw sockets so that no client library tidies it up.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm_testing.collectors import OtlpHttpCollector, Received, attributes_of
from otel_llm_testing.net import wait_for
from otel_llm_testing.raw_http import RecordingUpstream, error_of, gateway_env, raw_request, request_bytes

SPAN_KIND_SERVER = 2  # OTLP protobuf enum
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
QUICK = {"x-sim-tokens": "1", "x-sim-first-token-delay": "0", "x-sim-token-interval": "0"}


def _new_records(gateway: GatewayProcess, before: int, expected: int) -> list[dict[str, Any]]:
    """The access-log lines after the first ``before``, once ``expected`` of them were written."""
    wait_for(lambda: len(gateway.access_records()) >= before + expected, 10)
    return gateway.access_records()[before:]


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway-security")


@pytest.fixture(scope="module")
def gateway(sim_process: Any, workdir: Path) -> Iterator[GatewayProcess]:
    keys: dict[str, dict[str, Any]] = {
        "alice": {"routes": ["/v1/*"]},
        "bob": {"routes": ["/v1/chat/completions"], "models": ["sim-model"]},
        "carol": {"routes": ["/v1/models"], "rate": 0.02, "burst": 3},  # 3 at once, then one per 50 s
    }
    # these tests send many refused requests from one address on purpose: no refusal budget
    with GatewayProcess(sim_process.base_url, keys, env=gateway_env(workdir, "sim"), max_concurrency=1, max_queue=2,
                        max_queue_wait=20, max_body_bytes=1000, refusal_burst=100_000) as gw:
        yield gw


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def rec_gateway(recorder: RecordingUpstream, workdir: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(recorder.url, {"alice": {"routes": ["/v1/*"]}, "bob": {}}, env=gateway_env(workdir, "rec"),
                        max_concurrency=1, max_queue=1, max_queue_wait=0.5, max_body_bytes=1000,
                        refusal_burst=100_000) as gw:
        yield gw


def _requests_seen(sim: Any) -> int:
    return int(sim.stats()["requests"])


# --- authentication --------------------------------------------------------------------------


def test_no_credentials_is_401_and_nothing_reaches_upstream(gateway: GatewayProcess, sim: Any) -> None:
    assert _requests_seen(sim) == 0
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        attempts = [client.get("/v1/models"), client.post("/v1/chat/completions", json=CHAT),
                    client.get("/api/tags"), client.get("/sim/stats"), client.get("/"),
                    client.get("/v1/models", headers={"cookie": f"session={gateway.secrets['alice']}"}),
                    client.get("/v1/models", headers={"x-api-token": gateway.secrets["alice"]})]
        for response in attempts:
            assert response.status_code == 401, response.request.url
            assert response.headers["www-authenticate"] == 'Bearer realm="otel-llm-gateway"'
            assert error_of(response) == {"message": "an API key is required", "type": "unauthorized", "code": 401}
            assert "total;dur=" in response.headers["server-timing"]
        assert client.get("/-/health").json() == {"status": "ok"}  # the one open route, answered locally
        assert _requests_seen(sim) == 0
        # control: the counter does move for an authenticated request
        assert client.get("/v1/models", headers=gateway.headers("alice")).status_code == 200
    assert _requests_seen(sim) == 1


def test_invalid_credentials_are_401_and_nothing_reaches_upstream(gateway: GatewayProcess, sim: Any) -> None:
    alice = gateway.secrets["alice"]
    bad = {
        "wrong key": {"authorization": "Bearer olk_" + "A" * 43},
        "near miss": {"authorization": f"Bearer {alice[:-1]}{'B' if alice[-1] != 'B' else 'C'}"},
        "truncated": {"authorization": f"Bearer {alice[:-1]}"},
        "x-api-key": {"x-api-key": alice + "x"},
        "basic": {"authorization": f"Basic {alice}"},
        "oversized": {"authorization": "Bearer " + alice * 20},
    }
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for name, headers in bad.items():
            response = client.get("/v1/models", headers=headers)
            assert response.status_code == 401, name
            assert 'error="invalid_token"' in response.headers["www-authenticate"], name
            assert error_of(response)["type"] == "unauthorized"
        both = client.get("/v1/models", headers={"authorization": f"Bearer {alice}", "x-api-key": "olk_other"})
        assert both.status_code == 400 and error_of(both)["type"] == "bad_request"
    assert _requests_seen(sim) == 0


# --- authorization ---------------------------------------------------------------------------


def test_route_not_allowed_is_403_and_nothing_reaches_upstream(gateway: GatewayProcess, sim: Any) -> None:
    before = len(gateway.access_records())
    attempts = [("bob", "GET", "/v1/models"), ("alice", "GET", "/api/tags"), ("alice", "POST", "/api/chat"),
                ("alice", "GET", "/sim/stats"), ("carol", "POST", "/v1/chat/completions"),
                ("alice", "GET", "/V1/models")]
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for key_id, method, path in attempts:
            response = client.request(method, path, headers=gateway.headers(key_id),
                                      json=CHAT if method == "POST" else None)
            assert response.status_code == 403, (key_id, path)
            assert error_of(response)["type"] == "forbidden"
    assert _requests_seen(sim) == 0
    records = _new_records(gateway, before, len(attempts))
    assert [(r["key_id"], r["status"], r["outcome"]) for r in records] == [
        (key_id, 403, "forbidden") for key_id, _, _ in attempts]


@pytest.mark.parametrize("target", [
    "/v1/../sim/stats", "/v1/%2e%2e/sim/stats", "/v1/%2E%2E/sim/stats", "/v1/..%2fsim/stats",
    "/v1/..%2Fsim%2Fstats", "/v1/%2e%2e%2fsim/stats", "/v1/..%5csim/stats", "/v1/..\\sim/stats", "/v1//x",
    "/v1//../sim/stats", "/v1/./models", "/v1/%2e/models", "/v1/models%00", "/v1/%2fsim/stats",
])
def test_path_tricks_are_400_and_never_reach_upstream(gateway: GatewayProcess, sim: Any, target: str) -> None:
    reply = raw_request(gateway.url, request_bytes("GET", target, gateway.secrets["alice"]))
    assert reply.status == 400, reply.raw[:300]
    assert error_of(reply)["type"] == "bad_request"
    assert b"in_flight" not in reply.body  # not the simulator's stats
    stats = sim.stats()
    assert (stats["requests"], stats["routes"]) == (0, {})


def test_model_restriction(gateway: GatewayProcess, sim: Any) -> None:
    headers = {**gateway.headers("bob"), "content-type": "application/json", **QUICK}
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        def post(body: bytes) -> httpx.Response:
            return client.post("/v1/chat/completions", content=body, headers=headers)

        other = post(json.dumps({**CHAT, "model": "other-model"}).encode())
        assert other.status_code == 403 and error_of(other)["type"] == "forbidden"
        unnamed = post(json.dumps({"messages": CHAT["messages"]}).encode())
        assert unnamed.status_code == 403
        for duplicate in (b'{"model": "sim-model", "model": "other-model", "messages": []}',
                          b'{"model": "other-model", "model": "sim-model", "messages": []}'):
            response = post(duplicate)
            assert response.status_code == 400 and error_of(response)["type"] == "bad_request"
        assert post(b"not json").status_code == 400
        assert _requests_seen(sim) == 0
        allowed = post(json.dumps(CHAT).encode())  # control
        assert allowed.status_code == 200, allowed.text
        assert allowed.json()["model"] == "sim-model"
    stats = sim.stats()
    assert (stats["requests"], stats["generations"]) == (1, 1)


# --- limits ----------------------------------------------------------------------------------


def test_burst_over_the_key_rate_is_429_with_retry_after(gateway: GatewayProcess, sim: Any) -> None:
    """carol: burst 3, rate 0.02/s: the first three pass, then 429 with Retry-After <= 50 s."""
    with gateway.client("carol", timeout=10) as client:
        responses = [client.get("/v1/models") for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    for response in responses[3:]:
        retry_after = int(response.headers["retry-after"])  # a whole number of seconds
        assert 1 <= retry_after <= 50
        assert error_of(response) == {"message": "rate limit exceeded for this key", "type": "rate_limited",
                                      "code": 429}
    assert _requests_seen(sim) == 3


@pytest.mark.slow
def test_bounded_queue_rejects_at_once_and_protects_the_upstream(gateway: GatewayProcess, sim: Any) -> None:
    """1 slot + 2 queued, 8 concurrent slow requests: 3 succeed one at a time, 5 get 503 at once."""
    before = len(gateway.access_records())
    headers = {**gateway.headers("alice"), **QUICK, "x-sim-headers-delay": "1.5"}
    barrier = threading.Barrier(8)
    started = time.monotonic()

    def call(_: int) -> tuple[int, dict[str, str], bytes, float]:
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            barrier.wait()
            response = client.post("/v1/chat/completions", json=CHAT, headers=headers)
            return response.status_code, dict(response.headers), response.content, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    statuses = Counter(status for status, *_ in results)
    assert statuses == {200: 3, 503: 5}, results
    done_200 = sorted(t for status, _, _, t in results if status == 200)
    done_503 = [t for status, _, _, t in results if status == 503]
    assert max(done_503) < done_200[0]  # rejected while the first slow request was still running
    for status, response_headers, body, _ in results:
        if status == 503:
            assert int(response_headers["retry-after"]) >= 1
            assert json.loads(body)["error"]["type"] == "overloaded"
    stats = sim.stats()
    assert (stats["requests"], stats["generations"], stats["max_in_flight"]) == (3, 3, 1)
    records = _new_records(gateway, before, 8)
    assert Counter((r["status"], r["outcome"]) for r in records) == {(200, "allowed"): 3, (503, "overloaded"): 5}


@pytest.mark.slow
def test_queued_request_past_max_queue_wait_is_503(rec_gateway: GatewayProcess,
                                                   recorder: RecordingUpstream) -> None:
    """max_concurrency 1, max_queue_wait 0.5 s: while one request holds the slot, the next one
    waits about half a second, then gets 503 without ever reaching the upstream."""
    before = recorder.count()
    with concurrent.futures.ThreadPoolExecutor(1) as pool, rec_gateway.client("alice", timeout=30) as first, \
            rec_gateway.client("alice", timeout=30) as second:
        holder = pool.submit(first.post, "/v1/hold", json={}, headers={"x-test-delay": "2.5"})
        assert wait_for(lambda: recorder.count() == before + 1, 10)
        started = time.monotonic()
        queued = second.post("/v1/queued", json={})
        waited = time.monotonic() - started
        assert not holder.done()  # still holding the slot
        assert queued.status_code == 503, queued.text
        assert error_of(queued)["type"] == "overloaded" and int(queued.headers["retry-after"]) >= 1
        assert waited >= 0.45
        assert holder.result(30).status_code == 200
    assert [s.target for s in recorder.seen[before:]] == ["/v1/hold"]


# --- what crosses the gateway ----------------------------------------------------------------


def test_upstream_never_receives_the_callers_credentials(rec_gateway: GatewayProcess,
                                                        recorder: RecordingUpstream) -> None:
    secret = rec_gateway.secrets["alice"]
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {
        "authorization": f"Bearer {secret}", "x-api-key": secret, "cookie": f"session={secret}; theme=dark",
        "proxy-authorization": f"Basic {secret}", "connection": "keep-alive, x-hop-secret",
        "x-hop-secret": secret, "keep-alive": "timeout=5", "te": "trailers",
        "traceparent": f"00-{trace_id}-{parent_id}-01", "x-custom": "kept", "content-type": "application/json",
    }
    before = recorder.count()
    with httpx.Client(base_url=rec_gateway.url, timeout=10) as client:
        response = client.post("/v1/chat/completions?x=1", content=b'{"model": "m"}', headers=headers)
    assert response.status_code == 200 and response.json() == {"ok": True}
    (seen,) = recorder.seen[before:]
    names = {name for name, _ in seen.headers}
    for name in ("authorization", "x-api-key", "proxy-authorization", "x-hop-secret", "keep-alive", "te"):
        assert name not in names, name
    # the caller's cookies are not forwarded (a cookie the gateway itself may add: the next test)
    assert not any("theme=dark" in v for v in seen.values("cookie"))
    assert secret.encode() not in seen.head and secret.encode() not in seen.body
    assert secret[len("olk_"):].encode() not in seen.head
    # what must arrive
    assert (seen.method, seen.target, seen.body) == ("POST", "/v1/chat/completions?x=1", b'{"model": "m"}')
    assert seen.values("x-custom") == ["kept"]
    assert seen.values("host") == [urlsplit(recorder.url).netloc]
    assert seen.values("x-forwarded-for") == ["127.0.0.1"] and seen.values("x-forwarded-proto") == ["http"]
    (traceparent,) = seen.values("traceparent")
    version, forwarded_trace, forwarded_parent, _ = traceparent.split("-")
    # the caller's trace, continued from the gateway's span
    assert version == "00" and forwarded_trace == trace_id and forwarded_parent != parent_id
    # and on the way back: no upstream cookie, the gateway's own Server-Timing
    assert "set-cookie" not in response.headers
    assert "upstream-internal" not in response.headers["server-timing"]
    assert "total;dur=" in response.headers["server-timing"] and response.headers["x-accel-buffering"] == "no"


def test_upstream_key_replaces_the_callers(recorder: RecordingUpstream, workdir: Path) -> None:
    """With ``upstream_key_env`` the runtime gets the gateway's own key, never the caller's, and
    that runtime key goes nowhere else (replies, logs)."""
    runtime_key = "rt-CANARY-runtime-key-55e1"
    env = gateway_env(workdir, "upstream-key", GATEWAY_TEST_RUNTIME_KEY=runtime_key)
    with GatewayProcess(recorder.url, {"alice": {}}, env=env, upstream_key_env="GATEWAY_TEST_RUNTIME_KEY") as gw:
        before = recorder.count()
        with httpx.Client(base_url=gw.url, timeout=10) as client:
            responses = [client.get("/v1/models", headers={"x-api-key": gw.secrets["alice"]}),
                         client.get("/v1/models", headers=gw.headers("alice")),
                         client.get("/v1/models", headers={"authorization": "Bearer olk_wrong"})]
        assert [r.status_code for r in responses] == [200, 200, 401]
        seen = recorder.seen[before:]
        assert [s.values("authorization") for s in seen] == [[f"Bearer {runtime_key}"]] * 2
        assert all(s.values("x-api-key") == [] and gw.secrets["alice"].encode() not in s.head for s in seen)
        assert all(runtime_key not in f"{r.headers}{r.text}" for r in responses)
        _new_records(gw, 0, 3)
    assert runtime_key not in gw.log() and runtime_key not in gw.access_log_path.read_text()


def test_upstream_cookies_are_not_replayed_to_other_callers(rec_gateway: GatewayProcess,
                                                            recorder: RecordingUpstream) -> None:
    """The upstream answers every request with ``Set-Cookie: upstream-session=1``. The gateway
    strips it from the reply, and must not keep it either: its one shared upstream client would
    otherwise send alice's session cookie along with bob's requests."""
    before = recorder.count()
    with rec_gateway.client("alice", timeout=10) as alice, rec_gateway.client("bob", timeout=10) as bob:
        first = alice.get("/v1/models")
        second = bob.get("/v1/models")
    assert first.status_code == second.status_code == 200
    assert "set-cookie" not in first.headers and "set-cookie" not in second.headers
    assert [s.values("cookie") for s in recorder.seen[before:]] == [[], []]


def test_request_target_cannot_redirect_or_inject(rec_gateway: GatewayProcess,
                                                  recorder: RecordingUpstream) -> None:
    """An absolute-form target names another host: the request still goes to the configured
    upstream only. Percent-encoded CR LF stays encoded: never a header upstream. CONNECT is refused."""
    secret = rec_gateway.secrets["alice"]
    cases = [  # target -> what the upstream must see (None: nothing)
        ("GET", "http://evil.example:1234/v1/models", "/v1/models"),
        ("GET", "/v1/models%0d%0aX-Injected:%201", "/v1/models%0d%0aX-Injected:%201"),
        ("GET", "/v1/models?a=%0d%0aX-Injected:%201", "/v1/models?a=%0d%0aX-Injected:%201"),
        ("CONNECT", "evil.example:443", None),
    ]
    for method, target, expected in cases:
        before = recorder.count()
        reply = raw_request(rec_gateway.url, request_bytes(method, target, secret, host="evil.example"))
        seen = recorder.seen[before:]
        if expected is None:
            assert reply.status == 400 and seen == [], target
            continue
        assert reply.status == 200, (target, reply.raw[:200])
        assert [s.target for s in seen] == [expected]
        assert seen[0].values("host") == [urlsplit(recorder.url).netloc]
        assert "x-injected" not in {name for name, _ in seen[0].headers}


def test_client_cannot_spoof_its_forwarded_address(rec_gateway: GatewayProcess,
                                                   recorder: RecordingUpstream) -> None:
    """The gateway is the edge: the address it logs and hands upstream is the TCP peer's, not one
    a caller wrote into X-Forwarded-For (uvicorn's proxy_headers, on by default, trusts callers
    on 127.0.0.1 and rewrites the client address from that header)."""
    before, logged = recorder.count(), len(rec_gateway.access_records())
    claims = ("X-Forwarded-For: 6.6.6.6", "X-Forwarded-Proto: https", "X_Forwarded_For: 6.6.6.6",
              "X-Real-IP: 6.6.6.6", "Forwarded: for=6.6.6.6", "X-Forwarded-Host: evil.example",
              "X-Original-URL: /api/delete", "X-HTTP-Method-Override: DELETE")
    reply = raw_request(rec_gateway.url, request_bytes("GET", "/v1/models", rec_gateway.secrets["alice"], *claims))
    assert reply.status == 200
    (seen,) = recorder.seen[before:]
    (record,) = _new_records(rec_gateway, logged, 1)
    assert record["client"] == "127.0.0.1"
    assert seen.values("x-forwarded-for") == ["127.0.0.1"]
    assert seen.values("x-forwarded-proto") == ["http"]
    assert seen.values("forwarded") == ["for=127.0.0.1;proto=http"]
    names = {name.lower().replace("_", "-") for name, _ in seen.headers}
    assert not names & {"x-real-ip", "x-forwarded-host", "x-original-url", "x-http-method-override"}
    assert not any("6.6.6.6" in value or "evil" in value for _, value in seen.headers)


def _alice_head(rec_gateway: GatewayProcess) -> str:
    return f"Authorization: Bearer {rec_gateway.secrets['alice']}\r\n"


# name -> raw request (with a valid key, so only the framing can stop it), expected status
_INJECTIONS: dict[str, tuple[bytes, int]] = {
    "control": (b"GET /v1/models HTTP/1.1\r\nHost: g\r\n{auth}X-A: a\r\nConnection: close\r\n\r\n", 200),
    "bare_cr_in_value": (b"GET /v1/models HTTP/1.1\r\nHost: g\r\n{auth}X-A: a\rX-Injected: 1\r\n"
                         b"Connection: close\r\n\r\n", 400),
    "bare_lf_in_value": (b"GET /v1/models HTTP/1.1\r\nHost: g\r\n{auth}X-A: a\nX-Injected: 1\r\n"
                         b"Connection: close\r\n\r\n", 400),
    "nul_in_value": (b"GET /v1/models HTTP/1.1\r\nHost: g\r\n{auth}X-A: a\x00X-Injected: 1\r\n"
                     b"Connection: close\r\n\r\n", 400),
    "obs_fold": (b"GET /v1/models HTTP/1.1\r\nHost: g\r\n{auth}X-A: a\r\n X-Injected: 1\r\n"
                 b"Connection: close\r\n\r\n", 400),
    "content_length_and_chunked": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n{auth}Content-Length: 4\r\n"
                                   b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n", 400),
    "chunked_and_content_length": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n{auth}"
                                   b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\nConnection: close\r\n\r\n"
                                   b"0\r\n\r\n", 400),
    "smuggled_request": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n{auth}Content-Length: 6\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v1/smuggled HTTP/1.1\r\nHost: g\r\n"
                         b"{auth}Connection: close\r\n\r\n", 400),
    "two_content_lengths": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n{auth}Content-Length: 2\r\n"
                            b"Content-Length: 3\r\nConnection: close\r\n\r\n{} ", 400),
    "space_before_colon": (b"GET /v1/models HTTP/1.1\r\nHost: g\r\n{auth}Content-Length : 5\r\n"
                           b"Connection: close\r\n\r\n", 400),
}


@pytest.mark.parametrize("case", list(_INJECTIONS))
def test_header_injection_is_refused_before_upstream(rec_gateway: GatewayProcess, recorder: RecordingUpstream,
                                                     case: str) -> None:
    template, expected = _INJECTIONS[case]
    data = template.replace(b"{auth}", _alice_head(rec_gateway).encode())
    before = recorder.count()
    reply = raw_request(rec_gateway.url, data)
    assert reply.status == expected, reply.raw[:300]
    forwarded = recorder.seen[before:]
    if expected == 200:  # the control: a clean request does get through, and is seen here
        assert [s.target for s in forwarded] == ["/v1/models"] and forwarded[0].values("x-a") == ["a"]
        return
    # uvicorn's parser (httptools) refuses the request and closes the connection
    assert reply.body == b"Invalid HTTP request received." and reply.headers["connection"] == "close"
    assert forwarded == []


@pytest.mark.parametrize("layout", ["many_headers", "one_huge_header"])
def test_oversized_header_block_is_refused_before_upstream(rec_gateway: GatewayProcess,
                                                           recorder: RecordingUpstream, layout: str) -> None:
    """About 100 KB of request headers: a clean 4xx from the gateway itself, nothing forwarded."""
    pad = ([f"X-Pad-{i}: {'a' * 1000}" for i in range(100)] if layout == "many_headers"
           else [f"X-Pad: {'a' * 100_000}"])
    before = recorder.count()
    reply = raw_request(rec_gateway.url, request_bytes("GET", "/v1/models", rec_gateway.secrets["alice"], *pad))
    forwarded = [(s.target, len(s.head)) for s in recorder.seen[before:]]
    assert forwarded == [], f"the gateway forwarded a {forwarded[0][1]}-byte request head upstream"
    assert reply.status in (400, 413, 431) or reply.raw == b"", reply.raw[:300]


def test_oversized_body_is_413_and_nothing_reaches_upstream(rec_gateway: GatewayProcess,
                                                            recorder: RecordingUpstream) -> None:
    secret = rec_gateway.secrets["alice"]
    before = recorder.count()
    declared = raw_request(rec_gateway.url, request_bytes(
        "POST", "/v1/chat/completions", secret, "Content-Type: application/json", "Content-Length: 1001",
        body=b" " * 1001))
    chunks = b"".join(b"%x\r\n%s\r\n" % (250, b" " * 250) for _ in range(5)) + b"0\r\n\r\n"
    chunked = raw_request(rec_gateway.url, request_bytes(
        "POST", "/v1/chat/completions", secret, "Content-Type: application/json", "Transfer-Encoding: chunked",
        body=chunks))
    for reply in (declared, chunked):
        assert reply.status == 413, reply.raw[:300]
        assert reply.headers["connection"] == "close"
        assert error_of(reply) == {"message": "request body over 1000 bytes", "type": "bad_request", "code": 413}
    assert recorder.count() == before
    # the limit itself is allowed (control)
    exact = raw_request(rec_gateway.url, request_bytes(
        "POST", "/v1/exact", secret, "Content-Type: application/json", "Content-Length: 1000", body=b"x" * 1000))
    assert exact.status == 200
    assert [(s.target, s.body) for s in recorder.seen[before:]] == [("/v1/exact", b"x" * 1000)]


# --- logs, spans and shutdown ----------------------------------------------------------------

CANARY_BEARER = "olk_CANARYbearer0000leak0000Zq9"
CANARY_X_API_KEY = "CANARY-x-api-key-7f3c9e21"
CANARY_SECOND_KEY = "CANARY-second-key-b41d"
QUERY_SECRET = "SECRET123"


@dataclass
class TracedRun:
    """A gateway that served a fixed list of requests, then was stopped with SIGTERM."""

    url: str
    secret: str
    statuses: list[int]
    replies: list[str]  # response heads and bodies, as text
    upstream_requests: int
    exit_code: int | None
    log: str
    access_text: str
    access: list[dict[str, Any]]
    received: Received
    exported: str  # every exported trace and metric request, as protobuf text


@pytest.fixture(scope="module")
def traced(sim_process: Any, workdir: Path) -> Iterator[TracedRun]:
    with OtlpHttpCollector() as collector:
        env = gateway_env(workdir, "traced", OTEL_LLM_ENDPOINT=collector.endpoint)
        gateway = GatewayProcess(sim_process.base_url, {"alice": {"routes": ["/v1/*"]}}, env=env).start()
        exit_code = None
        try:
            alice = gateway.secrets["alice"]
            sim_process.reset()  # start configuration: earlier modules may have changed it
            before = sim_process.stats()["requests"]
            calls = [
                ("GET", "/v1/models", {}),
                ("GET", "/v1/models", {"authorization": f"Bearer {CANARY_BEARER}"}),
                ("POST", "/v1/chat/completions", {"x-api-key": CANARY_X_API_KEY}),
                ("GET", "/v1/models", {"authorization": f"Bearer {alice}", "x-api-key": CANARY_SECOND_KEY}),
                ("POST", f"/v1/chat/completions?token={QUERY_SECRET}", {"authorization": f"Bearer {alice}", **QUICK}),
                ("GET", f"/v1/models?token={QUERY_SECRET}&x=1", {"authorization": f"Bearer {alice}"}),
                ("GET", "/v1/models", {"authorization": f"Bearer {alice}"}),
            ]
            statuses, replies = [], []
            with httpx.Client(base_url=gateway.url, timeout=10) as client:
                for method, path, headers in calls:
                    response = client.request(method, path, headers=headers,
                                              json=CHAT if method == "POST" else None)
                    statuses.append(response.status_code)
                    replies.append(f"{response.headers}\n{response.text}")
            upstream_requests = sim_process.stats()["requests"] - before
        finally:
            exit_code = gateway.stop()
        received = collector.received
        exported = "\n".join(str(r) for r in [*received.traces, *received.metrics])
        access_text = gateway.access_log_path.read_text() if gateway.access_log_path.exists() else ""
        yield TracedRun(gateway.url, alice, statuses, replies, upstream_requests, exit_code, gateway.log(),
                        access_text, gateway.access_records(), received, exported)


def _server_spans(received: Received) -> list[dict[str, Any]]:
    return [attributes_of(span.attributes) for _, span in received.spans() if span.kind == SPAN_KIND_SERVER]


def test_traced_run_answers(traced: TracedRun) -> None:
    assert traced.statuses == [401, 401, 401, 400, 200, 200, 200]
    assert traced.upstream_requests == 3  # only the authenticated requests reached the simulator


@pytest.mark.parametrize("canary", [CANARY_BEARER, CANARY_X_API_KEY, CANARY_SECOND_KEY, "alice's key"])
def test_presented_secrets_appear_in_no_log_reply_or_span(traced: TracedRun, canary: str) -> None:
    secret = traced.secret if canary == "alice's key" else canary
    assert traced.exported and traced.access_text and traced.log  # there is something to search
    assert secret not in traced.access_text
    assert secret not in traced.log
    assert all(secret not in reply for reply in traced.replies)
    assert secret not in traced.exported
    # the exported spans are the requests above: one SERVER span each, outcome and key id recorded
    outcomes = Counter((s.get(sc.LLM_GATEWAY_OUTCOME), s.get(sc.LLM_GATEWAY_KEY_ID)) for s in
                       _server_spans(traced.received))
    assert outcomes == {("unauthorized", None): 3, ("bad_request", None): 1, ("allowed", "alice"): 3}


def test_server_spans_carry_no_header_value(traced: TracedRun) -> None:
    """As the README says: not even the caller's User-Agent (httpx sent its own)."""
    spans = _server_spans(traced.received)
    assert spans and all(sc.USER_AGENT_ORIGINAL not in span for span in spans)
    assert "python-httpx" not in traced.exported


def test_query_string_is_not_logged_or_traced(traced: TracedRun) -> None:
    assert QUERY_SECRET not in traced.access_text
    assert QUERY_SECRET not in traced.log
    assert QUERY_SECRET not in traced.exported
    assert [r["path"] for r in traced.access][4:6] == ["/v1/chat/completions", "/v1/models"]


def test_access_log_has_one_json_line_per_request_with_the_key_id(traced: TracedRun) -> None:
    lines = traced.access_text.splitlines()
    assert len(lines) == len(traced.statuses) == len(traced.access)
    for line in lines:
        json.loads(line)  # every line is one JSON object
    assert [(r["key_id"], r["status"]) for r in traced.access] == [
        (None, 401), (None, 401), (None, 401), (None, 400), ("alice", 200), ("alice", 200), ("alice", 200)]
    assert [r["outcome"] for r in traced.access] == ["unauthorized"] * 3 + ["bad_request"] + ["allowed"] * 3
    assert {"time", "client", "method", "path", "queue_ms", "total_ms", "bytes", "trace_id"} <= set(traced.access[0])
    span_traces = {span.trace_id.hex() for _, span in traced.received.spans() if span.kind == SPAN_KIND_SERVER}
    assert {r["trace_id"] for r in traced.access} == span_traces


def test_sigterm_exits_0_and_refuses_new_connections(traced: TracedRun, sim_process: Any) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{traced.url}/-/health", timeout=5)
    assert sim_process.stats()["requests"] >= 0  # the upstream is still up
    assert traced.exit_code == 0, f"exit code {traced.exit_code} after SIGTERM\n{traced.log}"
