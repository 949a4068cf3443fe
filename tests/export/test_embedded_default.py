"""The embedded default, end to end in clean subprocesses: ``otel_llm.instrument()`` with no
options writes an OTLP/JSON-lines file and one summary line per call (on stderr when the
application configured no logging), flushed at exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.export.jsonl import read_jsonl
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.subprocesses import VENV_BIN, clean_env, run_python

DEFAULT_FILE = "otel-llm-traces.jsonl"
NON_STREAMED = [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
STREAMED = [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
TRANSPORT = (sc.SPAN_POOL_WAIT, sc.SPAN_DNS, sc.SPAN_CONNECT)

# Two calls: model-a not streamed, model-b streamed; the process then just ends (no uninstrument).
APP = """
import sys, httpx
{before}
import otel_llm
otel_llm.instrument()
{after_instrument}
url = sys.argv[1] + "/v1/chat/completions"
messages = [{{"role": "user", "content": "hello"}}]
with httpx.Client(timeout=10) as client:
    client.post(url, json={{"model": "model-a", "messages": messages}}).raise_for_status()
    with client.stream("POST", url, json={{"model": "model-b", "messages": messages, "stream": True}}) as r:
        r.read()
{after_calls}
"""


def _run(tmp_path: Path, sim: Any, *, before: str = "", after_instrument: str = "", after_calls: str = "",
         **env: str) -> subprocess.CompletedProcess[str]:
    script = APP.format(before=before, after_instrument=after_instrument, after_calls=after_calls)
    result = run_python(script, tmp_path, clean_env(**env), sim.base_url)
    assert result.returncode == 0, result.stderr
    return result


def _summaries(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("otel-llm")]


def _check_file(path: Path) -> None:
    """Both calls with their phase children, as written at exit."""
    spans = list(read_jsonl(path))
    calls = sorted((s for s in spans if s["kind"] == 3), key=lambda s: s["startTimeUnixNano"])
    assert [c["name"] for c in calls] == ["chat model-a", "chat model-b"]
    for call, phases in zip(calls, (NON_STREAMED, STREAMED)):
        kids = sorted((s for s in spans if s["parentSpanId"] == call["spanId"]), key=lambda s: s["startTimeUnixNano"])
        assert [k["name"] for k in kids if k["name"] not in TRANSPORT] == phases
        assert all(k["traceId"] == call["traceId"] for k in kids)
        assert call["attributes"][sc.HTTP_RESPONSE_STATUS_CODE] == 200
        assert call["resource"].get("service.name")
    assert calls[0]["attributes"][sc.LLM_CLIENT_CONNECTION_REUSED] is False
    assert calls[1]["attributes"][sc.LLM_CLIENT_CONNECTION_REUSED] is True


@pytest.fixture
def fast_sim(sim: Any) -> Any:
    configure_sim(sim, tokens=4, first_token_delay=0.005, token_interval=0.001)
    return sim


def _check_view(output: str) -> None:
    assert "chat model-a" in output and "chat model-b" in output, output
    for name in {*NON_STREAMED, *STREAMED}:
        assert f"  {name} " in output, (name, output)


def test_file_summary_and_view(fast_sim: Any, tmp_path: Path) -> None:
    """File in cwd, one summary line per call, and both ``view`` entry points render the calls."""
    result = _run(tmp_path, fast_sim)
    _check_file(tmp_path / DEFAULT_FILE)
    lines = _summaries(result.stderr)
    assert len(lines) == 2, result.stderr
    assert "chat model-a" in lines[0] and "chat model-b" in lines[1]
    env = clean_env()
    module = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "view", "--width", "120"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert module.returncode == 0, module.stderr
    _check_view(module.stdout)
    script = subprocess.run([str(VENV_BIN / "otel-llm"), "view", "--width", "120", "--ascii", DEFAULT_FILE],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert script.returncode == 0, script.stderr
    _check_view(script.stdout)


def test_console_summary_off(fast_sim: Any, tmp_path: Path) -> None:
    """OTEL_LLM_CONSOLE_SUMMARY=false silences stderr; the file is still written."""
    result = _run(tmp_path, fast_sim, OTEL_LLM_CONSOLE_SUMMARY="false")
    assert _summaries(result.stderr) == []
    _check_file(tmp_path / DEFAULT_FILE)


def test_summary_goes_to_the_applications_logging(fast_sim: Any, tmp_path: Path) -> None:
    """An application that configured logging gets the summary lines through its own handler
    (here with its format, on stdout); otel_llm writes nothing to stderr itself."""
    configure = ('import logging\n'
                 'logging.basicConfig(stream=sys.stdout, format="app %(name)s %(levelname)s: %(message)s")')
    result = _run(tmp_path, fast_sim, before=configure)
    assert _summaries(result.stderr) == [], result.stderr
    logged = [line for line in result.stdout.splitlines() if line.startswith("app otel_llm.summary INFO: otel-llm")]
    assert len(logged) == 2, result.stdout
    assert "chat model-a" in logged[0] and "chat model-b" in logged[1]
    _check_file(tmp_path / DEFAULT_FILE)


def test_traces_file_variable(fast_sim: Any, tmp_path: Path) -> None:
    """OTEL_LLM_TRACES_FILE moves the file; ``view`` finds it through the same variable."""
    target = tmp_path / "elsewhere" / "calls.jsonl"
    target.parent.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _run(cwd, fast_sim, OTEL_LLM_TRACES_FILE=str(target))
    assert not (cwd / DEFAULT_FILE).exists()
    _check_file(target)
    view = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "view", "--width", "120"], cwd=cwd,
                          env=clean_env(OTEL_LLM_TRACES_FILE=str(target)), capture_output=True, text=True, timeout=30)
    assert view.returncode == 0, view.stderr
    _check_view(view.stdout)


APP_PROVIDER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
processors_before = provider._active_span_processor._span_processors
"""
APP_PROVIDER_AFTER_INSTRUMENT = """
assert trace.get_tracer_provider() is provider
assert provider._active_span_processor._span_processors == processors_before, "app provider was changed"
"""
APP_PROVIDER_REPORT = """
import json
print(json.dumps([[s.name, s.kind.name, s.parent.span_id if s.parent else None, s.context.span_id]
                  for s in exporter.get_finished_spans()]))
"""


def test_app_global_provider_is_used_unchanged(fast_sim: Any, tmp_path: Path) -> None:
    """An app that set a global SDK TracerProvider gets the spans; no JSONL file, no summary lines."""
    result = _run(tmp_path, fast_sim, before=APP_PROVIDER, after_instrument=APP_PROVIDER_AFTER_INSTRUMENT,
                  after_calls=APP_PROVIDER_REPORT)
    spans = json.loads(result.stdout.strip().splitlines()[-1])
    calls = {span_id: name for name, kind, _, span_id in spans if kind == "CLIENT"}
    assert sorted(calls.values()) == ["chat model-a", "chat model-b"]
    children = [(name, parent) for name, kind, parent, _ in spans if kind == "INTERNAL"]
    assert all(parent in calls for _, parent in children)
    assert {sc.SPAN_DOWNLOAD, sc.SPAN_DECODE} <= {name for name, _ in children}
    assert not (tmp_path / DEFAULT_FILE).exists()
    assert _summaries(result.stderr) == []


OPEN_STREAM = """
client2 = httpx.Client(timeout=10)
request = client2.build_request("POST", url, json={"model": "model-c", "messages": messages, "stream": True})
response = client2.send(request, stream=True)
chunks = response.iter_bytes()
next(chunks)  # read a little and leave the response open until the interpreter exits
"""


def _call_names(path: Path) -> list[str]:
    return sorted(s["name"] for s in read_jsonl(path) if s["kind"] == 3) if path.exists() else []


def test_open_stream_at_exit_is_still_written(fast_sim: Any, tmp_path: Path) -> None:
    """A streamed response still open when the script ends is finished and flushed at exit."""
    result = _run(tmp_path, fast_sim, after_calls=OPEN_STREAM)
    assert _call_names(tmp_path / DEFAULT_FILE) == ["chat model-a", "chat model-b", "chat model-c"]
    assert len(_summaries(result.stderr)) == 3


def test_open_stream_at_exit_after_early_finalizer(fast_sim: Any, tmp_path: Path) -> None:
    """Same as above, but the app created a ``weakref.finalize`` (here via TemporaryDirectory) first."""
    before = "import tempfile\nkeep = tempfile.TemporaryDirectory()"
    result = _run(tmp_path, fast_sim, before=before, after_calls=OPEN_STREAM)
    assert len(_summaries(result.stderr)) == 3  # the call did finish...
    # ...and is exported
    assert _call_names(tmp_path / DEFAULT_FILE) == ["chat model-a", "chat model-b", "chat model-c"]


def test_relative_traces_file_is_resolved_at_instrument(fast_sim: Any, tmp_path: Path) -> None:
    """The default file is announced as an absolute path at instrument(); a later chdir must not move it."""
    moved = tmp_path / "moved"
    moved.mkdir()
    _run(tmp_path, fast_sim, after_calls=f"import os\nos.chdir({str(moved)!r})")
    assert not (moved / DEFAULT_FILE).exists()
    _check_file(tmp_path / DEFAULT_FILE)
