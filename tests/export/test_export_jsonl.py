"""JsonLinesSpanExporter writes OTLP/JSON lines that read_jsonl (and protobuf) read back."""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as pb_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_llm import semconv as sc
from otel_llm.export.jsonl import JsonLinesSpanExporter, ReadStats, read_jsonl

MS = 1_000_000
T0 = 1_750_000_000_000 * MS

CALL_ATTRS: dict[str, Any] = {
    sc.GEN_AI_OPERATION_NAME: "chat",
    sc.GEN_AI_REQUEST_MODEL: "llama3",
    sc.SERVER_ADDRESS: "127.0.0.1",
    sc.SERVER_PORT: 11434,
    sc.HTTP_RESPONSE_STATUS_CODE: 200,
    sc.LLM_CLIENT_TIME_TO_FIRST_BYTE: 0.1,
    sc.LLM_CLIENT_CONNECTION_REUSED: True,
    sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 2**40,  # larger than a float-safe JSON number would need
}


def _record_call(tracer: trace.Tracer, start: int = T0) -> None:
    """One CLIENT call with two tiled INTERNAL phases, an event and a link."""
    parent = tracer.start_span("chat llama3", kind=SpanKind.CLIENT, start_time=start, attributes=CALL_ATTRS)
    parent.add_event("gen_ai.choice", {"index": 0}, timestamp=start + 50 * MS)
    ctx = trace.set_span_in_context(parent)
    wait = tracer.start_span(sc.SPAN_SERVER_WAIT, context=ctx, start_time=start,
                             links=[Link(parent.get_span_context(), {"why": "test"})])
    wait.end(end_time=start + 40 * MS)
    download = tracer.start_span(sc.SPAN_DOWNLOAD, context=ctx, start_time=start + 40 * MS)
    download.end(end_time=start + 100 * MS)
    parent.set_status(Status(StatusCode.ERROR, "boom"))
    parent.end(end_time=start + 100 * MS)


def _provider(*exporters: Any, service: str = "test-svc") -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _hex_ids_to_base64(obj: Any) -> Any:
    """protobuf's JSON parser wants base64 bytes; OTLP/JSON uses hex for trace/span ids."""
    if isinstance(obj, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId")
                else _hex_ids_to_base64(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids_to_base64(v) for v in obj]
    return obj


def _strict_json(line: str) -> Any:
    def reject(token: str) -> None:
        raise ValueError(f"bare {token} is not JSON")

    return json.loads(line, parse_constant=reject)


def test_round_trip_preserves_ids_times_attributes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    memory = InMemorySpanExporter()
    _record_call(_provider(JsonLinesSpanExporter(path), memory).get_tracer("otel_llm", "1.2.3"))
    original: list[ReadableSpan] = list(memory.get_finished_spans())

    read = list(read_jsonl(path))

    assert len(path.read_text().splitlines()) == 3  # SimpleSpanProcessor: one line per span
    assert [s["name"] for s in read] == [s.name for s in original]
    for got, want in zip(read, original):
        ctx = want.get_span_context()
        assert got["traceId"] == format(ctx.trace_id, "032x")
        assert got["spanId"] == format(ctx.span_id, "016x")
        assert got["parentSpanId"] == (format(want.parent.span_id, "016x") if want.parent else None)
        assert got["startTimeUnixNano"] == want.start_time
        assert got["endTimeUnixNano"] == want.end_time
        expected_attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in want.attributes.items()}
        assert got["attributes"] == expected_attrs
        assert got["resource"]["service.name"] == "test-svc"
        assert got["scope"] == {"name": "otel_llm", "version": "1.2.3"}
    call = read[-1]
    assert call["kind"] == 3 and read[0]["kind"] == 1
    assert call["status"] == {"code": 2, "message": "boom"}
    assert call["events"] == [{"name": "gen_ai.choice", "timeUnixNano": T0 + 50 * MS, "attributes": {"index": 0}}]


def test_line_is_otlp_json_shape(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _record_call(_provider(JsonLinesSpanExporter(path)).get_tracer("otel_llm"))
    request = _strict_json(path.read_text().splitlines()[-1])

    scope_spans = request["resourceSpans"][0]["scopeSpans"][0]
    span = scope_spans["spans"][0]
    attrs = {kv["key"]: kv["value"] for kv in span["attributes"]}
    assert scope_spans["scope"]["name"] == "otel_llm"
    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16 and "parentSpanId" not in span
    assert span["kind"] == 3 and span["startTimeUnixNano"] == str(T0)
    assert attrs[sc.SERVER_PORT] == {"intValue": "11434"}
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] == {"doubleValue": 0.1}
    assert attrs[sc.LLM_CLIENT_CONNECTION_REUSED] == {"boolValue": True}
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == {"arrayValue": {"values": [{"stringValue": "stop"}]}}
    assert span["status"] == {"code": 2, "message": "boom"}


def test_line_parses_as_protobuf_and_equals_official_encoder(tmp_path: Path) -> None:
    """Ids are converted hex -> base64 first (the only difference between OTLP/JSON and proto3 JSON)."""
    path = tmp_path / "t.jsonl"
    exporter = JsonLinesSpanExporter(path)
    memory = InMemorySpanExporter()
    tracer = _provider(memory).get_tracer("otel_llm", "1.0", schema_url="https://example/schema")
    _record_call(tracer)
    spans = memory.get_finished_spans()
    assert exporter.export(spans) is SpanExportResult.SUCCESS

    line = path.read_text().splitlines()[0]
    parsed = json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(line))), ExportTraceServiceRequest())

    official = pb_encode_spans(spans)
    assert parsed.SerializeToString(deterministic=True) == official.SerializeToString(deterministic=True)


def test_non_finite_doubles_stay_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    tracer = _provider(JsonLinesSpanExporter(path)).get_tracer("otel_llm")
    span = tracer.start_span("chat x", kind=SpanKind.CLIENT, attributes={
        "a.nan": math.nan, "a.inf": math.inf, "a.ninf": -math.inf, "a.list": [1.0, math.nan]})
    span.end()

    line = path.read_text().splitlines()[0]
    _strict_json(line)  # no bare NaN / Infinity tokens
    json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(line))), ExportTraceServiceRequest())
    (got,) = read_jsonl(path)
    assert math.isnan(got["attributes"]["a.nan"])
    assert got["attributes"]["a.inf"] == math.inf and got["attributes"]["a.ninf"] == -math.inf
    assert got["attributes"]["a.list"][0] == 1.0 and math.isnan(got["attributes"]["a.list"][1])


def test_groups_by_resource_then_scope(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    for service in ("svc-a", "svc-b"):
        provider = _provider(memory, service=service)
        for scope in ("scope-1", "scope-2"):
            provider.get_tracer(scope).start_span(f"{service}/{scope}").end()
    path = tmp_path / "t.jsonl"
    JsonLinesSpanExporter(path).export(memory.get_finished_spans())

    (request,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(request["resourceSpans"]) == 2
    for rs in request["resourceSpans"]:
        assert [ss["scope"]["name"] for ss in rs["scopeSpans"]] == ["scope-1", "scope-2"]
        assert all(len(ss["spans"]) == 1 for ss in rs["scopeSpans"])


def test_malformed_and_truncated_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _record_call(_provider(JsonLinesSpanExporter(path)).get_tracer("otel_llm"))
    good = path.read_text().splitlines()
    path.write_text("\n".join([good[0], "not json", "", '{"other": 1}', *good[1:], good[0][: len(good[0]) // 2]]))

    stats = ReadStats()
    spans = list(read_jsonl(path, stats))

    assert len(spans) == 3
    assert stats.malformed == 3 and stats.spans == 3 and stats.lines == 6


def test_write_failure_returns_failure_and_warns_once(tmp_path: Path, caplog: Any) -> None:
    exporter = JsonLinesSpanExporter(tmp_path)  # a directory cannot be opened for append
    memory = InMemorySpanExporter()
    _record_call(_provider(memory).get_tracer("otel_llm"))
    spans = memory.get_finished_spans()

    with caplog.at_level(logging.WARNING, logger="otel_llm.export.jsonl"):
        results = [exporter.export(spans) for _ in range(3)]

    assert results == [SpanExportResult.FAILURE] * 3
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_shutdown_and_flush(tmp_path: Path) -> None:
    exporter = JsonLinesSpanExporter(tmp_path / "t.jsonl")
    memory = InMemorySpanExporter()
    _record_call(_provider(memory).get_tracer("otel_llm"))
    assert exporter.force_flush() is True
    exporter.shutdown()
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    assert not (tmp_path / "t.jsonl").exists()


def test_concurrent_exports_keep_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    exporter = JsonLinesSpanExporter(path)
    memory = InMemorySpanExporter()
    _record_call(_provider(memory).get_tracer("otel_llm"))
    spans = memory.get_finished_spans()

    threads = [threading.Thread(target=lambda: [exporter.export(spans) for _ in range(20)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    stats = ReadStats()
    assert len(list(read_jsonl(path, stats))) == 4 * 20 * 3
    assert stats.malformed == 0


# --- a file that stays bounded -------------------------------------------------------------------


def test_the_span_file_is_rotated_before_it_passes_its_size(tmp_path: Path) -> None:
    """Each SimpleSpanProcessor export is one line; the file never passes ``max_bytes`` and one
    previous file is kept; ``read_rotated`` reads the previous file, then the current one."""
    from otel_llm.export.jsonl import read_rotated

    path = tmp_path / "t.jsonl"
    exporter = JsonLinesSpanExporter(path, max_bytes=4000, backups=1)
    tracer = _provider(exporter).get_tracer("otel_llm")
    for i in range(40):
        _record_call(tracer, start=T0 + i * 1000 * MS)
    assert path.exists() and (tmp_path / "t.jsonl.1").exists() and not (tmp_path / "t.jsonl.2").exists()
    for name in (path, tmp_path / "t.jsonl.1"):
        assert name.stat().st_size <= 4000
        assert all(_strict_json(line) for line in name.read_text().splitlines())  # whole lines only
    calls = [s for s in read_rotated(path) if s["name"] == "chat llama3"]
    starts = [s["startTimeUnixNano"] for s in calls]
    assert starts == sorted(starts) and starts[-1] == T0 + 39 * 1000 * MS  # oldest first, up to the newest
    assert 2 <= len(calls) < 40  # what rotated past the one backup is gone


def test_rotation_keeps_backups_and_zero_backups_empties_the_file(tmp_path: Path) -> None:
    from otel_llm.export.rotating import RotatingAppender, rotated_files

    line = b"x" * 99 + b"\n"
    kept = RotatingAppender(str(tmp_path / "a"), max_bytes=250, backups=3)
    for _ in range(20):
        kept.append(line)
    assert [Path(p).name for p in rotated_files(str(tmp_path / "a"))] == ["a.3", "a.2", "a.1", "a"]
    assert all(Path(p).stat().st_size == 200 for p in rotated_files(str(tmp_path / "a")))
    none = RotatingAppender(str(tmp_path / "b"), max_bytes=250, backups=0)
    for _ in range(5):
        none.append(line)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("b")) == ["b"]
    assert (tmp_path / "b").stat().st_size == 100
    unbounded = RotatingAppender(str(tmp_path / "c"), max_bytes=0)
    for _ in range(5):
        unbounded.append(line)
    assert (tmp_path / "c").stat().st_size == 500


def test_processes_sharing_a_rotating_file_keep_every_line_whole(tmp_path: Path) -> None:
    """Four processes append 300 lines each (about 130 KB in all) to one file rotated at 50 KB
    with two backups, room for all of it: rotations happen while they write, and every line is
    there, once and whole."""
    import subprocess
    import sys

    path = tmp_path / "shared.jsonl"
    code = ("import sys; from otel_llm.export.rotating import RotatingAppender\n"
            "a = RotatingAppender(sys.argv[1], max_bytes=50000, backups=2)\n"
            "for i in range(300): a.append(('{\"w\": %s, \"i\": %d, \"pad\": \"%s\"}\\n' "
            "% (sys.argv[2], i, 'p' * 80)).encode())\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(w)]) for w in range(4)]
    assert all(p.wait(60) == 0 for p in procs)
    files = [path, tmp_path / "shared.jsonl.1", tmp_path / "shared.jsonl.2"]
    lines = [json.loads(line) for f in files if f.exists() for line in f.read_text().splitlines()]
    assert all(f.exists() and f.stat().st_size <= 50000 for f in files)
    assert sorted((r["w"], r["i"]) for r in lines) == [(w, i) for w in range(4) for i in range(300)]


def test_view_reads_across_the_rotation(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "t.jsonl"
    tracer = _provider(JsonLinesSpanExporter(path, max_bytes=3000, backups=1)).get_tracer("otel_llm")
    for i in range(6):
        _record_call(tracer, start=T0 + i * 1000 * MS)
    assert (tmp_path / "t.jsonl.1").exists()
    in_backup = sum(1 for s in read_jsonl(tmp_path / "t.jsonl.1") if s["name"] == "chat llama3")
    done = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "view", "--ascii", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("chat llama3") == in_backup + sum(1 for s in read_jsonl(path)
                                                               if s["name"] == "chat llama3")
