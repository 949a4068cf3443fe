"""The README's commands run: `otel-llm sim`, and the benchmark script (as a smoke run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
OTEL_LLM = str(Path(sys.executable).with_name("otel-llm"))


def test_sim_help_lists_the_timing_options() -> None:
    out = subprocess.run([OTEL_LLM, "sim", "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--headers-delay", "--first-token-delay", "--token-interval", "--tokens", "--cold-delay",
                   "--concurrency", "--buffering", "--abort-after-tokens", "--runtime"):
        assert option in out


def test_sim_command_serves_a_chat_call() -> None:
    proc = subprocess.Popen([OTEL_LLM, "sim", "--port", "0", "--tokens", "3", "--first-token-delay", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        answer = httpx.post(f"{match[1]}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10).json()
        assert answer["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(10)


def test_benchmark_script_runs_and_reports_ratios() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "1",
                             "--calls", "20", "--streams", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "added CPU per call:" in result.stdout and "added CPU per streamed chunk:" in result.stdout
