"""`make demo-sim` runs examples/demo_sim.py: it must trace its four calls and draw them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otel_llm.export.jsonl import read_jsonl

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo_sim.py"


@pytest.mark.slow
def test_demo_traces_and_draws_four_calls(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(DEMO)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summaries = [line for line in result.stderr.splitlines() if line.startswith("otel-llm ")]
    assert len(summaries) == 4, result.stderr
    assert result.stdout.count("llm.server_wait") == 4
    assert result.stdout.count("llm.decode") == 3 and result.stdout.count("http.download") == 1
    calls = [s for s in read_jsonl(tmp_path / "otel-llm-traces.jsonl") if s["kind"] == 3]
    assert len(calls) == 4
    cold = min(calls, key=lambda s: s["startTimeUnixNano"])
    assert cold["attributes"]["llm.client.time_to_first_byte"] > 0.7  # the simulated cold load
    assert "demo-key-not-recorded" not in (tmp_path / "otel-llm-traces.jsonl").read_text()


@pytest.mark.slow
def test_demo_with_an_otlp_endpoint_sends_there_and_still_draws(tmp_path: Path) -> None:
    from otel_llm_testing.collectors import OtlpHttpCollector
    from otel_llm_testing.subprocesses import clean_env

    with OtlpHttpCollector() as collector:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint)
        result = subprocess.run([sys.executable, str(DEMO)], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("llm.server_wait") == 4
        exported_calls = [s for _, s in collector.received.spans() if s.kind == 3]
    assert len(exported_calls) == 4
