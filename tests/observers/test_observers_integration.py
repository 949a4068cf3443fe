"""Observers on by default with instrument(): the real llama.cpp server's process, state and the
host evidence end up in metrics and on each call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm_testing import LlamaServer
from otel_llm_testing.otel import Otel, make_otel

pytestmark = [pytest.mark.timeout(600), pytest.mark.runtime]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(slots=1) as running:
        yield running


@pytest.fixture
def observed() -> Iterator[Otel]:
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        sample_interval=0.2)
    try:
        yield state
    finally:
        otel_llm.uninstrument()


def _chat(server: LlamaServer, tokens: int, generating: threading.Event | None = None) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    for index, _ in enumerate(client.chat.completions.create(
            model="gemma", messages=[{"role": "user", "content": "Tell a story."}],
            max_tokens=tokens, stream=True, extra_body={"ignore_eos": True})):
        if generating is not None and index == 4:
            generating.set()


@pytest.mark.timing  # fixed sleeps against 0.2 s samples, overlapping calls
def test_calls_carry_host_and_runtime_evidence(server: LlamaServer, observed: Otel) -> None:
    # A call in the first sampling interval after instrument() has no sample describing it yet
    # (README); once the sampler has ticked, even a call shorter than the interval carries the
    # newest sample. (With the model file in the page cache this first call takes ~0.17 s.)
    time.sleep(0.5)
    _chat(server, 8)  # the server is now known to the observers
    time.sleep(0.6)  # a poll of its /metrics and a few host samples
    generating = threading.Event()
    # long enough to be still generating when the late call starts, however fast this machine
    # decodes (a fixed 60 tokens could finish within the wait below)
    long_call = threading.Thread(target=_chat, args=(server, 200, generating))
    long_call.start()
    assert generating.wait(60)
    time.sleep(0.6)  # polled while generating (every 0.2 s here)
    _chat(server, 4)
    long_call.join()
    calls = sorted(observed.calls(), key=lambda c: c.start_time)
    first, long, late = calls
    assert first.attributes.get(sc.LLM_RUNTIME_REQUESTS_RUNNING, 0) == 0
    assert late.attributes[sc.LLM_RUNTIME_REQUESTS_RUNNING] == 1  # the long call was generating
    assert late.attributes[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 1
    for call in calls:
        assert 0.0 <= call.attributes[sc.LLM_HOST_CPU_UTILIZATION] <= 1.0
        assert 0.0 < call.attributes[sc.LLM_HOST_MEMORY_UTILIZATION] < 1.0
    assert long.attributes[sc.LLM_HOST_CPU_UTILIZATION] > 0.3  # llama-server decoding on 2 cores


@pytest.mark.timing  # polled within a fixed 0.6 s
def test_runtime_process_and_state_metrics(server: LlamaServer, observed: Otel) -> None:
    _chat(server, 4)
    time.sleep(0.6)
    metrics = observed.metrics()
    runtime_memory = [p for p in metrics.get("process.memory.usage", [])
                      if p.attributes.get(sc.LLM_RUNTIME_NAME) == "llama.cpp"]
    assert runtime_memory and runtime_memory[0].value > 50 * 2**20  # it holds the model
    assert metrics.get("llamacpp.requests_processing"), sorted(metrics)
    assert metrics.get(sc.LLM_RUNTIME_REQUESTS_RUNNING)
    assert metrics.get("system.cpu.utilization") and metrics.get("system.memory.usage")


def test_observers_can_be_switched_off(server: LlamaServer) -> None:
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    try:
        _chat(server, 2)
    finally:
        otel_llm.uninstrument()
    call, _ = state.one_call()
    assert sc.LLM_HOST_CPU_UTILIZATION not in call.attributes
    assert "system.cpu.utilization" not in state.metrics()


@pytest.mark.slow
@pytest.mark.timing  # a 0.1 s sample must fall while the hog holds its memory
def test_memory_pressure_during_a_call_shows_on_that_call(sim) -> None:
    """A process that allocates and touches 3 GiB while a call runs raises the call's memory figure."""
    import subprocess
    import sys

    import httpx

    from otel_llm_testing.simulator import configure_sim

    configure_sim(sim, first_token_delay=0.0, token_interval=0.1, tokens=25)  # a 2.5 s stream
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        sample_interval=0.1, runtime_metrics=False)
    hog = ("import time\nblock = bytearray(3 * 2**30)\nfor i in range(0, len(block), 4096):\n"
           "    block[i] = 1\nprint('ready', flush=True)\ntime.sleep(30)\n")
    try:
        with httpx.Client() as client:
            client.post(f"{sim.base_url}/v1/chat/completions", json={"model": "m", "messages": [],
                                                                      "max_tokens": 2})  # baseline
            time.sleep(0.3)
            with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                               json={"model": "m", "stream": True, "messages": []}) as response:
                child = subprocess.Popen([sys.executable, "-c", hog], stdout=subprocess.PIPE, text=True)
                try:
                    assert child.stdout.readline().strip() == "ready"
                    response.read()
                finally:
                    child.kill()
                    child.wait()
    finally:
        otel_llm.uninstrument()
    baseline, pressured = sorted(state.calls(), key=lambda c: c.start_time)
    before = baseline.attributes[sc.LLM_HOST_MEMORY_UTILIZATION]
    during = pressured.attributes[sc.LLM_HOST_MEMORY_UTILIZATION]
    assert during - before > 0.05, (before, during)  # 3 GiB of 24 GiB is about 0.125


def test_a_watched_server_is_recognized_before_any_call(server: LlamaServer, observed: Otel) -> None:
    """``Telemetry.watch(url)`` (the gateway does it for its upstream at start): the observers
    identify the process listening there from /proc, with no model call and no request sent."""
    from otel_llm.instrumentor import current_telemetry

    telemetry = current_telemetry()
    assert telemetry is not None and telemetry.evidence is not None
    telemetry.watch("not a url")  # ignored, never raises
    telemetry.watch(f"{server.base_url}/v1")
    deadline = time.monotonic() + 10
    while telemetry.evidence.runtime_of("127.0.0.1", server.port) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert telemetry.evidence.runtime_of("127.0.0.1", server.port) == "llama.cpp"
    assert observed.calls() == []


def _ask(server: LlamaServer, words: int) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="gemma", max_tokens=2,
                                   messages=[{"role": "user", "content": "word " * words}])


def test_calls_carry_the_served_model_and_their_context_pressure(observed: Otel) -> None:
    """llama.cpp's /props, read once by the observers after the first call: the next calls carry
    its context per slot, model file and slots, and how much of that context their prompt took; a
    prompt over 80 % of it is flagged."""
    with LlamaServer(slots=1, context=256) as small:
        _ask(small, 4)  # noted by the observers; /props is read at the next poll
        deadline = time.monotonic() + 10
        telemetry = otel_llm.instrumentor.current_telemetry()
        assert telemetry is not None and telemetry.evidence is not None
        while not telemetry.evidence.model_attributes("127.0.0.1", small.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        _ask(small, 8)
        _ask(small, 215)
    _first, short, long = sorted(observed.calls(), key=lambda c: c.start_time)  # the first may end before the read
    for call in (short, long):
        attrs = call.attributes
        assert attrs[sc.LLM_MODEL_CONTEXT_LENGTH] == 256 and attrs[sc.LLM_MODEL_SLOTS] == 1
        assert attrs[sc.LLM_MODEL_NAME].endswith(".gguf") and attrs[sc.LLM_MODEL_QUANTIZATION]
        assert attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] == attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] / 256
    assert short.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] < 0.8 * 256 < long.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS]
    assert short.attributes[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is False
    assert long.attributes[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is True


def test_ollama_partial_offload_and_context_on_the_call(sim, tmp_path) -> None:
    """Ollama's /api/ps (polled anyway) says what the model runs as: the simulator reports half of
    it in VRAM. The next call through the real ollama client carries the sizes, the context
    length, the parameter size, the expiry and the partial offload, which otel-llm view prints."""
    import ollama

    from otel_llm.tools.view import render_calls
    from otel_llm.export.jsonl import JsonLinesSpanExporter, read_jsonl
    from otel_llm_testing.simulator import configure_sim

    configure_sim(sim, runtime="ollama", vram_share=0.5, tokens=4, first_token_delay=0.0)
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        sample_interval=0.1, host_metrics=False, gpu_metrics=False,
                        runtimes={sim.base_url: "ollama"})
    try:
        client = ollama.Client(host=sim.base_url)
        client.chat(model="sim-model", messages=[{"role": "user", "content": "hi"}])  # loads it
        telemetry = otel_llm.instrumentor.current_telemetry()
        assert telemetry is not None and telemetry.evidence is not None
        deadline = time.monotonic() + 10
        while not telemetry.evidence.model_attributes("127.0.0.1", sim.port, "sim-model") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        client.chat(model="sim-model", messages=[{"role": "user", "content": "hi"}])
    finally:
        otel_llm.uninstrument()
    call = sorted(state.calls(), key=lambda c: c.start_time)[-1]
    attrs = call.attributes
    assert attrs[sc.LLM_MODEL_MEMORY_TOTAL] == 2**30 and attrs[sc.LLM_MODEL_MEMORY_VRAM] == 2**29
    assert attrs[sc.LLM_DIAGNOSIS_PARTIAL_OFFLOAD] is True
    assert attrs[sc.LLM_MODEL_CONTEXT_LENGTH] == 4096 and attrs[sc.LLM_MODEL_QUANTIZATION] == "Q4_K_M"
    assert attrs[sc.LLM_MODEL_PARAMETER_SIZE] == "1B" and attrs[sc.LLM_MODEL_EXPIRES_AT] == "2100-01-01T00:00:00Z"
    assert attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] == attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] / 4096
    path = tmp_path / "traces.jsonl"
    JsonLinesSpanExporter(path).export([call])
    text = " ".join(render_calls(read_jsonl(path), 100).split())
    assert "partial offload: 512.0 MiB of 1024.0 MiB in VRAM" in text


def test_lmstudio_models_listing_on_the_call(sim) -> None:
    """LM Studio has no state route to poll: its /api/v0/models listing is read (until it lists a
    loaded model) and the calls carry its context length and quantization."""
    import httpx

    from otel_llm_testing.simulator import configure_sim

    configure_sim(sim, runtime="lmstudio", tokens=4, first_token_delay=0.0)
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        sample_interval=0.1, host_metrics=False, gpu_metrics=False,
                        runtimes={sim.base_url: "lmstudio"})
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        with httpx.Client(base_url=sim.base_url) as client:
            client.post("/api/v0/chat/completions", json=body).raise_for_status()
            telemetry = otel_llm.instrumentor.current_telemetry()
            assert telemetry is not None and telemetry.evidence is not None
            deadline = time.monotonic() + 15
            while not telemetry.evidence.model_attributes("127.0.0.1", sim.port) and time.monotonic() < deadline:
                time.sleep(0.05)
            client.post("/api/v0/chat/completions", json=body).raise_for_status()
    finally:
        otel_llm.uninstrument()
    call = sorted(state.calls(), key=lambda c: c.start_time)[-1]
    attrs = call.attributes
    assert (attrs[sc.LLM_MODEL_CONTEXT_LENGTH], attrs[sc.LLM_MODEL_QUANTIZATION]) == (4096, "Q4_K_M")
    assert attrs[sc.LLM_MODEL_NAME] == "sim-model" and sc.LLM_DIAGNOSIS_PARTIAL_OFFLOAD not in attrs


def test_model_of_a_server_started_without_metrics(observed: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server as its README starts it, without --metrics: /metrics answers 501, yet /props is
    read once and the calls carry the context length it reports and their context pressure. The
    server's own log does not list requests, so the poller's requests are counted at its client."""
    import httpx

    from otel_llm.instrumentor import current_telemetry
    from otel_llm.observers.runtime_state import MAX_FAILURES, RuntimeStateObserver

    sent: list[tuple[int, str]] = []
    fetch = RuntimeStateObserver._fetch

    def counted(self: RuntimeStateObserver, server, state, path, accept, metadata=False):  # type: ignore[no-untyped-def]
        sent.append((server.port, path))
        return fetch(self, server, state, path, accept, metadata)

    monkeypatch.setattr(RuntimeStateObserver, "_fetch", counted)
    with LlamaServer(slots=1, context=256, metrics=False) as small:
        assert httpx.get(f"{small.base_url}/metrics", timeout=10).status_code == 501  # really without it
        props = httpx.get(f"{small.base_url}/props", timeout=10).json()
        context = props["default_generation_settings"]["n_ctx"]  # what the server itself reports
        _ask(small, 4)  # noted by the observers (identified from /proc); /props is read at the next poll
        telemetry = current_telemetry()
        assert telemetry is not None and telemetry.evidence is not None
        deadline = time.monotonic() + 30
        while not telemetry.evidence.model_attributes("127.0.0.1", small.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        _ask(small, 8)
        _ask(small, 215)
        deadline = time.monotonic() + 30  # a few more polls: /props is not asked again
        while sent.count((small.port, "/metrics")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    asked = [path for port, path in sent if port == small.port]
    assert asked.count("/props") == 1, asked
    assert 3 <= asked.count("/metrics") <= MAX_FAILURES, asked  # absent: backed off, then no longer polled
    _first, short, long = sorted(observed.calls(), key=lambda c: c.start_time)  # the first may end before the read
    for call in (short, long):
        attrs = call.attributes
        assert attrs[sc.LLM_MODEL_CONTEXT_LENGTH] == context and attrs[sc.LLM_MODEL_SLOTS] == 1
        assert attrs[sc.LLM_MODEL_NAME].endswith(".gguf")
        assert attrs[sc.LLM_REQUEST_CONTEXT_PRESSURE] == attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] / context
    assert (short.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] < 0.8 * context
            < long.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS])
    assert short.attributes[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is False
    assert long.attributes[sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE] is True
