"""Small loopback servers shared by the integration tests.

* ``ModelServer``: an HTTP/1.1 (optionally TLS) OpenAI-style chat server that records every
  request's headers and answers JSON or an SSE stream.
* ``OtlpHttpCollector`` / ``OtlpGrpcCollector``: OTLP receivers that decode what they get.
* ``clean_env`` / ``run_python``: subprocess helpers with an environment free of OTel settings.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

LOOPBACK = "127.0.0.1"


# --- model server ----------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def _sse(obj: Any) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


class _ModelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ModelHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet."""

    def _record(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.owner.requests.append(RecordedRequest(self.command, self.path, headers, body))
        return body

    def _send_json(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._record()
        self._send_json({"object": "list", "data": [{"id": "tiny-model", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = self._record()
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        model = request.get("model", "tiny-model")
        owner = self.server.owner
        if request.get("stream"):
            self._stream(model, owner)
            return
        text = " ".join(f"tok{i}" for i in range(owner.tokens))
        self._send_json({
            "id": "chatcmpl-tiny", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": owner.tokens, "total_tokens": 3 + owner.tokens},
        })

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, model: str, owner: ModelServer) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse({"id": "chatcmpl-tiny", "object": "chat.completion.chunk", "created": 1, "model": model,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        self._chunk(frame({"role": "assistant", "content": ""}))
        time.sleep(owner.first_token_delay)
        for i in range(owner.tokens):
            if i:
                time.sleep(owner.token_interval)
            self._chunk(frame({"content": f"tok{i}" if i == 0 else f" tok{i}"}))
        self._chunk(frame({}, "stop") + _sse("[DONE]"))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _ModelHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: ModelServer, ssl_context: ssl.SSLContext | None) -> None:
        self.owner = owner
        self.ssl_context = ssl_context
        super().__init__((LOOPBACK, 0), _ModelHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(10)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.do_handshake()  # in the connection's thread, not the accept loop
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients closing mid-stream are normal here."""


class ModelServer:
    """OpenAI-style chat server on 127.0.0.1 (TLS if ``ssl_context``); use as a context manager."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, *, tokens: int = 5,
                 first_token_delay: float = 0.02, token_interval: float = 0.005) -> None:
        self.tokens = tokens
        self.first_token_delay = first_token_delay
        self.token_interval = token_interval
        self.requests: list[RecordedRequest] = []
        self._server = _ModelHTTPServer(self, ssl_context)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="model-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "", host: str = LOOPBACK) -> str:
        scheme = "https" if self._server.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# --- OTLP receivers --------------------------------------------------------------------------


@dataclass
class Received:
    """What an OTLP receiver decoded."""

    traces: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    encodings: list[str] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every received span."""
        out = []
        for request in self.traces:
            for resource_spans in request.resource_spans:
                resource = attributes_of(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out

    def write_otlp_json(self, path: Path) -> None:
        """The trace exports as OTLP/JSON lines, one per export, as the OpenTelemetry Collector's
        file exporter writes them (ids in hex, enums as numbers)."""
        with open(path, "w") as out:
            for request in self.traces:
                doc = MessageToDict(request, use_integers_for_enums=True)
                for resource_spans in doc.get("resourceSpans", ()):
                    for scope_spans in resource_spans.get("scopeSpans", ()):
                        for span in scope_spans.get("spans", ()):
                            for key in ("traceId", "spanId", "parentSpanId"):
                                if span.get(key):
                                    span[key] = base64.b64decode(span[key]).hex()
                out.write(json.dumps(doc) + "\n")

    def metric_names(self) -> set[str]:
        return {m.name for r in self.metrics for rm in r.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}


def any_value(value: Any) -> Any:
    """Decode an OTLP protobuf ``AnyValue``."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_of(key_values: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class _OtlpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _OtlpHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Quiet."""

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        received = self.server.received
        received.encodings.append(encoding)
        received.content_types.append(self.headers.get("Content-Type") or "")
        if self.path == "/v1/traces":
            received.traces.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            if self.server.forward_to:  # as a collector with a second exporter would
                httpx.post(self.server.forward_to + self.path, content=body, timeout=30, trust_env=False,
                           headers={"Content-Type": self.headers.get("Content-Type") or "application/x-protobuf"})
        elif self.path == "/v1/metrics":
            received.metrics.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
            reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class _OtlpHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, forward_to: str | None = None) -> None:
        self.received = Received()
        self.forward_to = forward_to
        super().__init__((LOOPBACK, 0), _OtlpHandler)


class OtlpHttpCollector:
    """OTLP http/protobuf receiver on 127.0.0.1 (POST /v1/traces, /v1/metrics); with
    ``forward_to`` (an OTLP/HTTP base URL) it also passes each trace export on, as a collector
    exporting to a backend does."""

    def __init__(self, forward_to: str | None = None) -> None:
        self._server = _OtlpHTTPServer(forward_to)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="otlp-http", daemon=True)

    @property
    def received(self) -> Received:
        return self._server.received

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpHttpCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC naming
        self.received.traces.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.received.metrics.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class OtlpGrpcCollector:
    """OTLP gRPC receiver (trace and metrics services) on 127.0.0.1, insecure."""

    def __init__(self) -> None:
        import grpc

        self.received = Received()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self.received), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(self.received), self._server)
        self.port = self._server.add_insecure_port(f"{LOOPBACK}:0")

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> OtlpGrpcCollector:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)


# --- subprocesses ----------------------------------------------------------------------------

_DROPPED_PREFIXES = ("OTEL_", "PYTHON")
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without OTel/otel_llm settings, proxies or PYTHON* variables, plus ``extra``.

    PYTHONPATH is this checkout, so a subprocess imports the otel_llm under test even when the
    venv's editable install points at another checkout (a git worktree)."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.upper().startswith(_DROPPED_PREFIXES) and k.lower() not in _PROXY_VARS
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run_python(script: str, cwd: Path, env: Mapping[str, str], *args: str,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Write ``script`` to ``cwd/app.py`` and run it with the venv's python."""
    path = cwd / "app.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path), *args], cwd=cwd, env=dict(env),
                          capture_output=True, text=True, timeout=timeout)


def walk_strings(value: Any) -> Iterator[str]:
    """Every string (and key) inside a nested structure of dicts, lists, tuples, bytes."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (bytes, bytearray)):
        yield bytes(value).decode("utf-8", "replace")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from walk_strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from walk_strings(item)
    elif value is not None:
        yield str(value)


@dataclass
class Plan:
    status: int
    headers: list[tuple[str, str]]
    chunks: list[bytes]
    chunked: bool = True
    repeat: int = 1  # send the chunks this many times (an endless stream without storing it)


class PlanServer:
    """Answers each POST with the next queued Plan, each chunk flushed on its own (raw socket,
    so any bytes and framing can be sent); anything else (an observer probing ``/metrics``) gets 404."""

    def __init__(self) -> None:
        self.plans: list[Plan] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, name="plan-server", daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            if not head.startswith(b"POST"):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            plan = self.plans.pop(0)
            lines = [f"HTTP/1.1 {plan.status} X", "connection: close", *(f"{k}: {v}" for k, v in plan.headers)]
            total = sum(map(len, plan.chunks)) * plan.repeat
            lines.append("transfer-encoding: chunked" if plan.chunked else f"content-length: {total}")
            try:
                conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                for _ in range(plan.repeat):
                    for chunk in plan.chunks:
                        if not chunk:
                            continue
                        if plan.chunked:
                            conn.sendall(b"%x\r\n" % len(chunk))
                            conn.sendall(chunk)
                            conn.sendall(b"\r\n")
                        else:
                            conn.sendall(chunk)
                if plan.chunked:
                    conn.sendall(b"0\r\n\r\n")
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
