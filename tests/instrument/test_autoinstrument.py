"""Zero-code instrumentation: ``opentelemetry-instrument python app.py`` traces an app that never
imports otel_llm, through the ``opentelemetry_instrumentor`` entry point."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from otel_llm import semconv as sc
from otel_llm.export.jsonl import read_jsonl
from otel_llm.instrumentor import OtelLlmInstrumentor
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.subprocesses import VENV_BIN, clean_env

APP = """
import sys
import ollama

client = ollama.Client(host=sys.argv[1])
reply = client.chat(model="auto-model", messages=[{"role": "user", "content": "hi"}])
assert reply.message.content.startswith("tok0"), reply
parts = list(client.chat(model="auto-model", messages=[{"role": "user", "content": "hi"}], stream=True))
assert len(parts) > 1
print("APP-DONE")
"""


def test_entry_point_is_registered() -> None:
    """The package declares ``opentelemetry_instrumentor: otel_llm -> OtelLlmInstrumentor``."""
    found = [ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == "otel_llm"]
    assert len(found) == 1
    assert found[0].value == "otel_llm.instrumentor:OtelLlmInstrumentor"
    assert found[0].load() is OtelLlmInstrumentor


def test_opentelemetry_instrument_traces_an_unmodified_app(sim: Any, tmp_path: Path) -> None:
    """Spans of the real ollama client land in the embedded JSONL file named by OTEL_LLM_TRACES_FILE."""
    configure_sim(sim, tokens=4, first_token_delay=0.005, token_interval=0.001)
    app = tmp_path / "app.py"
    app.write_text(APP)
    assert "otel_llm" not in APP  # the app itself never imports it
    traces = tmp_path / "auto.jsonl"
    env = clean_env(OTEL_LLM_TRACES_FILE=str(traces), PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run([str(VENV_BIN / "opentelemetry-instrument"), "python", str(app), sim.base_url],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "APP-DONE" in result.stdout
    spans = list(read_jsonl(traces))
    calls = sorted((s for s in spans if s["kind"] == 3 and sc.GEN_AI_OPERATION_NAME in s["attributes"]),
                   key=lambda s: s["startTimeUnixNano"])
    assert [c["name"] for c in calls] == ["chat auto-model", "chat auto-model"], [s["name"] for s in spans]
    for call in calls:
        attrs = call["attributes"]
        assert attrs[sc.LLM_API] == "ollama.chat"
        assert attrs[sc.GEN_AI_PROVIDER_NAME] == "ollama"
        assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
        kids = [s["name"] for s in spans if s["parentSpanId"] == call["spanId"]]
        assert sc.SPAN_SERVER_WAIT in kids
    assert calls[1]["attributes"][sc.GEN_AI_REQUEST_STREAM] is True
    assert sc.SPAN_DECODE in [s["name"] for s in spans if s["parentSpanId"] == calls[1]["spanId"]]
    summaries = [line for line in result.stderr.splitlines() if line.startswith("otel-llm")]
    assert len(summaries) == 2, result.stderr
