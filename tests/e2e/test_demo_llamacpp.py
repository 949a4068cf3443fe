"""`make demo` runs examples/demo.py against the real llama.cpp server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_llm.export.jsonl import read_jsonl
from tests.helpers_servers import OtlpHttpCollector

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


@pytest.mark.timeout(900)
@pytest.mark.runtime  # make demo / the quickstart start the real llama.cpp server in a child process
@pytest.mark.slow
def test_demo_on_the_real_server(tmp_path: Path) -> None:
    with OtlpHttpCollector() as collector:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint}
        result = subprocess.run([sys.executable, str(DEMO), "--warm", "2"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=900, env=env)
        exported = [span.name for _, span in collector.received.spans()]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for label in ("cold (first call after start)", "warm #1", "warm #2", "long prompt", "concurrent #1",
                  "concurrent #2", "summary"):
        assert label in out, label
    assert out.count("llama.cpp reports: prompt") == 6
    assert out.count("llm.first_token") == 6 and out.count("runtime.prefill") == 6
    calls = [s for s in read_jsonl(tmp_path / "otel-llm-traces.jsonl") if s["kind"] == 3]
    assert len(calls) == 6
    assert all(c["attributes"]["llm.runtime.name"] == "llama.cpp" for c in calls)
    assert exported.count("chat gemma-3-270m") == 6  # the same calls, also over OTLP
