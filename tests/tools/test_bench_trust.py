"""``otel-llm bench`` says when its stream timings cannot be trusted, and why: streams judged for
bursts by the SDK's rule, the generator's own event loop watched (stalls, run-queue wait), the
cause named (the generator starved of CPU, the generator busy, or the server and the path); and
its text-completions workload, the default of ``vllm bench serve``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from otel_llm.tools.bench import Level, RequestRecord, Workload, run_level, summarize
from otel_llm.tools.bench.load import LevelResult, _Stream, judge_burst
from otel_llm.tools.bench.selfwatch import LoopReport, LoopWatch, _percentile, runqueue_wait_ns
from otel_llm.tools.bench.stats import bursts
from otel_llm.tools.commands.bench import row, warnings
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.otel import Otel
from otel_llm_testing.subprocesses import clean_env

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = Workload("http://x", "openai-completions", "m")
LINUX_SCHEDSTAT = runqueue_wait_ns() is not None


# --- the completions workload ----------------------------------------------------------------------
def test_the_completions_workload_is_the_request_vllm_bench_serve_sends() -> None:
    url, payload = Workload("http://x/v1", "openai-completions", "tiny", output_tokens=24).request()
    assert url == "http://x/v1/completions"
    assert isinstance(payload["prompt"], str) and "messages" not in payload
    assert payload["max_tokens"] == 24 and payload["ignore_eos"] is True and payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True}  # the usage chunk brings the token counts
    chat_url, chat = Workload("http://x", "openai", "tiny").request()
    assert chat_url == "http://x/v1/chat/completions" and "prompt" not in chat


def test_every_text_completion_chunk_with_a_choice_is_a_token() -> None:
    stream = _Stream(WORKLOAD)
    stream.feed(b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: {"choices":[{"index":0,"text":""',
                1.0)
    stream.feed(b',"finish_reason":"length"}]}\n\ndata: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
                b"data: [DONE]\n\n", 2.0)
    assert stream.token_times == [1.0, 2.0]  # the finish chunk counts, as vLLM's bench counts it; usage does not


def test_a_completions_level_against_the_simulator(traced: Otel) -> None:
    with SimProcess(first_token_delay=0.05, token_interval=0.005, tokens=12) as sim:
        result = run_level(Level(concurrency=2, requests=4),
                           Workload(sim.base_url, "openai-completions", "sim-model", prompt_tokens=32,
                                    output_tokens=12))
    summary = summarize(result)
    assert summary["completed"] == 4 and summary["output_tokens"] == 48, summary
    assert summary["input_tokens"] > 0  # the usage chunk's prompt count
    calls = [s for s in traced.spans() if s.attributes and s.attributes.get("gen_ai.operation.name")]
    assert {s.attributes["gen_ai.operation.name"] for s in calls} == {"text_completion"}
    assert all(r.ttfb is not None and 0 < r.ttfb <= r.ttft for r in result.records)  # type: ignore[operator]


# --- the burst rule (the SDK's) ----------------------------------------------------------------------
def test_tokens_read_one_by_one_are_not_a_burst() -> None:
    times = [1.0 + 0.002 * i for i in range(24)]
    assert judge_burst(times, 0.995, 0.99, WORKLOAD) is False


def test_tokens_read_all_at_once_are_a_burst() -> None:
    assert judge_burst([1.09] * 24, 1.09, 1.0, WORKLOAD) is True


def test_a_stream_read_in_a_few_lumps_after_silences_is_a_burst() -> None:
    times = [1.0] * 8 + [1.05] * 8 + [1.1] * 8  # three reads of eight tokens, 50 ms apart
    assert judge_burst(times, 0.99, 0.98, WORKLOAD) is True


def test_a_short_stream_held_with_its_head_is_a_burst_and_a_prompt_one_is_not() -> None:
    assert judge_burst([1.1, 1.1, 1.1], 1.1, 1.0, WORKLOAD) is True  # head and tokens together, 100 ms late
    assert judge_burst([1.0, 1.004], 0.995, 0.99, WORKLOAD) is None  # too short to judge, not held
    assert judge_burst([1.0], 0.99, 0.98, WORKLOAD) is None


# --- the verdict -------------------------------------------------------------------------------------
def _level(burst: int, judged: int, stalled: int, loop: LoopReport | None) -> LevelResult:
    records = []
    for i in range(judged):
        record = RequestRecord(i, e2el=0.05, ttft=0.04, ttfb=0.005, output_tokens=24, itl=[0.0] * 23)
        record.burst = i < burst
        record.stalls, record.stall_late = (1, 0.03) if i < stalled else (0, 0.0)
        records.append(record)
    return LevelResult(Level(concurrency=2, requests=judged), records, duration=1.0, loop=loop)


def _loop(runqueue: float | None) -> LoopReport:
    return LoopReport(wall=1.0, ticks=90, late_p50=0.001, late_p99=0.06, late_max=0.07, stalls=6, stalled=0.3,
                      stalled_in_runqueue=None if runqueue is None else 0.3 * runqueue,
                      runqueue_wait=None if runqueue is None else 0.5)


def test_a_stall_explains_a_burst_only_when_it_is_as_long_as_half_the_silence() -> None:
    record = RequestRecord(0, ttfb=0.005, ttft=0.065, itl=[0.0] * 23, stalls=1, stall_late=0.04)
    assert record.silence == pytest.approx(0.06) and record.stalled  # the head on time, the tokens 60 ms late
    buffered = RequestRecord(0, ttfb=0.005, ttft=0.01, itl=[0.001, 0.06, 0.0, 0.06], stalls=1, stall_late=0.006)
    assert buffered.silence == pytest.approx(0.06) and not buffered.stalled  # the loop 6 ms late: not the cause
    assert not RequestRecord(0, ttft=0.01, itl=[0.0]).stalled  # no stall at all


def test_rare_bursts_leave_the_level_trusted() -> None:
    verdict = bursts(_level(1, 16, 1, _loop(1.0)))
    assert verdict == {"judged": 16, "burst": 1, "burst_during_stalls": 1, "share": 1 / 16, "cause": None}
    assert summarize(_level(1, 16, 1, _loop(1.0)))["stream_timing_trusted"] is True


@pytest.mark.parametrize(("stalled", "runqueue", "cause"), [
    (10, 0.95, "generator_cpu"), (10, 0.1, "generator_busy"), (10, None, "generator"), (1, 0.95, "upstream")])
def test_the_cause_of_frequent_bursts(stalled: int, runqueue: float | None, cause: str) -> None:
    summary = summarize(_level(12, 16, stalled, _loop(runqueue)))
    assert summary["bursts"]["cause"] == cause and summary["stream_timing_trusted"] is False
    said = warnings(summary)[0]
    assert said.startswith("concurrency 2: 12 of 16 streams reached the bench in bursts")
    expected = {"generator_cpu": "waiting for a CPU (95% of the stalled time in Linux's run queue",
                "generator_busy": "busy with its own work", "generator": "cannot tell whether it waited",
                "upstream": "the server or an intermediary released them in bursts"}[cause]
    assert expected in said, said
    assert ("the load generator was the limit" in said) == (cause != "upstream")
    assert row(summary).endswith("bursts 12/16 !")


def test_the_generators_cpu_share_and_lag_are_named_beside_the_bursts() -> None:
    level = _level(12, 16, 12, _loop(0.95))
    level.cpu_share = 0.97
    for record in level.records:
        record.scheduled, record.sent = 0.0, 0.04
    said = warnings(summarize(level))[0]
    assert "it used 97% of a core and its p90 send lag was 40.0 ms" in said, said


# --- the loop watch ------------------------------------------------------------------------------------
def test_lateness_percentiles_are_nearest_rank_in_tenths_of_a_millisecond() -> None:
    counts = Counter({0: 90, 5: 9, 600: 1})  # 0, 0.5 ms and 60 ms
    assert _percentile(counts, 0.5) == 0.0
    assert _percentile(counts, 0.99) == pytest.approx(0.0005)
    assert _percentile(counts, 1.0) == pytest.approx(0.06)
    assert _percentile(Counter(), 0.5) is None


def test_schedstat_unreadable_is_none(tmp_path: Path) -> None:
    assert runqueue_wait_ns(str(tmp_path / "missing")) is None
    (tmp_path / "bad").write_text("garbage")
    assert runqueue_wait_ns(str(tmp_path / "bad")) is None


def test_a_blocked_loop_is_a_stall_outside_the_run_queue() -> None:
    async def main() -> LoopReport:
        watch = LoopWatch()
        watch.start()
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        time.sleep(0.1)  # the loop held: sleeping, not waiting for a CPU
        end = time.perf_counter()
        await asyncio.sleep(0.03)
        report = await watch.stop()
        assert report.stalls_within(start, end)[0] == 1 and report.stalls_within(start, end)[1] >= 0.08
        return report

    report = asyncio.run(main())
    assert report.stalls >= 1 and report.late_max is not None and report.late_max >= 0.08, report
    if LINUX_SCHEDSTAT:
        assert report.stall_runqueue_share is not None and report.stall_runqueue_share < 0.5, report
        assert report.runqueue_wait is not None and report.runqueue_share is not None


# --- against real processes -----------------------------------------------------------------------------
@pytest.mark.timing
def test_a_buffering_server_is_named_not_the_generator(traced: Otel) -> None:
    with SimProcess(first_token_delay=0.05, token_interval=0.005, tokens=24, buffering=True,
                    buffer_flush_frames=12) as sim:
        result = run_level(Level(concurrency=2, requests=6),
                           Workload(sim.base_url, "openai-completions", "sim-model", prompt_tokens=32,
                                    output_tokens=24))
    summary = summarize(result)
    assert summary["bursts"]["burst"] == 6 and summary["bursts"]["cause"] == "upstream", summary["bursts"]
    assert "the bench read on time" in warnings(summary)[0]
    judged = [s for s in traced.spans() if s.attributes and "llm.diagnosis.stream_buffered" in s.attributes]
    # the SDK's own verdict on each call span agrees with the bench's (the same rule)
    assert [s.attributes["llm.diagnosis.stream_buffered"] for s in judged] == [True] * 6


@pytest.mark.timing
def test_a_loop_busy_with_its_own_work_is_named(traced: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    feed = _Stream.feed

    def slow_feed(self: _Stream, data: bytes, now: float) -> None:
        time.sleep(0.03)  # the loop held 30 ms per read by the generator's own (blocking) work
        feed(self, data, now)

    with SimProcess(first_token_delay=0.02, token_interval=0.005, tokens=24) as sim:
        monkeypatch.setattr(_Stream, "feed", slow_feed)
        result = run_level(Level(concurrency=2, requests=4),
                           Workload(sim.base_url, "openai-completions", "sim-model", prompt_tokens=32,
                                    output_tokens=24))
    summary = summarize(result)
    expected = "generator_busy" if LINUX_SCHEDSTAT else "generator"
    assert summary["bursts"]["cause"] == expected, (summary["bursts"], summary["generator_loop"])
    assert "the load generator was the limit" in warnings(summary)[0]


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.skipif(not LINUX_SCHEDSTAT or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux's scheduler statistics and two CPUs")
def test_a_generator_starved_of_cpu_is_named_as_the_limit(traced: Otel) -> None:
    """The generator's loop thread on one CPU at the lowest priority (SCHED_IDLE) beside a process
    spinning there, the server on the other CPU: it reads every stream late, in one burst, and the
    bench says its loop waited in the run queue."""
    out: dict[str, LevelResult] = {}
    with SimProcess(first_token_delay=0.05, token_interval=0.005, tokens=24) as sim:
        os.sched_setaffinity(sim.pid, {1})
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(hog.pid, {0})

            def starved() -> None:
                os.sched_setaffinity(0, {0})
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                out["level"] = run_level(Level(concurrency=2, requests=4), Workload(
                    sim.base_url, "openai-completions", "sim-model", prompt_tokens=32, output_tokens=24))

            thread = threading.Thread(target=starved)
            thread.start()
            thread.join(timeout=120)
        finally:
            hog.kill()
            hog.wait()
    summary = summarize(out["level"])
    assert summary["bursts"]["cause"] == "generator_cpu", (summary["bursts"], summary["generator_loop"])
    loop = summary["generator_loop"]
    assert loop["stalls"] >= 1 and loop["stall_runqueue_share"] >= 0.5 and loop["runqueue_share"] > 0.2, loop
    said = warnings(summary)[0]
    assert "the load generator was the limit" in said and "Linux's run queue" in said and "taskset" in said


@pytest.mark.slow
def test_the_command_writes_what_it_said_about_itself(tmp_path: Path) -> None:
    with SimProcess(first_token_delay=0.03, token_interval=0.004, tokens=16, buffering=True,
                    buffer_flush_frames=8) as sim:
        proc = subprocess.run(
            [sys.executable, "-m", "otel_llm.tools.main", "bench", sim.base_url, "--model", "sim-model", "--api",
             "openai-completions", "--concurrency", "2", "--requests", "4", "--output-tokens", "16", "--warmup", "1",
             "--json", str(tmp_path / "b.json"), "--html", str(tmp_path / "b.html")],
            env=clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "t.jsonl"), PYTHONPATH=str(REPO)), cwd=tmp_path,
            capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "(api openai-completions," in proc.stdout and "bursts 4/4 !" in proc.stdout, proc.stdout
    level = json.loads((tmp_path / "b.json").read_text())["levels"][0]
    assert level["stream_timing_trusted"] is False and level["bursts"]["cause"] == "upstream"
    assert level["warnings"] and f"warning: {level['warnings'][0]}" in proc.stdout
    assert all(r["burst"] is True and r["ttfb"] is not None for r in level["requests"])
    assert level["generator_loop"]["ticks"] > 0 and "head_at" not in level["requests"][0]
    assert "load generator: concurrency 2: 4 of 4 streams in bursts; event loop late p99" in proc.stdout
    html = (tmp_path / "b.html").read_text()
    assert "<th>bursts</th>" in html and "4/4 !" in html
    assert "<h2>warnings</h2>" in html and "the server or an intermediary released them in bursts" in html
