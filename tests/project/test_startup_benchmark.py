"""``benchmarks/startup.py --quick``: one run of each start-up figure, well-formed output.

Speed goals live in the benchmark itself; here only the shape of what it prints and writes.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "startup.py"


@pytest.mark.slow  # three kinds of fresh processes, LiteLLM's among them: about 15 s
def test_quick_run_reports_every_figure_and_target(tmp_path: Path) -> None:
    figures_file = tmp_path / "startup.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(figures_file)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert f"otel_llm from {ROOT / 'otel_llm' / '__init__.py'}" in out  # this checkout, not another
    for heading in ("(a) import otel_llm; otel_llm.instrument()", "(b) streamed httpx call",
                    "(c) litellm.acompletion(stream=True)"):
        assert heading in out, out
    verdicts = re.findall(r"target <= (\d+) ms: (PASS|FAIL)", out)
    assert [limit for limit, _ in verdicts] == ["150", "5", "5", "20", "20"], out

    figures = json.loads(figures_file.read_text())
    instrument, first_call, litellm = figures["instrument"], figures["first_call"], figures["litellm"]
    for key in ("sdk_process_ms", "otel_process_ms", "otel_main_ms", "beyond_sdk_ms"):
        assert math.isfinite(instrument[key]), key
    assert 0 < instrument["sdk_process_ms"] < instrument["otel_process_ms"]
    for key in ("plain_first_ms", "plain_later_ms", "otel_first_ms", "otel_later_ms"):
        assert first_call[key] > 0, key
    for variant in ("plain", "sdk", "otel"):
        assert litellm[f"{variant}_first_token_ms"] > 0
        assert len(litellm[f"{variant}_full_gc_runs_ms"]) == 1
