"""Real third-party GenAI instrumentations beside otel_llm, each in a virtualenv of its own.

The official OpenTelemetry OpenAI instrumentation (``opentelemetry-instrumentation-genai-openai``,
openai 3.x) and openlit (openai 2.x, OpenTelemetry pinned to an older release) conflict with this
project's pins and with each other, so each is installed once into its own virtualenv under the
cache directory (``~/.cache/otel-llm/beside-<name>``; 15-25 s with a warm pip cache), together
with otel_llm from this checkout (``pip install -e``, for its dependencies: the child imports the
checkout's own otel_llm anyway, through PYTHONPATH, so one cached virtualenv serves every
checkout), and installed again when the wanted pins or otel_llm's dependencies change (the
marker holds both).

:data:`APP` runs with that virtualenv's Python: the same four openai calls (sync and async,
streamed with ``include_usage`` and not) first with no instrumentation at all, then under the
setup asked for (``none``, ``alone``: otel_llm only, ``theirs``: the other instrumentation only,
``beside``: the other one, then otel_llm), all into one SDK TracerProvider and MeterProvider kept
in memory. It writes one JSON document, read back as a :class:`Run`: every finished span (name,
scope, kind, ids, attributes, and the attributes it had when it started, where the SDK's
``on_start`` saw it start: never otel_llm's, handed to the processors finished), every metric
point, what each call's HTTP request saw as the current span when it went out (the moment
otel_llm looks for another instrumentation's span), and the answers of both rounds.

    python = beside_python("openlit")
    run = run_calls(python, sim.base_url, "openlit", "beside", tmp_path)

    python -m otel_llm_testing.beside openlit [--setup beside] [--url URL]   # a run's JSON, on the simulator
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from otel_llm_testing.llama_server import DEFAULT_CACHE
from otel_llm_testing.markers import need
from otel_llm_testing.subprocesses import REPO, clean_env, private_venv

__all__ = ["APP", "CALLS", "INSTRUMENTATIONS", "SETUPS", "BesideError", "Instrumentation", "Run", "beside_python",
           "run_calls"]


class BesideError(RuntimeError):
    """An instrumentation's virtualenv could not be installed, or the app failed in it."""


@dataclass(frozen=True)
class Instrumentation:
    """A third-party GenAI instrumentation of the openai client and what its virtualenv holds."""

    name: str
    scope: str  # the instrumentation scope of its spans
    requirements: tuple[str, ...]  # installed, pinned
    constraints: tuple[str, ...]  # what pip may pick for the rest (otel_llm's dependencies included)
    module: str  # imported once after the install, as a check


# openlit 1.45.0 wants openai<3 and a set of contrib instrumentations that exists complete only at
# 0.66b1 / 1.45.1 (benchmarks/peers.py pins the same); the official one takes the newest.
INSTRUMENTATIONS = {
    "official": Instrumentation(
        "official", "opentelemetry.instrumentation.genai.openai",
        ("opentelemetry-instrumentation-genai-openai==1.3b0", "opentelemetry-util-genai==1.3b0", "openai==3.63.0"),
        ("opentelemetry-api==1.45.2", "opentelemetry-sdk==1.45.2", "opentelemetry-instrumentation==0.66b2",
         "opentelemetry-semantic-conventions==0.66b2"),
        "opentelemetry.instrumentation.genai.openai"),
    "openlit": Instrumentation(
        "openlit", "openlit.instrumentation.openai",
        ("openlit==1.45.0", "openai==2.54.0"),
        ("opentelemetry-api==1.45.1", "opentelemetry-sdk==1.45.1", "opentelemetry-instrumentation==0.66b1",
         "opentelemetry-semantic-conventions==0.66b1"),
        "openlit.instrumentation.openai"),
}
SETUPS = ("none", "alone", "theirs", "beside")
# label, async, streamed: each call's model is "m-<label>", so its spans are "chat m-<label>"
CALLS = (("sync", False, False), ("sync-stream", False, True), ("async", True, False),
         ("async-stream", True, True))
# settings of the caller's environment that must not reach the installer
_DROPPED_PREFIXES = ("OTEL_", "OPENLIT_", "PYTHON", "VIRTUAL_ENV")


def venv_path(name: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    return Path(cache_dir) / f"beside-{name}"


def _otel_llm_dependencies() -> list[str]:
    """This checkout's otel_llm dependencies: a change of them installs the virtualenvs again."""
    with open(REPO / "pyproject.toml", "rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


def _wanted(spec: Instrumentation) -> dict[str, list[str]]:
    return {"requirements": list(spec.requirements), "constraints": list(spec.constraints),
            "otel_llm": _otel_llm_dependencies()}


def _is_wanted(marker_text: str, wanted: dict[str, list[str]]) -> bool:
    try:
        return bool(json.loads(marker_text).get("wanted") == wanted)
    except (ValueError, AttributeError):
        return False


def beside_python(name: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The Python of ``name``'s virtualenv, installed on first use or when the pins changed."""
    need("backend", f"{name}'s virtualenv, installed from PyPI")
    spec = INSTRUMENTATIONS[name]
    venv = venv_path(name, cache_dir)
    wanted = _wanted(spec)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_DROPPED_PREFIXES)}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    constraints = venv.with_name(venv.name + ".constraints.txt")
    started = time.monotonic()

    def steps(python: str) -> list[list[str]]:
        constraints.write_text("\n".join(spec.constraints) + "\n")
        return [[python, "-m", "pip", "install", "--progress-bar", "off", "-c", str(constraints),
                 *spec.requirements, "-e", str(REPO)],
                [python, "-c", f"import {spec.module}, openai, otel_llm"]]

    def finish(python: str, log: IO[str]) -> str:
        listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                                env=env)
        log.write("$ pip list\n" + listed.stdout)
        try:
            installed = {item["name"].lower(): item["version"] for item in json.loads(listed.stdout)}
        except ValueError:
            installed = {}
        return json.dumps({"wanted": wanted, "seconds": round(time.monotonic() - started, 1),
                           "installed": installed}, indent=1)

    return private_venv(venv, "python", spec.requirements[0], steps, env,
                        lambda why: BesideError(f"installing {name} {why}"), "once; under a minute",
                        who="beside", current=lambda text: _is_wanted(text, wanted), finish=finish)


APP = r'''
import asyncio
import json
import sys

import openai
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

base_url, name, setup, out = sys.argv[1:5]
extra = json.loads(sys.argv[5])  # more create() arguments: max_tokens, temperature, extra_body...
calls = json.loads(sys.argv[6])  # [label, async, streamed], ...
messages = [{"role": "user", "content": "where did the time go"}]


def jsonable(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "items"):
        return {str(k): jsonable(v) for k, v in value.items()}
    return repr(value)


def describe(span):
    """An SDK span as the request finds it: name, scope, kind, attributes (None for no SDK span)."""
    scope = getattr(span, "instrumentation_scope", None)
    if scope is None:
        return None
    return {"name": span.name, "scope": scope.name, "kind": span.kind.name,
            "span_id": f"{span.get_span_context().span_id:016x}", "attributes": jsonable(span.attributes or {})}


label = None
seen = {}  # label -> what each HTTP request of the call saw as the current span


def note(request):
    seen.setdefault(label, []).append({"path": request.url.path, "current": describe(trace.get_current_span())})


async def anote(request):
    note(request)


def clients():
    return (openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                          http_client=openai.DefaultHttpxClient(event_hooks={"request": [note]})),
            openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                               http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [anote]})))


def usage_of(usage):
    if usage is None:
        return None
    return {k: getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def answer_of(response):
    choice = response.choices[0]
    return {"content": choice.message.content, "finish_reason": choice.finish_reason,
            "usage": usage_of(response.usage), "model": response.model}


class Stream:
    def __init__(self):
        self.deltas, self.finish_reason, self.usage, self.model = [], None, None, None

    def add(self, chunk):
        self.model = chunk.model
        if chunk.usage is not None:
            self.usage = usage_of(chunk.usage)
        for choice in chunk.choices:
            self.deltas.append(choice.delta.content or "")
            self.finish_reason = choice.finish_reason or self.finish_reason

    def answer(self):
        return {"content": "".join(self.deltas), "deltas": self.deltas, "finish_reason": self.finish_reason,
                "usage": self.usage, "model": self.model}


def arguments(call_label, streamed):
    kwargs = {"model": f"m-{call_label}", "messages": messages, **extra}
    if streamed:
        kwargs.update(stream=True, stream_options={"include_usage": True})
    return kwargs


async def run_async(client, todo, answers):
    global label
    async with client:
        for call_label, streamed in todo:
            label = call_label
            response = await client.chat.completions.create(**arguments(call_label, streamed))
            if streamed:
                stream = Stream()
                async for chunk in response:
                    stream.add(chunk)
                answers[call_label] = stream.answer()
            else:
                answers[call_label] = answer_of(response)


def round_of_calls():
    """The calls, one after another; each call's answer by its label."""
    global label
    answers = {}
    sync, asynchronous = clients()
    with sync:
        for call_label, is_async, streamed in calls:
            if is_async:
                continue
            label = call_label
            response = sync.chat.completions.create(**arguments(call_label, streamed))
            if streamed:
                stream = Stream()
                with response:
                    for chunk in response:
                        stream.add(chunk)
                answers[call_label] = stream.answer()
            else:
                answers[call_label] = answer_of(response)
    asyncio.run(run_async(asynchronous, [(c, s) for c, a, s in calls if a], answers))
    label = None
    return answers


class StartNotes(SpanProcessor):
    """The attributes each span had when it started (a span built finished never starts)."""

    def __init__(self):
        self.at_start = {}

    def on_start(self, span, parent_context=None):
        self.at_start[f"{span.get_span_context().span_id:016x}"] = jsonable(span.attributes or {})


def official(tracer_provider, meter_provider):
    from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)


def openlit(tracer_provider, meter_provider):
    """openlit's OpenAI instrumentor alone, without openlit.init() (exporters, pricing download, every
    other instrumentor): it takes its tracer from the global provider and its instruments from
    OpenlitConfig, which setup_meter() fills from the meter given (scope openlit.otel.metrics)."""
    from openlit._config import OpenlitConfig
    from openlit.instrumentation.openai import OpenAIInstrumentor
    from openlit.otel.metrics import setup_meter

    trace.set_tracer_provider(tracer_provider)
    OpenlitConfig()  # the first instance resets the class's settings: before they are set
    instruments, error = setup_meter(application_name="beside", environment="test",
                                     meter=meter_provider.get_meter("openlit.otel.metrics", "0.1.0"),
                                     otlp_endpoint=None, otlp_headers=None)
    assert error is None and instruments, error
    OpenlitConfig.metrics_dict = instruments
    OpenAIInstrumentor().instrument(environment="test", application_name="beside", pricing_info={},
                                    capture_message_content=False, disable_metrics=False)


plain = round_of_calls()  # before anything is instrumented
plain_seen, seen = seen, {}

exporter = InMemorySpanExporter()
notes = StartNotes()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(notes)
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
reader = InMemoryMetricReader()
meter_provider = MeterProvider(metric_readers=[reader])
if setup in ("theirs", "beside"):
    {"official": official, "openlit": openlit}[name](tracer_provider, meter_provider)
if setup in ("alone", "beside"):
    import otel_llm

    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, host_metrics=False,
                        gpu_metrics=False, runtime_metrics=False, console_summary=False)
instrumented = round_of_calls()
if setup in ("alone", "beside"):
    otel_llm.uninstrument()  # every call finished and recorded; the providers are ours, left running
tracer_provider.force_flush()

spans = []
for span in exporter.get_finished_spans():
    context, parent = span.get_span_context(), span.parent
    span_id = f"{context.span_id:016x}"
    spans.append({
        "name": span.name, "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
        "kind": span.kind.name, "trace_id": f"{context.trace_id:032x}", "span_id": span_id,
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "start": span.start_time, "end": span.end_time, "status": span.status.status_code.name,
        "attributes": jsonable(span.attributes or {}), "start_attributes": notes.at_start.get(span_id),
        "events": [event.name for event in span.events],
    })
metrics = []
data = reader.get_metrics_data()
for resource_metrics in data.resource_metrics if data else []:
    for scope_metrics in resource_metrics.scope_metrics:
        for metric in scope_metrics.metrics:
            points = []
            for point in metric.data.data_points:
                if hasattr(point, "count"):
                    points.append({"attributes": jsonable(point.attributes or {}), "count": point.count,
                                   "sum": point.sum})
                else:
                    points.append({"attributes": jsonable(point.attributes or {}), "value": point.value})
            metrics.append({"name": metric.name, "scope": scope_metrics.scope.name, "unit": metric.unit,
                            "type": type(metric.data).__name__, "points": points})
versions = {}
for dist in ("openai", "opentelemetry-sdk", "openlit", "opentelemetry-instrumentation-genai-openai"):
    try:
        from importlib.metadata import version

        versions[dist] = version(dist)
    except Exception:
        pass
with open(out, "w") as handle:
    json.dump({"name": name, "setup": setup, "versions": versions, "spans": spans, "metrics": metrics,
               "seen": seen, "plain_seen": plain_seen, "plain": plain, "instrumented": instrumented}, handle,
              indent=1)
print("CALLS-DONE")
'''


@dataclass(repr=False)
class Run:
    """What :data:`APP` wrote: spans, metrics, and the answers without and with instrumentation."""

    doc: dict[str, Any]
    stderr: str

    def __repr__(self) -> str:  # short: a failing assertion shows the runs it was given
        return (f"Run({self.doc['name']}/{self.doc['setup']}: {len(self.doc['spans'])} spans, "
                f"{len(self.doc['metrics'])} metrics)")

    @property
    def spans(self) -> list[dict[str, Any]]:
        return list(self.doc["spans"])

    @property
    def metrics(self) -> list[dict[str, Any]]:
        return list(self.doc["metrics"])

    def span(self, span_id: str | None) -> dict[str, Any] | None:
        return next((s for s in self.spans if s["span_id"] == span_id), None)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]

    def children(self, parent: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``parent``'s child spans in time order."""
        return sorted((s for s in self.spans if s["parent_id"] == parent["span_id"]),
                      key=lambda s: (s["start"], s["end"]))

    def metric_scopes(self) -> dict[str, list[str]]:
        """metric name -> the scopes that recorded it."""
        found: dict[str, list[str]] = {}
        for metric in self.metrics:
            found.setdefault(metric["name"], []).append(metric["scope"])
        return {name: sorted(scopes) for name, scopes in sorted(found.items())}

    def count(self, name: str, scope: str | None = None) -> int:
        """Records of histogram ``name`` (of ``scope`` only, when given), over all its points."""
        return sum(int(point.get("count", 0)) for metric in self.metrics
                   if metric["name"] == name and (scope is None or metric["scope"] == scope)
                   for point in metric["points"])

    def shape(self) -> str:
        """The span trees, one line a span (name, scope, kind; the gen_ai.* attributes' count), and
        the metric names by scope: for a failing assertion's message."""
        lines: list[str] = []

        def walk(span: Mapping[str, Any], depth: int) -> None:
            genai = sum(1 for key in span["attributes"] if key.startswith("gen_ai."))
            lines.append(f"{'  ' * depth}{span['name']}  [{span['scope']} {span['kind']}, gen_ai.*: {genai}]")
            for child in self.children(span):
                walk(child, depth + 1)

        ids = {s["span_id"] for s in self.spans}
        for root in sorted((s for s in self.spans if s["parent_id"] not in ids), key=lambda s: s["start"]):
            walk(root, 0)
        lines += [f"metric {name}: {scopes}" for name, scopes in self.metric_scopes().items()]
        return "\n".join(lines)


def run_calls(python: Path, base_url: str, name: str, setup: str, workdir: Path, *,
              extra: Mapping[str, Any] | None = None, calls: tuple[tuple[str, bool, bool], ...] = CALLS,
              env: Mapping[str, str] | None = None, timeout: float = 180) -> Run:
    """Run :data:`APP` with ``python`` against the server at ``base_url`` under ``setup`` (one of
    :data:`SETUPS`) with the instrumentation ``name``; ``extra``: more arguments of every
    ``create()``; ``env``: the child's environment (default: :func:`clean_env`, which puts this
    checkout's otel_llm first on its path)."""
    assert setup in SETUPS, setup
    workdir.mkdir(parents=True, exist_ok=True)
    script, out = workdir / "app.py", workdir / f"{name}-{setup}.json"
    script.write_text(APP)
    command = [str(python), str(script), base_url, name, setup, str(out), json.dumps(dict(extra or {})),
               json.dumps([list(call) for call in calls])]
    result = subprocess.run(command, cwd=workdir, env=dict(clean_env() if env is None else env),
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0 or "CALLS-DONE" not in result.stdout:
        raise BesideError(f"the app under {name}/{setup} failed ({result.returncode}):\n"
                          f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return Run(json.loads(out.read_text()), result.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m otel_llm_testing.beside NAME``: install if needed, run the calls, print the JSON."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name", choices=sorted(INSTRUMENTATIONS))
    parser.add_argument("--setup", choices=SETUPS, default="beside")
    parser.add_argument("--url", help="the model server (default: the simulator, started here)")
    parser.add_argument("--shape", action="store_true", help="print the span trees and metric scopes only")
    args = parser.parse_args(argv)
    python = beside_python(args.name)
    with tempfile.TemporaryDirectory(prefix="otel-llm-beside-") as tmp:
        if args.url:
            run = run_calls(python, args.url, args.name, args.setup, Path(tmp))
        else:
            from otel_llm.tools.sim import SimProcess

            with SimProcess(tokens=4) as sim:
                run = run_calls(python, sim.base_url, args.name, args.setup, Path(tmp))
    print(run.shape() if args.shape else json.dumps(run.doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
