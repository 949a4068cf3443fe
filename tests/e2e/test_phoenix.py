"""End to end against a real trace backend: an instrumented process streams model calls from the
simulator and exports OTLP (http/protobuf and gRPC) to Arize Phoenix; the spans are read back
through Phoenix's REST API and must form the documented tree.

The first run installs Phoenix into its own virtualenv under ~/.cache/otel-llm (see
otel_llm_testing.phoenix): hence the generous timeout.
"""

from __future__ import annotations

import time
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


# A call under an application span that the application's own sampler dropped: sample_rate=0, so only
# a rule keeps a call; the failed one is kept and exported under its parent's trace and span ids, the
# ordinary one is not, and the parent span itself never is. Two ways to get there: the application's
# tracer provider (global, its head sampler drops every trace) that otel_llm then uses and that exports
# to Phoenix, or otel_llm's own provider exporting to Phoenix while the application's span comes from
# another provider that records nothing.
DROPPED_PARENT_APP = """
import sys

import openai
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

import otel_llm

url, endpoint, setup = sys.argv[1:4]
resource = Resource.create({"service.name": f"dropped-parent-{setup}"})  # + OTEL_RESOURCE_ATTRIBUTES
options = dict(sample_rate=0, host_metrics=False, gpu_metrics=False, runtime_metrics=False)
if setup == "app-provider":
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    app_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)), resource=resource)
    app_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(f"{endpoint}/v1/traces")))
    trace.set_tracer_provider(app_provider)
    otel_llm.instrument(**options)
else:
    app_provider = TracerProvider(sampler=ALWAYS_OFF, resource=resource)
    otel_llm.instrument(endpoint=endpoint, **options)
client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
messages = [{"role": "user", "content": "where did the time go"}]
with app_provider.get_tracer("app").start_as_current_span("handle request") as app:
    parent = app.get_span_context()
    assert parent.is_valid and not parent.trace_flags.sampled and not app.is_recording(), parent
    answer = client.chat.completions.create(model=f"{setup}-ok", messages=messages)
    assert answer.choices[0].message.content.startswith("tok0"), answer
    try:
        client.chat.completions.create(model=f"{setup}-503", messages=messages,
                                       extra_headers={"x-sim-error-status": "503"})
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc
    else:
        raise AssertionError("the simulator did not fail the call")
otel_llm.uninstrument()  # flushes otel_llm's own provider
app_provider.shutdown()  # and the application's
print(f"PARENT {parent.trace_id:032x} {parent.span_id:016x}")
"""

TRACE_QUERY = """
query ($project: ID!, $traceId: ID!) {
  node(id: $project) {
    ... on Project {
      traceCount
      trace(traceId: $traceId) {
        traceId
        numSpans
        rootSpan { name spanId parentId }
        spans(first: 100) { edges { node { name spanId parentId } } }
      }
      rootsByParentId: spans(first: 100, filterCondition: "parent_id is None") { edges { node { name } } }
      rootsByParentSpan: spans(first: 100, filterCondition: "parent_span is None") {
        edges { node { name spanId parentId } }
      }
    }
  }
}
"""


@pytest.mark.parametrize("setup", ["app-provider", "otel-llm-provider"])
def test_a_kept_call_under_a_dropped_parent_is_an_orphan_root_in_phoenix(phoenix: PhoenixServer, upstream: SimProcess,
                                                                          setup: str, tmp_path: Path) -> None:
    """What Phoenix shows for a call a rule kept (HTTP 503) under an application span its sampler
    dropped: the call span keeps the missing parent's id as ``parent_id``; the trace is listed and
    found by its id, and Phoenix takes the call for its root (the trace's ``rootSpan``, the
    ``parent_span is None`` filter; the trace page's tree, not checked here, puts a span whose parent
    is absent at the top), but not where roots are asked for as ``parent_id is None`` (the spans
    table's default filter, the REST API's ``parent_id=null``). The ordinary call under the same
    parent exports nothing."""
    import httpx

    project = f"dropped-parent-{setup}"
    # Phoenix files spans under the resource's openinference.project.name: one project per setup
    env = clean_env(OTEL_METRICS_EXPORTER="none", OTEL_RESOURCE_ATTRIBUTES=f"openinference.project.name={project}")
    run = run_python(DROPPED_PARENT_APP, tmp_path, env, upstream.base_url, phoenix.otlp_http_endpoint, setup,
                     timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (tmp_path / "otel-llm-traces.jsonl").exists()
    trace_id, parent_id = run.stdout.split("PARENT ")[1].split()

    def arrived(found: list[dict[str, Any]]) -> bool:
        call = _call(found, f"{setup}-503")
        return call is not None and {sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD} <= {
            s["name"] for s in _children(found, call)}

    spans = phoenix.wait_for_spans(arrived, timeout=60, project=project)
    time.sleep(1)  # anything else exported with it (the ordinary call) would be in by now
    spans = phoenix.spans(project=project)
    call = _call(spans, f"{setup}-503")
    assert call is not None
    # the kept call: the application's trace id, its dropped span's id as parent, kept for failing
    assert call["context"]["trace_id"] == trace_id
    assert call["parent_id"] == parent_id
    assert call["status_code"] == "ERROR" and call["span_kind"] == "LLM"
    assert call["attributes"][sc.HTTP_RESPONSE_STATUS_CODE] == 503
    assert call["attributes"][sc.LLM_SAMPLING_REASON] == ["failed"]
    assert call["attributes"][sc.LLM_SAMPLING_ADJUSTED_COUNT] == 1.0
    # nothing else: the ordinary call was dropped, the parent span never exported
    assert _call(spans, f"{setup}-ok") is None
    assert all(s["context"]["trace_id"] == trace_id for s in spans)
    assert [s for s in spans if s["parent_id"] != _span_id(call)] == [call]
    assert parent_id not in {_span_id(s) for s in spans}

    with httpx.Client(base_url=phoenix.url, timeout=30) as client:
        base = f"/v1/projects/{project}"
        # REST: the parent id is stored as sent, so the call is no root where "no parent id" means root
        assert client.get(f"{base}/spans", params={"parent_id": "null"}).json()["data"] == []
        by_parent = client.get(f"{base}/spans", params={"parent_id": parent_id}).json()["data"]
        assert [s["name"] for s in by_parent] == [call["name"]]
        assert client.get(f"{base}/spans", params={"span_id": parent_id}).json()["data"] == []
        traces = client.get(f"{base}/traces").json()["data"]
        assert [t["trace_id"] for t in traces] == [trace_id]  # the trace is listed, one per trace id
        assert (_time(traces[0]["start_time"]), _time(traces[0]["end_time"])) == (
            _time(call["start_time"]), _time(call["end_time"]))  # spanning the call alone

        answer = client.post("/graphql", json={"query": TRACE_QUERY, "variables": {
            "project": traces[0]["project_id"], "traceId": trace_id}}).json()
    assert "errors" not in answer, answer
    node = answer["data"]["node"]
    assert node["traceCount"] == 1
    found = node["trace"]  # found by its id...
    assert found["traceId"] == trace_id and found["numSpans"] == len(spans)
    # ...with the orphan call as its root span: Phoenix's roots include spans whose parent never arrived
    assert found["rootSpan"] == {"name": call["name"], "spanId": _span_id(call), "parentId": parent_id}
    assert {e["node"]["spanId"] for e in found["spans"]["edges"]} == {_span_id(s) for s in spans}
    assert [e["node"] for e in node["rootsByParentSpan"]["edges"]] == [found["rootSpan"]]
    # but the spans table's default filter, `parent_id is None`, leaves it out
    assert node["rootsByParentId"]["edges"] == []


BESIDE_APP = """
import sys

import openai
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import otel_llm

url, endpoint = sys.argv[1:3]
provider = TracerProvider(resource=Resource.create({"service.name": "beside"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(f"{endpoint}/v1/traces")))
otel_llm.instrument(tracer_provider=provider, host_metrics=False, gpu_metrics=False, runtime_metrics=False)
client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
# the span the official GenAI instrumentation opens around the client's call, with what it sets
genai = provider.get_tracer("opentelemetry.instrumentation.genai.openai")
attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "beside-m"}
with genai.start_as_current_span("chat beside-m", kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
    answer = client.chat.completions.create(model="beside-m", messages=[{"role": "user", "content": "hi"}])
    span.set_attributes({"gen_ai.usage.input_tokens": answer.usage.prompt_tokens,
                         "gen_ai.usage.output_tokens": answer.usage.completion_tokens})
otel_llm.uninstrument()
provider.shutdown()
"""


def test_beside_another_instrumentation_phoenix_shows_one_llm_span_per_call(phoenix: PhoenixServer,
                                                                            upstream: SimProcess,
                                                                            tmp_path: Path) -> None:
    """Beside another GenAI instrumentation, Phoenix shows the call as the other instrumentation's
    LLM span, at the root, with its tokens; otel_llm's transport view is its child, of no LLM kind
    (nothing counted twice), with the phases under it."""
    project = "beside"
    env = clean_env(OTEL_METRICS_EXPORTER="none", OTEL_RESOURCE_ATTRIBUTES=f"openinference.project.name={project}")
    run = run_python(BESIDE_APP, tmp_path, env, upstream.base_url, phoenix.otlp_http_endpoint, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]

    def arrived(found: list[dict[str, Any]]) -> bool:
        view = next((s for s in found if s["name"] == "POST /v1/chat/completions"), None)
        return view is not None and sc.SPAN_SERVER_WAIT in {s["name"] for s in _children(found, view)}

    spans = phoenix.wait_for_spans(arrived, timeout=60, project=project)
    call = _call(spans, "beside-m")
    assert call is not None and call["parent_id"] is None and call["span_kind"] == "LLM"
    assert [s["name"] for s in spans if s["span_kind"] == "LLM"] == ["chat beside-m"]
    [view] = _children(spans, call)
    assert view["name"] == "POST /v1/chat/completions" and view["span_kind"] != "LLM", view["span_kind"]
    assert view["attributes"][sc.LLM_BESIDE_INSTRUMENTATION] == "opentelemetry.instrumentation.genai.openai"
    assert not [key for key in view["attributes"] if key.startswith("gen_ai.")]
    assert {sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT} <= {s["name"] for s in _children(spans, view)}
