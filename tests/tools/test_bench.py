"""``otel-llm bench``: the load core against the simulator's known service times (parallel and
serialized), open and closed loops, failures by kind, the definitions, the command and its JSON."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import otel_llm
from otel_llm.tools.bench import Level, RequestRecord, Workload, knee, parse_slo, percentile, run_level, summarize
from otel_llm.tools.bench.load import LevelResult, _arrivals
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.otel import Otel
from otel_llm_testing.subprocesses import clean_env

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
# the service time of one request: first token after F, then a token every INTERVAL, T tokens
F, INTERVAL, T = 0.2, 0.02, 20
E2EL = F + (T - 1) * INTERVAL  # 0.58 s
# a loaded 2-core machine: an event loop reading several streams wakes late by tens of ms
SLACK = 0.06


def _workload(sim: SimProcess, **kw: object) -> Workload:
    return Workload(sim.base_url, "openai", "sim-model", prompt_tokens=32, output_tokens=T, **kw)  # type: ignore[arg-type]


# --- definitions ---------------------------------------------------------------------------------
def test_every_openai_request_asks_for_the_usage_chunk() -> None:
    """The usage chunk is what brings a vLLM's per-request metrics (--enable-per-request-metrics)
    on a stream: every OpenAI-compatible request the bench sends asks for it."""
    url, payload = Workload("http://x/v1", "openai", "tiny").request()
    assert url == "http://x/v1/chat/completions"
    assert payload["stream"] is True and payload["stream_options"] == {"include_usage": True}


def test_a_level_shows_the_runtimes_draft_acceptance_beside_its_rate() -> None:
    from otel_llm.tools.commands.bench import row

    level = {"level": "concurrency 1", "completed": 4, "failed": 0, "request_throughput": 1.0,
             "output_throughput": 16.0, **{k: {"p50": 0.1, "p99": 0.2} for k in ("ttft", "tpot", "itl", "e2el")}}
    assert "draft" not in row(level)
    level["native"] = {"generation_rate": {"p50": 30.0}, "draft_acceptance_rate": {"p50": 0.717}}
    assert row(level).endswith("runtime 30.0 tok/s  draft accepted 72%")


def test_percentile_interpolates_as_numpy() -> None:
    values = [0.5, 0.1, 0.4, 0.2, 0.3]
    assert percentile(values, 50) == pytest.approx(0.3)
    assert percentile(values, 90) == pytest.approx(0.46)  # numpy.percentile(values, 90)
    assert percentile(values, 99) == pytest.approx(0.496)
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


def test_tpot_is_vllms_and_goodput_counts_requests_meeting_every_slo() -> None:
    fast = RequestRecord(0, ttft=0.1, e2el=1.1, output_tokens=11)
    slow = RequestRecord(1, ttft=0.6, e2el=1.6, output_tokens=11)
    one = RequestRecord(2, ttft=0.1, e2el=0.1, output_tokens=1)
    failed = RequestRecord(3, failure="http_503", status=503)
    assert fast.tpot == pytest.approx(0.1) and one.tpot is None
    result = LevelResult(Level(concurrency=2), [fast, slow, one, failed], duration=2.0)
    s = summarize(result, parse_slo("ttft=0.5,tpot=0.2"), attainment=0.5)
    assert s["completed"] == 3 and s["failed"] == 1 and s["failures"] == {"http_503": 1}
    assert s["goodput"] == pytest.approx(1.0)  # fast and one, over 2 s
    assert s["slo_attainment"] == pytest.approx(0.5) and s["meets_slo"]
    assert s["output_throughput"] == pytest.approx(23 / 2.0)
    assert not summarize(result, parse_slo("ttft=0.5"), attainment=0.9)["meets_slo"]


@pytest.mark.parametrize("text", ["ttft", "ttft=abc", "tpot=-1", "itl=0.1", "", "e2el=nan"])
def test_bad_slo_is_a_message(text: str) -> None:
    with pytest.raises(ValueError, match="SLO"):
        parse_slo(text)


def test_knee_is_where_throughput_stops_growing() -> None:
    assert knee([{"output_throughput": v} for v in (100, 190, 260, 270, 268)]) == 2
    assert knee([{"output_throughput": v} for v in (100, 200, 400)]) is None


def test_open_loop_arrivals_are_seeded_poisson() -> None:
    level = Level(rate=4.0, requests=400)
    times = _arrivals(level, seed=7)
    assert times == _arrivals(level, seed=7) != _arrivals(level, seed=8)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.15)
    assert _arrivals(Level(rate=math.inf, requests=5), 0) == [0.0] * 5


# --- against the simulator ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_parallel_levels_match_the_injected_service_times(traced: Otel, client: str) -> None:
    with SimProcess(first_token_delay=F, token_interval=INTERVAL, tokens=T) as sim:
        workload = _workload(sim)
        assert run_level(Level(concurrency=1, requests=1), workload, http_client=client).http_client == client
        one = summarize(run_level(Level(concurrency=1, requests=4), workload, http_client=client))
        four = summarize(run_level(Level(concurrency=4, requests=8), workload, http_client=client))
    for s in (one, four):
        assert s["completed"] == s["sent"] and not s["failures"], s
        assert F <= s["ttft"]["p50"] <= F + SLACK, s["ttft"]
        assert s["tpot"]["p50"] == pytest.approx(INTERVAL, abs=0.005), s["tpot"]
        assert s["itl"]["p50"] == pytest.approx(INTERVAL, abs=0.01), s["itl"]
        assert E2EL <= s["e2el"]["p50"] <= E2EL + SLACK * 2, s["e2el"]
        assert s["output_tokens"] == T * s["completed"]  # the runtime's usage counts
    # four streams at once on a parallel runtime: four times the throughput
    assert one["request_throughput"] == pytest.approx(1 / E2EL, rel=0.2)
    assert four["request_throughput"] == pytest.approx(4 / E2EL, rel=0.25)


@pytest.mark.slow
def test_serialized_runtime_queues_and_throughput_stays_flat(traced: Otel) -> None:
    with SimProcess(first_token_delay=F, token_interval=INTERVAL, tokens=T, concurrency="serialized") as sim:
        workload = _workload(sim)
        one = summarize(run_level(Level(concurrency=1, requests=3), workload))
        three = summarize(run_level(Level(concurrency=3, requests=9), workload))
    assert one["request_throughput"] == pytest.approx(1 / E2EL, rel=0.2)
    assert three["request_throughput"] == pytest.approx(1 / E2EL, rel=0.2)
    # in steady state each request waits for the two ahead of it: TTFT ~ 2 service times + F
    assert three["ttft"]["p50"] == pytest.approx(2 * E2EL + F, rel=0.2), three["ttft"]
    assert three["tpot"]["p50"] == pytest.approx(INTERVAL, abs=0.005)  # decoding itself is not slower
    assert knee([one, three]) == 0


def test_open_loop_sends_on_schedule(traced: Otel) -> None:
    with SimProcess(first_token_delay=0.05, token_interval=0.005, tokens=8) as sim:
        workload = Workload(sim.base_url, "openai", "sim-model", prompt_tokens=16, output_tokens=8)
        result = run_level(Level(rate=10.0, requests=12), workload, seed=3)
        burst = run_level(Level(rate=math.inf, requests=6), workload)
    assert [r.scheduled for r in result.records] == _arrivals(Level(rate=10.0, requests=12), 3)
    assert all(r.sent >= r.scheduled for r in result.records)
    assert percentile([r.lag for r in result.records], 50) < 0.05
    assert all(r.ok for r in result.records + burst.records)
    assert max(r.sent for r in burst.records) < 0.5  # all at once


def test_closed_loop_lag_is_the_generators_own_time_between_requests(traced: Otel,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_llm.tools.commands.bench import warnings

    with SimProcess(first_token_delay=0.02, token_interval=0.005, tokens=5) as sim:
        workload = Workload(sim.base_url, "openai", "sim-model", prompt_tokens=16, output_tokens=5)
        quick = run_level(Level(concurrency=2, requests=6), workload)
        build = Workload.request

        def slow(self: Workload) -> tuple[str, dict]:
            time.sleep(0.05)  # a generator busy for 50 ms before each request (it blocks the loop)
            return build(self)

        monkeypatch.setattr(Workload, "request", slow)
        slowed = run_level(Level(concurrency=1, requests=4), workload)
    for r in quick.records + slowed.records:
        assert r.ok and r.ended is not None and r.ended >= r.sent >= r.scheduled
    by_worker_end = sorted(r.ended for r in quick.records)
    assert all(any(abs(r.scheduled - end) < 1e-9 for end in by_worker_end) for r in quick.records[2:])
    assert percentile([r.lag for r in slowed.records[1:]], 50) >= 0.045
    said = warnings(summarize(slowed))
    assert any("between a response's end and the next request" in line for line in said), said
    assert percentile([r.lag for r in quick.records], 50) < percentile([r.lag for r in slowed.records[1:]], 50)


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_injected_failures_are_counted_by_kind(traced: Otel, client: str) -> None:
    with SimProcess(first_token_delay=0.02, token_interval=0.005, tokens=10, error_status=503, fault_every=3) as sim:
        errors = summarize(run_level(Level(concurrency=1, requests=9), _workload(sim), http_client=client))
        sim.configure(error_status=None, abort_after_tokens=3, fault_every=2)
        broken = summarize(run_level(Level(concurrency=1, requests=8), _workload(sim), http_client=client))
        sim.configure(abort_after_tokens=None, first_token_delay=2.0)
        slow = summarize(run_level(Level(concurrency=2, requests=2), _workload(sim, timeout=0.5), http_client=client))
        port = sim.port
    gone = run_level(Level(concurrency=1, requests=1), _workload(sim), http_client=client)  # nothing listens now
    assert errors["failures"] == {"http_503": 3} and errors["completed"] == 6, errors
    assert broken["failures"] == {"broken_stream": 4} and broken["completed"] == 4, broken
    assert slow["failures"] == {"timeout": 2}, slow
    assert [(r.failure, r.retries) for r in gone.records] == [("unreachable", 0)], (port, gone.records)


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_every_request_is_a_traced_model_call(traced: Otel, client: str) -> None:
    with SimProcess(first_token_delay=0.02, token_interval=0.005, tokens=6) as sim:
        result = run_level(Level(concurrency=2, requests=4), _workload(sim), http_client=client)
    calls = [s for s in traced.spans() if s.attributes and "gen_ai.operation.name" in s.attributes]
    assert len(calls) == 4
    assert {format(s.context.trace_id, "032x") for s in calls} == {r.trace_id for r in result.records}


# --- the command ------------------------------------------------------------------------------------
def _bench(sim: SimProcess, tmp_path: Path, *args: str, **popen: object) -> subprocess.Popen[str]:
    env = clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl"), PYTHONPATH=str(REPO))
    popen.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "otel_llm.tools.main", "bench", sim.base_url, "--model", "sim-model",
                             "--api", "openai", *args], env=env, cwd=tmp_path, text=True,
                            stderr=subprocess.PIPE, **popen)  # type: ignore[call-overload]


@pytest.mark.slow
def test_command_prints_the_table_and_writes_every_request(tmp_path: Path) -> None:
    with SimProcess(first_token_delay=0.05, token_interval=0.01, tokens=10, concurrency="serialized") as sim:
        proc = _bench(sim, tmp_path, "--concurrency", "1,2", "--requests", "4", "--output-tokens", "10",
                      "--slo", "ttft=0.1,tpot=0.05", "--json", str(tmp_path / "bench.json"),
                      "--html", str(tmp_path / "bench.html"))
        out, err = proc.communicate(timeout=120)
        sim_pid = sim.pid
    assert proc.returncode == 0, err
    assert "concurrency 1" in out and "concurrency 2" in out and "TTFT p50" in out
    assert "highest load meeting the SLO (ttft <= 100 ms, tpot <= 50 ms, 90% of requests): concurrency 1" in out
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["configuration"]["output_tokens"] == 10 and doc["configuration"]["slo"] == {"ttft": 0.1, "tpot": 0.05}
    assert doc["configuration"]["http_client"] == "aiohttp"  # the default where it is installed
    first, second = doc["levels"]
    assert first["meets_slo"] and not second["meets_slo"]
    assert len(first["requests"]) == 4 and all(r["output_tokens"] == 10 for r in first["requests"])
    traces = (tmp_path / "traces.jsonl").read_text()
    assert all(r["trace_id"] in traces for level in doc["levels"] for r in level["requests"])
    assert doc["knee"] == 0  # a serialized runtime: the second level adds no throughput
    memory = first["runtime_memory"]  # the simulator's own process, watched through the level
    assert memory["pids"] == [sim_pid] and memory["samples"] >= 2
    assert 10 * 2**20 < memory["peak_rss_bytes"] < 2 * 2**30 and memory["peak_gpu_memory_bytes"] is None
    assert "peak RSS" in out and f"{sim_pid}" in doc["configuration"]["runtime_processes"]
    from otel_llm.tools.bench.html import render_html

    assert (tmp_path / "bench.html").read_text() == render_html(doc)


@pytest.mark.backend
def test_html_report_renders_in_chromium(tmp_path: Path, chromium: str) -> None:
    """The report of a run (two levels, an SLO, a knee) drawn by headless Chromium: both charts,
    the knee and SLO marks, a line per series, no script, and pixels in the series' colours."""
    from otel_llm.tools.bench.html import COLORS, write_html
    from otel_llm_testing.chromium import read_png, run_chromium

    def level(name: str, tput: float, ttft: float) -> dict[str, object]:
        dist = lambda v: {"mean": v, "p50": v, "p90": v * 1.2, "p99": v * 1.5}  # noqa: E731
        return {"level": name, "completed": 8, "failed": 0, "failures": {}, "request_throughput": tput / 20,
                "output_throughput": tput, "total_token_throughput": tput * 3, "ttft": dist(ttft),
                "tpot": dist(0.02), "itl": dist(0.02), "e2el": dist(ttft + 0.4), "goodput": tput / 25,
                "meets_slo": ttft < 0.5}
    doc = {"configuration": {"url": "http://127.0.0.1:8000", "model": "m<x>", "api": "openai",
                             "slo": {"ttft": 0.5, "tpot": 0.05}},
           "levels": [level("concurrency 1", 100, 0.1), level("concurrency 2", 190, 0.2),
                      level("concurrency 4", 200, 0.9)], "knee": 1}
    report = tmp_path / "bench.html"
    write_html(doc, report)
    dom = run_chromium(chromium, tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    assert html.count('data-chart="latency"') == 1 and html.count('data-chart="throughput"') == 1
    assert html.count('class="knee"') == 4 and html.count('class="slo"') == 2
    assert "<script" not in html.lower() and "m&lt;x&gt;" in html and "concurrency 2" in html
    assert html.count('<path class="line"') == 10  # 3 + 3 latency series, 2 + 2 throughput series
    shot = tmp_path / "shot.png"
    proc = run_chromium(chromium, tmp_path, f"--screenshot={shot}", report.as_uri())
    assert shot.exists(), proc.stdout + proc.stderr
    _, _, rows = read_png(shot)
    wanted = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in COLORS[:3]]
    hits = [0] * len(wanted)
    for row in rows:
        for x in range(0, len(row), 3):
            for n, (r, g, b) in enumerate(wanted):
                if abs(row[x] - r) <= 6 and abs(row[x + 1] - g) <= 6 and abs(row[x + 2] - b) <= 6:
                    hits[n] += 1
    assert all(h > 100 for h in hits), hits


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_writes_what_was_measured(tmp_path: Path) -> None:
    with SimProcess(first_token_delay=0.05, token_interval=0.01, tokens=10) as sim, \
            open(tmp_path / "out.txt", "w") as out:
        proc = _bench(sim, tmp_path, "--concurrency", "1,1,1,1", "--requests", "5", "--output-tokens", "10",
                      "--warmup", "0", "--json", str(tmp_path / "bench.json"), stdout=out)
        deadline = time.monotonic() + 60
        while "concurrency 1 " not in (tmp_path / "out.txt").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # inside the second level
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    text = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 130, (text, err)
    assert "Traceback" not in err and "interrupted" in text, (text, err)
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert 1 <= len(doc["levels"]) < 4 and len(doc["levels"][0]["requests"]) == 5


def test_ctrl_c_between_two_levels_keeps_the_levels_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while the first level's row is printed (after the level, before the next one)."""
    import argparse

    from otel_llm.tools.commands import bench as cli

    def interrupted(summary: dict) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "row", interrupted)
    monkeypatch.setenv("OTEL_LLM_TRACES_FILE", str(tmp_path / "traces.jsonl"))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with SimProcess(first_token_delay=0.02, token_interval=0.005, tokens=5) as sim:
        args = parser.parse_args([sim.base_url, "--model", "m", "--api", "openai", "--concurrency", "1,2",
                                  "--requests", "3", "--output-tokens", "5", "--warmup", "0",
                                  "--json", str(tmp_path / "bench.json")])
        assert cli.run(args) == 130
    assert "interrupted: the levels measured so far are reported" in capsys.readouterr().out
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [level["level"] for level in doc["levels"]] == ["concurrency 1"]
    assert len(doc["levels"][0]["requests"]) == 3 and not otel_llm.is_instrumented()


@pytest.mark.slow
def test_the_pages_command_runs_against_the_simulator(tmp_path: Path) -> None:
    """The bench page's first command, its URL pointed at the simulator (an OpenAI-compatible vLLM)."""
    page = (REPO / "docs" / "bench.md").read_text()
    start = page.index("```sh\notel-llm bench http://127.0.0.1:8000") + 6
    command = page[start:page.index("```", start)].replace("\\\n", " ").split()
    assert command[:2] == ["otel-llm", "bench"]
    with SimProcess(first_token_delay=0.01, token_interval=0.002, tokens=64) as sim:
        args = [sim.base_url if a == "http://127.0.0.1:8000" else "sim-model" if a == "NAME" else a
                for a in command[2:]]
        env = clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl"), PYTHONPATH=str(REPO))
        done = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "bench", *args], env=env, cwd=tmp_path,
                              text=True, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [level["level"] for level in doc["levels"]] == [f"concurrency {c}" for c in (1, 2, 4, 8)]
    assert all(level["completed"] == 32 and level["meets_slo"] for level in doc["levels"]), done.stdout


def test_token_chunks_of_a_real_vllm_stream_are_counted_as_its_bench_counts() -> None:
    """vLLM's recorded stream (tests/fixtures/runtimes/vllm): the role chunk is not a token, every
    other chunk with a choice is (the finish chunk too), the usage chunk is not; the count of
    output tokens is vLLM's own usage, and the request ends at its last token chunk, as vLLM's
    bench ends it (not at the usage chunk, [DONE] or the close)."""
    from otel_llm.tools.bench.load import _finish, _Stream

    raw = (REPO / "tests/fixtures/runtimes/vllm/chat_stream.sse").read_bytes()
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
    with_choice = [e for e in events if e.get("choices")]
    stream = _Stream(Workload("http://x", "openai", "tiny"))
    for i, piece in enumerate(raw.split(b"\n\n")):
        stream.feed(piece + b"\n\n", float(i))
    record = RequestRecord(0)
    _finish(record, Workload("http://x", "openai", "tiny"), stream, -1.0)
    assert len(stream.token_times) == len(with_choice) - 1  # the role chunk left out
    assert record.ttft == 2.0 and len(record.itl) == len(stream.token_times) - 1
    pieces = raw.split(b"\n\n")
    usage_at = next(i for i, piece in enumerate(pieces) if b'"usage": {' in piece or b'"usage":{' in piece)
    assert stream.token_times[-1] < usage_at  # the usage chunk comes after the last token
    assert record.e2el == stream.token_times[-1] + 1.0
    usage = next(e["usage"] for e in events if e.get("usage"))
    assert record.output_tokens == usage["completion_tokens"] and record.input_tokens == usage["prompt_tokens"]


def test_the_runtimes_own_figures_stand_beside_the_clients(tmp_path: Path) -> None:
    """A llama.cpp-flavoured simulator reports ``timings``: each request's record carries the
    runtime's generation rate (1 / token interval), the level its percentiles, the row its p50."""
    with SimProcess(runtime="llama.cpp", first_token_delay=0.05, token_interval=0.01, tokens=12) as sim:
        proc = _bench(sim, tmp_path, "--concurrency", "2", "--requests", "4", "--output-tokens", "12",
                      "--json", str(tmp_path / "bench.json"))
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (level,) = json.loads((tmp_path / "bench.json").read_text())["levels"]
    assert level["native"]["runtime"] == ["llama.cpp"]
    assert level["native"]["generation_rate"]["p50"] == pytest.approx(100, rel=0.15)
    assert all(r["native"]["llm.runtime.generation_tokens"] == 12 for r in level["requests"])
    assert "runtime 1" in out  # "runtime 100.x tok/s" (or 9x) beside the client's figures


def test_the_token_never_reaches_the_output_or_the_json(tmp_path: Path) -> None:
    """--auth-env: the token is sent, and a server that echoes it in its error leaves no trace of it
    in the table, the warnings or the JSON."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Echo(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - detection probes: nothing here
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = f'{{"error": "bad key {self.headers.get("Authorization")}"}}'.encode()
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl"), PYTHONPATH=str(REPO),
                        BENCH_TOKEN="sk-very-secret-1234")
        done = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "bench", f"http://127.0.0.1:{server.server_port}",
                               "--model", "m", "--api", "openai", "--auth-env", "BENCH_TOKEN", "--concurrency", "1",
                               "--requests", "2", "--warmup", "0", "--json", str(tmp_path / "bench.json")],
                              env=env, cwd=tmp_path, text=True, capture_output=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    (level,) = json.loads((tmp_path / "bench.json").read_text())["levels"]
    assert level["failures"] == {"http_401": 2} and "bad key Bearer ***" in level["requests"][0]["detail"]
    for text in (done.stdout, done.stderr, (tmp_path / "bench.json").read_text(),
                 (tmp_path / "traces.jsonl").read_text()):
        assert "sk-very-secret-1234" not in text


class _ClosingServer:
    """A raw HTTP/1.1 server that answers a request on a connection's first use with a complete
    chunked SSE stream and keeps the connection open without ``Connection: close``, then closes
    unanswered any later request on that connection (llama.cpp after each stream, with the race
    that loses: the client reused the socket before the server's FIN reached it). ``always``:
    every request is closed unanswered."""

    def __init__(self, always: bool = False) -> None:
        import socket
        import threading

        self.always = always
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(conn) -> bool:  # type: ignore[no-untyped-def]
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), b"0"))
        while len(body) < length:
            body += conn.recv(65536)
        return True

    def _serve(self, conn) -> None:  # type: ignore[no-untyped-def]
        with conn:
            if not self._read_request(conn) or self.always:
                return
            events = [{"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in range(3)]
            events.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
            body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
            self._read_request(conn)  # the next request on this connection: closed unanswered

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_a_request_the_server_closed_unanswered_is_sent_once_more(traced: Otel, client: str) -> None:
    server = _ClosingServer()
    try:
        workload = Workload(f"http://127.0.0.1:{server.port}", "openai", "m", prompt_tokens=4, output_tokens=3)  # type: ignore[arg-type]
        summary = summarize(run_level(Level(concurrency=1, requests=4), workload, http_client=client))
    finally:
        server.close()
    # the second request went out on the first one's connection, was closed, and sent again on a
    # connection the client does not keep; so the third opens one, and the fourth is closed on it
    assert summary["completed"] == 4 and summary["failed"] == 0, summary["failures"]
    assert summary["retries"] == 2 and server.connections == 4
    assert summary["output_tokens"] == 12


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_a_server_that_never_answers_fails_after_one_retry(traced: Otel, client: str) -> None:
    server = _ClosingServer(always=True)
    try:
        workload = Workload(f"http://127.0.0.1:{server.port}", "openai", "m", prompt_tokens=4, output_tokens=3)  # type: ignore[arg-type]
        result = run_level(Level(concurrency=1, requests=2), workload, http_client=client)
    finally:
        server.close()
    assert [(r.failure, r.retries) for r in result.records] == [("broken_stream", 1)] * 2
    assert server.connections == 4


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_the_second_try_opens_a_connection_when_the_pool_holds_several_closed_ones(traced: Otel, client: str) -> None:
    """After two requests at once, the pool keeps two connections the server will close on their
    next use (llama.cpp after a level of concurrency 2 or 4): the next request takes one, and its
    second try must not take the other."""
    import asyncio
    from dataclasses import dataclass

    from otel_llm.tools.bench.transport import open_transport

    @dataclass
    class Record:
        status: int | None = None
        failure: str | None = None
        detail: str | None = None
        retries: int = 0

    async def run(url: str) -> list[Record]:
        transport = open_transport(client, timeout=10.0)
        payload = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        records = [Record() for _ in range(3)]
        try:
            await asyncio.gather(*(transport.send(url, payload, {}, r, lambda data: None) for r in records[:2]))
            await transport.send(url, payload, {}, records[2], lambda data: None)
        finally:
            await transport.close()
        return records

    server = _ClosingServer()
    try:
        records = asyncio.run(run(f"http://127.0.0.1:{server.port}/v1/chat/completions"))
    finally:
        server.close()
    assert [(r.status, r.failure, r.retries) for r in records] == [(200, None, 0), (200, None, 0), (200, None, 1)], (
        [r.detail for r in records])
    assert server.connections == 3  # the third request's second try: a new connection


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_ctrl_c_inside_a_level_marks_it_interrupted_wherever_it_lands(traced: Otel, client: str) -> None:
    """The level's own SIGINT handler records the interruption and cancels the level, whatever the
    event loop runs when the signal comes; the process's handler is left as it was."""
    import os
    import threading

    before = signal.getsignal(signal.SIGINT)
    with SimProcess(first_token_delay=0.02, token_interval=0.01, tokens=10) as sim:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        stop = threading.Event()
        result = run_level(Level(concurrency=2, requests=200), _workload(sim), stop=stop, http_client=client)
    assert result.interrupted and result.stopped and stop.is_set()
    done = [r for r in result.records if r.ok]
    assert 0 < len(done) < 200, len(done)
    assert signal.getsignal(signal.SIGINT) is before
