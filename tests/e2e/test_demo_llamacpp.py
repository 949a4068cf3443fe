"""`make demo` runs examples/demo.py against the real llama.cpp server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_llm.export.jsonl import read_jsonl
from otel_llm_testing.collectors import OtlpHttpCollector

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.py"
SPAN_LINE = re.compile(r"^  ([a-z_]+\.[a-z_]+) +\+[\d.]+m?s ", re.M)


def _waterfalls(text: str) -> dict[str, list[str]]:
    """The demo's output: each call's label (``== cold (first call after start)``) -> the names of
    its waterfall's bars, in order."""
    sections = re.split(r"^== (.+)$", text, flags=re.M)
    return {label: SPAN_LINE.findall(body) for label, body in zip(sections[1::2], sections[2::2])}


def test_waterfalls_reads_each_calls_bars() -> None:
    text = "== cold\nchat m\n  http.connect        +0.0ms     0.6ms │█ │\n  llm.decode   +1.2s   3.0ms │ │\n== warm\n"
    assert _waterfalls(text) == {"cold": ["http.connect", "llm.decode"], "warm": []}


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
    _the_documentation_shows_this_output(out)


def _the_documentation_shows_this_output(out: str) -> None:
    """The run the getting-started page and the README show (docs/snippets/demo.txt, and its
    second concurrent call in the README) has the bars of this real run, call by call."""
    real = _waterfalls(out)
    shown = _waterfalls((ROOT / "docs" / "snippets" / "demo.txt").read_text())
    assert shown and all(real[label] == bars for label, bars in shown.items()), (shown, real)
    readme = (ROOT / "README.md").read_text()
    excerpt = readme[readme.index("```text\nchat gemma-3-270m"):]
    excerpt = excerpt[:excerpt.index("\n```\n")]
    assert SPAN_LINE.findall(excerpt) == real["concurrent #2"] == shown["concurrent #2"]
    assert "1 other call(s) in flight" in excerpt and "1 other call(s) in flight" in out.split("== concurrent #2")[1]
