"""End to end against a real trace backend: an instrumented process streams model calls from the
simulator and exports OTLP (http/protobuf and gRPC) to Arize Phoenix; the spans are read back
through Phoenix's REST API and must form the documented tree.

The first run installs Phoenix into its own virtualenv under ~/.cache/otel-llm (see
otel_llm_testing.phoenix): hence the generous timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.phoenix import PhoenixServer
from otel_llm_testing.subprocesses import clean_env, run_python

pytestmark = [pytest.mark.timeout(900), pytest.mark.backend]

TOKENS = 6
HEADERS_DELAY, FIRST_TOKEN_DELAY, TOKEN_INTERVAL = 0.01, 0.03, 0.005
PHASES = [sc.SPAN_CONNECT, sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
TOLERANCE_S = 2e-6  # Phoenix returns times with microsecond precision

APP = """
import sys

import ollama
import openai

import otel_llm

url, endpoint, protocol, tag = sys.argv[1:5]
otel_llm.instrument(service_name=f"phoenix-{tag}", endpoint=endpoint, protocol=protocol,
                    host_metrics=False, gpu_metrics=False, runtime_metrics=False)
messages = [{"role": "user", "content": "where did the time go"}]
client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
stream = client.chat.completions.create(model=f"{tag}-openai", messages=messages, stream=True,
                                        stream_options={"include_usage": True})
text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
assert text.startswith("tok0"), text
parts = list(ollama.Client(host=url).chat(model=f"{tag}-ollama", messages=messages, stream=True))
assert parts[-1].done, parts[-1]
otel_llm.uninstrument()  # flushes the batch to Phoenix
print("CALLS-DONE")
"""


@pytest.fixture(scope="module")
def phoenix() -> Iterator[PhoenixServer]:
    with PhoenixServer() as server:
        yield server


@pytest.fixture(scope="module")
def upstream() -> Iterator[SimProcess]:
    with SimProcess(runtime="ollama", tokens=TOKENS, headers_delay=HEADERS_DELAY,
                    first_token_delay=FIRST_TOKEN_DELAY, token_interval=TOKEN_INTERVAL) as sim:
        yield sim


def _time(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def _span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"])


def _children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((s for s in spans if s.get("parent_id") == _span_id(parent)),
                  key=lambda s: (_time(s["start_time"]), _time(s["end_time"])))


def _call(spans: list[dict[str, Any]], model: str) -> dict[str, Any] | None:
    return next((s for s in spans if s["name"] == f"chat {model}"), None)


def _complete(spans: list[dict[str, Any]], tag: str) -> bool:
    """Both calls of the run arrived with their phases and the ollama call's runtime spans."""
    for model, extra in ((f"{tag}-openai", []), (f"{tag}-ollama", [sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE])):
        call = _call(spans, model)
        if call is None or not set(PHASES + extra) <= {s["name"] for s in _children(spans, call)}:
            return False
    return True


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_streamed_calls_reach_phoenix_as_one_tree_per_call(phoenix: PhoenixServer, upstream: SimProcess,
                                                           protocol: str, tmp_path: Path) -> None:
    tag = "grpc" if protocol == "grpc" else "http"
    endpoint = phoenix.otlp_grpc_endpoint if protocol == "grpc" else phoenix.otlp_http_endpoint
    run = run_python(APP, tmp_path, clean_env(), upstream.base_url, endpoint, protocol, tag, timeout=120)
    assert run.returncode == 0 and "CALLS-DONE" in run.stdout, run.stderr[-3000:]
    assert not (tmp_path / "otel-llm-traces.jsonl").exists()  # OTLP, not the embedded default

    spans = phoenix.wait_for_spans(lambda found: _complete(found, tag), timeout=60)

    for client, model in (("openai", f"{tag}-openai"), ("ollama", f"{tag}-ollama")):
        call = _call(spans, model)
        assert call is not None
        attrs = call["attributes"]
        trace_id = call["context"]["trace_id"]
        assert call["parent_id"] is None, "the call is the root of its trace"
        assert call["span_kind"] == "LLM"  # Phoenix recognised the gen_ai.* attributes as a model call
        assert call["status_code"] in ("UNSET", "OK")
        assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[sc.GEN_AI_REQUEST_MODEL] == model
        assert attrs[sc.GEN_AI_REQUEST_STREAM] is True
        assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
        assert attrs[sc.SERVER_PORT] == upstream.port
        assert attrs[sc.LLM_API] == ("openai.chat" if client == "openai" else "ollama.chat")
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == TOKENS
        assert attrs[sc.LLM_CLIENT_CHUNKS] == TOKENS
        ttfb, ttft = attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE], attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
        assert HEADERS_DELAY * 0.8 <= ttfb < ttft
        assert ttft >= (HEADERS_DELAY + FIRST_TOKEN_DELAY) * 0.8
        # the simulator keeps to its plan: a first token that comes late (a busy machine) leaves a
        # shorter decode, but the last token never comes before its planned time
        planned_last = HEADERS_DELAY + FIRST_TOKEN_DELAY + (TOKENS - 1) * TOKEN_INTERVAL
        assert ttft + attrs[sc.LLM_CLIENT_GENERATION_DURATION] >= planned_last - 0.002
        assert attrs[sc.LLM_CLIENT_GENERATION_DURATION] > 0

        kids = _children(spans, call)
        assert all(k["context"]["trace_id"] == trace_id for k in kids)
        phases = [k for k in kids if not k["attributes"].get(sc.LLM_SYNTHESIZED)]
        assert [p["name"] for p in phases] == PHASES
        # the phases tile the call: no gap, no overlap, first starts and last ends with it
        start, end = _time(call["start_time"]), _time(call["end_time"])
        assert abs(_time(phases[0]["start_time"]) - start) <= TOLERANCE_S
        assert abs(_time(phases[-1]["end_time"]) - end) <= TOLERANCE_S
        for before, after in zip(phases, phases[1:]):
            assert abs(_time(before["end_time"]) - _time(after["start_time"])) <= TOLERANCE_S, (before, after)
        # the attributes and the phases tell the same story
        first_token = next(p for p in phases if p["name"] == sc.SPAN_FIRST_TOKEN)
        assert abs(_time(first_token["end_time"]) - start - ttft) <= 1e-3
        wait = next(p for p in phases if p["name"] == sc.SPAN_SERVER_WAIT)
        assert abs(_time(wait["end_time"]) - start - ttfb) <= 1e-3

        runtime = {k["name"]: k for k in kids if k["attributes"].get(sc.LLM_SYNTHESIZED)}
        if client == "openai":  # Ollama's /v1 reports usage only: no native timings, no runtime.* spans
            assert runtime == {}
            continue
        assert attrs[sc.LLM_RUNTIME_NAME] == "ollama"
        assert attrs[sc.LLM_RUNTIME_GENERATION_TOKENS] == TOKENS
        assert {sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE} <= set(runtime)
        for span in runtime.values():
            assert start - TOLERANCE_S <= _time(span["start_time"]) <= _time(span["end_time"]) <= end + TOLERANCE_S
        prefill, decode = runtime[sc.SPAN_RUNTIME_PREFILL], runtime[sc.SPAN_RUNTIME_DECODE]
        assert abs(_time(prefill["end_time"]) - _time(decode["start_time"])) <= TOLERANCE_S
        assert abs(_time(prefill["end_time"]) - _time(first_token["end_time"])) <= TOLERANCE_S

    # nothing of this run is left dangling: every span's parent is a span Phoenix has
    ids = {_span_id(s) for s in spans}
    ours = [s for s in spans if s["context"]["trace_id"] in
            {_call(spans, f"{tag}-openai")["context"]["trace_id"],  # type: ignore[index]
             _call(spans, f"{tag}-ollama")["context"]["trace_id"]}]  # type: ignore[index]
    assert len(ours) >= 2 * len(PHASES) + 3
    assert all(s["parent_id"] is None or s["parent_id"] in ids for s in ours)


ROOT = Path(__file__).resolve().parents[2]
PAGE_SERVE = "python -m otel_llm_testing.phoenix        # UI and OTLP/HTTP on 127.0.0.1:6006, OTLP/gRPC on 4317"
PAGE_SEND = "OTEL_LLM_ENDPOINT=http://127.0.0.1:6006 OTEL_METRICS_EXPORTER=none python examples/openai_client.py"


@pytest.mark.timeout(900)
def test_page_phoenix_commands(upstream: SimProcess, tmp_path: Path) -> None:
    """The documentation's two Phoenix lines, with free ports instead of 6006/4317 and the simulator as
    the model server: the example's call arrives in Phoenix as a trace."""
    import subprocess
    import sys
    import time

    import httpx

    page = (Path(__file__).resolve().parents[2] / "docs" / "backends.md").read_text()
    assert PAGE_SERVE in page and PAGE_SEND in page
    from otel_llm_testing.net import free_port

    port, grpc_port = free_port(), free_port()
    env = clean_env()
    server = subprocess.Popen([sys.executable, "-m", "otel_llm_testing.phoenix", "--port", str(port),
                               "--grpc-port", str(grpc_port)], env={**env, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = server.stdout.readline()
        assert f"UI http://127.0.0.1:{port}" in banner, banner
        example_env = {**env, "OTEL_LLM_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_METRICS_EXPORTER": "none",
                       "OTEL_LLM_EXAMPLE_URL": upstream.base_url, "OTEL_LLM_TRACES_FILE": str(tmp_path / "t.jsonl"),
                       "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, str(ROOT / "examples" / "openai_client.py")], env=example_env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "Failed to export" not in run.stderr  # metrics are off, traces accepted
        deadline, names = time.monotonic() + 30, set()
        while time.monotonic() < deadline and not any(n.startswith("chat ") for n in names):
            spans = httpx.get(f"http://127.0.0.1:{port}/v1/projects/default/spans", timeout=10).json()
            names = {s.get("name", "") for s in spans.get("data", [])}
            time.sleep(0.5)
        assert any(n.startswith("chat ") for n in names) and sc.SPAN_SERVER_WAIT in names, names
    finally:
        server.terminate()
        server.wait(30)
