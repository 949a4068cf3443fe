"""RuntimeStateObserver: the real llama.cpp server, and recorded /metrics and /api/ps answers
served from a loopback HTTP server."""

from __future__ import annotations

import json

import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Metric, Sum

import otel_llm
from otel_llm.observers import _runtime_client
from otel_llm.observers.poll_policy import POLL_ALL, PollPolicy
from otel_llm.observers.registry import ServerRegistry
from otel_llm.observers.runtime_state import MAX_FAILURES, RuntimeStateObserver, otel_name
from otel_llm_testing import LlamaServer
from otel_llm_testing.fake_runtime import FakeRuntime, observer_fixture
from otel_llm_testing.otel import make_otel

FIXTURES = Path(__file__).parents[1] / "fixtures" / "observers"
LOOPBACK = "127.0.0.1"


# --- observer + in-memory metrics ------------------------------------------------------------------
@dataclass
class Rig:
    observer: RuntimeStateObserver
    registry: ServerRegistry
    reader: InMemoryMetricReader
    now: list[float] = field(default_factory=lambda: [1000.0])  # the observer's clock (s)

    def later(self, seconds: float) -> None:
        self.now[0] += seconds

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        return {m.name: m for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
                for m in sm.metrics}

    def points(self, name: str) -> list[tuple[float, dict[str, Any]]]:
        metric = self.metrics().get(name)
        return [] if metric is None else [(p.value, dict(p.attributes)) for p in metric.data.data_points]

    def value(self, name: str, **attrs: Any) -> float | None:
        found = [v for v, a in self.points(name) if all(a.get(k.replace("__", ".")) == w for k, w in attrs.items())]
        assert len(found) <= 1, found
        return found[0] if found else None


@pytest.fixture
def rig() -> Iterator[Rig]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    registry = ServerRegistry()
    # the fakes run in this process, which the default policy never polls: these tests are
    # about what is read and how failures back off, so every noted server may be polled
    observer = RuntimeStateObserver(provider.get_meter("test"), registry, interval=0.05,
                                    policy=PollPolicy(POLL_ALL))
    rig = Rig(observer, registry, reader)
    observer._clock = lambda: rig.now[0]  # back-off times move only when a test says so
    try:
        yield rig
    finally:
        observer.stop()
        provider.shutdown()


def _runtime_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_llm" and "runtime state" in r.getMessage()]


# --- vLLM, TGI, SGLang ------------------------------------------------------------------------------
def test_vllm_metrics_reemitted_and_normalized(rig: Rig, fake: FakeRuntime) -> None:
    fake.serve("/metrics", observer_fixture("vllm_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, "vllm")
    rig.observer.poll_once()

    metrics = rig.metrics()
    server = {"server.address": LOOPBACK, "server.port": fake.port, "llm.runtime.name": "vllm"}
    running = metrics["vllm.num_requests_running"]
    assert isinstance(running.data, Gauge)
    assert sorted(p.value for p in running.data.data_points) == [1.0, 2.0]
    assert {**server, "engine": "0", "model_name": "Qwen/Qwen2.5-0.5B-Instruct"} in \
        [dict(p.attributes) for p in running.data.data_points]
    prompt = metrics["vllm.prompt_tokens_total"]
    assert isinstance(prompt.data, Sum) and prompt.data.is_monotonic
    assert sorted(p.value for p in prompt.data.data_points) == [766.0, 1234.0]
    assert rig.value("vllm.request_success_total", finished_reason="length") == 2.0
    # histograms: _sum and _count as counters; no buckets, no _created timestamps
    ttft_sum, ttft_count = (metrics["vllm.time_to_first_token_seconds_sum"],
                            metrics["vllm.time_to_first_token_seconds_count"])
    assert isinstance(ttft_sum.data, Sum) and ttft_sum.data.data_points[0].value == 3.5
    assert ttft_count.data.data_points[0].value == 42.0
    assert not [n for n in metrics if n.endswith(("_bucket", "_created"))]
    assert "vllm.cache_config_info" in metrics  # info-style gauge, labels kept
    assert "python_gc_objects_collected_total" in metrics  # every numeric series
    assert rig.points("vllm.spec_decode_ratio") == []  # NaN skipped

    # normalized: counts summed over engines, KV usage averaged
    assert rig.points("llm.runtime.requests.running") == [(3, server)]
    assert rig.points("llm.runtime.requests.waiting") == [(3, server)]
    assert rig.points("llm.runtime.kv_cache.usage") == [(0.375, server)]
    assert metrics["llm.runtime.kv_cache.usage"].unit == "1"

    state = rig.observer.latest_state(LOOPBACK, fake.port)
    assert state["requests.running"] == 3 and state["requests.waiting"] == 3
    assert state["kv_cache.usage"] == 0.375
    assert isinstance(state["timestamp"], int) and 0 < time.perf_counter_ns() - state["timestamp"] < 5e9
    # a known runtime: only its own endpoint, and its model metadata once
    assert fake.hits == {"/metrics": 1, "/v1/models": 1}


def test_real_vllm_metrics(rig: Rig, fake: FakeRuntime) -> None:
    """A real vLLM 0.32.0's /metrics after 7 requests (tools/record_vllm_fixtures.py), served to a
    server no option names: recognized as vLLM from its series, normalized, every series kept."""
    text = observer_fixture("vllm_real_metrics.txt")
    fake.serve("/metrics", text)
    rig.registry.note(LOOPBACK, fake.port, None)
    rig.observer.poll_once()
    assert rig.observer.runtime_of(LOOPBACK, fake.port) == "vllm"
    server = {"server.address": LOOPBACK, "server.port": fake.port, "llm.runtime.name": "vllm"}
    for name in ("llm.runtime.requests.running", "llm.runtime.requests.waiting", "llm.runtime.kv_cache.usage"):
        assert rig.points(name) == [(0, server)], name
    assert rig.value("vllm.request_success_total", finished_reason="length") == 7
    assert rig.value("vllm.generation_tokens_total") == 53
    for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert rig.value(f"vllm.{histogram}_count") > 0, histogram
        assert rig.value(f"vllm.{histogram}_sum") > 0, histogram
    # every vLLM series of the answer became an instrument (buckets and _created aside)
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line.startswith("vllm:") and "_bucket" not in line and "_created" not in line}
    missing = {n for n in names if otel_name(n) not in rig.metrics()}
    assert not missing, sorted(missing)


def test_vllm_legacy_kv_cache_fallback(rig: Rig, fake: FakeRuntime) -> None:
    fake.serve("/metrics", observer_fixture("vllm_legacy_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, "vllm")
    rig.observer.poll_once()
    state = rig.observer.latest_state(LOOPBACK, fake.port)
    assert (state["requests.running"], state["requests.waiting"], state["kv_cache.usage"]) == (1, 4, 0.75)


def test_tgi_metrics(rig: Rig, fake: FakeRuntime) -> None:
    fake.serve("/metrics", observer_fixture("tgi_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, "tgi")
    rig.observer.poll_once()
    metrics = rig.metrics()
    assert rig.points("tgi_queue_size")[0][0] == 5
    assert isinstance(metrics["tgi_request_count"].data, Sum)
    assert rig.value("tgi_batch_forward_duration_count", method="prefill") == 15
    assert rig.value("tgi_request_duration_sum") == 25.5
    assert "tgi_request_duration" not in metrics  # summary quantiles skipped
    state = rig.observer.latest_state(LOOPBACK, fake.port)
    assert (state["requests.running"], state["requests.waiting"], state["kv_cache.usage"]) == (4, 5, None)
    assert rig.points("llm.runtime.kv_cache.usage") == []


def test_sglang_metrics_and_runtime_inferred(rig: Rig, fake: FakeRuntime) -> None:
    """An unknown-runtime server: /api/ps is absent (backed off), /metrics names the runtime."""
    fake.serve("/metrics", observer_fixture("sglang_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, None)
    rig.observer.poll_once()
    assert rig.value("sglang.num_running_reqs") == 6
    assert rig.value("sglang.e2e_request_latency_seconds_sum") == 12.5
    server = {"server.address": LOOPBACK, "server.port": fake.port, "llm.runtime.name": "sglang"}
    assert rig.points("llm.runtime.requests.running") == [(6, server)]
    assert rig.points("llm.runtime.requests.waiting") == [(2, server)]
    assert rig.points("llm.runtime.kv_cache.usage") == [(0.42, server)]
    assert rig.points("sglang.gen_throughput")[0][1]["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    rig.observer.poll_once()
    assert fake.hits == {"/api/ps": 1, "/metrics": 2}


def test_model_metadata_read_once_per_runtime_process(rig: Rig, fake: FakeRuntime) -> None:
    """vLLM's /v1/models (max_model_len) is read at the first poll, once."""
    fake.serve("/metrics", observer_fixture("vllm_metrics.txt"))
    fake.serve("/v1/models", json.dumps({"object": "list", "data": [
        {"id": "tiny", "object": "model", "max_model_len": 512}]}), content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, "vllm")
    assert rig.observer.model_of(LOOPBACK, fake.port) is None
    rig.observer.poll_once()
    rig.later(60)
    rig.observer.poll_once()
    model = rig.observer.model_of(LOOPBACK, fake.port)
    assert model is not None and (model.context_length, model.model) == (512, "tiny")
    assert fake.hits == {"/metrics": 2, "/v1/models": 1}


LLAMACPP_PROPS = {"default_generation_settings": {"n_ctx": 256}, "model_path": "/models/tiny-Q4_K_M.gguf",
                  "model_ftype": "Q4_K_M", "total_slots": 1}


def test_model_metadata_read_once_when_the_state_route_is_absent(rig: Rig, fake: FakeRuntime,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """llama-server without --metrics: its /metrics is absent (backed off, then no longer polled),
    its /props is read anyway, at the first poll, and only then."""
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    fake.serve("/props", json.dumps(LLAMACPP_PROPS), content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")  # /metrics: 404
    rig.observer.poll_once()
    model = rig.observer.model_of(LOOPBACK, fake.port)
    assert model is not None and (model.context_length, model.slots) == (256, 1)
    assert model.model == "/models/tiny-Q4_K_M.gguf" and model.quantization == "Q4_K_M"
    assert rig.observer.latest_state(LOOPBACK, fake.port) == {}  # no state: nothing to say of it
    _poll_through_back_off(rig)
    assert fake.hits == {"/metrics": MAX_FAILURES, "/props": 1}
    assert rig.observer.model_of(LOOPBACK, fake.port) == model  # kept
    logs = _runtime_logs(caplog)
    assert len(logs) == 1 and "/metrics: answered 404 (llama-server needs --metrics)" in logs[0], logs


@pytest.mark.parametrize("status", [404, 401, 403, None])
def test_metadata_route_failing_for_good_is_asked_once(rig: Rig, fake: FakeRuntime,
                                                       caplog: pytest.LogCaptureFixture, status: int | None) -> None:
    """Both routes refuse (or lack) the request, or /props answers what is not JSON (None): the
    metadata route is asked once, never again; a refused state route (401, 403) too, an absent
    one is backed off and stops at its bound."""
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    if status is None:
        fake.serve("/props", "<html>not here</html>", content_type="text/html")
    else:
        body = '{"error":{"code":%d}}' % status
        fake.serve("/metrics", body, status=status, content_type="application/json")
        fake.serve("/props", body, status=status, content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    rig.observer.poll_once()
    first = dict(fake.hits)
    assert first == {"/metrics": 1, "/props": 1}
    _poll_through_back_off(rig, seconds=120, step=0.5)
    state_route = 1 if status in (401, 403) else MAX_FAILURES  # a refusal stops it at once
    assert fake.hits == {"/metrics": state_route, "/props": 1}
    assert rig.observer.model_of(LOOPBACK, fake.port) is None
    assert not rig.observer._model_pending(rig.observer._states[(LOOPBACK, fake.port)])
    logs = _runtime_logs(caplog)
    assert len([m for m in logs if "/props" in m]) == 1 and len([m for m in logs if "/metrics" in m]) == 1, logs
    assert not [m for m in logs if "/props" in m and "--metrics" in m]


def test_metadata_route_refusing_the_connection_is_asked_once() -> None:
    """LM Studio (no state route): a listing whose connection is refused is not asked again."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        raise httpx.ConnectError("refused", request=request)

    registry = ServerRegistry()
    client = httpx.Client(transport=httpx.MockTransport(handler))
    observer = RuntimeStateObserver(MeterProvider().get_meter("t"), registry, client=client, interval=0.05,
                                    policy=PollPolicy(POLL_ALL))
    now = [1000.0]
    observer._clock = lambda: now[0]
    registry.note("lmstudio.local", 1234, "lmstudio")
    for _ in range(100):
        observer.poll_once()
        now[0] += 1.0
    observer.stop()
    client.close()
    assert seen == ["/api/v0/models"]


def test_metadata_route_of_a_restarted_server_is_asked_again(rig: Rig, fake: FakeRuntime,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A /props that failed is asked again once another runtime process listens there (new pid)."""
    generation = [1]
    monkeypatch.setattr(rig.observer.policy, "generation", lambda host, port: generation[0])
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    rig.observer.poll_once()
    rig.later(60)
    rig.observer.poll_once()
    assert fake.hits["/props"] == 1 and rig.observer.model_of(LOOPBACK, fake.port) is None
    fake.serve("/props", json.dumps(LLAMACPP_PROPS), content_type="application/json")
    generation[0] = 2  # restarted
    rig.later(60)
    rig.observer.poll_once()
    rig.later(60)
    rig.observer.poll_once()
    assert fake.hits["/props"] == 2
    model = rig.observer.model_of(LOOPBACK, fake.port)
    assert model is not None and model.context_length == 256


def test_metadata_route_of_a_loading_server_is_backed_off(rig: Rig, fake: FakeRuntime) -> None:
    """A 503 (llama-server answers it while loading its model) is not a refusal: asked again after
    the back-off, and read once it answers."""
    fake.serve("/props", '{"error":{"code":503,"message":"Loading model"}}', status=503,
               content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    rig.observer.poll_once()
    rig.observer.poll_once()
    assert fake.hits["/props"] == 1  # not at once
    fake.serve("/props", json.dumps(LLAMACPP_PROPS), content_type="application/json")
    rig.later(0.05)
    rig.observer.poll_once()
    rig.later(60)
    rig.observer.poll_once()
    assert fake.hits["/props"] == 2
    model = rig.observer.model_of(LOOPBACK, fake.port)
    assert model is not None and model.context_length == 256


def test_calls_carry_the_model_of_a_server_without_state_route(fake: FakeRuntime) -> None:
    """Through instrument(): a llama.cpp server (named in the runtimes option) whose /metrics is
    absent; the calls after /props was read carry its context length and their context pressure,
    flagged over 80 %; /props is asked once however many polls follow."""
    from otel_llm import semconv as sc
    from otel_llm.instrumentor import current_telemetry

    fake.serve("/props", json.dumps(LLAMACPP_PROPS), content_type="application/json")
    fake.serve("POST /v1/chat/completions", json.dumps({
        "id": "c1", "object": "chat.completion", "model": "tiny",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 230, "completion_tokens": 1, "total_tokens": 231}}),
        content_type="application/json")
    otel = make_otel()
    otel_llm.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                        sample_interval=0.2, host_metrics=False, gpu_metrics=False,
                        runtimes={f"http://{LOOPBACK}:{fake.port}": "llama.cpp"})
    url = f"http://{LOOPBACK}:{fake.port}/v1/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    try:
        telemetry = current_telemetry()
        assert telemetry is not None and telemetry.evidence is not None
        with httpx.Client(timeout=10) as client:
            client.post(url, json=body).raise_for_status()
            deadline = time.monotonic() + 20
            while not telemetry.evidence.model_attributes(LOOPBACK, fake.port) and time.monotonic() < deadline:
                time.sleep(0.05)
            client.post(url, json=body).raise_for_status()
            deadline = time.monotonic() + 20  # a few more polls of /metrics (0.2, 0.4 s apart...)
            while fake.hits.get("/metrics", 0) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        otel_llm.uninstrument()
    assert fake.hits.get("/metrics", 0) >= 3 and fake.hits["/props"] == 1, fake.hits
    call = sorted(otel.calls(), key=lambda c: c.start_time)[-1]
    attrs = call.attributes
    assert attrs[sc.LLM_MODEL_CONTEXT_LENGTH] == 256 and attrs[sc.LLM_MODEL_SLOTS] == 1
    assert attrs[sc.LLM_MODEL_NAME] == "/models/tiny-Q4_K_M.gguf"
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 230
    assert attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] == 230 / 256
    assert attrs[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is True


@pytest.mark.parametrize("body", ["not json", '{"data": [{"id": "a", "max_model_len": "NaN"}]}',
                                  '{"data": [{"id": "a"}, {"id": "b", "max_model_len": 9}]}', "[]"])
def test_odd_model_metadata_gives_none(rig: Rig, fake: FakeRuntime, body: str) -> None:
    fake.serve("/metrics", observer_fixture("vllm_metrics.txt"))
    fake.serve("/v1/models", body, content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, "vllm")
    rig.observer.poll_once()
    model = rig.observer.model_of(LOOPBACK, fake.port)
    assert model is None or model.context_length is None
    assert rig.observer.latest_state(LOOPBACK, fake.port)["requests.running"] == 3  # the poll went on


def test_runtime_recognized_from_its_metrics_for_the_calls(rig: Rig, fake: FakeRuntime) -> None:
    """A server no route or option names: once /metrics shows ``vllm:`` series, ``runtime_of``
    (what a call to it is attributed to) says vllm; a server that stops being polled is forgotten."""
    fake.serve("/metrics", observer_fixture("vllm_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, None)
    assert rig.observer.runtime_of(LOOPBACK, fake.port) is None
    rig.observer.poll_once()
    assert rig.observer.runtime_of(LOOPBACK, fake.port) == "vllm"
    assert rig.observer.runtime_of(LOOPBACK, fake.port + 1) is None
    rig.observer.policy = PollPolicy("configured")  # nobody configured it: no longer polled
    rig.observer.poll_once()
    assert rig.observer.runtime_of(LOOPBACK, fake.port) is None


# --- Ollama ------------------------------------------------------------------------------------------
def test_ollama_ps(rig: Rig, fake: FakeRuntime) -> None:
    fake.serve("/api/ps", observer_fixture("ollama_ps.json"), content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, "ollama")
    rig.observer.poll_once()
    server = {"server.address": LOOPBACK, "server.port": fake.port, "llm.runtime.name": "ollama"}
    gemma = {**server, "gen_ai.request.model": "gemma3:270m"}
    qwen = {**server, "gen_ai.request.model": "qwen3:0.6b"}
    assert sorted(rig.points("llm.runtime.model.loaded"), key=str) == sorted([(1, gemma), (1, qwen)], key=str)
    assert rig.value("llm.runtime.model.memory", gen_ai__request__model="gemma3:270m",
                     llm__runtime__memory__location="total") == 550199296
    assert rig.value("llm.runtime.model.memory", gen_ai__request__model="gemma3:270m",
                     llm__runtime__memory__location="vram") == 412649472
    assert rig.value("llm.runtime.model.memory", gen_ai__request__model="qwen3:0.6b",
                     llm__runtime__memory__location="vram") == 0
    assert rig.metrics()["llm.runtime.model.memory"].unit == "By"
    expires = dict((a["gen_ai.request.model"], v) for v, a in rig.points("llm.runtime.model.expires_in"))
    assert expires["gemma3:270m"] > 60 * 365 * 86400 and expires["qwen3:0.6b"] == 0.0
    state = rig.observer.latest_state(LOOPBACK, fake.port)
    assert state["models.loaded"] == ("gemma3:270m", "qwen3:0.6b") and state["requests.waiting"] is None
    assert fake.hits == {"/api/ps": 1}  # Ollama has no /metrics: never asked


def test_unknown_runtime_answering_api_ps_is_ollama(rig: Rig, fake: FakeRuntime) -> None:
    fake.serve("/api/ps", '{"models": []}', content_type="application/json")
    rig.registry.note(LOOPBACK, fake.port, None)
    rig.observer.poll_once()
    assert rig.observer.latest_state(LOOPBACK, fake.port)["models.loaded"] == ()
    fake.serve("/api/ps", observer_fixture("ollama_ps.json"), content_type="application/json")
    rig.observer.poll_once()
    assert {a["llm.runtime.name"] for _v, a in rig.points("llm.runtime.model.loaded")} == {"ollama"}


def test_non_json_api_ps(rig: Rig, fake: FakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """A known Ollama answering something that is not JSON: a failure like any other, backed off
    (no retry at the next poll), and an answer in the right format before the bound recovers."""
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    fake.serve("/api/ps", "<html>oops</html>", content_type="text/html")
    rig.registry.note(LOOPBACK, fake.port, "ollama")
    rig.observer.poll_once()
    rig.observer.poll_once()
    assert fake.hits["/api/ps"] == 1  # not asked again at once
    rig.later(0.05)
    rig.observer.poll_once()
    assert fake.hits["/api/ps"] == 2 and rig.points("llm.runtime.model.loaded") == []
    fake.serve("/api/ps", observer_fixture("ollama_ps.json"), content_type="application/json")
    rig.later(0.1)
    rig.observer.poll_once()
    assert len(rig.points("llm.runtime.model.loaded")) == 2
    assert _runtime_logs(caplog) == []  # the endpoint never reached the bound


# --- robustness --------------------------------------------------------------------------------------
def test_malformed_metrics_logged_once_then_recovers(rig: Rig, fake: FakeRuntime,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    fake.serve("/metrics", observer_fixture("vllm_legacy_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, "vllm")
    rig.observer.poll_once()
    before = rig.observer.latest_state(LOOPBACK, fake.port)
    fake.serve("/metrics", observer_fixture("malformed_metrics.txt"))
    rig.observer.poll_once()
    rig.later(0.05)
    rig.observer.poll_once()
    assert fake.hits["/metrics"] == 3
    metrics_logs = [m for m in _runtime_logs(caplog) if "/metrics" in m]  # (no /v1/models here: one line)
    assert metrics_logs == []  # backing off, not stopped: nothing to say yet
    assert rig.points("vllm.num_requests_running") == []  # stale series are not reported
    assert rig.points("llm.runtime.requests.waiting") == []
    assert rig.observer.latest_state(LOOPBACK, fake.port) == before  # last good poll, its timestamp
    fake.serve("/metrics", observer_fixture("vllm_metrics.txt"))
    rig.later(0.1)
    rig.observer.poll_once()
    assert rig.observer.latest_state(LOOPBACK, fake.port)["requests.waiting"] == 3
    assert fake.hits["/metrics"] == 4
    fake.serve("/metrics", observer_fixture("malformed_metrics.txt"))  # the count started again at the success
    for _ in range(MAX_FAILURES - 1):
        rig.later(10)
        rig.observer.poll_once()
    assert [m for m in _runtime_logs(caplog) if "/metrics" in m] == []
    assert fake.hits["/metrics"] == 4 + MAX_FAILURES - 1 and fake.hits["/v1/models"] == 1


def _poll_through_back_off(rig: Rig, seconds: float = 30.0, step: float = 0.01) -> None:
    """Poll every ``step`` seconds of the observer's clock for ``seconds``."""
    for _ in range(int(seconds / step)):
        rig.observer.poll_once()
        rig.later(step)


def test_http_500_backs_off_exponentially_then_stops(rig: Rig, fake: FakeRuntime,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    fake.serve("/metrics", "boom", status=500)
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    asked: list[float] = []
    for _ in range(3000):  # 30 s of the observer's clock, polled every 10 ms
        before = fake.hits.get("/metrics", 0)
        rig.observer.poll_once()
        if fake.hits.get("/metrics", 0) > before:
            asked.append(round(rig.now[0] - 1000.0, 2))
        rig.later(0.01)
    # never an immediate retry: 1, 2, 4, 8 intervals of 0.05 s apart (to the 10 ms polling
    # step), then no more
    assert len(asked) == MAX_FAILURES, asked
    gaps = [later - earlier for earlier, later in zip(asked, asked[1:])]
    assert all(want <= gap <= want + 0.011 for gap, want in zip(gaps, (0.05, 0.1, 0.2, 0.4))), gaps
    assert fake.hits["/props"] == 1  # its model metadata, asked once (absent here: never again)
    logs = [m for m in _runtime_logs(caplog) if "/metrics" in m]
    assert len(logs) == 1, logs
    assert "answered HTTP 500" in logs[0] and f"no longer polled after {MAX_FAILURES} consecutive" in logs[0]
    assert rig.observer.latest_state(LOOPBACK, fake.port) == {}


def test_unreachable_runtime_stops_after_the_bound(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    rig.registry.note(LOOPBACK, port, "vllm")
    started = time.monotonic()
    _poll_through_back_off(rig, seconds=10, step=0.05)
    assert time.monotonic() - started < 10  # refused at once, never waited for
    logs = _runtime_logs(caplog)
    assert len(logs) == 1 and "unreachable (ConnectError)" in logs[0] and "no longer polled" in logs[0], logs
    assert rig.observer._states[(LOOPBACK, port)].backoff.failures == {"/metrics": MAX_FAILURES}  # /v1/models not tried
    assert rig.observer.latest_state(LOOPBACK, port) == {}
    assert rig.points("llm.runtime.requests.running") == []


def test_timeouts_count_as_failures(rig: Rig, caplog: pytest.LogCaptureFixture,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that accepts and never answers (a hung server) is backed off like a refusal."""
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    monkeypatch.setattr(_runtime_client, "TIMEOUT", 0.1)
    with socket.socket() as silent:
        silent.bind((LOOPBACK, 0))
        silent.listen(16)  # the kernel completes the handshakes; nobody reads or answers
        rig.registry.note(LOOPBACK, silent.getsockname()[1], "tgi")
        _poll_through_back_off(rig, seconds=5, step=0.05)
    logs = _runtime_logs(caplog)
    assert len(logs) == 1 and "Timeout" in logs[0] and "no longer polled" in logs[0], logs


def test_absent_endpoint_backs_off_then_stops(rig: Rig, fake: FakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """llama.cpp without --metrics answers 501 (other servers 404): backed off, then one line."""
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    fake.serve("/metrics", '{"error":{"code":501}}', status=501, content_type="application/json")
    _poll_through_back_off(rig)
    assert fake.hits["/metrics"] == MAX_FAILURES
    logs = [m for m in _runtime_logs(caplog) if "501" in m]
    assert len(logs) == 1 and "--metrics" in logs[0]
    assert [r.levelno for r in caplog.records if "501" in r.getMessage()] == [logging.INFO]


@pytest.mark.parametrize("status", [401, 403])
def test_endpoint_refusing_the_poll_stops_at_once(rig: Rig, fake: FakeRuntime, caplog: pytest.LogCaptureFixture,
                                                  status: int) -> None:
    """A runtime behind an authenticating gateway refuses the unauthenticated polls: its state
    route and its metadata route each asked exactly once, one log line each, never again (the
    poller has no credentials to offer)."""
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    fake.serve("/metrics", '{"error":{"code":%d}}' % status, status=status, content_type="application/json")
    fake.serve("/props", '{"error":{"code":%d}}' % status, status=status, content_type="application/json")
    _poll_through_back_off(rig, seconds=120, step=0.5)
    assert fake.hits == {"/metrics": 1, "/props": 1}
    logs = _runtime_logs(caplog)
    assert len(logs) == 2, logs
    assert all("needs credentials" in m and "no longer polled" in m for m in logs), logs


@pytest.mark.slow
def test_real_500_server_gets_a_bounded_number_of_polls(fake: FakeRuntime) -> None:
    """The background thread, real time: a server answering 500 to everything receives exactly
    MAX_FAILURES polls (0.05 + 0.1 + 0.2 + 0.4 s apart at a 0.05 s interval), then none."""
    fake.serve("/metrics", "boom", status=500)
    registry = ServerRegistry()
    registry.note(LOOPBACK, fake.port, "vllm")
    observer = RuntimeStateObserver(MeterProvider().get_meter("t"), registry, interval=0.05,
                                    policy=PollPolicy(POLL_ALL))
    started = time.monotonic()
    observer.start()
    try:
        deadline = time.monotonic() + 20
        while fake.hits.get("/metrics", 0) < MAX_FAILURES and time.monotonic() < deadline:
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        assert fake.hits["/metrics"] == MAX_FAILURES
        assert elapsed >= 0.75  # backed off: five polls at the 0.05 s interval would take 0.2 s
        time.sleep(1.5)  # twice the back-off the next poll would have waited
        assert fake.hits == {"/metrics": MAX_FAILURES, "/v1/models": 1}  # its model metadata: absent, once
    finally:
        observer.stop()


def test_series_changing_type_between_polls(rig: Rig, fake: FakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    rig.registry.note(LOOPBACK, fake.port, "llama.cpp")
    counter = "# TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 10\n" \
              "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
    fake.serve("/metrics", counter)
    rig.observer.poll_once()
    assert isinstance(rig.metrics()["llamacpp.n_tokens_max"].data, Sum)
    gauge = counter.replace("counter", "gauge").replace(" 10", " 7").replace("processing 1", "processing 0")
    fake.serve("/metrics", gauge)
    rig.observer.poll_once()
    rig.observer.poll_once()
    metrics = rig.metrics()
    assert "llamacpp.n_tokens_max" not in metrics  # the counter has no point: the gauge series is dropped
    assert rig.value("llamacpp.requests_processing") == 0  # the rest goes on
    assert len([m for m in _runtime_logs(caplog) if "first seen as a counter" in m]) == 1


def test_poll_all_polls_registered_servers_but_not_cloud_apis(fake: FakeRuntime) -> None:
    """poll_runtimes=all: what polling did before the policy (every self-hosted-looking server)."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(404)

    reader = InMemoryMetricReader()
    registry = ServerRegistry()
    client = httpx.Client(transport=httpx.MockTransport(handler))
    observer = RuntimeStateObserver(MeterProvider(metric_readers=[reader]).get_meter("t"), registry, client=client,
                                    policy=PollPolicy(POLL_ALL))
    registry.note("api.openai.com", 443, None)
    registry.note("api.example.com", 8000, None)
    registry.note("lmstudio.local", 1234, "lmstudio")
    observer.poll_once()
    assert seen == ["http://lmstudio.local:1234/api/v0/models"]  # no state route: its model listing only
    seen.clear()
    registry.note("10.1.2.3", 8000, None)
    registry.note("ollama", 11434, None)
    observer.poll_once()  # the listing answered 404: backing off, not asked again yet
    assert sorted(seen) == sorted(["http://10.1.2.3:8000/api/ps", "http://10.1.2.3:8000/metrics",
                                   "http://ollama:11434/api/ps", "http://ollama:11434/metrics"])
    observer.stop()
    assert not client.is_closed  # a client passed in belongs to the caller
    client.close()


def test_background_thread_polls(rig: Rig, fake: FakeRuntime) -> None:
    fake.serve("/metrics", observer_fixture("tgi_metrics.txt"))
    rig.registry.note(LOOPBACK, fake.port, "tgi")
    rig.observer.start()
    deadline = time.monotonic() + 5
    while fake.hits.get("/metrics", 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.hits["/metrics"] >= 3
    thread = rig.observer._thread
    assert thread is not None and thread.daemon and thread is not threading.current_thread()
    rig.observer.stop()
    assert not thread.is_alive()
    count = fake.hits["/metrics"]
    time.sleep(0.2)
    assert fake.hits["/metrics"] == count


def test_polls_are_not_traced_by_otel_llm(fake: FakeRuntime) -> None:
    """/metrics and /api/ps are not model routes: the instrumentation leaves them alone."""
    otel = make_otel()
    otel_llm.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    try:
        fake.serve("/metrics", observer_fixture("sglang_metrics.txt"))
        fake.serve("/api/ps", observer_fixture("ollama_ps.json"), content_type="application/json")
        registry = ServerRegistry()
        registry.note(LOOPBACK, fake.port, None)
        observer = RuntimeStateObserver(otel.meter_provider.get_meter("t"), registry, policy=PollPolicy(POLL_ALL))
        observer.poll_once()
        observer.stop()
        assert fake.hits == {"/metrics": 1, "/api/ps": 1}
        assert otel.spans() == []
    finally:
        otel_llm.uninstrument()


def test_polls_are_not_traced_by_httpx_instrumentation(fake: FakeRuntime) -> None:
    """An application that also runs opentelemetry-instrumentation-httpx gets no span per poll."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    otel = make_otel()
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=otel.tracer_provider)
    try:
        fake.serve("/metrics", observer_fixture("tgi_metrics.txt"))
        registry = ServerRegistry()
        registry.note(LOOPBACK, fake.port, "tgi")
        observer = RuntimeStateObserver(otel.meter_provider.get_meter("t"), registry, policy=PollPolicy(POLL_ALL))
        observer.poll_once()
        observer.stop()
        assert fake.hits == {"/metrics": 1}
        httpx.get(f"http://{LOOPBACK}:{fake.port}/metrics", timeout=2)  # the application's own request
        assert [s.name for s in otel.spans()] == ["GET"]
    finally:
        instrumentor.uninstrument()


# --- the real llama.cpp server -----------------------------------------------------------------------
def _generate(base_url: str, prompt: str, done: list[str], enough: threading.Event) -> None:
    """A long streamed generation; hanging up once ``enough`` is set cancels it in llama.cpp."""
    body = {"prompt": prompt, "n_predict": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base_url}/completion", json=body, timeout=120) as response:
        for _ in response.iter_lines():
            if enough.is_set():
                break
    done.append(prompt)


def _wait_for(rig: Rig, host: str, port: int, **want: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        rig.observer.poll_once()
        state = rig.observer.latest_state(host, port)
        if all(state.get(k.replace("_", ".", 1)) == v for k, v in want.items()):
            return state
        time.sleep(0.05)
    raise AssertionError(f"runtime state never reached {want}: {state}")


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_real_llamacpp(rig: Rig) -> None:
    rig.observer.policy = PollPolicy()  # the default: a llama-server process /proc identifies
    with LlamaServer(slots=1) as server:
        rig.registry.note(LOOPBACK, server.port, None)  # route-implied nothing: /proc names it
        assert rig.observer.runtime_of(LOOPBACK, server.port) is None
        rig.observer.poll_once()
        assert rig.observer.runtime_of(LOOPBACK, server.port) == "llama.cpp"
        metrics = rig.metrics()
        attrs = {"server.address": LOOPBACK, "server.port": server.port, "llm.runtime.name": "llama.cpp"}
        assert isinstance(metrics["llamacpp.prompt_tokens_total"].data, Sum)
        assert isinstance(metrics["llamacpp.requests_processing"].data, Gauge)
        assert dict(metrics["llamacpp.requests_deferred"].data.data_points[0].attributes) == attrs
        assert rig.points("llm.runtime.requests.running") == [(0, attrs)]
        assert rig.observer.latest_state(LOOPBACK, server.port)["kv_cache.usage"] is None

        done: list[str] = []
        enough = threading.Event()
        first = threading.Thread(target=_generate, args=(server.base_url, "Once upon a time", done, enough))
        first.start()
        _wait_for(rig, LOOPBACK, server.port, requests_running=1)
        second = threading.Thread(target=_generate, args=(server.base_url, "The sea was", done, enough))
        second.start()
        busy = _wait_for(rig, LOOPBACK, server.port, requests_running=1, requests_waiting=1)
        assert len(done) == 0, "the first generation ended before the second was queued"
        assert rig.points("llm.runtime.requests.waiting") == [(1, attrs)]
        _wait_for(rig, LOOPBACK, server.port, requests_running=1, requests_waiting=1)  # steady, not a blip
        enough.set()  # both end early: the first is cancelled, then the second once it starts
        first.join(60)
        second.join(60)
        assert len(done) == 2
        idle = _wait_for(rig, LOOPBACK, server.port, requests_running=0, requests_waiting=0)
        assert idle["timestamp"] > busy["timestamp"]
        assert rig.value("llamacpp.tokens_predicted_total") > 0
