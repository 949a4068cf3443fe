"""The example programs in examples/ run as their docstrings say, against the simulator, and record
what they claim: each test reads the spans back (the embedded traces file or an OTLP receiver)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.export.jsonl import read_jsonl
from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.subprocesses import VENV_BIN, clean_env
from otel_llm_testing.collectors import OtlpHttpCollector, Received, attributes_of, walk_strings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODEL = "sim-llama"
TOKENS = 8
TEXT = "tok0" + "".join(f" tok{i}" for i in range(1, TOKENS))
STREAMED_PHASES = [sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3  # OTLP numbering
# every example that a test below runs
TESTED = ["openai_client.py", "ollama_client.py", "raw_httpx.py", "async_streaming.py", "own_providers.py",
          "zero_code.py", "gateway.py"]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    # Ollama flavour: native /api/* routes with Ollama's counters, and an OpenAI-compatible /v1
    with SimProcess(runtime="ollama", tokens=TOKENS, first_token_delay=0.02, token_interval=0.005) as server:
        yield server


def example_env(sim: SimProcess, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(OTEL_LLM_EXAMPLE_URL=sim.base_url, OTEL_LLM_EXAMPLE_MODEL=MODEL,
                     OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl"), OTEL_LLM_HOST_METRICS="false",
                     OTEL_LLM_GPU_METRICS="false", OTEL_LLM_RUNTIME_METRICS="false", **extra)


def run_example(name: str, tmp_path: Path, env: dict[str, str], *args: str,
                launcher: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*(launcher or [sys.executable]), str(EXAMPLES / name), *args]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def file_spans(tmp_path: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(tmp_path / "traces.jsonl"))


def calls_of(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((s for s in spans if s["kind"] == KIND_CLIENT), key=lambda s: s["startTimeUnixNano"])


def children(spans: list[dict[str, Any]], parent: dict[str, Any], synthesized: bool = False) -> list[str]:
    return [s["name"] for s in sorted(spans, key=lambda s: (s["startTimeUnixNano"], s["endTimeUnixNano"]))
            if s["parentSpanId"] == parent["spanId"] and bool(s["attributes"].get(sc.LLM_SYNTHESIZED)) == synthesized]


def summaries(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("otel-llm ")]


def otlp_spans(received: Received) -> list[dict[str, Any]]:
    """What an OTLP receiver got, in the shape read_jsonl gives (hex ids, plain attributes)."""
    return [{"traceId": span.trace_id.hex(), "spanId": span.span_id.hex(),
             "parentSpanId": span.parent_span_id.hex() or None, "name": span.name, "kind": span.kind,
             "startTimeUnixNano": span.start_time_unix_nano, "endTimeUnixNano": span.end_time_unix_nano,
             "attributes": attributes_of(span.attributes), "resource": resource}
            for resource, span in received.spans()]


def assert_streamed_call(spans: list[dict[str, Any]], call: dict[str, Any], api: str = "openai.chat") -> None:
    attrs = call["attributes"]
    assert call["name"] == f"chat {MODEL}"
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert attrs[sc.LLM_API] == api
    assert attrs[sc.GEN_AI_REQUEST_STREAM] is True
    assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[sc.LLM_CLIENT_CHUNKS] == TOKENS
    assert 0 < attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] < attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
    # (a gateway's SERVER span is a child of the call too: the phases are its INTERNAL children)
    assert children([s for s in spans if s["kind"] == KIND_INTERNAL], call) == STREAMED_PHASES


# --- the SDK and plain-httpx examples (embedded default: traces file + summary lines) ---------------


def test_openai_client(sim: SimProcess, tmp_path: Path) -> None:
    result = run_example("openai_client.py", tmp_path, example_env(sim, tmp_path))
    assert result.stdout.strip() == TEXT
    assert len(summaries(result.stderr)) == 1 and f"chat {MODEL}" in summaries(result.stderr)[0]
    spans = file_spans(tmp_path)
    [call] = calls_of(spans)
    assert call["resource"]["service.name"] == "openai-client-example"
    assert_streamed_call(spans, call)
    assert call["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == TOKENS  # stream_options include_usage


def test_ollama_client(sim: SimProcess, tmp_path: Path) -> None:
    result = run_example("ollama_client.py", tmp_path, example_env(sim, tmp_path))
    assert result.stdout.splitlines() == [TEXT, TEXT]
    spans = file_spans(tmp_path)
    chat, generate = calls_of(spans)
    assert_streamed_call(spans, chat, api="ollama.chat")
    # Ollama's own counters: runtime spans beside the phases
    assert chat["attributes"][sc.LLM_RUNTIME_NAME] == "ollama"
    assert {sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE} <= set(children(spans, chat, synthesized=True))
    # not streamed: no first token seen, the body arrives at once
    assert generate["name"] == f"text_completion {MODEL}"
    assert generate["attributes"][sc.LLM_API] == "ollama.generate"
    assert generate["attributes"].get(sc.GEN_AI_REQUEST_STREAM) is not True
    assert children(spans, generate)[-2:] == [sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
    assert sc.SPAN_FIRST_TOKEN not in children(spans, generate)
    assert sc.SPAN_RUNTIME_DECODE in children(spans, generate, synthesized=True)


def test_raw_httpx(sim: SimProcess, tmp_path: Path) -> None:
    result = run_example("raw_httpx.py", tmp_path, example_env(sim, tmp_path))
    assert result.stdout.strip() == TEXT
    spans = file_spans(tmp_path)
    [call] = calls_of(spans)
    assert call["resource"]["service.name"] == "raw-httpx-example"
    assert_streamed_call(spans, call)
    assert call["attributes"][sc.URL_FULL] == f"{sim.base_url}/v1/chat/completions"


def test_async_streaming(sim: SimProcess, tmp_path: Path) -> None:
    result = run_example("async_streaming.py", tmp_path, example_env(sim, tmp_path), "3")
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("stream "))
    assert [line.split(":")[0] for line in lines] == ["stream 1", "stream 2", "stream 3"]
    assert all(repr(TEXT) in line for line in lines)
    spans = file_spans(tmp_path)
    calls = calls_of(spans)
    assert len(calls) == 3 and len({c["traceId"] for c in calls}) == 3, "one trace per call"
    for call in calls:
        assert_streamed_call(spans, call)
    # the streams really ran at the same time, and the calls say so
    assert max(c["startTimeUnixNano"] for c in calls) < min(c["endTimeUnixNano"] for c in calls)
    assert max(c["attributes"][sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] for c in calls) >= 1


# --- the application's own providers -----------------------------------------------------------


def test_own_providers_over_otlp(sim: SimProcess, tmp_path: Path) -> None:
    with OtlpHttpCollector() as collector:
        result = run_example("own_providers.py", tmp_path,
                             example_env(sim, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint))
    assert result.stdout.strip() == TEXT
    assert not (tmp_path / "traces.jsonl").exists(), "otel_llm must not create providers of its own"
    assert summaries(result.stderr) == []
    spans = otlp_spans(collector.received)
    assert {s["resource"]["service.name"] for s in spans} == {"own-providers-example"}
    assert {s["resource"]["deployment.environment"] for s in spans} == {"dev"}
    [app_span] = [s for s in spans if s["name"] == "answer-question"]
    [call] = calls_of(spans)
    assert app_span["parentSpanId"] is None and app_span["attributes"]["app.question.id"] == 42
    assert call["parentSpanId"] == app_span["spanId"] and call["traceId"] == app_span["traceId"]
    assert_streamed_call(spans, call)
    # the model-call metrics went through the application's MeterProvider too
    assert {sc.METRIC_OPERATION_DURATION, sc.METRIC_TIME_TO_FIRST_CHUNK} \
        <= collector.received.metric_names()


def test_own_providers_on_the_console(sim: SimProcess, tmp_path: Path) -> None:
    result = run_example("own_providers.py", tmp_path, example_env(sim, tmp_path))
    assert result.stdout.startswith(TEXT + "\n")
    # ConsoleSpanExporter prints every span as JSON; the phases and the app span are there
    for name in ["answer-question", f"chat {MODEL}", *STREAMED_PHASES]:
        assert f'"name": "{name}"' in result.stdout, name
    assert '"service.name": "own-providers-example"' in result.stdout
    assert sc.METRIC_OPERATION_DURATION in result.stdout  # ConsoleMetricExporter
    assert not (tmp_path / "traces.jsonl").exists()


# --- zero code ---------------------------------------------------------------------------------


def test_zero_code_under_opentelemetry_instrument(sim: SimProcess, tmp_path: Path) -> None:
    source = (EXAMPLES / "zero_code.py").read_text()
    imported = {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {node.module for node in ast.walk(ast.parse(source))
                                            if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith("otel_llm") for name in imported)
    with OtlpHttpCollector() as collector:
        env = example_env(sim, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
                          OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_SERVICE_NAME="zero-code-example",
                          PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        result = run_example("zero_code.py", tmp_path, env, launcher=[str(VENV_BIN / "opentelemetry-instrument"),
                                                                      "python"])
    assert result.stdout.strip() == TEXT
    assert not (tmp_path / "traces.jsonl").exists()  # an endpoint is set: OTLP only
    spans = otlp_spans(collector.received)
    assert {s["resource"]["service.name"] for s in spans} == {"zero-code-example"}
    [call] = calls_of(spans)
    assert call["parentSpanId"] is None
    assert_streamed_call(spans, call)


# --- the gateway -------------------------------------------------------------------------------


def _gateway_env(collector: OtlpHttpCollector, tmp_path: Path) -> dict[str, str]:
    return {"OTEL_LLM_ENDPOINT": collector.endpoint, "OTEL_LLM_HOST_METRICS": "false",
            "OTEL_LLM_GPU_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
            "OTEL_LLM_TRACES_FILE": str(tmp_path / "gateway-unused.jsonl")}


def assert_client_gateway_runtime_trace(spans: list[dict[str, Any]], sim: SimProcess) -> None:
    """The example's call -> the gateway's SERVER span -> auth, queue and the upstream call."""
    by_service: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_service.setdefault(span["resource"]["service.name"], []).append(span)
    assert set(by_service) == {"gateway-example", "otel-llm-gateway"}
    [call] = calls_of(by_service["gateway-example"])
    assert_streamed_call(spans, call)
    assert call["parentSpanId"] is None
    assert {k.rpartition(".")[2] for k in call["attributes"] if k.startswith(sc.LLM_SERVER_TIMING_PREFIX)} \
        == {"auth", "queue", "upstream", "total"}
    [server] = [s for s in spans if s["kind"] == KIND_SERVER]
    assert server["name"] == "POST /v1/chat/completions"
    assert server["traceId"] == call["traceId"] and server["parentSpanId"] == call["spanId"]
    assert server["attributes"][sc.LLM_GATEWAY_KEY_ID] == "example"
    assert server["attributes"][sc.LLM_GATEWAY_OUTCOME] == "allowed"
    assert children(spans, server) == [sc.SPAN_GATEWAY_AUTH, sc.SPAN_GATEWAY_QUEUE, f"chat {MODEL}"]
    [upstream] = calls_of(by_service["otel-llm-gateway"])
    assert upstream["parentSpanId"] == server["spanId"]
    assert upstream["attributes"][sc.URL_FULL] == f"{sim.base_url}/v1/chat/completions"
    assert sc.SPAN_SERVER_WAIT in children(spans, upstream)
    assert {s["traceId"] for s in spans} == {call["traceId"]}, "one trace"


@pytest.mark.slow
def test_gateway_example_through_a_running_gateway(sim: SimProcess, tmp_path: Path) -> None:
    with OtlpHttpCollector() as collector:
        with GatewayProcess(sim.base_url, {"example": {"routes": ["/v1/*"]}},
                            env=_gateway_env(collector, tmp_path)) as gateway:
            key = gateway.secrets["example"]
            result = run_example("gateway.py", tmp_path, example_env(
                sim, tmp_path, OTEL_LLM_EXAMPLE_GATEWAY=gateway.url, OTEL_LLM_EXAMPLE_KEY=key,
                OTEL_LLM_ENDPOINT=collector.endpoint))
            access = gateway.access_records()
        # the gateway flushed its spans when it stopped
    assert "started otel-llm gateway" not in result.stdout
    assert result.stdout.splitlines()[-1] == TEXT
    assert "Server-Timing: auth;dur=" in result.stdout and "upstream;" in result.stdout
    assert [(r["key_id"], r["status"]) for r in access] == [("example", 200)]
    spans = otlp_spans(collector.received)
    assert_client_gateway_runtime_trace(spans, sim)
    assert not any(key in text for span in spans for text in walk_strings(span["attributes"]))


def test_gateway_example_starts_its_own_gateway(sim: SimProcess, tmp_path: Path) -> None:
    """Run as a user would, with no gateway: it starts one; both processes append to one file."""
    result = run_example("gateway.py", tmp_path, example_env(sim, tmp_path))
    assert "started otel-llm gateway on http://127.0.0.1:" in result.stdout
    assert result.stdout.splitlines()[-1] == TEXT
    assert_client_gateway_runtime_trace(file_spans(tmp_path), sim)


# --- every example ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", TESTED)
def test_example_is_documented_and_defaults_to_a_real_server(name: str) -> None:
    source = (EXAMPLES / name).read_text()
    module = ast.parse(source)
    doc = ast.get_docstring(module) or ""
    assert f"examples/{name}" in doc, "the docstring says how to run it"
    assert 'os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")' in source

