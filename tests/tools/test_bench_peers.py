"""``benchmarks/peers.py``: a smoke run with the configurations that need no install (none, the
official httpx instrumentation, otel_llm), a short soak, and the arithmetic of the figures.

The peers (openlit, traceloop-sdk) are installed into their own virtualenvs on first use, which
takes about a minute each: not here; ``python benchmarks/peers.py`` does it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import peers  # noqa: E402


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.slow
def test_quick_run_prints_the_tables_ratios_and_capabilities() -> None:
    result = run("--quick", "--no-install", "--configs", "none,httpx-official,otel_llm")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for title in ("non-streamed call, raw httpx", "streamed call of 256 tokens, raw httpx",
                  "20 concurrent async streams of 256 tokens, raw httpx", "non-streamed call, openai client (httpx2)",
                  "streamed call of 256 tokens, openai client (httpx2)",
                  "20 concurrent async streams of 256 tokens, openai client (httpx2)"):
        assert f"== {title}:" in out, out
    tables = out.split("== memory")[0]
    rows = re.findall(r"^(none|httpx-official|otel_llm)\s+(model call|HTTP only|not seen|-)\s", tables, re.M)
    assert len(rows) == 3 * 6, out
    # otel_llm traces every workload as model calls; the official instrumentation as HTTP requests
    assert {seen for name, seen in rows if name == "otel_llm"} == {"model call"}
    assert {seen for name, seen in rows if name == "httpx-official"} == {"HTTP only"}
    assert "== memory" in out and "== capability matrix" in out
    matrix = out.split("== capability matrix")[1]
    assert re.search(r"^otel_llm\s+model call\s+model call\s+yes\s+yes \(\d+\)\s+yes \(\d+\)", matrix, re.M), matrix
    assert re.search(r"^httpx-official\s+HTTP only\s+HTTP only\s+no\s+no\s+no", matrix, re.M), matrix
    for client in ("httpx", "openai"):
        assert re.search(rf"otel_llm / httpx-official, added CPU per call \({client}\): (\d+\.\d+x|n/a)", out), out
        assert f"otel_llm added CPU per chunk ({client}/stream):" in out
        assert f"otel_llm added CPU per chunk ({client}/async):" in out
    assert "openlit" not in out and "openllmetry" not in out  # not asked for: nothing installed


def test_unknown_configuration_is_refused() -> None:
    result = run("--configs", "none,bogus", timeout=60)
    assert result.returncode == 2 and "bogus" in result.stderr


@pytest.mark.slow
def test_soak_memory_stays_flat() -> None:
    result = run("--soak", "2000", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    points = re.findall(r"^\s*(\d+)\s+([\d.]+) MB\s+([\d.]+) MB\s+([\d.]+) MB", result.stdout, re.M)
    assert [int(p[0]) for p in points] == [0, 100, 1000, 2000], result.stdout
    growth = re.search(r"growth from 100 to 2000 calls: RSS ([+-][\d.]+) MB, traced ([+-][\d.]+) MB", result.stdout)
    assert growth, result.stdout
    rss, traced = float(growth[1]), float(growth[2])
    # generous: a leak of one span tree or one response body per call would be tens of MB here
    assert traced < 1.0, result.stdout
    assert rss < 25.0, result.stdout


def _round(cpu: dict[str, float], chunks: dict[str, int], ttft: float = 0.001) -> dict[str, Any]:
    return {name: {"requests": 10, "cpu": value * 10, "chunks": chunks[name] * 10, "spans": 10,
                   "ttfts": [ttft] * 10, "probe": {"attribute_keys": ["gen_ai.request.model"]}}
            for name, value in cpu.items()}


def test_figures_pair_each_round_with_none_and_take_the_chunk_slope() -> None:
    chunks = {"httpx/stream": 258, "httpx/stream-short": 18, "httpx/call": 1}
    none = [_round({"httpx/stream": 5e-3, "httpx/stream-short": 1e-3, "httpx/call": 500e-6}, chunks),
            _round({"httpx/stream": 6e-3, "httpx/stream-short": 2e-3, "httpx/call": 700e-6}, chunks)]
    # a configuration adding 100 us per call and 1 us per chunk (plus 100 us per stream)
    ours = [_round({"httpx/stream": 5e-3 + 100e-6 + 258e-6, "httpx/stream-short": 1e-3 + 100e-6 + 18e-6,
                    "httpx/call": 600e-6}, chunks),
            _round({"httpx/stream": 6e-3 + 100e-6 + 258e-6, "httpx/stream-short": 2e-3 + 100e-6 + 18e-6,
                    "httpx/call": 800e-6}, chunks)]
    fig = peers.Figures({"none": {"rounds": none}, "otel_llm": {"rounds": ours}})
    assert fig.rounds == 2
    assert fig.added_rounds("otel_llm", "httpx/call", "cpu") == pytest.approx([100e-6, 100e-6])
    assert fig.per_chunk_rounds("otel_llm", "httpx/stream", "httpx/stream-short") == pytest.approx([1e-6, 1e-6])
    ratio, pairs = fig.ratio([300e-6, 200e-6, 100e-6], [100e-6, 100e-6, 0.0])
    assert ratio == pytest.approx(2.5) and pairs == pytest.approx([2.0, 3.0])  # rounds with nothing to divide by drop
    assert peers.seen(fig, "otel_llm", "httpx/call") == "model call"


def test_a_round_where_noise_outweighs_a_cost_has_no_ratio() -> None:
    """A CI round measured otel_llm's added CPU per call as -1251.7 us (the machine's noise): it
    printed -0.52x. Such a round is left out; with no round left the ratio is n/a."""
    fig = peers.Figures({})
    assert fig.ratio([-1.2517e-3], [2.3914e-3]) == (None, [])
    assert fig.ratio([-1e-3, 3e-3, 2e-3], [2e-3, 1e-3, 1e-3]) == (2.5, [2.0, 3.0])
