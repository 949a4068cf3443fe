"""The gateway's HTTP surface under hypothesis, through a real socket to a real gateway in front of
a recording upstream: request lines, headers and bodies built from the pieces request smuggling
and parser confusion use (odd methods and versions, bare CR/LF, duplicate and conflicting
lengths, chunked framing, NUL and high bytes, encoded paths, pipelined requests).

Invariants: nothing reaches the runtime unless the request carried the valid key; the gateway
answers or closes every connection and keeps serving; its memory stays bounded.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm_testing.raw_http import RecordingUpstream

TIMEOUT = 0.3  # the gateway's header, body and idle timeouts: an unfinished or kept-alive exchange ends quickly


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gateway(recorder: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gateway-fuzz")
    env = {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_GPU_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
           "OTEL_LLM_TRACES_FILE": str(workdir / "traces.jsonl")}
    keys = {"alice": {"routes": ["/v1/*"], "models": ["m"]}}
    with GatewayProcess(recorder.url, keys, env=env, header_timeout=TIMEOUT, body_timeout=TIMEOUT,
                        idle_timeout=TIMEOUT, max_body_bytes=4096, refusal_burst=1_000_000,
                        access_log="off") as gw:
        yield gw


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


METHODS = st.one_of(st.sampled_from(["GET", "POST", "PUT", "DELETE", "TRACE", "OPTIONS", "CONNECT", "PATCH",
                                     "HEAD", "get", "PO ST", "", "G\x00T", "POST\t"]),
                    st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=8))
TARGETS = st.one_of(
    st.sampled_from(["/v1/chat/completions", "/v1/models", "/v1/../sim/stats", "/v1/%2e%2e/x", "//v1/models",
                     "/v1/models%00", "/v1\\models", "*", "http://evil/v1/models", "/v1/models?x=%zz",
                     "/v1/chat/completions#frag", "/" + "a" * 3000, "/v1/%2F..%2Fadmin"]),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40).map(lambda t: "/" + t))
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 x", "", "HTTP/0.9", "http/1.1", "HTTP/1.10"])
NAMES = st.sampled_from(["Host", "Content-Length", "Transfer-Encoding", "Authorization", "X-Api-Key", "Connection",
                         "Expect", "X-Forwarded-For", "Cookie", "Content-Type", "Content-Length ", " Host", "X\x00Y",
                         "Transfer_Encoding", "Upgrade", "X-HTTP-Method-Override"])
VALUES = st.one_of(st.sampled_from(["chunked", "chunked, identity", "identity", "0", "-1", "5", "99999999999999999999",
                                    "1e3", "0x10", "close", "keep-alive", "100-continue", "h2c", "Bearer",
                                    "Bearer olk_" + "A" * 43, "application/json", "a\rb", "a\nb", "\xff\xfe"]),
                   st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=30))
BODIES = st.one_of(st.sampled_from([b"", b'{"model": "m"}', b'{"model": "x"}', b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n",
                                    b"ffffffffffffffff\r\n", b'{"model": "m", "model": "x"}',
                                    b"GET /v1/models HTTP/1.1\r\nHost: g\r\n\r\n"]),
                   st.binary(max_size=600))
EOLS = st.sampled_from(["\r\n", "\n", "\r", "\r\r\n"])


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A request the gateway would forward, with a few of the odd pieces added."""
    body = b'{"model": "m"}'
    headers = ["Host: g", "Authorization: Bearer {KEY}", f"Content-Length: {len(body)}"]
    for _ in range(draw(st.integers(0, 2))):
        headers.insert(draw(st.integers(0, len(headers))), f"{draw(NAMES)}: {draw(VALUES)}")
    head = "\r\n".join([f"POST {draw(st.sampled_from(['/v1/chat/completions', '/v1/x']))} HTTP/1.1", *headers])
    return head.encode("latin-1", "replace") + b"\r\n\r\n" + body, True


@st.composite
def anything(draw: st.DrawFn) -> tuple[bytes, bool]:
    """Raw request bytes, and whether they carry the valid key (filled in by the test)."""
    eol = draw(EOLS)
    line = f"{draw(METHODS)} {draw(TARGETS)} {draw(VERSIONS)}"
    headers = [f"{draw(NAMES)}: {draw(VALUES)}" for _ in range(draw(st.integers(0, 6)))]
    with_key = draw(st.booleans())
    if with_key:
        headers.insert(draw(st.integers(0, len(headers))), "Authorization: Bearer {KEY}")
    head = eol.join([line, *headers]) + eol + eol
    data = head.encode("latin-1", "replace") + draw(BODIES)
    if draw(st.booleans()):  # pipelined: a second request on the same bytes
        data += data
    return data, with_key


requests = st.one_of(anything(), near_valid())


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@pytest.mark.slow
@given(case=requests)
def test_the_gateway_holds_whatever_the_bytes(gateway: GatewayProcess, recorder: RecordingUpstream,
                                              case: tuple[bytes, bool]) -> None:
    data, _ = case
    secret = gateway.secrets["alice"]
    data = data.replace(b"{KEY}", secret.encode())
    before = recorder.count()
    parts = urlsplit(gateway.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        try:  # no half-close: uvicorn takes a client's EOF for its leaving
            conn.sendall(data)
        except OSError:
            pass
        deadline = time.monotonic() + TIMEOUT + 8
        try:
            while time.monotonic() < deadline and conn.recv(65536):
                pass
        except OSError:
            pass
        assert time.monotonic() < deadline, "the gateway neither answered nor closed the connection"
    if secret.encode() not in data:
        assert recorder.count() == before, f"forwarded without the key: {data[:200]!r}"
    assert gateway._proc is not None and gateway._proc.poll() is None, gateway.log()[-2000:]


@pytest.mark.slow  # reads what the fuzz test above left behind: runs with it
def test_after_the_fuzz_the_gateway_serves_with_bounded_memory(gateway: GatewayProcess,
                                                             recorder: RecordingUpstream) -> None:
    import httpx

    # some generated requests were well-formed and carried the key: forwarding was exercised too
    assert recorder.count() > 0

    with httpx.Client(base_url=gateway.url, headers=gateway.headers("alice"), timeout=10) as client:
        assert client.get("/v1/models").status_code == 200
    assert _rss_kb(gateway.pid) < 250 * 1024, _rss_kb(gateway.pid)
