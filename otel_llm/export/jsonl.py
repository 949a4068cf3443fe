"""Write spans as OTLP/JSON lines, and read them back.

Each ``export()`` call appends one line holding one ``ExportTraceServiceRequest`` in the
OTLP/JSON encoding (hex ids, int64 as strings, enums as integers) -- the same format the
OpenTelemetry Collector's ``file`` exporter writes, so either side can read the other's files.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind

from otel_llm.config import DEFAULT_TRACES_FILE
from otel_llm.export.rotating import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, RotatingAppender, rotated_files

__all__ = [
    "DEFAULT_TRACES_FILE",
    "JsonLinesSpanExporter",
    "ReadStats",
    "decode_any_value",
    "encode_any_value",
    "encode_spans",
    "flatten_spans",
    "read_jsonl",
    "read_rotated",
]

_logger = logging.getLogger(__name__)

# OTLP's SpanKind numbering starts at 1 (0 is UNSPECIFIED); the SDK's starts at 0.
_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
# SpanFlags bits from trace.proto: "we know whether the parent is remote" / "it is remote".
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


# --- encoding ------------------------------------------------------------------------------


def _encode_double(value: float) -> float | str:
    """OTLP/JSON (proto3 JSON) spells non-finite doubles as strings; bare NaN is not JSON."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def encode_any_value(value: Any) -> dict[str, Any]:
    """Encode one attribute value as an OTLP/JSON ``AnyValue`` object."""
    if value is None:
        return {}
    if isinstance(value, bool):  # before int: bool is an int subclass
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 is a string in proto3 JSON
    if isinstance(value, float):
        return {"doubleValue": _encode_double(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _encode_attributes(value)}}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [encode_any_value(v) for v in value]}}
    # Unknown types should not reach here (the SDK validates attributes); keep the data.
    return {"stringValue": str(value)}


def _encode_attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": str(k), "value": encode_any_value(v)} for k, v in (attributes or {}).items()]


def _flags(parent: SpanContext | None) -> int:
    flags = _FLAG_HAS_IS_REMOTE
    if parent is not None and parent.is_remote:
        flags |= _FLAG_IS_REMOTE
    return flags


def _encode_link(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": format(link.context.trace_id, "032x"),
        "spanId": format(link.context.span_id, "016x"),
        "attributes": _encode_attributes(link.attributes),
        "flags": _flags(link.context),
    }
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    return out


def _encode_span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    if ctx is None:  # the SDK's ReadableSpan allows it; OTLP needs the span's ids
        raise ValueError(f"span {span.name!r} has no span context")
    out: dict[str, Any] = {
        "traceId": format(ctx.trace_id, "032x"),
        "spanId": format(ctx.span_id, "016x"),
    }
    trace_state = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if trace_state:
        out["traceState"] = trace_state
    if span.parent is not None:
        out["parentSpanId"] = format(span.parent.span_id, "016x")
    out.update(
        flags=_flags(span.parent),
        name=span.name,
        kind=_KIND.get(span.kind, 0),
        startTimeUnixNano=str(span.start_time or 0),
        endTimeUnixNano=str(span.end_time or 0),
        attributes=_encode_attributes(span.attributes),
    )
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(e.timestamp),
                "name": e.name,
                "attributes": _encode_attributes(e.attributes),
                **({"droppedAttributesCount": e.dropped_attributes} if e.dropped_attributes else {}),
            }
            for e in span.events
        ]
    if span.links:
        out["links"] = [_encode_link(link) for link in span.links]
    for key, count in (
        ("droppedAttributesCount", span.dropped_attributes),
        ("droppedEventsCount", span.dropped_events),
        ("droppedLinksCount", span.dropped_links),
    ):
        if count:
            out[key] = count
    status: dict[str, Any] = {"code": span.status.status_code.value}
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    return out


def _encode_scope(span: ReadableSpan) -> dict[str, Any]:
    scope = span.instrumentation_scope
    if scope is None:
        return {}
    out: dict[str, Any] = {"name": scope.name}
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = _encode_attributes(scope.attributes)
    return out


def encode_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Build one OTLP/JSON ``ExportTraceServiceRequest``, grouping spans by resource then scope."""
    # Resource and InstrumentationScope are hashable in the SDK, so they can key the grouping.
    grouped: dict[Any, dict[Any, list[ReadableSpan]]] = {}
    for span in spans:
        grouped.setdefault(span.resource, {}).setdefault(span.instrumentation_scope, []).append(span)
    resource_spans = []
    for resource, by_scope in grouped.items():
        scope_spans = []
        for scope, members in by_scope.items():
            entry: dict[str, Any] = {
                "scope": _encode_scope(members[0]),
                "spans": [_encode_span(s) for s in members],
            }
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        rs: dict[str, Any] = {
            "resource": {"attributes": _encode_attributes(resource.attributes if resource else None)},
            "scopeSpans": scope_spans,
        }
        if resource is not None and resource.schema_url:
            rs["schemaUrl"] = resource.schema_url
        resource_spans.append(rs)
    return {"resourceSpans": resource_spans}


# --- exporter -------------------------------------------------------------------------------


class JsonLinesSpanExporter(SpanExporter):
    """Append each batch of spans to ``path`` as one OTLP/JSON line."""

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_TRACES_FILE, max_bytes: int = DEFAULT_MAX_BYTES,
                 backups: int = DEFAULT_BACKUPS) -> None:
        # Resolved now: an application that changes directory later must not scatter its spans.
        self.path = os.path.abspath(os.fspath(path))
        self._file = RotatingAppender(self.path, max_bytes, backups)
        self._lock = threading.Lock()
        self._shutdown = False
        # Warn once per run of failures: a full disk must not flood the log on every batch.
        self._warned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append one line; never raises, returns FAILURE if the line could not be written."""
        if self._shutdown:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = json.dumps(encode_spans(spans), separators=(",", ":"), allow_nan=False) + "\n"
            data = line.encode("utf-8", "surrogatepass")
            with self._lock:
                # One write() on an O_APPEND file keeps lines whole even when several
                # processes share the file; opening per export survives external rotation.
                self._file.append(data)
        except Exception as exc:  # noqa: BLE001 - an exporter must never break the app
            if not self._warned:
                self._warned = True
                _logger.warning("otel_llm: cannot write spans to %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        self._warned = False
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Refuse further exports; nothing is buffered, so nothing to flush."""
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Every export is written and closed immediately, so this is always done."""
        return True


# --- reading --------------------------------------------------------------------------------


@dataclass
class ReadStats:
    """Counters filled in by :func:`read_jsonl` while it iterates."""

    lines: int = 0
    spans: int = 0
    malformed: int = 0


_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def decode_any_value(value: Mapping[str, Any]) -> Any:
    """Decode an OTLP/JSON ``AnyValue`` object to a plain Python value."""
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        raw = value["doubleValue"]
        return _SPECIAL_DOUBLES[raw] if isinstance(raw, str) and raw in _SPECIAL_DOUBLES else float(raw)
    if "arrayValue" in value:
        return [decode_any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return _decode_attributes(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None


def _decode_attributes(items: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {kv["key"]: decode_any_value(kv.get("value", {})) for kv in items or []}


def _flatten_span(span: Mapping[str, Any], resource: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
    status = span.get("status") or {}
    return {
        "traceId": str(span["traceId"]).lower(),
        "spanId": str(span["spanId"]).lower(),
        "parentSpanId": str(span["parentSpanId"]).lower() if span.get("parentSpanId") else None,
        "name": str(span.get("name", "")),
        "kind": int(span.get("kind", 0)),
        "startTimeUnixNano": int(span.get("startTimeUnixNano", 0)),
        "endTimeUnixNano": int(span.get("endTimeUnixNano", 0)),
        "attributes": _decode_attributes(span.get("attributes")),
        "events": [
            {
                "name": e.get("name", ""),
                "timeUnixNano": int(e.get("timeUnixNano", 0)),
                "attributes": _decode_attributes(e.get("attributes")),
            }
            for e in span.get("events", [])
        ],
        "status": {"code": int(status.get("code", 0)), "message": status.get("message", "")},
        "resource": resource,
        "scope": scope,
    }


def _spans_in_line(line: str) -> list[dict[str, Any]]:
    """Decode one line completely, so a bad line yields nothing rather than half its spans."""
    return _flatten_request(json.loads(line))


def flatten_spans(spans: Sequence[ReadableSpan]) -> list[dict[str, Any]]:
    """SDK spans as the flattened dicts that ``read_jsonl`` yields (for in-process viewers)."""
    return _flatten_request(json.loads(json.dumps(encode_spans(spans))))


def _flatten_request(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rs in request["resourceSpans"]:
        resource = _decode_attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans", []):
            raw_scope = ss.get("scope") or {}
            scope = {"name": raw_scope.get("name", ""), "version": raw_scope.get("version", "")}
            out.extend(_flatten_span(s, resource, scope) for s in ss.get("spans", []))
    return out


def read_rotated(path: str | os.PathLike[str], stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """:func:`read_jsonl` over ``path``'s rotated files (``path.2``, ``path.1``: oldest first),
    then ``path``; ``FileNotFoundError`` only when none of them exists."""
    files = [f for f in rotated_files(os.fspath(path)) if os.path.exists(f)]
    if not files:
        raise FileNotFoundError(os.fspath(path))
    for name in files:
        yield from read_jsonl(name, stats)


def read_jsonl(path: str | os.PathLike[str], stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield flattened span dicts from an OTLP/JSON-lines file.

    Each dict has ``traceId``, ``spanId``, ``parentSpanId`` (None for roots), ``name``,
    ``kind`` (OTLP number, CLIENT=3), ``startTimeUnixNano``/``endTimeUnixNano`` (int),
    ``attributes`` (plain dict), ``events``, ``status`` (``code``/``message``), ``resource``
    (attribute dict) and ``scope``. Lines that do not decode -- e.g. the truncated last line
    of a killed process -- are skipped and counted in ``stats.malformed``. Opening a missing
    file raises ``FileNotFoundError`` on first iteration.
    """
    stats = stats if stats is not None else ReadStats()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            stats.lines += 1
            try:
                spans = _spans_in_line(line)
            except (ValueError, KeyError, TypeError, AttributeError):
                stats.malformed += 1
                continue
            stats.spans += len(spans)
            yield from spans
