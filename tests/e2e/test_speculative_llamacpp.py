"""Speculative decoding on the real llama.cpp server (``--model-draft``, the model drafting for
itself): a traced call carries llama.cpp's drafted and accepted counts and the acceptance rate,
and ``otel-llm view``, ``diagnose`` and ``bench`` show the rate beside the generation rate."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.export.jsonl import read_jsonl
from otel_llm_testing.llama_server import LlamaServer
from otel_llm_testing.subprocesses import clean_env

pytestmark = [pytest.mark.timeout(600), pytest.mark.runtime, pytest.mark.slow]

CLI = [sys.executable, "-m", "otel_llm.tools.main"]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(draft=True) as running:
        yield running


def _run(args: list[str], tmp_path: Path) -> str:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl")))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _call_attributes(tmp_path: Path) -> dict[str, Any]:
    calls = [s for s in read_jsonl(tmp_path / "traces.jsonl") if s["kind"] == 3]
    assert len(calls) == 1
    return dict(calls[0]["attributes"])


def test_a_traced_call_carries_the_draft_counts_and_view_shows_the_rate(server: LlamaServer, tmp_path: Path) -> None:
    script = (
        "import openai, otel_llm\n"
        "otel_llm.instrument(console_summary=False)\n"
        f"client = openai.OpenAI(base_url={server.base_url + '/v1'!r}, api_key='unused')\n"
        "stream = client.chat.completions.create(model='gemma', max_tokens=32, stream=True,\n"
        "    stream_options={'include_usage': True},\n"
        "    messages=[{'role': 'user', 'content': 'Count from 1 to 20, separated by commas.'}])\n"
        "print(''.join(c.choices[0].delta.content or '' for c in stream if c.choices))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl")))
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    attrs = _call_attributes(tmp_path)
    drafted, accepted = attrs[sc.LLM_RUNTIME_DRAFT_TOKENS], attrs[sc.LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED]
    assert drafted > 0 and 0 < accepted <= drafted
    assert attrs[sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE] == pytest.approx(accepted / drafted)
    view = " ".join(_run(["view", "--last", "1"], tmp_path).split())
    assert f"draft accepted {accepted / drafted:.0%} ({accepted}/{drafted})" in view


def test_bench_shows_the_acceptance_rate_per_level(server: LlamaServer, tmp_path: Path) -> None:
    out = _run(["bench", server.base_url, "--model", "gemma", "--concurrency", "1", "--requests", "2",
                "--prompt-tokens", "32", "--output-tokens", "16", "--json", "bench.json"], tmp_path)
    level = json.loads((tmp_path / "bench.json").read_text())["levels"][0]
    rate = level["native"]["draft_acceptance_rate"]["p50"]
    assert 0 < rate <= 1
    row = next(line for line in out.splitlines() if line.startswith("concurrency 1"))
    assert "runtime " in row and f"draft accepted {rate:.0%}" in row


def test_diagnose_records_the_acceptance_rate_of_each_trial(server: LlamaServer, tmp_path: Path) -> None:
    out = _run(["diagnose", server.base_url, "--model", "gemma", "--quick", "--json", "diagnose.json"], tmp_path)
    record = json.loads((tmp_path / "diagnose.json").read_text())
    warm = [t for t in record["targets"][0]["warm"] if t["error"] is None]
    assert warm and all(0 < t["draft_acceptance"] <= 1 for t in warm)
    assert "draft accepted" in out

