"""detect_api / runtime_hint probes, and deliberate cold trials (otel_llm.tools.detect / .cold)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm.tools.diagnose.cold import ColdControl, cold_trials, cold_verdict_evidence, model_loaded
from otel_llm.tools.detect import detect, detect_api, loaded_model, runtime_hint
from otel_llm.tools.diagnose.trials import Trial, TrialRunner
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.net import free_port

MODEL = "sim-model"
FAST = dict(cold_delay=0.5, first_token_delay=0.02, token_interval=0.002, tokens=4)



class _VllmLike(BaseHTTPRequestHandler):
    """Only vLLM's side-effect-free routes: /v1/models (owned_by vllm), /version, /health."""

    def do_GET(self) -> None:  # noqa: N802
        answers = {"/v1/models": {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]},
                   "/version": {"version": "0.9.1"}, "/health": None}
        if self.path not in answers:
            self.send_response(404)
            self.end_headers()
            return
        body = b"" if answers[self.path] is None else json.dumps(answers[self.path]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def vllm_like() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VllmLike)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def ollama_sim() -> Iterator[SimProcess]:
    with SimProcess(runtime="ollama", model=MODEL, **FAST) as sim:
        yield sim


@pytest.fixture()
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel_llm.instrument(tracer_provider=provider, host_metrics=False, gpu_metrics=False, runtime_metrics=False,
                        console_summary=False)
    try:
        yield provider, exporter
    finally:
        otel_llm.uninstrument()
        provider.shutdown()


def _runner(traced: tuple[TracerProvider, InMemorySpanExporter], url: str, api: str = "ollama") -> TrialRunner:
    provider, exporter = traced
    return TrialRunner(provider, exporter, url=url, api=api, model=MODEL, max_tokens=4, headers={}, timeout=20.0)


# ---------------------------------------------------------------- detect


def test_detect_ollama_sim(ollama_sim: SimProcess) -> None:
    assert detect_api(ollama_sim.base_url) == "ollama"
    found = detect(ollama_sim.base_url + "/v1")
    assert (found.api, found.runtime, found.version) == ("ollama", "ollama", "0.33.0")
    assert ollama_sim.stats()["routes"].get("POST /api/chat", 0) == 0  # probes generate nothing


def test_detect_openai_only_server(vllm_like: str) -> None:
    assert detect_api(vllm_like) == "openai"
    assert runtime_hint(vllm_like) == "vllm"
    assert detect(vllm_like).version == "0.9.1"


def test_detect_vllm_sim_is_seen_as_ollama_because_the_sim_serves_every_listing() -> None:
    # The simulator answers /api/version and "Ollama is running" whatever its runtime flavour, so a
    # route-based detector cannot tell its vllm flavour from Ollama (llama.cpp's has /props: above).
    # Documented on the simulator's page.
    with SimProcess(runtime="vllm", model=MODEL) as sim:
        assert detect_api(sim.base_url) == "ollama"
        assert sim.stats()["requests"] >= 1
        assert not any(r.startswith("POST") for r in sim.stats()["routes"])


@pytest.mark.parametrize("concurrency, slots", [("serialized", 1), ("parallel", None)])
def test_detect_llamacpp_sim_by_its_props(concurrency: str, slots: int | None) -> None:
    """The llama.cpp flavour answers ``GET /props`` as llama-server does, so it is told from Ollama
    (whose routes it also serves) and its context, model file and slots are read; a parallel
    simulator has no slot count and claims none."""
    with SimProcess(runtime="llama.cpp", model=MODEL, concurrency=concurrency) as sim:
        found = detect(sim.base_url + "/v1", model=MODEL)
        assert (found.api, found.runtime, found.version) == ("llamacpp", "llama.cpp", "otel-llm sim")
        assert detect_api(sim.base_url) == "llamacpp"
        info = loaded_model(sim.base_url, found.runtime, found.api, MODEL)
        assert info is not None
        assert (info.context_length, info.model, info.slots) == (4096, f"/models/{MODEL}.gguf", slots)
        assert not any(r.startswith("POST") for r in sim.stats()["routes"])
    with SimProcess(runtime="ollama", model=MODEL) as sim:  # other flavours: no /props
        assert httpx.get(sim.base_url + "/props", timeout=10).status_code == 404


@pytest.mark.runtime
def test_detect_llamacpp_real_server() -> None:
    from otel_llm_testing import LlamaServer

    with LlamaServer() as server:
        found = detect(server.base_url)
        assert found.api == "llamacpp"
        assert found.runtime == "llama.cpp"
        assert detect_api(server.base_url) == "llamacpp"


def test_detect_refused_port() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert detect_api(url, timeout=1.0) is None
    assert runtime_hint(url, timeout=1.0) is None


# ---------------------------------------------------------------- cold


@pytest.mark.slow
def test_cold_trials_ollama_control(ollama_sim: SimProcess,
                                    traced: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    url = ollama_sim.base_url
    runner = _runner(traced, url)
    try:
        runner.one("warmup")  # loaded now: the control must unload it
        with httpx.Client() as client:
            assert model_loaded(client, url, MODEL) is True
        seen: list[Trial] = []
        cold = cold_trials(runner, 2, ColdControl.ollama(), url, MODEL, on_trial=seen.append)
        warm = [runner.one("warm", 0)]
    finally:
        runner.close()
    assert seen == cold and len(cold) == 2
    for trial in cold:
        assert trial.ok, trial
        assert trial.kind == "cold"
        assert trial.ttft is not None and trial.ttft > 0.45
        assert trial.load is not None and abs(trial.load - 0.5) < 0.1
    assert warm[0].ok and warm[0].ttft is not None and warm[0].ttft < 0.3 and not warm[0].load
    stats = ollama_sim.stats()["routes"]
    assert stats.get("POST /api/generate") == 2  # one unload per trial
    assert stats.get("GET /api/ps", 0) >= 4  # unloaded confirmed, then re-checked before each request
    assert stats.get("POST /api/chat") == 4  # warmup + exactly one per cold trial + warm
    evidence = cold_verdict_evidence(cold, warm)
    assert evidence["cold_trials"] == 2 and evidence["warm_trials"] == 1 and evidence["reset_failed"] == 0
    assert evidence["cold_ttft_s"] > 0.45 and evidence["warm_median_ttft_s"] < 0.3
    assert evidence["excess_s"] > 0.3
    assert abs(evidence["native_load_duration_s"] - 0.5) < 0.1
    assert evidence["meets_threshold"] is True


def test_cold_trials_user_command(ollama_sim: SimProcess, traced: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    url = ollama_sim.base_url
    runner = _runner(traced, url)
    command = (f'"{sys.executable}" -c "import httpx; '
               f"httpx.post('{url}/sim/unload', json={{}}, trust_env=False).raise_for_status()\"")
    try:
        runner.one("warmup")
        cold = cold_trials(runner, 1, ColdControl.from_command(command, ready_timeout=10), url, MODEL)
        failed = cold_trials(runner, 1, ColdControl.parse("false"), url, MODEL)
    finally:
        runner.close()
    assert cold[0].ok and cold[0].ttft is not None and cold[0].ttft > 0.45
    assert cold[0].load is not None and abs(cold[0].load - 0.5) < 0.1
    assert failed[0].error == "reset_failed" and not failed[0].ok
    assert "exited 1" in (failed[0].detail or "")
    assert failed[0].ttft is None
    assert ollama_sim.stats()["routes"].get("POST /api/chat") == 2  # no request after a failed reset


def test_cold_trials_still_loaded_is_reset_failed(ollama_sim: SimProcess,
                                                 traced: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    url = ollama_sim.base_url
    runner = _runner(traced, url)
    try:
        runner.one("warmup")
        cold = cold_trials(runner, 1, ColdControl.from_command("true", ready_timeout=5), url, MODEL)
    finally:
        runner.close()
    assert cold[0].error == "reset_failed" and "loaded again" in (cold[0].detail or "")


def test_cold_control_validation_and_evidence_without_data() -> None:
    assert ColdControl.parse("ollama").kind == "ollama"
    assert ColdControl.parse("systemctl restart x").command == "systemctl restart x"
    with pytest.raises(ValueError):
        ColdControl.from_command("  ")
    with pytest.raises(ValueError):
        ColdControl("reboot")
    evidence = cold_verdict_evidence([Trial(kind="cold", error="reset_failed")], [])
    assert evidence["reset_failed"] == 1 and evidence["cold_ttft_s"] is None
    assert evidence["meets_threshold"] is None and "native_load_duration_s" not in evidence
