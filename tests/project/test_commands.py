"""The commands the documentation shows run: `otel-llm sim`, the gateway's quick start, and the
benchmark scripts of the performance page (as smoke runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text()
SAMPLING = (ROOT / "docs" / "sampling.md").read_text()
OTEL_LLM = str(Path(sys.executable).with_name("otel-llm"))
# this checkout's otel_llm and otel_llm_testing, also when the venv's editable installs point at
# another checkout (a worktree)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testing")])}


def test_sim_help_lists_the_timing_options() -> None:
    out = subprocess.run([OTEL_LLM, "sim", "--help"], capture_output=True, text=True, check=True, env=ENV).stdout
    for option in ("--headers-delay", "--first-token-delay", "--token-interval", "--tokens", "--cold-delay",
                   "--concurrency", "--buffering", "--abort-after-tokens", "--runtime"):
        assert option in out


def test_sim_command_serves_a_chat_call() -> None:
    proc = subprocess.Popen([OTEL_LLM, "sim", "--port", "0", "--tokens", "3", "--first-token-delay", "0"],
                            stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        answer = httpx.post(f"{match[1]}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10).json()
        assert answer["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_benchmark_script_runs_and_reports_ratios() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "1",
                             "--calls", "20", "--streams", "2"], capture_output=True, text=True, timeout=300,
                            env=ENV)
    assert result.returncode == 0, result.stderr
    assert "added CPU per call:" in result.stdout and "added CPU per streamed chunk:" in result.stdout


@pytest.mark.slow
def test_benchmark_script_compares_each_stack_with_the_httpx_path() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "1",
                             "--calls", "10", "--streams", "2", "--stacks", "httpx,aiohttp,requests"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^(httpx|aiohttp|requests) +(httpx-official|otel_llm) ", result.stdout, re.M)
    assert rows == [("httpx", "httpx-official"), ("httpx", "otel_llm"), ("aiohttp", "otel_llm"),
                    ("requests", "otel_llm")], result.stdout
    for stack in ("aiohttp", "requests"):
        assert re.search(rf"^{stack} path / httpx path, otel_llm's added CPU: per call (-?[\d.]+x|n/a) .* per chunk "
                         r"(-?[\d.]+x|n/a) ", result.stdout,
                         re.M), result.stdout



def test_benchmark_report_survives_a_round_noisier_than_the_overhead(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI run measured otel_llm's added CPU per call as negative (the machine's noise exceeded
    it): the report says the ratio is unavailable instead of printing ``infx``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overhead

    monkeypatch.setattr(overhead, "CHUNKS", {stack: {overhead.SHORT: [18], overhead.LONG: [1026]}
                                             for stack in ("httpx", "aiohttp")})
    def run(call: float, short: float, long: float) -> dict[str, list[float]]:
        return {"call": [call], "short": [short], "long": [long]}
    results = {"httpx": {"none": run(8.6e-3, 0.01, 0.05), "httpx-official": run(7.2e-3, 0.01, 0.07),
                         "otel_llm": run(7.7e-3, 0.01, 0.08)},
               "aiohttp": {"none": run(0.8e-3, 0.01, 0.05), "otel_llm": run(2.0e-3, 0.01, 0.06)}}
    overhead.report(results)
    out = capsys.readouterr().out
    assert "otel_llm / httpx-official, added CPU per call: n/a (no round with a positive reference" in out
    assert "inf" not in out
    chunk = float(out.split("per chunk ")[-1].split("x ")[0])
    assert chunk == pytest.approx((0.06 - 0.05) / (0.08 - 0.05), abs=0.005)

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_instruction_counts_run_under_callgrind() -> None:
    """``python benchmarks/instructions.py``, shortened to one non-streamed call, on two stacks
    (four children under callgrind each: about 3 minutes)."""
    assert "python benchmarks/instructions.py" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"), "--stacks",
                             "httpx,requests", "--calls", "1", "--workloads", "call"], capture_output=True, text=True,
                            timeout=880, env=ENV)
    assert result.returncode == 0, result.stderr
    added = re.findall(r"^(httpx|requests) +call +client +([\d.]+) M instructions per call, "
                       r"otel_llm adds +(-?[\d.]+) M",
                       result.stdout, re.M)
    assert [stack for stack, _, _ in added] == ["httpx", "requests"], result.stdout
    assert all(float(client) > 0.1 and float(ours) > 0.1 for _, client, ours in added), result.stdout
    assert re.search(r"^requests vs the httpx path, per call: [\d.]+x", result.stdout, re.M), result.stdout



@pytest.mark.slow
@pytest.mark.timeout(600)
def test_record_costs_count_the_sdk_per_histogram_record() -> None:
    """``instructions.py --records``, shortened: the SDK's instructions per histogram record grow
    with its attributes (eight children under callgrind, a few seconds each)."""
    assert "python benchmarks/instructions.py --records" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"), "--records",
                             "--calls", "20"], capture_output=True, text=True, timeout=580, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(re.findall(r"^SDK histogram record, (.+?) +([\d.]+) k instructions$", result.stdout, re.M))
    assert list(rows) == ["0 attributes", "3 attributes", "7 attributes", "6 attributes, with an exemplar"], \
        result.stdout
    none, three, seven = (float(rows[f"{n} attributes"]) for n in (0, 3, 7))
    assert 10 < none < three < seven < 1000, result.stdout
    per = re.search(r"^per attribute: ([\d.]+) k instructions", result.stdout, re.M)
    assert per and float(per.group(1)) == pytest.approx((seven - none) / 7, abs=0.1), result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_seam_costs_count_otel_llm_alone_per_call_and_per_chunk() -> None:
    """``instructions.py --seam``, shortened: otel_llm's own instructions per call and per chunk,
    with no HTTP stack (five children under callgrind, two with chunk_metric off)."""
    assert "python benchmarks/instructions.py --seam" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"), "--seam",
                             "--calls", "10"], capture_output=True, text=True, timeout=580, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"^through the seam: +([\d.]+) k instructions per call \(20 chunks\), +([\d.]+) k per chunk$",
                      result.stdout, re.M)
    assert found, result.stdout
    per_call, per_chunk = float(found.group(1)), float(found.group(2))
    path = re.search(r"^  with chunk_metric off: +([\d.]+) k per chunk; the time_per_output_chunk records: "
                     r"+(-?[\d.]+) k per chunk$", result.stdout, re.M)
    assert path, result.stdout
    # the stream path alone is a few bytecodes a chunk; each time_per_output_chunk value is one
    # SDK histogram record with the call's attributes (tens of k, see --records)
    per_chunk_path, records = float(path.group(1)), float(path.group(2))
    assert 100 < per_call < 10_000 and 1 < per_chunk_path < 100 and per_chunk_path * 20 < per_call, result.stdout
    assert records == pytest.approx(per_chunk - per_chunk_path, abs=0.02) and 20 < records < 2000, result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_seam_costs_of_a_dropped_call() -> None:
    """``instructions.py --seam --sample-rate 0``, shortened: what a call whose spans are dropped
    still costs (capture, the build, the metrics), less than a recorded one."""
    assert "python benchmarks/instructions.py --seam --sample-rate 0" in SAMPLING
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"), "--seam",
                             "--calls", "10", "--sample-rate", "0"], capture_output=True, text=True, timeout=580,
                            env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"^through the seam \(sample_rate 0\): +([\d.]+) k instructions per call", result.stdout, re.M)
    assert found, result.stdout
    assert 100 < float(found.group(1)) < 10_000, result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sampling_benchmark_misses_no_outlier_and_counts_every_call() -> None:
    """``benchmarks/sampling.py``, shortened: every injected outlier kept, every call in the metrics,
    fewer spans at a lower rate."""
    assert "python benchmarks/sampling.py" in SAMPLING
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sampling.py"), "--calls", "300",
                             "--rates", "off,0.1", "--outliers", "0.03"], capture_output=True, text=True,
                            timeout=580, env=ENV)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = re.findall(r"^rate +(\S+): +(\d+) spans, +(\d+) calls kept \((.*)\); outliers missed (\d+) of (\d+); "
                      r"adjusted counts sum (\d+) for 300 calls; metrics counted (\d+);", result.stdout, re.M)
    assert [row[0] for row in rows] == ["off", "0.1"], result.stdout
    for rate, spans, kept, reasons, missed, outliers, estimate, counted in rows:
        assert missed == "0" and outliers == "9" and counted == "300", result.stdout
    (_, full, *_), (_, sampled, kept, reasons, *_) = rows
    assert int(sampled) < int(full) / 3 and "failed 3" in reasons and "cold 3" in reasons, result.stdout
    assert re.search(r"^spans exported at rate 0.1: [\d.]+x fewer than at off", result.stdout, re.M), result.stdout


_SERVER_ROW = re.compile(r"^ *(gateway|proxy) +(\S+): +(\d+) spans, +(\d+) calls kept \((.*?)\); outliers missed (\d+) "
                         r"of (\d+); adjusted counts sum (\d+) for (\d+) calls; metrics counted (\d+), requests (\d+); "
                         r"CPU .*?; trees cut (\d+)(?:; client and gateway disagree on (\d+) traces(?: \((.*)\))?)?$",
                         re.M)
# rules each process judges by the timings it saw itself: the client and the gateway can differ
_JUDGED_APART = {"slow", "queued", "buffered"}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("via", ["gateway", "proxy"])
def test_sampling_benchmark_through_the_gateway_and_the_proxy(via: str) -> None:
    """``benchmarks/sampling.py --via``, shortened: through ``otel-llm gateway`` (instrumented client)
    and ``otel-llm proxy`` (uninstrumented client) every injected outlier's server tree is exported,
    no tree is cut, the server's metrics count every call, the ordinary calls kept and the adjusted
    counts are within binomial bounds of the rate; client and gateway keep the same traces, but for
    a rule each judges by its own timings (the slowest 1 % of its own calls)."""
    calls, rate, outliers = 400, 0.1, 12  # 12: one call in 33, taking turns: slow, failed, cold
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sampling.py"), "--calls", str(calls),
                             "--rates", f"off,{rate}", "--outliers", "0.03", "--via", via],
                            capture_output=True, text=True, timeout=580, env=ENV)
    rows = _SERVER_ROW.findall(result.stdout)
    assert [(row[0], row[1]) for row in rows] == [(via, "off"), (via, "0.1")], result.stdout + result.stderr[-3000:]
    for _, _, _, _, _, missed, seen, _, made, counted, requests, cut, disagree, why in rows:
        assert (missed, seen, made, counted, requests, cut) == ("0", str(outliers), str(calls), str(calls),
                                                                 str(calls), "0"), result.stdout
        assert (disagree != "") == (via == "gateway"), result.stdout  # the gateway's row says it
        if disagree not in ("", "0"):  # kept by one side alone: only by a rule judged apart
            assert set(re.findall(r"([a-z]+) \d+", why)) <= _JUDGED_APART, result.stdout
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    full, sampled = int(rows[0][2]), int(rows[1][2])
    _, _, _, kept, reasons, _, _, estimate, *_ = rows[1]
    by_reason = {name: int(n) for name, n in re.findall(r"(\w+) (\d+)", reasons)}
    assert by_reason.get("failed") == outliers // 3 and by_reason.get("cold") == outliers // 3, result.stdout
    assert by_reason.get("slow", 0) >= outliers // 3, result.stdout
    # the ordinary calls kept at the rate: binomial, within 4 standard deviations
    ordinary = calls - (int(kept) - by_reason.get("rate", 0))  # less those a rule kept
    mean, sd = ordinary * rate, (ordinary * rate * (1 - rate)) ** 0.5
    assert abs(by_reason.get("rate", 0) - mean) <= 4 * sd, (by_reason, mean, sd)
    # the adjusted counts estimate the calls made: each call kept at the rate stands for 1 / rate
    assert abs(int(estimate) - calls) <= 4 * (ordinary * (1 - rate) / rate) ** 0.5, result.stdout
    assert sampled < full / 3, result.stdout
    if via == "gateway":  # the client's own rows: every outlier kept, every call counted
        client = re.findall(r"^rate +(\S+): .*; outliers missed (\d+) of (\d+); .*; metrics counted (\d+);",
                            result.stdout, re.M)
        assert client == [(r, "0", str(outliers), str(calls)) for r in ("off", "0.1")], result.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_replayed_streams_give_the_per_chunk_figure() -> None:
    """``instructions.py --replay``, shortened to one 256-token stream per run: the client's
    instructions per chunk and what otel_llm adds to them, from recorded chunks replayed through
    httpx2's transport (six children under callgrind: none, otel_llm, otel_llm with chunk_metric off)."""
    assert "python benchmarks/instructions.py --replay" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"), "--replay", "--streams",
                             "1", "--tokens", "256", "--repeat", "1"],
                            capture_output=True, text=True, timeout=880, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"^per chunk, replayed \((\d+)- minus (\d+)-chunk streams.*: the async openai client ([\d.]+) k "
                      r"instructions, otel_llm adds (-?[\d.]+) k \((-?[\d.]+) %\), (-?[\d.]+) k with chunk_metric off "
                      r"\((-?[\d.]+) %", result.stdout, re.M)
    assert found, result.stdout
    long, short, client, with_records, with_share, added, share = (float(v) for v in found.groups())
    assert long - short == 240  # one chunk per token, the role and usage chunks in both
    # the client parses each chunk into objects (hundreds of k); otel_llm appends a timestamp and
    # scans in bulk: far below the client's own. One run of 240 chunks each: a run counts up to
    # ~2.6 M more or less on the main thread (see _chunk_replay), ~11 k a chunk here (with
    # 64-token streams one run came out at -53 k a chunk)
    assert 100 < client < 5000 and abs(added) < client / 10, result.stdout
    assert share == pytest.approx(100 * added / client, abs=0.01), result.stdout
    # by default each chunk after the first is also one time_per_output_chunk histogram record
    assert with_records > added + 20 and with_share == pytest.approx(100 * with_records / client, abs=0.01), \
        result.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_peer_instruction_counts_include_the_sdk_floor(tmp_path: Path) -> None:
    """``instructions.py --peers``, shortened to raw httpx non-streamed calls for no
    instrumentation, otel_llm and the SDK floor (six children under callgrind; no peer installed):
    the floor (the same spans and records replayed with no model call) is a real part of what
    otel_llm adds, and the report splits it from otel_llm's own code."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instructions.py"), "--peers", "--no-install",
                             "--configs", "none,otel_llm,sdk-floor", "--peer-workloads", "httpx/call", "--calls", "2",
                             "--json", str(tmp_path / "figures.json")],
                            capture_output=True, text=True, timeout=1480, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    # spans exported per call tell which configurations trace the workload (a peer that exports
    # none is left out of the ratios): a call with native counters is six spans
    spans = {row["config"]: row["spans"] for row in json.loads((tmp_path / "figures.json").read_text())}
    assert spans["none"] == 0 and spans["otel_llm"] == 6, spans
    # the other threads' part can come out below zero on a short run: the observers' threads wake
    # on timers, so their counts depend on how long each run lasts (spans are exported at the flush)
    row = re.search(r"^httpx call +([\d.]+) M +\+([\d.]+) M \((-?[\d.]+)\) +\+([\d.]+) M$", result.stdout, re.M)
    assert row, result.stdout
    own, ours, other_threads, floor = map(float, row.groups())
    assert own > 1.0 and 0.3 < floor < ours, result.stdout
    assert abs(other_threads) < ours, result.stdout
    assert "openai call" not in result.stdout  # a workload not asked for gets no row
    share = re.search(r"the SDK's part of what otel_llm adds per call \(httpx\): ([\d.]+) M of ([\d.]+) M",
                      result.stdout)
    assert share and float(share.group(1)) == floor and float(share.group(2)) == ours, result.stdout
    assert "openlit" not in result.stdout  # not asked for

@pytest.mark.slow
def test_breakdown_benchmark_runs_and_reports_each_part() -> None:
    """``python benchmarks/breakdown.py``, shortened: SDK record costs, added CPU per call for
    each configuration, and per chunk with an idle and a busy consumer."""
    assert "python benchmarks/breakdown.py" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "breakdown.py"), "--rounds", "1",
                             "--calls", "10", "--streams", "2", "--busy", "2"], capture_output=True, text=True,
                            timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    costs = re.findall(r"^  (\d) attributes\s+([\d.]+) us$", result.stdout, re.M)
    assert [n for n, _ in costs] == ["0", "3", "7"] and all(float(v) > 0 for _, v in costs), result.stdout
    configs = re.findall(r"^  (httpx-official|otel_llm|otel_llm, no metric records)\s+-?[\d.]+ us", result.stdout, re.M)
    assert configs == ["httpx-official", "otel_llm", "otel_llm, no metric records"], result.stdout
    assert re.findall(r"consumer doing (\d+) JSON parses per chunk: +-?[\d.]+ us", result.stdout) == ["0", "2"]


def test_bench_clients_benchmark_prints_each_client_with_and_without_otel_llm() -> None:
    """``python benchmarks/bench_clients.py``, shortened: the generator's CPU per stream through
    aiohttp and httpx, each with otel_llm off and on (figures only: speed is not asserted)."""
    assert "python benchmarks/bench_clients.py" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_clients.py"), "--streams", "8",
                             "--tokens", "16"], capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^(aiohttp|httpx)\s+otel_llm (off|on)\s+client CPU per 16-token stream: ([\d.]+) ms$",
                      result.stdout, re.M)
    assert [(c, o) for c, o, _ in rows] == [("aiohttp", "off"), ("aiohttp", "on"), ("httpx", "off"), ("httpx", "on")]
    assert all(float(ms) > 0 for _, _, ms in rows), result.stdout


@pytest.mark.runtime
@pytest.mark.slow
def test_observers_benchmark_runs_with_a_real_llama_server() -> None:
    """``python benchmarks/observers.py --llama``, shortened: warm costs, the runtime process
    found by its port, and the threads in place, calling and idle."""
    assert "python benchmarks/observers.py --llama" in PERFORMANCE
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "observers.py"), "--llama", "--cycles", "5",
                             "--ticks", "20", "--in-place", "1"], capture_output=True, text=True, timeout=300,
                            env=ENV)
    assert result.returncode == 0, result.stderr
    assert "'llama.cpp')]" in result.stdout, result.stdout  # found, with its pid
    assert "runtime state polled in place: llama.cpp answered" in result.stdout, result.stdout
    shares = re.findall(r"observer threads in place, application (calling every 0.5 s|idle): ([\d.]+) % of one core",
                        result.stdout)
    assert [kind for kind, _ in shares] == ["calling every 0.5 s", "idle"], result.stdout


GATEWAY_PAGE = (ROOT / "docs" / "gateway.md").read_text()
KEYGEN = "otel-llm gateway keygen alice --routes '/v1/*' '/api/*' >> keys.toml"
SERVE = "otel-llm gateway --upstream http://127.0.0.1:11434 --listen 127.0.0.1:8080 --keys keys.toml"


def test_gateway_page_commands_run(tmp_path: Path) -> None:
    """The gateway page's two quick-start lines, run by a shell, with only the addresses changed."""
    from otel_llm.tools.sim import SimProcess

    assert KEYGEN in GATEWAY_PAGE and SERVE in GATEWAY_PAGE
    bin_dir = str(Path(OTEL_LLM).parent)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OTEL_LLM_HOST_METRICS": "false",
           "OTEL_LLM_TRACES_FILE": str(tmp_path / "t.jsonl")}
    keygen = subprocess.run(KEYGEN, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert keygen.returncode == 0, keygen.stderr
    key = keygen.stderr.strip().splitlines()[-1]
    assert key.startswith("olk_") and key not in (tmp_path / "keys.toml").read_text()
    with SimProcess(runtime="ollama", tokens=3) as sim:
        command = SERVE.replace("http://127.0.0.1:11434", sim.base_url).replace("127.0.0.1:8080", "127.0.0.1:0")
        proc = subprocess.Popen(f"exec {command}", shell=True, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        try:
            match = re.search(r"listening on (http://\S+)", proc.stderr.readline())
            assert match
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
            assert httpx.post(f"{match[1]}/api/chat", json=body, timeout=10).status_code == 401
            answer = httpx.post(f"{match[1]}/api/chat", json=body, headers={"x-api-key": key}, timeout=10)
            assert answer.status_code == 200 and answer.json()["eval_count"] == 3
            assert httpx.get(f"{match[1]}/sim/stats", headers={"x-api-key": key}, timeout=10).status_code == 403
        finally:
            proc.terminate()
            proc.wait(15)


def test_gateway_benchmark_runs_and_reports_the_target() -> None:
    """The gateway and the proxy beside direct calls, with the kernel placing the processes and no
    wait between requests (nginx, pinned and settled as by default: the test below)."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gateway.py"), "--quick",
                             "--relays", "gateway,proxy", "--no-pin", "--settle-ms", "0"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^loopback, \d+ CPU\(s\), client and servers unpinned, 0 ms between requests, 60 measured",
                     out, re.M), out
    assert out.count("added TTFB") == 2 and "gateway CPU per request" in out
    assert "target: added median TTFB <= 1 ms on loopback" in out
    assert out.count("added by proxy TTFB") == 2 and out.count("proxy CPU per request") == 2
    assert re.search(r"^  proxy +[-\d.]+ / +[-\d.]+ +[-\d.]+ / +[-\d.]+ +\d+\.\d+$", out, re.M), out
    assert "proxy / nginx: n/a (nginx left out)" in out and "via nginx" not in out
    assert re.search(r"target: proxy's added median TTFB <= 0.5 ms on loopback: (PASS|MISS)", out)
    assert re.search(r"^overall: (PASS|MISS)$", out, re.M)


@pytest.mark.backend
def test_gateway_benchmark_puts_the_proxy_beside_nginx() -> None:
    """The whole run: direct, the gateway, the proxy and Debian's nginx (installed when missing)."""
    from otel_llm_testing.markers import need
    from otel_llm_testing.nginx import ensure_nginx

    need("backend", "nginx")
    ensure_nginx()
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gateway.py"), "--quick"],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # pinned where there are two CPUs or more: the client alone on the first
    placement = (r"client on CPU (\d+), servers on CPU ([\d,]+)" if len(os.sched_getaffinity(0)) > 1
                 else "client and servers unpinned")
    header = re.search(rf"^loopback, \d+ CPU\(s\), (?:{placement}), 0.5 ms between requests", out, re.M)
    assert header, out
    if header.groups():
        assert header[1] not in header[2].split(","), out
    assert out.count("added TTFB") == 2 and "target: added median TTFB <= 1 ms on loopback" in out
    for relay in ("proxy", "nginx"):
        assert out.count(f"added by {relay} TTFB") == 2 and out.count(f"{relay} CPU per request") == 2, relay
    for relay in ("gateway", "proxy", "nginx"):
        assert re.search(rf"^  {relay} +[-\d.]+ / +[-\d.]+ +[-\d.]+ / +[-\d.]+ +\d+\.\d+$", out, re.M), (relay, out)
    ratio = r"(-?\d+\.\dx|n/a)"
    assert re.search(rf"proxy / nginx: added median TTFB non-streamed chat {ratio}, streamed chat {ratio}; "
                     rf"CPU per streamed token {ratio}", out), out
    assert re.search(r"target: proxy's added median TTFB <= 0.5 ms on loopback: (PASS|MISS)", out)


@pytest.mark.slow
@pytest.mark.backend
@pytest.mark.timing
def test_relay_load_benchmark_puts_the_proxy_beside_nginx(tmp_path: Path) -> None:
    """``benchmarks/relay_load.py`` at a small level: the compiled load (built with Debian's Go,
    installed when missing), direct, nginx (installed when missing) and the proxy in turn, the
    table and the ratios to nginx, and the figures in its JSON."""
    from otel_llm_testing.nginx import ensure_nginx

    ensure_nginx()
    out_json = tmp_path / "relay.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "relay_load.py"), "--levels", "16x50",
                             "--tokens", "16", "--duration", "3", "--json", str(out_json)],
                            capture_output=True, text=True, timeout=600, env=ENV)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("16 x 50 tok/s:"), out
    for way in ("direct", "nginx", "proxy"):
        assert re.search(rf"^  {way} +\d+ ", out, re.M), out
    assert re.search(r"^  proxy vs nginx: chunks \d\.\d+x \((ok|NOT MET), >= 0\.98x\), TTFT p99 [-+]\d+\.\d ms", out,
                     re.M), out
    level = json.loads(out_json.read_text())["levels"]["16 x 50 tok/s"]
    for way, figures in level["ways"].items():
        assert figures["errors"] == 0, (way, figures)
        # 16 streams at 50 tokens/s each deliver 800 a second when nothing holds them up; a relay
        # that lost or held back events would deliver far fewer
        assert 400 < figures["chunks_per_s"] <= 880, (way, figures)
        assert figures["ttft_ms"]["p50"] >= 19, (way, figures)  # the upstream's first token comes at 20 ms
    assert level["ways"]["direct"]["relay_cpu"] == 0
    assert level["ways"]["nginx"]["relay_cpu"] > 0 and level["ways"]["proxy"]["relay_cpu"] > 0
    assert set(level["verdict"]["met"]) == {"chunks", "ttft_p99_ms", "gap_p99_ms", "cpu", "errors"}
