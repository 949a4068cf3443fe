"""HTML report of ``otel-llm diagnose``: rendered from a real run's JSON record, then drawn by headless Chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otel_llm.tools.diagnose.html import PHASE_COLORS, median_warm_trial, render_html, waterfall_segments, write_html
from otel_llm_testing.chromium import read_png, run_chromium

MODEL = "<script>alert('m')</script>&model"


def _start_sim(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "otel_llm.tools.sim", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if match:
            return proc, match.group(0)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("simulator did not print its URL")


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The --json record of a real quick diagnose run against two simulators (one with a cold start)."""
    tmp = tmp_path_factory.mktemp("diagnose_html")
    sims = [_start_sim("--cold-delay", "0.4", "--first-token-delay", "0.08", "--token-interval", "0.005"),
            _start_sim("--first-token-delay", "0.03", "--token-interval", "0.005")]
    try:
        env = dict(os.environ, OTEL_LLM_TRACES_FILE=str(tmp / "traces.jsonl"))
        out = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "diagnose", sims[0][1], sims[1][1],
                              "--model", MODEL, "--quick", "--json", str(tmp / "rec.json"),
                              "--html", str(tmp / "report.html")],
                             cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
        assert (tmp / "rec.json").exists(), out.stdout + out.stderr
    finally:
        for proc, _url in sims:
            proc.kill()
            proc.wait()
    data = json.loads((tmp / "rec.json").read_text())
    assert len(data["targets"]) == 2
    data["_html_from_command"] = (tmp / "report.html").read_text(encoding="utf-8")
    return data


def _with_sweep(record: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(json.dumps(record))
    data["targets"][0]["prompt_sweep"] = [
        {"prompt_tokens": n, "ttft_s": 0.05 + n * 2e-4, "native_prompt_eval_s": n * 1.5e-4} for n in (128, 512, 2048)]
    data["targets"][0]["prompt_sweep"].append({"prompt_tokens": 4096, "ttft_s": 0.9, "native_prompt_eval_s": None})
    return data


def _sweeps(record: dict[str, Any]) -> int:
    return sum(1 for t in record["targets"] if t.get("prompt_sweep"))


def _svgs(html: str, kind: str) -> list[str]:
    return re.findall(rf'<svg class="chart" data-chart="{kind}".*?</svg>', html, re.S)


# ---------------------------------------------------------------- unit

@pytest.mark.slow
def test_charts_and_verdicts(record: dict[str, Any]) -> None:
    html = render_html(_with_sweep(record))
    first, second = record["targets"]
    # one waterfall per representative trial (cold + median warm) and target
    assert len(_svgs(html, "waterfall")) == 4
    cold_wf = _svgs(html, "waterfall")[0]
    assert cold_wf.count('class="bar phase"') == len(waterfall_segments(first["cold"])) == len(first["cold"]["phases"])
    for name in first["cold"]["phases"]:
        assert f'data-phase="{name}"' in cold_wf
    assert median_warm_trial(first) in first["warm"]
    # ttft: one bar per cold + warm trial
    ttft = _svgs(html, "ttft")
    assert len(ttft) == 2
    assert ttft[0].count('<rect class="bar"') == 1 + len(first["warm"])
    # concurrency: a point per successful trial, a ttft and a rate bar per level
    conc = _svgs(html, "concurrency")
    assert len(conc) == 2
    n_trials = sum(len(ts) for ts in first["concurrency"].values())
    assert conc[0].count("<circle") == n_trials
    assert conc[0].count('<rect class="bar"') == 2 * len(first["concurrency"])
    assert "<path" in conc[0]
    # prompt sweep only where the record holds one (the injected one: 3 + 4 points, two lines)
    sweep = _svgs(html, "prompt-sweep")
    assert len(sweep) == _sweeps(_with_sweep(record))
    assert sweep[0].count("<circle") == 7 and sweep[0].count("<path") == 2
    for target, chart in zip([t for t in record["targets"] if t.get("prompt_sweep")][1:], sweep[1:]):
        points = target["prompt_sweep"]
        assert chart.count("<circle") == sum((p["ttft_s"] is not None) + (p["native_prompt_eval_s"] is not None)
                                             for p in points)
    without = json.loads(json.dumps(record))
    for target in without["targets"]:
        target.pop("prompt_sweep", None)
    assert not _svgs(render_html(without), "prompt-sweep")
    # verdicts and comparison table
    assert first["primary"] == "cold_start"
    for target in record["targets"]:
        for verdict in target["verdicts"]:
            assert f'data-code="{verdict["code"]}"' in html
    assert '<table class="comparison">' in html
    assert html.count('<section class="target"') == 2
    assert second["url"] in html


def test_single_target_has_no_comparison(record: dict[str, Any]) -> None:
    data = dict(record, targets=record["targets"][:1])
    html = render_html(data)
    assert '<table class="comparison">' not in html
    assert len(_svgs(html, "waterfall")) == 2


def test_escaped_and_self_contained(record: dict[str, Any]) -> None:
    data = _with_sweep(record)
    data["targets"][0]["verdicts"].append({"code": "x<y", "summary": "<img src=x onerror=alert(1)>",
                                           "evidence": {"a<b": "\"q\""}, "remedy": "<b>bold</b>"})
    data["targets"][0]["cold"]["phases"]["<evil phase>"] = 0.01
    html = render_html(data)
    assert "<script" not in html.lower()
    assert "<img" not in html and "<b>" not in html and "<evil" not in html
    assert "&lt;script&gt;alert(&#x27;m&#x27;)&lt;/script&gt;&amp;model" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    # no external resources: no src/href/import/url(), and the only URLs are the targets', as text
    assert not re.search(r"<[^>]*\b(src|href|xlink:href)\s*=", html)
    assert "@import" not in html and "url(" not in html
    urls = {t["url"] for t in record["targets"]}
    for found in re.findall(r"https?://[^\s\"'<>;]+", html):
        assert any(found.startswith(u) for u in urls), found


def test_tolerates_failed_and_sparse_records() -> None:
    failed = {"kind": "cold", "index": 0, "error": "unreachable", "detail": "refused", "status": None,
              "ttft": None, "phases": {}}
    data = {"config": {"model": "m"},
            "targets": [{"url": "http://127.0.0.1:9", "reachability": failed, "cold": None, "warm": [],
                         "concurrency": {}, "verdicts": [{"code": "unreachable", "summary": "no listener",
                                                          "evidence": {}, "remedy": "start it"}],
                         "primary": "unreachable"},
                        {"url": "http://127.0.0.1:10", "warm": [{"kind": "warm", "index": 0, "error": None,
                                                                 "ttfb": 0.01, "ttft": 0.05, "decode": 0.2,
                                                                 "total": 0.26, "phases": {}}]}]}
    html = render_html(data)
    assert 'data-code="unreachable"' in html and "failed" in html
    wf = _svgs(html, "waterfall")
    assert len(wf) == 1 and wf[0].count('class="bar phase"') == 3  # derived from ttfb/ttft/decode


# ---------------------------------------------------------------- real rendering

@pytest.mark.backend
def test_real_rendering(record: dict[str, Any], chromium: str, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    write_html(_with_sweep(record), report)
    shot = tmp_path / "shot.png"
    proc = run_chromium(chromium, tmp_path, f"--screenshot={shot}", report.as_uri())
    assert shot.exists() and shot.stat().st_size > 10_000, proc.stdout + proc.stderr
    width, height, rows = read_png(shot)
    assert (width, height) == (1200, 2000)
    colored = 0
    wanted = {name: tuple(int(PHASE_COLORS[name][i:i + 2], 16) for i in (1, 3, 5))
              for name in ("llm.first_token", "llm.server_wait", "llm.decode")}
    hits = dict.fromkeys(wanted, 0)
    for row in rows:
        for x in range(0, len(row), 3):
            r, g, b = row[x], row[x + 1], row[x + 2]
            if min(r, g, b) < 235:
                colored += 1
            for name, (wr, wg, wb) in wanted.items():
                if abs(r - wr) <= 4 and abs(g - wg) <= 4 and abs(b - wb) <= 4:
                    hits[name] += 1
    share = colored / (width * height)
    assert share > 0.02, share
    # the phase bars are drawn: each colour covers at least a small bar's worth of pixels
    assert all(count > 200 for count in hits.values()), hits

    dom = run_chromium(chromium, tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    for kind, count in (("waterfall", 4), ("ttft", 2), ("concurrency", 2),
                        ("prompt-sweep", _sweeps(_with_sweep(record)))):
        assert html.count(f'data-chart="{kind}"') == count, kind
    assert "<script" not in html.lower()
    assert html.count("<rect") > 30 and html.count("<circle") > 7


def test_command_writes_the_same_report(record: dict[str, Any]) -> None:
    """``diagnose --html FILE`` writes what render_html makes of the ``--json`` record."""
    from otel_llm.tools.diagnose.html import render_html

    written = record["_html_from_command"]
    plain = {k: v for k, v in record.items() if k != "_html_from_command"}
    assert written == render_html(plain)
    assert written.count('data-chart="waterfall"') == 4
