"""``otel-llm diagnose``: one simulator scenario per injected bottleneck, plus pure verdict tests."""

from __future__ import annotations

import json
import os
import re
import statistics
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import otel_llm
from otel_llm.tools.commands.diagnose import parse_args, run
from otel_llm.tools.diagnose.hoststate import HostReading
from otel_llm.tools.diagnose.trials import TargetResult, Trial, request_for
from otel_llm.tools.diagnose.verdicts import CODES, THRESHOLDS, Verdict, verdicts

from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.net import free_port

SECRET = "sk-diagnose-test-secret-9f3b2c"


@pytest.fixture(autouse=True)
def _traces_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "traces.jsonl"
    monkeypatch.setenv("OTEL_LLM_TRACES_FILE", str(path))
    return path


def diagnose(url: str, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    record = tmp_path / "diagnose.json"
    try:
        api = [] if "--api" in extra else ["--api", "openai"]  # the simulator serves every flavour's routes
        code = run(parse_args([url, "--model", "sim-model", "--quick", "--json", str(record), *api, *extra]))
    finally:
        assert not otel_llm.is_instrumented()
    return code, json.loads(record.read_text())


def primary(data: dict[str, Any]) -> str:
    return data["targets"][0]["primary"]


def codes(data: dict[str, Any]) -> list[str]:
    return [v["code"] for v in data["targets"][0]["verdicts"]]


# --- scenarios against the simulator -------------------------------------------------------------
# A verdict decided from measured times is marked timing (rerun on failure): on a shared 2-core
# machine one bad scheduling moment is not a regression. Reachability, HTTP status, auth and the
# record's structure do not depend on the clock and run once.

@pytest.mark.slow
@pytest.mark.timing
def test_healthy_no_false_alarm(sim: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                _traces_file: Path) -> None:
    code, data = diagnose(sim.base_url, tmp_path)
    assert code == 0
    assert codes(data) == ["healthy"]
    out = capsys.readouterr().out
    for step in ("[1] reachability", "[2] warm-up", "[4] prompt-size sweep", "[5] concurrency sweep",
                 "[6] streaming check", "healthy"):
        assert step in out
    # every trial is a traced call, also written to the JSONL traces file
    assert _traces_file.exists() and "llm.client.time_to_first_token" in _traces_file.read_text()


@pytest.mark.slow
@pytest.mark.timing
def test_cold_start(sim: Any, tmp_path: Path) -> None:
    configure_sim(sim, cold_delay=1.0)
    _, data = diagnose(sim.base_url, tmp_path)
    assert primary(data) == "cold_start"
    verdict = data["targets"][0]["verdicts"][0]
    assert verdict["evidence"]["excess_s"] > 0.8
    # cold never mixed with warm
    target = data["targets"][0]
    assert target["cold"]["ttft"] > 1.0
    assert all(t["ttft"] < 0.5 for t in target["warm"])


@pytest.mark.slow
@pytest.mark.timing
def test_queueing(sim: Any, tmp_path: Path) -> None:
    configure_sim(sim, concurrency="serialized")
    _, data = diagnose(sim.base_url, tmp_path)
    assert primary(data) == "queueing"
    assert "serializes" in data["targets"][0]["verdicts"][0]["remedy"]


@pytest.mark.slow
@pytest.mark.timing
def test_buffering(sim: Any, tmp_path: Path) -> None:
    configure_sim(sim, buffering=True, buffer_flush_interval=0.15, token_interval=0.01)
    _, data = diagnose(sim.base_url, tmp_path)
    assert primary(data) == "buffering"
    assert data["targets"][0]["streaming"]["buffered_trials"] >= 1


@pytest.mark.slow
@pytest.mark.timing
def test_text_completions_are_diagnosed_as_chat_is(sim: Any, tmp_path: Path) -> None:
    """``--api openai-completions`` (``/v1/completions``): the same procedure, the same verdicts."""
    configure_sim(sim, buffering=True, buffer_flush_interval=0.15, token_interval=0.01)
    _, data = diagnose(sim.base_url, tmp_path, "--api", "openai-completions")
    assert primary(data) == "buffering"
    assert data["targets"][0]["api"] == "openai-completions"


@pytest.mark.slow
@pytest.mark.timing
def test_slow_prefill(sim: Any, tmp_path: Path) -> None:
    """llama.cpp reports its prompt evaluation: a long one is named, not mistaken for queueing."""
    configure_sim(sim, runtime="llama.cpp", first_token_delay=0.8, token_interval=0.02, tokens=16)
    _, data = diagnose(sim.base_url, tmp_path, "--max-concurrency", "1")
    assert primary(data) == "prefill_bound"


@pytest.mark.slow
@pytest.mark.timing
def test_slow_decode(sim: Any, tmp_path: Path) -> None:
    configure_sim(sim, first_token_delay=0.02, token_interval=0.1, tokens=16)  # 10 tokens/s
    _, data = diagnose(sim.base_url, tmp_path, "--max-concurrency", "1")
    assert primary(data) == "decode_bound"



def test_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, data = diagnose(f"http://127.0.0.1:{free_port()}", tmp_path)
    assert code == 1
    assert codes(data) == ["unreachable"]
    assert data["targets"][0]["warm"] == []
    assert "no reachable listener" in capsys.readouterr().out


def test_http_error_404(sim: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    configure_sim(sim, error_status=404)
    code, data = diagnose(sim.base_url, tmp_path)
    assert code == 1
    assert codes(data) == ["http_error"]
    verdict = data["targets"][0]["verdicts"][0]
    assert verdict["evidence"]["status"] == 404
    assert "wrong route or model" in verdict["summary"]
    assert "a listener did answer" in capsys.readouterr().out


def test_auth_missing_401(sim: Any, tmp_path: Path) -> None:
    configure_sim(sim, error_status=401)
    _, data = diagnose(sim.base_url, tmp_path)
    assert codes(data) == ["auth_missing"]
    assert data["targets"][0]["verdicts"][0]["evidence"]["auth_sent"] is False


@pytest.mark.slow
def test_secret_never_printed_or_recorded(sim: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch, _traces_file: Path) -> None:
    monkeypatch.setenv("DIAG_TOKEN", SECRET)
    code, data = diagnose(sim.base_url, tmp_path, "--auth-env", "DIAG_TOKEN")
    assert code == 0
    assert data["config"]["auth_sent"] is True and data["config"]["auth_env"] == "DIAG_TOKEN"
    configure_sim(sim, error_status=403)
    _, rejected = diagnose(sim.base_url, tmp_path, "--auth-env", "DIAG_TOKEN")
    assert codes(rejected) == ["auth_missing"]
    out = capsys.readouterr()
    assert SECRET not in out.out and SECRET not in out.err
    assert SECRET not in (tmp_path / "diagnose.json").read_text()
    assert SECRET not in json.dumps(data)
    assert SECRET not in _traces_file.read_text()


def test_missing_auth_env_is_an_error(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIAG_TOKEN_UNSET", raising=False)
    assert run(parse_args([sim.base_url, "--model", "m", "--auth-env", "DIAG_TOKEN_UNSET"])) == 2


@pytest.mark.slow
def test_json_structure(sim: Any, tmp_path: Path) -> None:
    code, data = diagnose(sim.base_url, tmp_path, "--trials", "3")
    assert code == 0
    config = data["config"]
    for key in ("model", "api", "urls", "trials", "max_tokens", "max_concurrency", "client_host", "runtimes"):
        assert key in config
    assert config["model"] == "sim-model" and config["api"] == "openai" and config["urls"] == [sim.base_url]
    assert config["trials"] == 3 and config["max_tokens"] == 16 and config["max_concurrency"] == 2
    assert config["client_host"] == socket.gethostname()
    assert config["runtimes"][0]["name"]
    target = data["targets"][0]
    assert target["reachability"]["status"] == 200
    assert target["cold"]["kind"] == "cold"
    assert len(target["warm"]) == 3 and all(t["kind"] == "warm" for t in target["warm"])
    assert set(target["concurrency"]) == {"1", "2"} and len(target["concurrency"]["2"]) == 2
    for trial in target["warm"]:
        assert trial["ttfb"] > 0 and trial["ttft"] >= trial["ttfb"] and trial["client_rate"] > 0
        assert trial["trace_id"] and len(trial["trace_id"]) == 32
        assert "llm.server_wait" in trial["phases"]
    assert target["warm_stats"]["ttft"]["n"] == 3
    assert target["warm_stats"]["ttft"]["min"] <= target["warm_stats"]["ttft"]["median"] \
        <= target["warm_stats"]["ttft"]["max"]
    assert {"code", "summary", "evidence", "remedy"} <= set(target["verdicts"][0])


@pytest.mark.slow
@pytest.mark.timing  # 'healthy' for the live target rests on its measured times
def test_two_targets_side_by_side(sim: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    record = tmp_path / "two.json"
    code = run(parse_args([sim.base_url, down, "--model", "sim-model", "--quick", "--trials", "1",
                           "--json", str(record)]))
    data = json.loads(record.read_text())
    assert code == 1
    assert [t["primary"] for t in data["targets"]] == ["healthy", "unreachable"]
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("phase (warm)")][0]
    assert sim.base_url in header and down in header


def test_subcommand_registered() -> None:
    from otel_llm.tools.main import COMMANDS

    assert "diagnose" in [c.name for c in COMMANDS]


# --- pure verdicts ----------------------------------------------------------------------------


def warm(n: int = 5, **fields: Any) -> list[Trial]:
    base = {"ttfb": 0.01, "ttft": 0.05, "decode": 0.15, "total": 0.2, "client_rate": 100.0,
            "stream_buffered": False, "max_chunk_gap": 0.01}
    base.update(fields)
    return [Trial(kind="warm", index=i, **base) for i in range(n)]


def result(**fields: Any) -> TargetResult:
    defaults: dict[str, Any] = {"url": "http://x", "reachable": Trial(kind="cold", status=200, ttft=0.05,
                                                                      total=0.2, client_rate=100.0),
                                "warm": warm()}
    defaults.update(fields)
    return TargetResult(**defaults)


def test_verdicts_healthy() -> None:
    found = verdicts(result())
    assert [v.code for v in found] == ["healthy"]
    assert isinstance(found[0], Verdict) and found[0].evidence["warm_trials"] == 5


def test_verdicts_reachability() -> None:
    assert verdicts(result(reachable=Trial(kind="cold", error="unreachable")))[0].code == "unreachable"
    assert verdicts(result(reachable=Trial(kind="cold", error="http_error", status=500)))[0].code == "http_error"
    assert verdicts(result(reachable=Trial(kind="cold", error="http_error", status=403)))[0].code == "auth_missing"
    not_found = verdicts(result(reachable=Trial(kind="cold", error="http_error", status=404)))
    assert [v.code for v in not_found] == ["http_error"] and "wrong route or model" in not_found[0].summary


def test_verdicts_cold_start_with_native_load() -> None:
    found = verdicts(result(reachable=Trial(kind="cold", status=200, ttft=2.1, load=2.0, total=2.3)))
    assert found[0].code == "cold_start"
    assert found[0].evidence["native_load_duration_s"] == 2.0 and "keep the model resident" in found[0].remedy
    # a slightly slower first request (fresh connection) is no cold start
    assert verdicts(result(reachable=Trial(kind="cold", status=200, ttft=0.08)))[0].code == "healthy"


def test_verdicts_prefill_bound() -> None:
    found = verdicts(result(warm=warm(ttft=2.0, prompt_eval=1.8, total=2.2, decode=0.15)))
    assert found[0].code == "prefill_bound" and found[0].evidence["share"] == 0.9
    # short waits are not worth a verdict even when prefill is all of them
    assert verdicts(result(warm=warm(ttft=0.05, prompt_eval=0.05)))[0].code == "healthy"


def test_verdicts_decode_bound() -> None:
    found = verdicts(result(warm=warm(ttft=0.2, decode=3.0, total=3.2, client_rate=5.0, native_rate=5.5)))
    assert found[0].code == "decode_bound" and found[0].evidence["generation_rate_tps"] == 5.5
    # decode share alone at a fast rate is the normal shape of a healthy stream
    assert verdicts(result(warm=warm(decode=0.16, total=0.2, client_rate=100.0)))[0].code == "healthy"


def test_verdicts_queueing_and_shared_compute() -> None:
    serialized = {2: [Trial(kind="concurrent", ttft=0.05, total=0.2, client_rate=100.0),
                      Trial(kind="concurrent", index=1, ttft=0.25, total=0.4, client_rate=100.0)]}
    found = verdicts(result(concurrency=serialized))
    assert [v.code for v in found] == ["queueing"]
    assert found[0].evidence["growth_s"] == 0.2
    # the same late first token, but the second stream arrived in one burst (decode 10 ms of the
    # first's 150): a starved frontend, not a queue
    collapsed = {2: [Trial(kind="concurrent", ttft=0.05, total=0.2, decode=0.15, client_rate=100.0),
                     Trial(kind="concurrent", index=1, ttft=0.25, total=0.26, decode=0.01, client_rate=900.0)]}
    assert "queueing" not in [v.code for v in verdicts(result(concurrency=collapsed))]
    serialized[2][0].decode, serialized[2][1].decode = 0.15, 0.15
    assert [v.code for v in verdicts(result(concurrency=serialized))] == ["queueing"]
    shared = {2: [Trial(kind="concurrent", ttft=0.06, total=0.35, client_rate=50.0),
                  Trial(kind="concurrent", index=1, ttft=0.07, total=0.36, client_rate=49.0)]}
    found = verdicts(result(concurrency=shared))
    assert [v.code for v in found] == ["shared_compute"] and found[0].evidence["rate_tps"] == 49.5


def test_verdicts_buffering() -> None:
    found = verdicts(result(warm=warm(stream_buffered=True, max_chunk_gap=0.15)))
    assert found[0].code == "buffering" and found[0].evidence["median_max_chunk_gap_s"] == 0.15
    assert all(v.code in CODES for v in found)


def _host(step: str, pid: int | None = 100, swap_in: int = 0, swap_out: int = 0, faults: int = 50) -> HostReading:
    return HostReading(step, pid, {"pswpin": swap_in, "pswpout": swap_out, "pgmajfault": faults})


def test_verdicts_runtime_restarted() -> None:
    failed = Trial(kind="warm", index=1, error="unreachable", detail="All connection attempts failed")
    found = verdicts(result(warm=warm(2) + [failed], host_readings=[_host("start", 100), _host("end", 200)]))
    assert found[0].code == "runtime_restarted"
    evidence = found[0].evidence
    assert (evidence["pid_before"], evidence["pid_after"], evidence["failed_trials"]) == (100, 200, 1)
    assert evidence["failures"] == ["warm #2: unreachable All connection attempts failed"]
    assert "pid 100 -> 200" in found[0].summary and "dmesg" in found[0].remedy
    # the same process throughout, or no process seen at one end: no restart to report
    assert verdicts(result(host_readings=[_host("start", 100), _host("end", 100)]))[0].code == "healthy"
    assert verdicts(result(host_readings=[_host("start", None), _host("end", 200)]))[0].code == "healthy"
    # a --cold command may restart the runtime on purpose: not across the cold step, but after it
    cold = [_host("start", 100), _host("before cold trials", 100), _host("after cold trials", 300)]
    assert verdicts(result(host_readings=cold + [_host("end", 300)]))[0].code == "healthy"
    found = verdicts(result(host_readings=cold + [_host("end", 400)]))
    assert found[0].code == "runtime_restarted" and found[0].evidence["pid_before"] == 300
    assert found[0].evidence["between"] == "after cold trials .. end" and found[0].evidence["failed_trials"] == 0


def test_verdicts_context_pressure_from_the_runtimes_context_length() -> None:
    from otel_llm.parse.runtimes import ModelInfo

    llama = ModelInfo("/props", context_length=128, slots=4)
    # 40 of 128 tokens: room to spare; 104 (81 %): flagged with the trial and the route it read
    assert verdicts(result(warm=warm(input_tokens=40), model_info=llama))[0].code == "healthy"
    found = verdicts(result(warm=warm(3, input_tokens=100) + [Trial(kind="warm", index=3, input_tokens=104,
                                                                      ttft=0.05, total=0.2, client_rate=100.0)],
                            model_info=llama))
    assert [v.code for v in found] == ["context_pressure"]
    evidence = found[0].evidence
    assert evidence["input_tokens"] == 104 and evidence["trial"] == "warm #4" and evidence["share"] == 0.812
    assert evidence["trials_over"] == 1 and evidence["source"] == "/props" and evidence["context_length"] == 128
    assert "81% of the model's 128-token context" in found[0].summary and "-np" in found[0].remedy
    # no context length read, or no usage in the answers: nothing to say
    assert verdicts(result(warm=warm(input_tokens=120), model_info=ModelInfo("/v1/models")))[0].code == "healthy"
    assert verdicts(result(warm=warm(), model_info=llama))[0].code == "healthy"
    # another verdict comes first; the pressure is still reported
    slow = verdicts(result(warm=warm(input_tokens=120, prompt_eval=0.9, ttft=1.0, total=1.2), model_info=llama))
    assert [v.code for v in slow][-1] == "context_pressure" and len(slow) >= 2


def test_verdicts_memory_pressure_from_vmstat_deltas() -> None:
    pages, faults = THRESHOLDS["swap_pages"], THRESHOLDS["major_faults"]
    found = verdicts(result(host_readings=[_host("start", swap_in=10, swap_out=20),
                                           _host("end", swap_in=10 + pages // 2, swap_out=20 + pages // 2)]))
    assert found[0].code == "memory_pressure"
    assert {k: found[0].evidence[k] for k in ("swap_in_pages", "swap_out_pages", "major_faults")} == {
        "swap_in_pages": pages // 2, "swap_out_pages": pages // 2, "major_faults": 0}
    found = verdicts(result(host_readings=[_host("start", faults=50), _host("end", faults=50 + faults)]))
    assert [v.code for v in found] == ["memory_pressure"] and found[0].evidence["major_faults"] == faults
    # just under both thresholds: the odd swapped page and a few faults are no pressure
    calm = [_host("start", swap_out=5, faults=50), _host("end", swap_out=4 + pages, faults=49 + faults)]
    assert verdicts(result(host_readings=calm))[0].code == "healthy"
    # the deliberate cold step (a model loaded from disk on purpose) is not counted
    cold = [_host("start"), _host("before cold trials"), _host("after cold trials", faults=50 + 10 * faults),
            _host("end", faults=50 + 10 * faults)]
    assert verdicts(result(host_readings=cold))[0].code == "healthy"
    # a server on another host has no readings: nothing to say
    assert verdicts(result(host_readings=[]))[0].code == "healthy"


def test_host_readings_from_a_vmstat_file(tmp_path: Path) -> None:
    from otel_llm.tools.diagnose.hoststate import read_host

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\npgmajfault 930\npswpin 7\npswpout 8\noom_kill 0\n")
    with socket.socket() as own:  # a listener in this process is never the runtime
        own.bind(("127.0.0.1", 0))
        own.listen()
        reading = read_host(f"http://127.0.0.1:{own.getsockname()[1]}/v1", "start", str(vmstat))
    assert reading == HostReading("start", None, {"pswpin": 7, "pswpout": 8, "pgmajfault": 930})
    assert read_host("http://203.0.113.9:8080", "start", str(vmstat)) is None  # not on this host


def test_request_payloads() -> None:
    url, body = request_for("openai", "http://h:1/v1/", "m", 8)
    assert url == "http://h:1/v1/chat/completions" and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8 and body["stream"] is True
    url, body = request_for("ollama", "http://h:1", "m", 8)
    assert url == "http://h:1/api/chat" and body["options"]["num_predict"] == 8
    url, body = request_for("llamacpp", "http://h:1", "m", 8)
    assert url == "http://h:1/completion" and body["n_predict"] == 8


def test_a_trials_line_shows_the_draft_acceptance_beside_the_native_rate() -> None:
    from otel_llm.tools.diagnose.report import trial_line

    trial = Trial(kind="warm", ttfb=0.01, ttft=0.05, decode=0.5, total=0.6, client_rate=30.0, native_rate=31.0)
    assert "draft" not in trial_line(trial)
    trial.draft_acceptance = 0.4074
    assert "native 31.0 tok/s, draft accepted 41%" in trial_line(trial)


def test_prefill_fit_is_least_squares() -> None:
    from otel_llm.tools.diagnose.sweep import fit
    from otel_llm.tools.diagnose.trials import Trial

    trials = [Trial(kind="prompt", input_tokens=n, prompt_eval=0.01 + n / 250, ttft=0.03 + n / 200)
              for n in (40, 260, 1000)]
    fitted = fit(trials)
    assert abs(fitted["native"]["tokens_per_second"] - 250) < 1e-6
    assert abs(fitted["client"]["tokens_per_second"] - 200) < 1e-6
    assert abs(fitted["native"]["fixed_s"] - 0.01) < 1e-9
    assert fit([Trial(kind="prompt", input_tokens=10, ttft=0.1)])["client"] is None  # one point: no line
    no_native = fit([Trial(kind="prompt", input_tokens=n, ttft=n / 100) for n in (10, 20)])
    assert no_native["native"] is None and no_native["client"] is not None


@pytest.mark.runtime
@pytest.mark.timing  # the fitted prefill rate is measured
def test_prompt_sweep_on_the_real_llamacpp_server(tmp_path: Path) -> None:
    """Native prompt evaluation grows with the prompt: the fitted prefill rate is a real number."""
    from otel_llm_testing import LlamaServer

    record_file = tmp_path / "record.json"
    with LlamaServer(slots=2) as server:
        result = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "diagnose", server.base_url,
                                 "--model", "gemma", "--quick", "--json", str(record_file)],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "fitted prefill rate (native)" in result.stdout
    target = json.loads(record_file.read_text())["targets"][0]
    points = target["prompt_sweep"]
    assert len(points) == 2 and points[1]["prompt_tokens"] > 5 * points[0]["prompt_tokens"]
    assert points[1]["native_prompt_eval_s"] > points[0]["native_prompt_eval_s"]
    # each sweep point says how big its request was, and the bigger prompt was the bigger request
    assert 0 < points[0]["request_bytes"] < points[1]["request_bytes"]
    assert re.search(r"^    \d+ prompt tokens \([\d.]+ (B|KiB) request\): ", result.stdout, re.M), result.stdout
    assert 30 < target["prefill_fit"]["native"]["tokens_per_second"] < 5000
    assert target["runtime"]["name"] == "llama.cpp"
    # /props: the context each of the two slots holds (LlamaServer.context is per slot), the model file, its type
    model = target["model"]
    assert model["source"] == "/props" and model["context_length"] == server.context and model["slots"] == 2
    assert model["model"].endswith(".gguf") and model["quantization"]
    assert f"context length {server.context} tokens per request (/props)" in result.stdout


@pytest.mark.runtime
@pytest.mark.timing  # a fit needs the bigger prompt measured slower
def test_prompt_sweep_stays_within_a_small_context(tmp_path: Path) -> None:
    """A llama.cpp server holding 512 tokens per request: the sweep's sizes are brought within
    80 % of it (prompt and output limit), every point is answered, and the fit has them all."""
    from otel_llm_testing import LlamaServer

    record_file = tmp_path / "record.json"
    with LlamaServer(slots=1, context=512) as server:
        result = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "diagnose", server.base_url,
                                 "--model", "gemma", "--quick", "--max-tokens", "32", "--json", str(record_file)],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    target = json.loads(record_file.read_text())["targets"][0]
    assert target["model"]["context_length"] == 512
    points = target["prompt_sweep"]
    assert len(points) == 2, result.stdout
    assert all(p["prompt_tokens"] + 32 <= 0.8 * 512 for p in points), points
    assert points[1]["prompt_tokens"] > 3 * points[0]["prompt_tokens"]  # still a spread to fit a line to
    assert "within 80% of the context length (512 tokens)" in result.stdout
    assert target["prefill_fit"]["native"] is not None


@pytest.mark.slow
@pytest.mark.timing
def test_deliberate_cold_trials_through_the_ollama_lifecycle_control(tmp_path: Path) -> None:
    from otel_llm.tools.sim import SimProcess

    with SimProcess(runtime="ollama", cold_delay=0.6, first_token_delay=0.02, token_interval=0.002, tokens=8) as sim:
        code, data = diagnose(sim.base_url, tmp_path, "--api", "ollama", "--cold", "ollama", "--cold-trials", "2")
    assert code == 0
    target = data["targets"][0]
    assert [t["kind"] for t in target["cold_trials"]] == ["cold", "cold"]
    assert all(t["ttft"] > 0.55 and abs(t["load"] - 0.6) < 0.1 for t in target["cold_trials"])
    cold = next(v for v in target["verdicts"] if v["code"] == "cold_start")
    assert cold["evidence"]["cold_trials"] == 2 and abs(cold["evidence"]["native_load_duration_s"] - 0.6) < 0.1


def test_partial_offload_read_from_ollamas_ps_once_the_model_is_loaded(tmp_path: Path) -> None:
    from otel_llm.tools.sim import SimProcess

    with SimProcess(runtime="ollama", vram_share=0.25, first_token_delay=0.01, token_interval=0.002, tokens=8) as sim:
        pid = sim.pid
        code, data = diagnose(sim.base_url, tmp_path, "--api", "ollama")
        sim.configure(vram_share=1.0)
        _, whole = diagnose(sim.base_url, tmp_path, "--api", "ollama")
    assert code == 0
    target = data["targets"][0]
    assert target["model"]["size"] == 2**30 and target["model"]["size_vram"] == 2**28  # the record keeps them
    offload = next(v for v in target["verdicts"] if v["code"] == "partial_offload")
    assert offload["evidence"]["vram_share"] == 0.25 and offload["evidence"]["source"] == "/api/ps"
    assert "only 25% of the model" in offload["summary"] and "num_gpu" in offload["remedy"]
    assert "partial_offload" not in codes(whole)  # all of it in VRAM
    memory = target["memory"]  # Ollama's size holds weights and KV cache: the estimate says so
    assert memory["weights_bytes"] == 2**30 and memory["vram_bytes"] == 2**28 and "/api/ps" in memory["weights_source"]
    # /api/show's shape: 16 layers x 8 KV heads x (64 + 64) wide x 2 bytes, over /api/ps's 4096 tokens
    assert memory["kv_cache_bytes"] == 16 * 8 * 128 * 2 * 4096 and "/api/show" in memory["kv_cache_source"]
    assert target["model"]["parameter_count"] == 10**9 and target["model"]["context_length"] == 4096
    assert memory["runtime_rss_bytes"] > 0 and memory["runtime_pids"] == [pid]


def test_verdict_partial_offload_needs_both_sizes() -> None:
    from otel_llm.parse.runtimes import ModelInfo

    def found(info: ModelInfo) -> list[str]:
        return [v.code for v in verdicts(result(model_info=info))]

    assert found(ModelInfo("/api/ps", size=100, size_vram=60)) == ["partial_offload"]
    assert found(ModelInfo("/api/ps", size=100, size_vram=100)) == ["healthy"]
    assert found(ModelInfo("/api/ps", size=100, size_vram=0)) == ["healthy"]  # CPU only: not an offload
    assert found(ModelInfo("/api/ps", size=100)) == ["healthy"]


@pytest.mark.runtime
@pytest.mark.timing  # the verdicts of a real server rest on its measured times
def test_api_is_detected_when_not_given(tmp_path: Path) -> None:
    from otel_llm_testing import LlamaServer

    with LlamaServer(slots=2) as server:
        pid = server.pid
        record = tmp_path / "auto.json"
        assert run(parse_args([server.base_url, "--model", "gemma", "--quick", "--json", str(record)])) == 0
    target = json.loads(record.read_text())["targets"][0]
    assert target["api"] == "llamacpp" and target["runtime"]["name"] == "llama.cpp"
    # the model file /props names, and llama-server's resident memory with the model mapped in
    memory = target["memory"]
    assert memory["weights_bytes"] == os.path.getsize(target["model"]["model"]) and memory["runtime_pids"] == [pid]
    assert memory["runtime_rss_bytes"] > 0.5 * memory["weights_bytes"], memory
    # a healthy real server: no false alarm (two slots on two cores may honestly share compute).
    # On a machine busy enough that llama.cpp itself reports generating below the threshold,
    # decode_bound is the true finding, with the runtime's own rate as its evidence; the first
    # request of a just-started server is then slow enough to count as cold too.
    native = statistics.median(t["native_rate"] for t in target["warm"] if t["native_rate"])
    codes = [v["code"] for v in target["verdicts"]]
    if native < THRESHOLDS["decode_low_rate"]:
        assert "decode_bound" in codes and set(codes) <= {"decode_bound", "cold_start", "shared_compute"}, (
            native, target["verdicts"])
        decode = next(v for v in target["verdicts"] if v["code"] == "decode_bound")
        assert decode["evidence"]["generation_rate_tps"] == pytest.approx(native, abs=0.1)
    else:
        assert target["primary"] in ("healthy", "shared_compute"), (native, target["verdicts"])
    warm = target["warm_stats"]
    assert warm  # sensible numbers, native beside client


@pytest.mark.slow
@pytest.mark.timing
def test_network_path_between_two_urls_of_the_same_service(tmp_path: Path) -> None:
    from otel_llm_testing.lab import DelayingProxy
    from otel_llm.tools.sim import SimProcess

    with SimProcess(runtime="llama.cpp", first_token_delay=0.05, token_interval=0.005, tokens=16) as sim:
        with DelayingProxy("127.0.0.1", sim.port, 0.1) as proxy:
            code, data = diagnose(sim.base_url, tmp_path, proxy.url, "--api", "openai")
    assert code == 0
    direct, remote = data["targets"]
    assert "network_path" not in [v["code"] for v in direct["verdicts"]]
    path = next(v for v in remote["verdicts"] if v["code"] == "network_path")
    assert abs(path["evidence"]["excess_s"] - 0.2) < 0.06  # the proxy's round trip


@pytest.mark.slow
def test_auth_check_through_gateways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from otel_llm_testing.lab import AuthGateway
    from otel_llm.tools.sim import SimProcess

    monkeypatch.setenv("DIAG_TOKEN", SECRET)
    with SimProcess(first_token_delay=0.01, token_interval=0.002, tokens=4) as sim:
        with AuthGateway(sim.base_url, keys={"ci": SECRET}, max_concurrent=1) as gateway:
            code, guarded = diagnose(gateway.url, tmp_path, "--api", "openai", "--auth-env", "DIAG_TOKEN",
                                     "--auth-check", "--max-concurrency", "1")
        with AuthGateway(sim.base_url, keys={"ci": SECRET}, enforce=False) as gateway:
            _, open_door = diagnose(gateway.url, tmp_path, "--api", "openai", "--auth-env", "DIAG_TOKEN",
                                    "--auth-check", "--max-concurrency", "1")
    assert code == 0 and "auth_missing" not in [v["code"] for v in guarded["targets"][0]["verdicts"]]
    assert open_door["targets"][0]["primary"] == "auth_missing"
    out = capsys.readouterr().out
    assert "[7] authentication check" in out and SECRET not in out


def test_progress_bar() -> None:
    from otel_llm.tools.diagnose.report import progress_bar

    assert progress_bar(0, 4, "warm", width=8) == "warm [--------] 0/4"
    assert progress_bar(2, 4, "warm", width=8) == "warm [####----] 2/4"
    assert progress_bar(9, 4, "warm", width=8) == "warm [########] 9/4"


@pytest.mark.runtime
def test_runtime_restarted_during_the_trials_of_the_real_llamacpp_server(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server killed after the first warm trial and started again on its port after the
    second (which fails on the dead server): the verdict names both PIDs and the failed trial."""
    import os
    import signal

    from otel_llm.tools.diagnose.trials import TrialRunner
    from otel_llm_testing import LlamaServer

    servers = [LlamaServer(slots=2).start()]
    pids = [servers[0].pid]
    one = TrialRunner.one

    def around_warm_trials(runner: TrialRunner, kind: str, index: int = 0, *args: Any, **kwargs: Any) -> Trial:
        trial = one(runner, kind, index, *args, **kwargs)
        if kind == "warm" and index == 0:
            os.kill(pids[0], signal.SIGKILL)
            servers[0].stop()  # reaped; the next trial finds nobody listening
        elif kind == "warm" and index == 1:
            servers.append(LlamaServer(slots=2, port=servers[0].port).start())
            pids.append(servers[-1].pid)
        return trial

    monkeypatch.setattr(TrialRunner, "one", around_warm_trials)
    try:
        record = tmp_path / "restart.json"
        run(parse_args([servers[0].base_url, "--model", "gemma", "--api", "llamacpp", "--quick", "--trials", "3",
                        "--max-concurrency", "1", "--json", str(record)]))
    finally:
        for server in servers:
            server.stop()
    target = json.loads(record.read_text())["targets"][0]
    assert target["warm"][1]["error"] in ("unreachable", "error")
    assert target["warm"][0]["error"] is None and target["warm"][2]["error"] is None
    assert target["primary"] == "runtime_restarted", target["verdicts"]
    evidence = target["verdicts"][0]["evidence"]
    assert (evidence["pid_before"], evidence["pid_after"]) == tuple(pids) and pids[0] != pids[1]
    assert evidence["failed_trials"] == 1 and evidence["failures"][0].startswith("warm #2: ")
    assert [r["pid"] for r in target["host"]] == pids
