"""`otel-llm view`: waterfall rendering of recorded calls, and the CLI around it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from otel_llm import semconv as sc
from otel_llm.tools import main as cli_main
from otel_llm.tools.view import UNACCOUNTED, group_calls, render_calls
from otel_llm.export.jsonl import JsonLinesSpanExporter, read_jsonl

REPO = Path(__file__).resolve().parents[2]
MS = 1_000_000
T0 = 1_750_000_000_000 * MS
WIDTH = 100

STREAMING = [
    (sc.SPAN_DNS, 0, 2), (sc.SPAN_CONNECT, 2, 5), (sc.SPAN_UPLOAD, 5, 10),
    (sc.SPAN_SERVER_WAIT, 10, 100), (sc.SPAN_FIRST_TOKEN, 100, 200), (sc.SPAN_DECODE, 200, 1000),
]


def _attrs(model: str, **extra: Any) -> dict[str, Any]:
    return {
        sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: model, sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: 8080, sc.HTTP_RESPONSE_STATUS_CODE: 200, sc.LLM_CLIENT_TIME_TO_FIRST_BYTE: 0.1,
        sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.2, sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 40, sc.LLM_CLIENT_GENERATION_RATE: 50.0,
        sc.LLM_RUNTIME_NAME: "llama.cpp", sc.LLM_CLIENT_CONNECTION_REUSED: True, **extra,
    }


def _record(tracer: trace.Tracer, model: str, start: int, total_ms: int,
            phases: Sequence[tuple[str, int, int]], **extra: Any) -> None:
    """One CLIENT call span with INTERNAL phase children at the given ms offsets."""
    call = tracer.start_span(f"chat {model}", kind=SpanKind.CLIENT, start_time=start, attributes=_attrs(model, **extra))
    ctx = trace.set_span_in_context(call)
    for name, lo, hi in phases:
        tracer.start_span(name, context=ctx, start_time=start + lo * MS).end(end_time=start + hi * MS)
    call.end(end_time=start + total_ms * MS)


def _tracer(path: Path) -> trace.Tracer:
    # SimpleSpanProcessor writes each span on its own line: children land before their parent.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    return provider.get_tracer("otel_llm")


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    """Three calls, written newest first, so rendering must sort them."""
    path = tmp_path / "traces.jsonl"
    tracer = _tracer(path)
    _record(tracer, "newest", T0 + 20_000 * MS, 1000, STREAMING)
    _record(tracer, "middle", T0 + 10_000 * MS, 100,
            [(sc.SPAN_UPLOAD, 0, 10), (sc.SPAN_SERVER_WAIT, 10, 50), (sc.SPAN_DOWNLOAD, 70, 100)])
    _record(tracer, "oldest", T0, 1000, STREAMING)
    return path


def _bar(line: str) -> str:
    """The bar area of a phase row, between its two edge characters."""
    return line.split("│")[1] if "│" in line else line.split("|")[1]


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  ") and ("│" in line or "|" in line)]


def _blocks(text: str) -> list[str]:
    return text.split("\n\n")


def test_calls_are_ordered_newest_last(traces: Path) -> None:
    text = render_calls(read_jsonl(traces), WIDTH)
    headers = [block.splitlines()[0] for block in _blocks(text)]
    assert [h.split()[1] for h in headers] == ["oldest", "middle", "newest"]
    assert headers[0].startswith("chat oldest  127.0.0.1:8080  200  ")
    assert headers[0].endswith("total 1.000s")
    block = _blocks(text)[0]
    measurements = " ".join(line for line in block.splitlines()[1:] if line not in _rows(block))
    assert all(len(line) <= WIDTH for line in block.splitlines())  # measurements wrap
    for part in ("ttfb 100.0ms", "ttft 200.0ms", "tokens in 12 / out 40", "50.0 tok/s", "runtime llama.cpp",
                 "conn reused"):
        assert part in measurements


def test_phase_rows_in_order_with_proportional_bars(traces: Path) -> None:
    block = _blocks(render_calls(read_jsonl(traces), WIDTH, last=1))[0]
    rows = _rows(block)
    assert [r.split()[0] for r in rows] == [name for name, _, _ in STREAMING]
    assert all(len(_bar(r)) == len(_bar(rows[0])) for r in rows)
    assert all(len(r) <= WIDTH for r in block.splitlines()[2:])
    bar_width = len(_bar(rows[0]))
    decode = _bar(rows[-1])  # 800 of 1000 ms, starting at 20 %
    assert abs(decode.count("█") - 0.8 * bar_width) <= 1
    assert abs(decode.index("█") - 0.2 * bar_width) <= 1
    first_token = _bar(rows[-2])  # 10 %
    assert abs(first_token.count("█") - 0.1 * bar_width) <= 1
    assert "+200.0ms" in rows[-1] and "800.0ms" in rows[-1]
    assert UNACCOUNTED not in block  # the phases tile the call


def test_half_the_call_gets_half_the_width(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _record(_tracer(path), "m", T0, 200, [(sc.SPAN_SERVER_WAIT, 0, 100), (sc.SPAN_DOWNLOAD, 100, 200)])
    rows = _rows(render_calls(read_jsonl(path), 80))
    width = len(_bar(rows[0]))
    assert abs(_bar(rows[0]).count("█") - width / 2) <= 1
    assert _bar(rows[0]).count("█") + _bar(rows[1]).count("█") == width  # tiles meet, no overlap


def test_unaccounted_gap_is_shown(traces: Path) -> None:
    block = _blocks(render_calls(read_jsonl(traces), WIDTH))[1]  # "middle": 50..70 ms uncovered
    gap_row = _rows(block)[-1]
    assert gap_row.split()[0] == UNACCOUNTED
    assert "+50.0ms" in gap_row and "20.0ms" in gap_row
    bar = _bar(gap_row)
    assert abs(bar.count("░") - 0.2 * len(bar)) <= 1 and abs(bar.index("░") - 0.5 * len(bar)) <= 1


def test_call_without_children_is_all_unaccounted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _record(_tracer(path), "m", T0, 50, [])
    (row,) = _rows(render_calls(read_jsonl(path), WIDTH, ascii=True))
    assert row.split()[0] == UNACCOUNTED and set(_bar(row)) == {"."}


def test_last_and_trace_filters(traces: Path) -> None:
    spans = list(read_jsonl(traces))
    assert [b.split()[1] for b in _blocks(render_calls(spans, WIDTH, last=2))] == ["middle", "newest"]
    middle = next(s for s in spans if s["name"] == "chat middle")
    only = render_calls(spans, WIDTH, trace_id=middle["traceId"][:8].upper())
    assert len(_blocks(only)) == 1 and only.startswith("chat middle")
    assert render_calls(spans, WIDTH, trace_id="ffffffffffffffff0") == ""


def test_ascii_mode_uses_only_ascii(traces: Path) -> None:
    text = render_calls(read_jsonl(traces), WIDTH, ascii=True)
    text.encode("ascii")
    assert "#" in text


def test_error_and_nan_attributes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _record(_tracer(path), "m", T0, 100, [(sc.SPAN_CONNECT, 0, 100)],
            **{sc.HTTP_RESPONSE_STATUS_CODE: 503, sc.ERROR_TYPE: "503",
               sc.LLM_CLIENT_GENERATION_RATE: math.nan, sc.LLM_CLIENT_TIME_TO_FIRST_BYTE: math.inf})
    text = render_calls(read_jsonl(path), WIDTH)
    assert "503 ERROR" in text.splitlines()[0]
    assert "nan" not in text and "inf" not in text and "tok/s" not in text and "ttfb" not in text


def test_a_sampled_call_says_why_it_was_kept(tmp_path: Path) -> None:
    """Read back from the traces file: the reasons arrive as a JSON array."""
    path = tmp_path / "t.jsonl"
    _record(_tracer(path), "m", T0, 100, [(sc.SPAN_CONNECT, 0, 100)],
            **{sc.LLM_SAMPLING_REASON: ("slow", "cold"), sc.LLM_SAMPLING_ADJUSTED_COUNT: 1.0})
    _record(_tracer(path), "n", T0 + 200 * MS, 100, [(sc.SPAN_CONNECT, 0, 100)],
            **{sc.LLM_SAMPLING_REASON: ("rate",), sc.LLM_SAMPLING_ADJUSTED_COUNT: 20.0})
    first, second = _blocks(render_calls(read_jsonl(path), WIDTH))
    assert "kept slow,cold" in first and "x1" not in first
    assert "kept rate x20" in second


def test_duplicate_spans_and_non_model_spans_are_ignored(traces: Path) -> None:
    spans = list(read_jsonl(traces))
    plain_http = dict(spans[0], kind=3, spanId="ab" * 8, parentSpanId=None, name="GET", attributes={})
    assert render_calls(spans + spans + [plain_http], WIDTH) == render_calls(spans, WIDTH)


# --- the CLI --------------------------------------------------------------------------------


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != cli_main.ENV_TRACES_FILE}
    full_env.update(PYTHONPATH=str(REPO), PYTHONIOENCODING="utf-8", **(env or {}))
    return subprocess.run([sys.executable, "-m", "otel_llm.tools.main", *args], capture_output=True, text=True,
                          encoding="utf-8", env=full_env, cwd=cwd, timeout=60)


def test_cli_view_prints_waterfalls(traces: Path) -> None:
    result = _run("view", str(traces), "--width", "90")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_calls(read_jsonl(traces), 90) + "\n"
    assert "█" in result.stdout and result.stderr == ""


def test_cli_view_last_and_ascii(traces: Path) -> None:
    result = _run("view", str(traces), "--last", "1", "--ascii")
    assert result.returncode == 0
    assert result.stdout.startswith("chat newest") and "chat middle" not in result.stdout
    assert "#" in result.stdout and "█" not in result.stdout


def test_cli_view_default_file_from_env(traces: Path, tmp_path: Path) -> None:
    result = _run("view", env={cli_main.ENV_TRACES_FILE: str(traces)}, cwd=tmp_path)
    assert result.returncode == 0 and "chat oldest" in result.stdout


def test_cli_view_missing_file(tmp_path: Path) -> None:
    result = _run("view", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 1 and result.stdout == ""
    assert "nope.jsonl" in result.stderr


def test_cli_view_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    result = _run("view", str(path))
    assert result.returncode == 0
    assert result.stdout.strip() == f"no model calls recorded in {path}"


def test_cli_view_skips_malformed_and_truncated_lines(traces: Path) -> None:
    lines = traces.read_text().splitlines()
    traces.write_text("\n".join(["garbage {", *lines, lines[-1][:40]]))
    result = _run("view", str(traces))
    assert result.returncode == 0
    assert "skipped 2 malformed line(s)" in result.stderr
    assert result.stdout.count("chat ") == 3


def test_main_version_and_usage(capsys: Any) -> None:
    assert cli_main.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("otel-llm ")
    assert cli_main.main([]) == 2
    assert cli_main.main(["view", "--last", "0"]) == 2


def test_broken_optional_command_does_not_break_view(monkeypatch: Any, traces: Path, capsys: Any) -> None:
    broken = cli_main.module_command("sim", "missing module", "otel_llm._no_such_module_")
    view = next(c for c in cli_main.COMMANDS if c.name == "view")
    monkeypatch.setattr(cli_main, "COMMANDS", (view, broken))
    assert cli_main.main(["sim", "--anything"]) == 2
    assert "unavailable" in capsys.readouterr().err
    assert cli_main.main(["view", str(traces), "--ascii"]) == 0
    assert "chat newest" in capsys.readouterr().out


def _hop_trace(path: Path, tracer: trace.Tracer | None = None) -> None:
    """An app's call through a gateway to vLLM, as one collector would write the three processes'
    spans: the app's CLIENT call, the gateway's SERVER span, its relayed CLIENT call, and vLLM's
    own ``llm_request`` SERVER span under that."""
    tracer = tracer or _tracer(path)
    call = tracer.start_span("chat tiny", kind=SpanKind.CLIENT, start_time=T0, attributes=_attrs("tiny"))
    server = tracer.start_span("POST /v1/chat/completions", context=trace.set_span_in_context(call),
                               kind=SpanKind.SERVER, start_time=T0 + 5 * MS)
    hop = tracer.start_span("chat tiny", context=trace.set_span_in_context(server), kind=SpanKind.CLIENT,
                            start_time=T0 + 7 * MS,
                            attributes=_attrs("tiny", **{sc.SERVER_PORT: 8000, sc.LLM_GATEWAY_RELAYED: True}))
    tracer.start_span(sc.SPAN_SERVER_WAIT, context=trace.set_span_in_context(hop),
                      start_time=T0 + 8 * MS).end(end_time=T0 + 400 * MS)
    vllm = {sc.VLLM_TIME_IN_QUEUE: 0.25, sc.VLLM_TIME_IN_PREFILL: 0.1, sc.VLLM_TIME_IN_DECODE: 0.5,
            sc.VLLM_TIME_TO_FIRST_TOKEN: 0.36, sc.VLLM_E2E: 0.86, sc.VLLM_PROMPT_TOKENS: 12,
            sc.VLLM_COMPLETION_TOKENS: 40}
    tracer.start_span("llm_request", context=trace.set_span_in_context(hop), kind=SpanKind.SERVER,
                      start_time=T0 + 9 * MS, attributes=vllm).end(end_time=T0 + 870 * MS)
    hop.end(end_time=T0 + 880 * MS)
    server.end(end_time=T0 + 890 * MS)
    call.end(end_time=T0 + 900 * MS)


def test_a_call_relayed_by_a_gateway_is_one_call_with_its_hop_and_the_runtimes_span(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    _hop_trace(path)
    (call,) = group_calls(read_jsonl(path))
    assert call.span["attributes"][sc.SERVER_PORT] == 8080, "the app's call is the one counted"
    (hop,) = call.relayed
    assert hop.span["attributes"][sc.SERVER_PORT] == 8000 and [p["name"] for p in hop.phases] == [sc.SPAN_SERVER_WAIT]
    assert [s["name"] for s in hop.served] == ["llm_request"] and not call.served
    text = render_calls(read_jsonl(path), width=WIDTH, ascii=True)
    assert text.count("relayed on its behalf as:") == 1 and "the runtime's own span" in text
    assert "queue 250.0ms  prefill 100.0ms  decode 500.0ms  ttft 360.0ms  e2e 860.0ms" in text
    assert all(len(line) <= WIDTH for line in text.splitlines()), text


def test_the_gateways_spans_alone_are_a_call(tmp_path: Path) -> None:
    """Without the caller's spans (the gateway's own traces file), the relayed call is the call."""
    path = tmp_path / "traces.jsonl"
    _hop_trace(path)
    spans = [s for s in read_jsonl(path) if s["name"] != "chat tiny" or s["attributes"][sc.SERVER_PORT] == 8000]
    (call,) = group_calls(spans)
    assert call.span["attributes"][sc.LLM_GATEWAY_RELAYED] is True and len(call.served) == 1


def test_a_parent_cycle_in_a_hostile_file_ends(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    _hop_trace(path)
    spans = list(read_jsonl(path))
    server = next(s for s in spans if s["name"].startswith("POST "))
    runtime = next(s for s in spans if s["name"] == "llm_request")
    server["parentSpanId"] = server["spanId"]  # the gateway's span its own parent
    runtime["parentSpanId"] = server["spanId"]
    calls = group_calls(spans)
    assert len(calls) == 2 and not any(c.served for c in calls)


def test_a_collectors_otlp_json_file_reads_the_same(tmp_path: Path) -> None:
    """The same spans exported over OTLP/HTTP to a receiver and written as the Collector's file
    exporter writes them: one call, its hop, the runtime's span."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from otel_llm_testing.collectors import OtlpHttpCollector

    with OtlpHttpCollector() as collector:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{collector.endpoint}/v1/traces")))
        _hop_trace(tmp_path / "unused.jsonl", provider.get_tracer("otel_llm"))
        provider.shutdown()
        collector.received.write_otlp_json(tmp_path / "collector.json")
    (call,) = group_calls(read_jsonl(tmp_path / "collector.json"))
    (hop,) = call.relayed
    assert [s["name"] for s in hop.served] == ["llm_request"]


def test_context_pressure_is_flagged_with_its_evidence(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    tracer = _tracer(path)
    _record(tracer, "full", T0, 100, [], **{sc.LLM_REQUEST_CONTEXT_PRESSURE: 0.875, sc.LLM_MODEL_CONTEXT_LENGTH: 512,
                                            sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE: True})
    _record(tracer, "roomy", T0 + 1000 * MS, 100, [], **{sc.LLM_REQUEST_CONTEXT_PRESSURE: 0.5,
                                                          sc.LLM_MODEL_CONTEXT_LENGTH: 512,
                                                          sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE: False})
    full, roomy = _blocks(render_calls(read_jsonl(path), WIDTH))
    assert "context pressure: the prompt fills 88% of the 512-token context" in " ".join(full.split())
    assert "context pressure" not in roomy


def test_a_speculative_call_shows_its_draft_acceptance_beside_the_runtime(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    tracer = _tracer(path)
    _record(tracer, "drafted", T0, 1000, STREAMING, **{sc.LLM_RUNTIME_DRAFT_TOKENS: 46,
                                                       sc.LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED: 33,
                                                       sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE: 33 / 46})
    _record(tracer, "plain", T0 + 2_000 * MS, 1000, STREAMING)
    drafted, plain = render_calls(read_jsonl(path), WIDTH).split("\n\n")[:2]
    assert "runtime llama.cpp draft accepted 72% (33/46)" in " ".join(drafted.split())  # lines may wrap
    assert "draft" not in plain


def _proxied(path: Path, server_attrs: dict[str, Any]) -> None:
    """A call made by ``otel-llm proxy`` for a client in another language: under the proxy's
    SERVER span, which carries the caller's side."""
    tracer = _tracer(path)
    server = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER, start_time=T0,
                               attributes=server_attrs)
    under = trace.set_span_in_context(server)
    call = tracer.start_span("chat tiny", context=under, kind=SpanKind.CLIENT, start_time=T0 + MS,
                             attributes=_attrs("tiny"))
    call.end(end_time=T0 + 900 * MS)
    server.end(end_time=T0 + 910 * MS)


def _caller_line(path: Path) -> str | None:
    lines = [line for line in render_calls(read_jsonl(path), width=200).splitlines()
             if line.startswith("  via otel-llm proxy")]
    assert len(lines) <= 1
    return lines[0] if lines else None


def test_a_call_through_the_proxy_shows_the_callers_side(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    _proxied(path, {sc.USER_AGENT_ORIGINAL: "curl/8.5.0", sc.LLM_PROXY_TIME_TO_FIRST_BYTE: 0.0012,
                    sc.LLM_PROXY_TIME_TO_FIRST_TOKEN: 0.2013, sc.LLM_PROXY_WRITE_WAIT: 0.35,
                    sc.LLM_GATEWAY_OUTCOME: "client_closed"})
    (call,) = group_calls(read_jsonl(path))
    assert call.caller is not None and call.caller["name"] == "POST /v1/chat/completions"
    assert _caller_line(path) == ("  via otel-llm proxy  caller curl/8.5.0  head written 1.2ms  first token written "
                                  "201.3ms  caller read slowly: writes waited 350.0ms  caller hung up")


@pytest.mark.parametrize("server_attrs, line", [
    # a caller that kept reading (writes went straight into the socket buffer): no slow-reader note
    ({sc.LLM_PROXY_TIME_TO_FIRST_BYTE: 0.001, sc.LLM_PROXY_WRITE_WAIT: 0.0002},
     "  via otel-llm proxy  head written 1.0ms"),
    # hostile values from a file: dropped, never a crash
    ({sc.USER_AGENT_ORIGINAL: 7, sc.LLM_PROXY_TIME_TO_FIRST_BYTE: float("nan"), sc.LLM_PROXY_WRITE_WAIT: "slow"},
     "  via otel-llm proxy"),
    # a gateway's SERVER span (no llm.proxy.* attribute): not the proxy's, no line
    ({sc.USER_AGENT_ORIGINAL: "curl/8.5.0", sc.LLM_GATEWAY_OUTCOME: "allowed"}, None),
])
def test_the_callers_line_says_only_what_the_proxy_recorded(tmp_path: Path, server_attrs: dict[str, Any],
                                                            line: str | None) -> None:
    path = tmp_path / "traces.jsonl"
    _proxied(path, server_attrs)
    assert _caller_line(path) == line
