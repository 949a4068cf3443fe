"""HTTP libraries are patched when the application imports them, not by ``instrument()``.

Each check runs in a fresh interpreter (the venv's python), since this test process has every
library imported already: ``instrument()`` imports none of them, a library imported after it is
traced, one imported after ``uninstrument()`` is left alone until the next ``instrument()``, a
stack whose modules arrive one by one is patched when the last one does, and a failing patch
never breaks the application's import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import otel_llm
from otel_llm.instrumentor import OtelLlmInstrumentor
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.otel import make_otel
from otel_llm_testing.subprocesses import clean_env, run_python

HTTP_LIBRARIES = ("aiohttp", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "requests")

# In-memory spans; prints the CLIENT spans as [name, children] pairs on its last line.
PRELUDE = """
import asyncio, json, sys
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
import otel_llm

exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
OPTIONS = dict(tracer_provider=tracer_provider, meter_provider=MeterProvider(), host_metrics=False,
               gpu_metrics=False, runtime_metrics=False)
URL = sys.argv[1] + "/v1/chat/completions"

def body(model):
    return {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}

def calls():
    spans = exporter.get_finished_spans()
    out = []
    for span in spans:
        if span.kind == SpanKind.CLIENT:
            kids = sorted(s.name for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id)
            out.append([span.name, kids])
    exporter.clear()
    return sorted(out)

def loaded():
    return sorted(m for m in %r if m in sys.modules)

def call_each(tag):
    import httpx, httpx2, aiohttp, requests, urllib3
    with httpx.Client(timeout=10) as client, client.stream("POST", URL, json=body(f"httpx-{tag}")) as r:
        r.read()
    with httpx2.Client(timeout=10) as client, client.stream("POST", URL, json=body(f"httpx2-{tag}")) as r:
        r.read()

    async def aio():
        async with aiohttp.ClientSession() as session:
            async with session.post(URL, json=body(f"aiohttp-{tag}")) as response:
                await response.read()

    asyncio.run(aio())
    with requests.Session() as session:
        session.post(URL, json=body(f"requests-{tag}"), timeout=10).content
    urllib3.PoolManager().request("POST", URL, json=body(f"urllib3-{tag}")).data
""" % (HTTP_LIBRARIES,)

CLIENTS = ("httpx", "httpx2", "aiohttp", "requests", "urllib3")


def _run(script: str, tmp_path: Path, *args: str, **env: str) -> Any:
    result = run_python(script, tmp_path, clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "t.jsonl"), **env), *args)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def _names(calls: list[list[Any]]) -> list[str]:
    return [name for name, _ in calls]


@pytest.fixture
def fast_sim(sim: Any) -> Any:
    configure_sim(sim, tokens=3, first_token_delay=0.0, token_interval=0.0)
    return sim


def test_instrument_imports_no_http_library(tmp_path: Path) -> None:
    """The embedded default (observers on) leaves every HTTP library and
    ``opentelemetry.instrumentation`` unimported."""
    script = """
import json, sys
import otel_llm
otel_llm.instrument()
unwanted = ("aiohttp", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "requests",
            "opentelemetry.instrumentation", "prometheus_client")
print(json.dumps([otel_llm.is_instrumented(), sorted(m for m in unwanted if m in sys.modules)]))
"""
    (instrumented, imported), _ = _run(script, tmp_path)
    assert instrumented is True
    assert imported == []


def test_library_imported_after_instrument_is_traced(fast_sim: Any, tmp_path: Path) -> None:
    """Each stack imported after ``instrument()`` gets its span tree, once per call."""
    script = PRELUDE + """
otel_llm.instrument(**OPTIONS)
before = loaded()
call_each("late")
print(json.dumps([before, calls()]))
"""
    (before, calls), _ = _run(script, tmp_path, fast_sim.base_url)
    assert before == []
    assert _names(calls) == sorted(f"chat {client}-late" for client in CLIENTS)
    for name, kids in calls:
        assert "llm.server_wait" in kids and "llm.decode" in kids, (name, kids)


def test_httpcore_is_patched_when_httpx_imports_it(tmp_path: Path) -> None:
    """httpx imports httpcore only when it builds a transport: each is patched on its own import."""
    script = """
import json, sys
import otel_llm
from otel_llm.capture import install
otel_llm.instrument(host_metrics=False, gpu_metrics=False, runtime_metrics=False)
import httpx
after_import = [sorted(install.patched_stacks()), "httpcore" in sys.modules]
httpx.Client().close()
import httpcore
wrapped = hasattr(httpcore.SyncBackend.__dict__["connect_tcp"], "__wrapped__")
print(json.dumps([after_import, sorted(install.patched_stacks()), wrapped]))
"""
    (after_import, after_client, wrapped), _ = _run(script, tmp_path)
    assert after_import == [["httpx"], False]
    assert after_client == ["httpcore", "httpx"]
    assert wrapped is True


def test_library_imported_after_uninstrument_is_not_patched(fast_sim: Any, tmp_path: Path) -> None:
    """A hook that fires between sessions patches nothing; the next ``instrument()`` patches what
    was imported meanwhile, and tracing works again."""
    script = PRELUDE + """
import importlib
otel_llm.instrument(**OPTIONS)
otel_llm.uninstrument()
call_each("between")
import aiohttp, httpcore, httpx, httpx2, urllib3
from otel_llm.capture import install
targets = [(httpx.HTTPTransport, "handle_request"), (httpx2.HTTPTransport, "handle_request"),
           (httpcore.SyncBackend, "connect_tcp"), (aiohttp.ClientSession, "_request"),
           (urllib3.connectionpool.HTTPConnectionPool, "urlopen")]
wrapped = [hasattr(owner.__dict__[name], "__wrapped__") for owner, name in targets]
wrapped.append("_trace_configs" in aiohttp.ClientSession.__dict__)
between = [calls(), wrapped, sorted(install.patched_stacks())]
otel_llm.instrument(**OPTIONS)
call_each("again")
print(json.dumps(between + [calls()]))
"""
    (between_calls, wrapped, stacks, again), _ = _run(script, tmp_path, fast_sim.base_url)
    assert between_calls == []
    assert wrapped == [False] * 6
    assert stacks == []
    assert _names(again) == sorted(f"chat {client}-again" for client in CLIENTS)


def test_instrument_uninstrument_cycles_keep_tracing(fast_sim: Any, tmp_path: Path) -> None:
    """instrument -> uninstrument -> instrument, with the libraries imported in the first session."""
    script = PRELUDE + """
results = []
for round_ in range(3):
    otel_llm.instrument(**OPTIONS)
    otel_llm.instrument(**OPTIONS)  # idempotent
    call_each(f"r{round_}")
    results.append(calls())
    otel_llm.uninstrument()
    call_each("off")
    results.append(calls())
print(json.dumps(results))
"""
    results, _ = _run(script, tmp_path, fast_sim.base_url)
    for round_ in range(3):
        assert _names(results[2 * round_]) == sorted(f"chat {client}-r{round_}" for client in CLIENTS)
        assert results[2 * round_ + 1] == []


def test_stack_waits_for_all_its_modules(tmp_path: Path) -> None:
    """A stack whose package imports a needed submodule lazily is patched when that submodule
    arrives, not before (and not by importing it)."""
    package = tmp_path / "lazypkg"
    package.mkdir()
    (package / "__init__.py").write_text("class Client:\n    def send(self):\n        return 'sent'\n")
    (package / "reader.py").write_text("class Reader:\n    def read(self):\n        return 'read'\n")
    script = """
import json, sys
sys.path.insert(0, sys.argv[1])
import otel_llm
from otel_llm.capture import install
from otel_llm.capture.shared import Patch, Stack

def wrapper(wrapped, instance, args, kwargs):
    return "patched " + wrapped(*args, **kwargs)

def patches(get_sink):
    return [Patch(sys.modules["lazypkg"], "Client.send", wrapper),
            Patch(sys.modules["lazypkg.reader"], "Reader.read", wrapper)]

stack = Stack("lazypkg", ("lazypkg", "lazypkg.reader"), patches)
install.STACKS += (stack,)
for name in stack.modules:
    install._BY_MODULE.setdefault(name, []).append(stack)
otel_llm.instrument(host_metrics=False, gpu_metrics=False, runtime_metrics=False)
import lazypkg
first = [lazypkg.Client().send(), "lazypkg.reader" in sys.modules]
import lazypkg.reader
second = [lazypkg.Client().send(), lazypkg.reader.Reader().read()]
otel_llm.uninstrument()
third = [lazypkg.Client().send(), lazypkg.reader.Reader().read()]
print(json.dumps([first, second, third]))
"""
    (first, second, third), _ = _run(script, tmp_path, str(tmp_path))
    assert first == ["sent", False]
    assert second == ["patched sent", "patched read"]
    assert third == ["sent", "read"]


def test_failing_patch_never_breaks_the_import(tmp_path: Path) -> None:
    """An error while patching is logged once; the application's import and its calls work."""
    script = """
import json
import otel_llm
from otel_llm.capture import httpcore as adapter

def broken(module):
    raise RuntimeError("boom")

adapter._stream_classes = broken
otel_llm.instrument(host_metrics=False, gpu_metrics=False, runtime_metrics=False)
import httpx
from otel_llm.capture import install
print(json.dumps([httpx.__name__, hasattr(httpx.HTTPTransport.__dict__["handle_request"], "__wrapped__"),
                  sorted(install.patched_stacks())]))
"""
    (name, wrapped, stacks), stderr = _run(script, tmp_path)
    assert name == "httpx"
    assert wrapped is False
    assert stacks == ["httpx"]  # given up on, not retried at every import
    assert "patching httpx failed" in stderr


def test_instrumentor_and_instrument_share_one_session() -> None:
    """``OtelLlmInstrumentor`` (opentelemetry-instrument's way) and ``otel_llm.instrument()`` drive
    the same session: each sees and undoes what the other did."""
    assert not otel_llm.is_instrumented()
    state = make_otel()
    options = dict(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                   host_metrics=False, gpu_metrics=False, runtime_metrics=False)
    instrumentor = OtelLlmInstrumentor()
    try:
        instrumentor.instrument(**options)
        assert otel_llm.is_instrumented() and instrumentor.is_instrumented_by_opentelemetry
        otel_llm.instrument(**options)  # already instrumented: nothing happens
        otel_llm.uninstrument()
        assert not instrumentor.is_instrumented_by_opentelemetry
        otel_llm.instrument(**options)
        assert instrumentor.is_instrumented_by_opentelemetry
        instrumentor.uninstrument()
        assert not otel_llm.is_instrumented()
        instrumentor.instrument(**options)  # its own flag did not go stale
        assert otel_llm.is_instrumented()
    finally:
        otel_llm.uninstrument()
    assert not instrumentor.is_instrumented_by_opentelemetry
