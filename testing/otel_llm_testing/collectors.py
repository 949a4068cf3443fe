"""OTLP receivers that decode what they get (HTTP/protobuf and gRPC), and readers of it."""

from __future__ import annotations

import base64
import gzip
import json
import threading
import zlib
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_llm_testing.net import LOOPBACK

__all__ = ["OtlpGrpcCollector", "OtlpHttpCollector", "Received", "any_value", "attributes_of", "walk_strings"]


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
