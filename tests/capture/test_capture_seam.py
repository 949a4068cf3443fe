"""The capture seam: any HTTP stack can feed a call through LlmCall's named methods, capture
depends on nothing that builds telemetry, and the sink only reads the record."""

from __future__ import annotations

import ast
import copy
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm.capture.call import END_EOF, CallRecord, CallRequest, LlmCall
from otel_llm.instrumentor import current_telemetry
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim

PACKAGE = Path(__file__).resolve().parents[2] / "otel_llm"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _imports(folder: str) -> dict[str, set[str]]:
    """otel_llm modules imported by each module of ``folder`` (any import statement)."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / folder).glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[path.name] = {n for n in names if n.startswith("otel_llm")}
    return found


def test_capture_imports_nothing_that_builds_or_exports_telemetry() -> None:
    forbidden = ("otel_llm.telemetry", "otel_llm.export", "otel_llm.observers", "otel_llm.tools",
                 "otel_llm.instrumentor", "otel_llm.gateway")
    imports = _imports("capture")
    assert "call.py" in imports and "httpcore.py" in imports
    bad = {module: sorted(n for n in names if n.startswith(forbidden)) for module, names in imports.items()}
    assert not any(bad.values()), bad


def test_telemetry_knows_capture_only_through_the_seam() -> None:
    """Building spans and metrics depends on the seam's types (the call and its record), never on
    an adapter."""
    seam = ("otel_llm.capture.call", "otel_llm.capture.record")
    for module, names in _imports("telemetry").items():
        capture = {n for n in names if n.startswith("otel_llm.capture")}
        assert all(n in seam or n.startswith(tuple(m + "." for m in seam)) for n in capture), (module, capture)


def _snapshot(value: Any) -> Any:
    """A comparable deep copy (objects with slots, like the stream scanner, by their slots)."""
    slots = getattr(type(value), "__slots__", None)
    if slots and not isinstance(value, tuple):
        return (type(value).__name__, {name: _snapshot(getattr(value, name, None)) for name in slots})
    return copy.deepcopy(value)


def _record(call: LlmCall) -> dict[str, Any]:
    return {name: _snapshot(getattr(call, name)) for name in LlmCall.__slots__
            if name not in ("_lock", "__weakref__", "sink", "request")}


@pytest.mark.parametrize("stream", [False, True])
def test_the_sink_does_not_write_into_the_record(sim, otel: Otel, monkeypatch: pytest.MonkeyPatch,
                                                 stream: bool) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.0, token_interval=0.0, runtime="ollama")
    sink = current_telemetry()
    assert sink is not None
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    original, original_start = type(sink).call_finished, type(sink).call_started
    calls: dict[int, LlmCall] = {}

    def started(self: Any, call: LlmCall) -> object:
        calls[call.key] = call
        return original_start(self, call)

    def checked(self: Any, record: CallRecord, state: object) -> None:
        call = calls[record.key]
        before = {**_record(call), "record": _snapshot(record._replace(request=None))}
        original(self, record, state)
        seen.append((before, {**_record(call), "record": _snapshot(record._replace(request=None))}))

    monkeypatch.setattr(type(sink), "call_started", started)
    monkeypatch.setattr(type(sink), "call_finished", checked)
    httpx.post(f"{sim.base_url}/api/chat", json={**CHAT, "stream": stream}, timeout=10)
    assert len(seen) == 1
    before, after = seen[0]
    changed = sorted(name for name in before if before[name] != after[name])
    assert changed == [], changed
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_RUNTIME_NAME] == "ollama"  # the evidence still reached the span


class _RawHttp:
    """A minimal HTTP/1.1 client on a socket, fed into the seam as any new adapter would be."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def post(self, path: str, body: dict[str, Any]) -> tuple[bytes, list[bytes]]:
        sink = current_telemetry()
        assert sink is not None
        route = sink.route(path)
        assert route is not None
        payload = json.dumps(body).encode()
        headers: dict[str, str] = {"content-type": "application/json"}
        url = f"http://{self.host}:{self.port}{path}"
        call = LlmCall.open(sink, route, CallRequest("POST", "http", self.host, self.port, path, url, headers,
                                                      payload))
        call.connect_started()
        conn = socket.create_connection((self.host, self.port))
        call.connected(conn.getpeername()[:2])
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        call.request_started()
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n"
                     f"Content-Length: {len(payload)}\r\n{head}\r\n".encode() + payload)
        call.request_sent()
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head_bytes, _, rest = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        response_headers = dict(line.split(": ", 1) for line in lines[1:])
        call.response_started(status, response_headers)
        pieces = [rest] if rest else []
        if rest:
            call.chunk(rest)
        while True:
            piece = conn.recv(65536)
            if not piece:
                break
            call.chunk(piece)
            pieces.append(piece)
        conn.close()
        call.finish(END_EOF)
        return headers["traceparent"].encode(), pieces


def test_a_new_http_stack_gets_the_same_span_tree(sim, otel: Otel) -> None:
    """The seam alone (no httpx) gives phases, time to first token and native counters."""
    configure_sim(sim, tokens=6, first_token_delay=0.15, token_interval=0.02, headers_delay=0.05,
                  runtime="llama.cpp")
    traceparent, pieces = _RawHttp("127.0.0.1", sim.port).post(
        "/v1/chat/completions", {**CHAT, "stream": True})
    call, kids = otel.one_call()
    assert [k.name for k in kids] == [sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT,
                                      sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
    assert traceparent.decode().split("-")[2] == format(call.context.span_id, "016x")
    attrs = call.attributes
    assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[sc.NETWORK_PEER_ADDRESS] == "127.0.0.1"
    assert attrs[sc.LLM_CLIENT_CONNECTION_REUSED] is False
    # first token 0.05 + 0.15 s after the request, within what a busy machine's wake-ups allow
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] == pytest.approx(0.2, abs=0.1)
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] > attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE]
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    assert attrs[sc.LLM_RUNTIME_NAME] == "llama.cpp"  # from the stream's own `timings`
    assert b"".join(pieces).count(b"data: ") >= 6
