"""The quickstart example runs as its docstring says, against the real llama.cpp server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
@pytest.mark.runtime  # make demo / the quickstart start the real llama.cpp server in a child process
@pytest.mark.slow
def test_quickstart_then_view(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip()  # the model's answer reached the application
    summaries = [line for line in run.stderr.splitlines() if line.startswith("otel-llm ")]
    assert len(summaries) == 1 and "llama.cpp" in summaries[0]
    view = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "view", "--last", "1"], cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    assert "runtime.prefill" in view.stdout and "llm.first_token" in view.stdout
