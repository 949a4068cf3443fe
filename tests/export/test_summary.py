"""SummarySpanProcessor logs one line per model call (to stderr when no logging is configured);
format_summary is pure."""

from __future__ import annotations

import io
import logging
import math
import subprocess
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_llm import semconv as sc
from otel_llm.export.summary import SUMMARY_LOGGER, SummarySpanProcessor, format_summary
from otel_llm_testing.subprocesses import clean_env, run_python

FULL: dict[str, Any] = {
    sc.GEN_AI_OPERATION_NAME: "chat",
    sc.GEN_AI_REQUEST_MODEL: "gemma3",
    sc.SERVER_ADDRESS: "127.0.0.1",
    sc.SERVER_PORT: 8080,
    sc.HTTP_RESPONSE_STATUS_CODE: 200,
    sc.LLM_CLIENT_TIME_TO_FIRST_BYTE: 0.101,
    sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN: 0.352,
    sc.LLM_CLIENT_GENERATION_DURATION: 0.871,
    sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 40,
    sc.LLM_CLIENT_GENERATION_RATE: 45.9,
    sc.LLM_CLIENT_CONNECTION_REUSED: True,
}


def test_full_line() -> None:
    assert format_summary(FULL, 1.234) == (
        "otel-llm  chat gemma3 @127.0.0.1:8080  200  total 1.234s  ttfb 0.101s  ttft 0.352s"
        "  decode 0.871s  in 12  out 40 tok  45.9 tok/s  reused"
    )


def test_only_present_parts_are_shown() -> None:
    attrs = {sc.GEN_AI_OPERATION_NAME: "embeddings", sc.GEN_AI_REQUEST_MODEL: "nomic",
             sc.LLM_CLIENT_CONNECTION_REUSED: False, sc.LLM_RUNTIME_NAME: "ollama"}
    assert format_summary(attrs, 0.05) == "otel-llm  embeddings nomic  total 0.050s  new conn  ollama"


def test_error_call_shows_error_type() -> None:
    attrs = {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m", sc.SERVER_ADDRESS: "h",
             sc.SERVER_PORT: 1, sc.ERROR_TYPE: "httpx.ConnectError"}
    line = format_summary(attrs, 0.002, StatusCode.ERROR, "refused")
    assert line == "otel-llm  chat m @h:1  error httpx.ConnectError  total 0.002s"
    assert format_summary({sc.HTTP_RESPONSE_STATUS_CODE: 503, sc.ERROR_TYPE: "503"}, 1.0, 2).startswith(
        "otel-llm  model call  503  error  total")
    assert "error refused" in format_summary({}, 1.0, StatusCode.ERROR, "refused")


def test_non_finite_values_are_omitted() -> None:
    attrs = {**FULL, sc.LLM_CLIENT_TIME_TO_FIRST_BYTE: math.nan, sc.LLM_CLIENT_GENERATION_RATE: math.inf}
    line = format_summary(attrs, math.nan)
    assert "nan" not in line and "inf" not in line and "ttfb" not in line and "total" not in line
    assert "ttft 0.352s" in line


def _emit(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("otel_llm")
    call = tracer.start_span("chat gemma3", kind=SpanKind.CLIENT, start_time=0, attributes=FULL)
    child = tracer.start_span(sc.SPAN_DECODE, context=trace.set_span_in_context(call), start_time=0)
    child.end(end_time=10)
    tracer.start_span("GET", kind=SpanKind.CLIENT).end()  # plain HTTP call: not a model call
    call.set_status(Status(StatusCode.OK))
    call.end(end_time=1_234_000_000)


def test_processor_writes_one_line_per_model_call() -> None:
    stream = io.StringIO()
    provider = TracerProvider()
    provider.add_span_processor(SummarySpanProcessor(stream))
    _emit(provider)
    assert stream.getvalue().splitlines() == [format_summary(FULL, 1.234)]


def test_processor_logs_the_line_through_logging(caplog: Any, capsys: Any) -> None:
    """Without a stream, the line is an INFO record of otel_llm.summary: pytest's handler on the
    root logger receives it, and otel_llm writes nothing to stderr itself."""
    provider = TracerProvider()
    provider.add_span_processor(SummarySpanProcessor())
    with caplog.at_level(logging.DEBUG):
        _emit(provider)
    records = [r for r in caplog.records if r.name == SUMMARY_LOGGER]
    assert [(r.levelno, r.getMessage()) for r in records] == [(logging.INFO, format_summary(FULL, 1.234))]
    assert capsys.readouterr().err == ""


def test_summary_logger_level_silences_it(caplog: Any) -> None:
    summary = logging.getLogger(SUMMARY_LOGGER)
    provider = TracerProvider()
    provider.add_span_processor(SummarySpanProcessor())
    level = summary.level
    summary.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.DEBUG, logger="otel_llm"):
            _emit(provider)
    finally:
        summary.setLevel(level)
    assert [r for r in caplog.records if r.name == SUMMARY_LOGGER] == []


# In a fresh interpreter, where nothing but the script configures logging.
_CLEAN = """
import logging, sys
{before}
from opentelemetry.sdk.trace import TracerProvider
from otel_llm.export.summary import SummarySpanProcessor
from tests.export.test_summary import _emit
provider = TracerProvider()
provider.add_span_processor(SummarySpanProcessor())
_emit(provider)
{between}
_emit(provider)
"""


def _clean_run(tmp_path: Path, before: str = "", between: str = "") -> subprocess.CompletedProcess[str]:
    result = run_python(_CLEAN.format(before=before, between=between), tmp_path, clean_env())
    assert result.returncode == 0, result.stderr
    return result


def test_no_logging_configured_the_line_is_on_stderr(tmp_path: Path) -> None:
    result = _clean_run(tmp_path)
    line = format_summary(FULL, 1.234)
    assert result.stderr == f"{line}\n{line}\n"  # byte-identical to the formatted line, nothing else
    assert result.stdout == ""


def test_application_handler_receives_it_and_stderr_stays_clean(tmp_path: Path) -> None:
    configure = 'logging.basicConfig(stream=sys.stdout, format="%(name)s|%(levelname)s|%(message)s")'
    result = _clean_run(tmp_path, before=configure)
    line = format_summary(FULL, 1.234)
    assert result.stderr == ""
    assert result.stdout == f"otel_llm.summary|INFO|{line}\n" * 2


def test_logging_configured_later_takes_over(tmp_path: Path) -> None:
    """The fallback is decided at each line: once the application configures logging, its
    handlers get the lines and the fallback stops writing."""
    configure = 'logging.basicConfig(stream=sys.stdout, format="app: %(message)s")'
    result = _clean_run(tmp_path, between=configure)
    line = format_summary(FULL, 1.234)
    assert result.stderr == f"{line}\n"
    assert result.stdout == f"app: {line}\n"


def test_silenced_by_level_without_any_logging_configured(tmp_path: Path) -> None:
    result = _clean_run(tmp_path, before='logging.getLogger("otel_llm.summary").setLevel(logging.WARNING)')
    assert result.stderr == "" and result.stdout == ""


def test_processor_never_raises_and_warns_once(caplog: Any) -> None:
    stream = io.StringIO()
    stream.close()
    provider = TracerProvider()
    provider.add_span_processor(SummarySpanProcessor(stream))
    with caplog.at_level(logging.WARNING, logger="otel_llm.export.summary"):
        _emit(provider)
        _emit(provider)
    assert len(caplog.records) == 1


def test_a_sampled_call_says_why_it_was_kept() -> None:
    assert format_summary({sc.LLM_SAMPLING_REASON: ("slow", "failed"), sc.LLM_SAMPLING_ADJUSTED_COUNT: 1.0},
                          1.0).endswith("total 1.000s  kept slow,failed")
    assert format_summary({sc.LLM_SAMPLING_REASON: ["rate"], sc.LLM_SAMPLING_ADJUSTED_COUNT: 100.0},
                          1.0).endswith("kept rate x100")
    assert format_summary({sc.LLM_SAMPLING_REASON: ("parent",)}, 1.0).endswith("kept parent")
    assert "kept" not in format_summary({sc.LLM_SAMPLING_REASON: "slow"}, 1.0)  # not the array it must be
