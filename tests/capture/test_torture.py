"""Torture tests (issue 9): otel_llm under hostile conditions, every test bounded in time and count.

* Exporter down (an OTLP endpoint with nothing listening; a collector that accepts and never
  answers): the application sees no exception, byte-identical responses and unchanged latency,
  memory stays bounded by the batch queue, and ``uninstrument()`` returns promptly. Run in a child
  process (``python -m tests.capture.test_torture exporter-down ...``) so the exporters' 10 s timeouts never
  stall this process and tracemalloc measures a clean heap.
* Chaos: thousands of calls (``OTEL_LLM_TORTURE_CALLS``, default 10,000) with early close, task
  cancellation, server aborts, error statuses, client timeouts and garbage-collected responses,
  from sync threads (httpx, httpx2) and asyncio tasks at once: every call span ends exactly once
  with the end reason the application saw, no context leaks, no internal state is left behind.
* Cross-talk: 16 threads on one ``httpx.Client`` and 100 tasks on one ``httpx.AsyncClient``, each
  call with its own model, token count and injected delays: each span carries its own call's values.
* ``instrument()``/``uninstrument()`` toggled 200 times while other threads call: no double
  wrapping, no lost or duplicated call, responses intact.
* Regressions found here: a call that fails mid-body stays in memory; a garbage-collected call
  finished inside the collector deadlocks on otel_llm's own lock; llm.client.active_requests goes
  stale after re-instrumenting with the same meter provider.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import math
import os
import queue
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

import otel_llm
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once

REPO = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
perf = time.perf_counter

# Per-request simulator settings for a small, fast answer whatever the simulator's current config.
FAST = {
    "x-sim-tokens": "2", "x-sim-first-token-delay": "0", "x-sim-token-interval": "0",
    "x-sim-headers-delay": "0", "x-sim-cold-delay": "0", "x-sim-runtime": "vllm", "x-sim-role-frame": "true",
    "x-sim-abort-after-tokens": "off", "x-sim-error-status": "off", "x-sim-buffering": "false",
    "x-sim-keepalive-interval": "0", "x-sim-concurrency": "parallel", "x-sim-cached-tokens": "0",
}
NO_PROBES = {"host_metrics": False, "gpu_metrics": False, "runtime_metrics": False}
_VOLATILE = re.compile(rb'"(id|created)": ?("[^"]*"|\d+)')


def normalized(data: bytes) -> bytes:
    """The simulator's answer without its per-request id and wall-clock second."""
    return _VOLATILE.sub(rb'"\1":0', data)


def chat(model: str, stream: bool = True, words: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": stream,
                            "messages": [{"role": "user", "content": " ".join(["w"] * words)}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _reset_sim(sim: Any) -> None:
    httpx.post(f"{sim.base_url}/sim/reset", timeout=10).raise_for_status()


def _hooks_installed() -> list[tuple[Any, str]]:
    import httpcore
    import httpcore2

    return [(httpx.HTTPTransport, "handle_request"), (httpx.AsyncHTTPTransport, "handle_async_request"),
            (httpx2.HTTPTransport, "handle_request"), (httpx2.AsyncHTTPTransport, "handle_async_request"),
            (httpcore.SyncBackend, "connect_tcp"), (httpcore.AnyIOBackend, "connect_tcp"),
            (httpcore2.SyncBackend, "connect_tcp"), (httpcore2.AnyIOBackend, "connect_tcp")]


# =============================================================================================
# 1. Exporter down
# =============================================================================================

BASELINE_CALLS = 300
DOWN_CALLS = {"refused": 900, "hanging": 3000}  # instrumented calls; latency counted from the 100th
MEMORY_EVERY = 500
UNINSTRUMENT_LIMIT = 8.0  # seconds uninstrument() may take with a collector that never answers


def _exporter_down_child(sim_url: str, endpoint: str, calls: int, trace_memory: bool,
                         measure_uninstrument: bool) -> None:
    """The application: baseline calls, then the same calls instrumented towards a dead exporter.
    With trace_memory, tracemalloc runs from before the baseline (so both latencies pay for it) and
    the traced memory is sampled after gc every MEMORY_EVERY calls from instrument() on.
    Prints one JSON line per phase; ends with os._exit so no atexit flush waits on the exporter."""
    import tracemalloc

    from otel_llm import _core
    from otel_llm.instrumentor import current_telemetry
    from otel_llm.capture.call import open_calls

    def emit(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    client = httpx.Client(headers=FAST, timeout=30)
    url = sim_url + CHAT
    body = chat("down-model")
    expected: list[bytes] = []
    exceptions: list[str] = []
    mismatched = 0

    def call() -> float:
        nonlocal mismatched
        start = perf()
        try:
            with client.stream("POST", url, json=body) as response:
                data = normalized(response.read())
        except Exception as exc:  # anything here reached the application
            exceptions.append(repr(exc))
            return perf() - start
        elapsed = perf() - start
        if not expected:
            expected.append(data)
        elif data != expected[0]:
            mismatched += 1
        return elapsed

    def traced() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    if trace_memory:
        tracemalloc.start()
    baseline = [call() for _ in range(BASELINE_CALLS)]
    memory = [traced()] if trace_memory else []
    otel_llm.instrument(endpoint=endpoint, console_summary=False, **NO_PROBES)
    assert _core._session is not None
    providers = _core._session.providers
    batch = providers.tracer_provider._active_span_processor._span_processors[0]._batch_processor
    queue_max = 0
    down = []
    for i in range(1, calls + 1):
        elapsed = call()
        if i > 100:  # by now the first export has started failing
            down.append(elapsed)
        if i % 50 == 0:
            queue_max = max(queue_max, len(batch._queue))
        if trace_memory and i % MEMORY_EVERY == 0:
            memory.append(traced())
    peak = tracemalloc.get_traced_memory()[1] if trace_memory else 0
    telemetry = current_telemetry()
    assert telemetry is not None
    emit(phase="calls", description=providers.description, baseline=baseline, down=down,
         exceptions=len(exceptions), first_exception=exceptions[:1], mismatched=mismatched,
         queue_max=queue_max, max_queue_size=batch._max_queue_size, batch_size=batch._max_export_batch_size,
         memory=memory, peak=peak, live=len(open_calls()), in_flight=sum(telemetry.in_flight.by_server.values()))
    if measure_uninstrument:
        start = perf()
        otel_llm.uninstrument()
        emit(phase="uninstrument", seconds=perf() - start)
    sys.stdout.flush()
    os._exit(0)


@contextmanager
def _dead_collector(mode: str) -> Iterator[tuple[str, list[socket.socket]]]:
    """An OTLP endpoint that is down: 'refused' (nothing listens) or 'hanging' (accepts the
    connection, never reads nor answers)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    if mode == "refused":
        server.close()
    else:
        def accept() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                held.append(conn)

        threading.Thread(target=accept, name="hanging-collector", daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}", held
    finally:
        server.close()
        for conn in held:
            conn.close()


def _run_exporter_down(sim: Any, mode: str) -> dict[str, Any]:
    from otel_llm_testing.subprocesses import clean_env

    _reset_sim(sim)
    hanging = mode == "hanging"
    with _dead_collector(mode) as (endpoint, held), tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.capture.test_torture", "exporter-down", sim.base_url, endpoint,
             str(DOWN_CALLS[mode]), "1" if hanging else "0", "1" if hanging else "0"],
            cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.put(line)
            lines.put(None)  # the child is gone

        threading.Thread(target=read, daemon=True).start()
        results: dict[str, Any] = {"mode": mode, "uninstrument_seconds": None}
        try:
            try:
                line = lines.get(timeout=90)
            except queue.Empty:
                line = None
            if line is None:
                stderr.seek(0)
                pytest.fail(f"the exporter-down application failed or hung: {stderr.read()[-3000:]}")
            results.update(json.loads(line))
            if hanging:
                try:
                    line = lines.get(timeout=UNINSTRUMENT_LIMIT + 1)
                except queue.Empty:
                    line = None
                # None: still inside uninstrument() when we stopped waiting
                results["uninstrument_seconds"] = json.loads(line)["seconds"] if line else float("inf")
            results["collector_connections"] = len(held)
        finally:
            proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
    return results


@pytest.fixture(scope="module")
def exporter_down(sim_process: Any) -> Callable[[str], dict[str, Any]]:
    """Runs each exporter-down scenario once per module; tests read its measurements."""
    cache: dict[str, dict[str, Any]] = {}

    def get(mode: str) -> dict[str, Any]:
        if mode not in cache:
            cache[mode] = _run_exporter_down(sim_process, mode)
        return cache[mode]

    return get


def _settle(done: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll until done() (a garbage-collected call may be finished on another thread)."""
    deadline = perf() + timeout
    while not done():
        if perf() > deadline:
            return False
        time.sleep(0.01)
    return True


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.parametrize("mode", ["refused", "hanging"])
def test_exporter_down_leaves_the_application_alone(exporter_down: Callable[[str], dict[str, Any]], mode: str) -> None:
    """No exception, byte-identical responses, latency within noise of the uninstrumented baseline."""
    r = exporter_down(mode)
    assert r["description"].startswith("OTLP"), r["description"]
    assert r["exceptions"] == 0, r["first_exception"]
    assert r["mismatched"] == 0
    base, down = statistics.median(r["baseline"]), statistics.median(r["down"])
    numbers = (f"{mode}: median {down * 1e3:.2f} ms vs baseline {base * 1e3:.2f} ms, "
               f"p99 {_quantile(r['down'], 0.99) * 1e3:.1f} ms vs {_quantile(r['baseline'], 0.99) * 1e3:.1f} ms, "
               f"max {max(r['down']) * 1e3:.1f} ms")
    print(numbers)
    assert down < base + 0.020, numbers
    # No call waited on the exporter (a 1 s retry backoff or the 10 s export timeout).
    assert _quantile(r["down"], 0.99) < 0.5, numbers
    assert r["live"] == 0 and r["in_flight"] == 0
    # the exporter was stuck (retry backoff, or waiting for an answer): spans piled up to the
    # queue's bound and no further
    assert r["queue_max"] == r["max_queue_size"], r["queue_max"]
    if mode == "hanging":
        assert r["collector_connections"] >= 1, "the exporter never reached the hanging collector"


def test_exporter_down_memory_is_bounded_by_the_batch_queue(exporter_down: Callable[[str], dict[str, Any]]) -> None:
    """Collector hanging, 3,000 calls (about 15,000 spans): what stays allocated is what
    instrument() set up (modules, exporters, instruments) plus the batch processor's queue (2,048
    spans) and the batch stuck in the exporter (512 spans), reached within the first 500 calls;
    from call 500 to 3,000 (12,500 more spans) memory stays flat (tracemalloc after gc)."""
    r = exporter_down("hanging")
    memory = r["memory"]
    kept = [m - memory[0] for m in memory]
    numbers = (f"traced memory kept after instrument(), every {MEMORY_EVERY} calls (kB): "
               f"{[round(k / 1e3) for k in kept]}; peak +{(r['peak'] - memory[0]) / 1e6:.2f} MB; "
               f"queue {r['queue_max']}/{r['max_queue_size']} spans, export batch {r['batch_size']}")
    print(numbers)
    # The queue's content varies by a few hundred kB (call spans are larger than phase spans);
    # keeping the 12,500 later spans would add about 10 MB, a leak of 250 bytes a call 600 kB.
    assert kept[-1] - kept[1] < 600_000, numbers
    assert kept[-1] < 16_000_000, numbers
    assert r["peak"] - memory[0] < 24_000_000, numbers


def test_uninstrument_returns_promptly_with_a_hanging_collector(exporter_down: Callable[[str], dict[str, Any]]) -> None:
    """uninstrument() flushes otel_llm's own providers; a collector that never answers must not
    hold the application for the exporters' full retry budget (measured: about 40 s)."""
    seconds = exporter_down("hanging")["uninstrument_seconds"]
    print(f"uninstrument() with a hanging collector: {seconds:.1f} s" if math.isfinite(seconds) else
          f"uninstrument() with a hanging collector: still running after {UNINSTRUMENT_LIMIT + 1:.0f} s")
    assert seconds <= UNINSTRUMENT_LIMIT, (
        f"uninstrument() took more than {UNINSTRUMENT_LIMIT:.0f} s with a hanging collector")


# =============================================================================================
# 2. Chaos: thousands of calls ending every possible way
# =============================================================================================

TOTAL_CALLS = int(os.environ.get("OTEL_LLM_TORTURE_CALLS", "10000"))
ROUNDS = (0.2, 0.4, 0.4)  # memory is compared between the ends of the last two rounds

# (kind, weight); a kind's calls use model "chaos-<kind>" so spans can be matched to what the
# application saw. "nonmodel" is a GET /v1/models: never a span.
SYNC_MIX = [("eof", 30), ("json", 12), ("close", 16), ("abort", 10), ("status", 10), ("timeout", 1),
            ("gc", 3), ("nonmodel", 5)]
ASYNC_MIX = [("eof", 25), ("json", 10), ("break", 14), ("abort", 10), ("status", 10), ("cancel_body", 12),
             ("cancel_wait", 5), ("timeout", 2), ("gc", 1), ("nonmodel", 5)]
STATUSES = ["400", "429", "500", "503"]


class SpanLedger(SpanProcessor):
    """Counts ended spans in preallocated arrays, so recording 50,000 spans adds no memory."""

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self.client_ids = array("Q", [0]) * capacity
        self.child_parents = array("Q", [0]) * (capacity * 8)
        self.clients = 0
        self.children = 0
        self.orphans = 0
        self.overflow = 0
        self.reasons: Counter[tuple[str, str]] = Counter()  # (model, end reason)
        self.errors: Counter[tuple[str, str]] = Counter()   # (model, error.type)

    def on_end(self, span: ReadableSpan) -> None:
        with self.lock:
            if span.kind is SpanKind.CLIENT:
                attrs = span.attributes or {}
                model = str(attrs.get(sc.GEN_AI_REQUEST_MODEL))
                self.reasons[(model, str(attrs.get(sc.LLM_CLIENT_END_REASON)))] += 1
                if sc.ERROR_TYPE in attrs:
                    self.errors[(model, str(attrs[sc.ERROR_TYPE]))] += 1
                if self.clients < len(self.client_ids):
                    self.client_ids[self.clients] = span.context.span_id
                else:
                    self.overflow += 1
                self.clients += 1
            else:
                if span.parent is None:
                    self.orphans += 1
                elif self.children < len(self.child_parents):
                    self.child_parents[self.children] = span.parent.span_id
                else:
                    self.overflow += 1
                self.children += 1


class Started:
    """Model requests that reached the transport, counted by a request event hook: httpx runs
    the hooks right before calling the transport, with no await in between."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def sync_hook(self, request: Any) -> None:
        if request.url.path == CHAT:
            with self.lock:
                self.count += 1

    async def async_hook(self, request: Any) -> None:
        self.sync_hook(request)
        started = request.extensions.get("torture_started")
        if started is not None:
            started.set()


class Tally:
    """What the application saw, per worker (merged at the end)."""

    def __init__(self) -> None:
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (model, expected end reason)
        self.statuses: Counter[tuple[str, str]] = Counter()
        self.calls = 0
        self.leaks: list[str] = []
        self.bad: list[str] = []

    def merge(self, other: Tally) -> None:
        self.outcomes.update(other.outcomes)
        self.statuses.update(other.statuses)
        self.calls += other.calls
        self.leaks += other.leaks
        self.bad += other.bad


def _context_leak() -> str | None:
    from otel_llm.capture.call import CURRENT_CALL

    if len(otel_context.get_current()):
        return f"OpenTelemetry context left set: {dict(otel_context.get_current())}"
    if CURRENT_CALL.get() is not None:
        return "otel_llm CURRENT_CALL left set"
    return None


def _pick(mix: list[tuple[str, int]], rng: random.Random) -> str:
    return rng.choices([k for k, _ in mix], weights=[w for _, w in mix])[0]


def _chaos_request(kind: str, rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
    """Body and per-request simulator headers of one chaos call."""
    model = f"chaos-{kind}"
    headers: dict[str, str] = {}
    body = chat(model, stream=kind not in ("json", "status", "timeout"))
    if kind in ("close", "break"):
        headers["x-sim-tokens"] = "30"
    elif kind == "abort":
        headers.update({"x-sim-tokens": "5", "x-sim-abort-after-tokens": "1"})
    elif kind == "status":
        headers["x-sim-error-status"] = rng.choice(STATUSES)
    elif kind == "timeout":
        headers["x-sim-headers-delay"] = "0.1"
    elif kind == "cancel_body":
        headers.update({"x-sim-tokens": "20", "x-sim-token-interval": "0.002"})
    elif kind == "cancel_wait":
        headers["x-sim-headers-delay"] = "0.1"
    elif kind == "gc":
        headers["x-sim-tokens"] = "3"
    return body, headers


class ChaosSync:
    """One thread's worth of sync chaos calls through ``client`` (httpx or httpx2)."""

    def __init__(self, lib: Any, client: Any, base: str, tally: Tally, started: Started, seed: int) -> None:
        self.lib, self.client, self.base, self.tally, self.started = lib, client, base, tally, started
        self.rng = random.Random(seed)
        self.garbage = 0

    def run(self, jobs: Iterator[int], limit: int) -> None:
        while next(jobs) < limit:
            kind = _pick(SYNC_MIX, self.rng)
            try:
                self.one(kind)
            except Exception as exc:
                self.tally.bad.append(f"sync {kind}: {exc!r}")
            self.tally.calls += 1
            leak = _context_leak()
            if leak:
                self.tally.leaks.append(f"sync {kind}: {leak}")

    def one(self, kind: str) -> None:
        lib, client, tally = self.lib, self.client, self.tally
        url = self.base + CHAT
        model = f"chaos-{kind}"
        body, headers = _chaos_request(kind, self.rng)
        if kind == "nonmodel":
            assert client.get(self.base + "/v1/models").status_code == 200
            return
        if kind == "gc":
            fresh = lib.Client(headers=FAST, timeout=10, event_hooks={"request": [self.started.sync_hook]})
            response = fresh.send(fresh.build_request("POST", url, json=body, headers=headers), stream=True)
            assert response.status_code == 200
            del response, fresh  # dropped unconsumed, never closed
            tally.outcomes[(model, "garbage_collected")] += 1
            self.garbage += 1
            if self.garbage % 20 == 0:
                gc.collect()
            return
        reason = "eof"
        try:
            if kind in ("json", "status"):
                response = client.post(url, json=body, headers=headers)
                if kind == "status":
                    tally.statuses[(model, str(response.status_code))] += 1
                    assert response.status_code == int(headers["x-sim-error-status"])
                else:
                    assert response.json()["model"] == model
            elif kind == "timeout":
                client.post(url, json=body, headers=headers, timeout=lib.Timeout(10, read=0.02))
            else:
                with client.stream("POST", url, json=body, headers=headers) as response:
                    data = b""
                    for chunk in response.iter_raw():
                        data += chunk
                        if kind == "close":
                            reason = "closed"
                            break
                    if kind == "eof":
                        assert data.endswith(b"data: [DONE]\n\n"), data[-200:]
        except lib.HTTPError:
            reason = "error"
        if kind == "abort":
            assert reason == "error", "the server abort did not reach the application"
        tally.outcomes[(model, reason)] += 1


class ChaosAsync:
    """Chaos calls from asyncio tasks sharing one AsyncClient."""

    def __init__(self, lib: Any, base: str, tally: Tally, started: Started, seed: int) -> None:
        self.lib, self.base, self.tally, self.started = lib, base, tally, started
        self.rng = random.Random(seed)

    async def run(self, client: Any, jobs: Iterator[int], limit: int) -> None:
        while next(jobs) < limit:
            kind = _pick(ASYNC_MIX, self.rng)
            try:
                await self.one(client, kind)
            except Exception as exc:
                self.tally.bad.append(f"async {kind}: {exc!r}")
            self.tally.calls += 1
            leak = _context_leak()
            if leak:
                self.tally.leaks.append(f"async {kind}: {leak}")

    async def one(self, client: Any, kind: str) -> None:
        lib, tally = self.lib, self.tally
        url = self.base + CHAT
        model = f"chaos-{kind}"
        body, headers = _chaos_request(kind, self.rng)
        if kind == "nonmodel":
            assert (await client.get(self.base + "/v1/models")).status_code == 200
            return
        if kind in ("cancel_body", "cancel_wait"):
            tally.outcomes[(model, await self.cancelled_call(client, kind, url, body, headers))] += 1
            return
        if kind == "gc":
            fresh = lib.AsyncClient(headers=FAST, timeout=10, event_hooks={"request": [self.started.async_hook]})
            response = await fresh.send(fresh.build_request("POST", url, json=body, headers=headers), stream=True)
            assert response.status_code == 200
            del response, fresh
            tally.outcomes[(model, "garbage_collected")] += 1
            return
        reason = "eof"
        try:
            if kind in ("json", "status"):
                response = await client.post(url, json=body, headers=headers)
                if kind == "status":
                    tally.statuses[(model, str(response.status_code))] += 1
                else:
                    assert response.json()["model"] == model
            elif kind == "timeout":
                await client.post(url, json=body, headers=headers, timeout=lib.Timeout(10, read=0.02))
            else:
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    data = b""
                    async for chunk in response.aiter_raw():
                        data += chunk
                        if kind == "break":
                            reason = "closed"
                            break
                    if kind == "eof":
                        assert data.endswith(b"data: [DONE]\n\n"), data[-200:]
        except lib.HTTPError:
            reason = "error"
        if kind == "abort":
            assert reason == "error", "the server abort did not reach the application"
        tally.outcomes[(model, reason)] += 1

    async def cancelled_call(self, client: Any, kind: str, url: str, body: dict[str, Any],
                             headers: dict[str, str]) -> str:
        """Cancel the task making the call: mid-body, or while it waits for headers. Returns the
        end reason the application's view implies (the task may win the race and finish)."""
        started, first_chunk = asyncio.Event(), asyncio.Event()
        seen: dict[str, str] = {}

        async def consume() -> None:
            data = b""
            try:
                async with client.stream("POST", url, json=body, headers=headers,
                                         extensions={"torture_started": started}) as response:
                    async for chunk in response.aiter_raw():
                        data += chunk
                        first_chunk.set()
                seen["reason"] = "eof"
            except asyncio.CancelledError:
                # Cancelled after the last byte arrived (e.g. inside the aclose() that aiter_raw
                # awaits after the end of the body): the body may or may not have been seen to end.
                seen["reason"] = "eof|cancelled" if data.endswith(b"data: [DONE]\n\n") else "cancelled"
                leak = _context_leak()
                if leak:
                    self.tally.leaks.append(f"cancelled task: {leak}")
                raise

        task = asyncio.create_task(consume())
        if kind == "cancel_body":
            await first_chunk.wait()
        else:
            await started.wait()
            await asyncio.sleep(0.003)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return seen["reason"]


def _async_thread(base: str, tallies: list[Tally], started: Started, jobs: Iterator[int], limit: int,
                  seed: int) -> None:
    async def main() -> None:
        workers = []
        clients = []
        for lib, tasks in ((httpx, 12), (httpx2, 4)):
            tally = Tally()
            tallies.append(tally)
            chaos = ChaosAsync(lib, base, tally, started, seed + tasks)
            client = lib.AsyncClient(headers=FAST, timeout=10, event_hooks={"request": [started.async_hook]})
            clients.append(client)
            workers += [chaos.run(client, jobs, limit) for _ in range(tasks)]
        try:
            await asyncio.gather(*workers)
        finally:
            for client in clients:
                await client.aclose()

    asyncio.run(main())


def _census() -> Counter[str]:
    """Live otel_llm per-call objects."""
    from otel_llm.telemetry.spans import CallSpan
    from otel_llm.capture.call import LlmCall
    from otel_llm.parse.framing import StreamScanner

    found: Counter[str] = Counter()
    for obj in gc.get_objects():
        cls = type(obj)
        if cls in (LlmCall, CallSpan, StreamScanner) or (
                cls.__module__ == "otel_llm.capture.httpcore" and cls.__name__.endswith("LlmStream")):
            found[cls.__name__] += 1
    return found


def _reason_mismatches(spans: Counter[tuple[str, str]], seen: Counter[tuple[str, str]]) -> list[str]:
    """Per model: the call spans' end reasons against what the application saw ("eof|cancelled":
    a task cancelled after its last byte, either is right)."""
    problems = []
    for model in sorted({m for m, _ in spans} | {m for m, _ in seen}):
        got = Counter({r: n for (m, r), n in spans.items() if m == model})
        want = Counter({r: n for (m, r), n in seen.items() if m == model})
        either = want.pop("eof|cancelled", 0)
        extra, missing = got - want, want - got
        if missing or sum(extra.values()) != either or set(extra) - {"eof", "cancelled"}:
            problems.append(f"{model}: spans {dict(got)}, application saw {dict(want)} "
                            f"and {either} eof-or-cancelled")
    return problems


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_chaos_every_call_ends_exactly_once(sim: Any) -> None:
    """TOTAL_CALLS calls (sync threads on httpx and httpx2, asyncio tasks on both) ending every way
    there is. Every model call that reached the transport has exactly one call span, with the end
    reason and error type the application saw; no context leaks; no state left behind."""
    from otel_llm.instrumentor import current_telemetry
    from otel_llm.capture.call import open_calls

    assert not otel_llm.is_instrumented()
    reset_log_once()
    ledger = SpanLedger(TOTAL_CALLS + 100)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(ledger)
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]),
                        **NO_PROBES)
    base = sim.base_url
    gc.collect()
    census_before = _census()
    tallies: list[Tally] = []
    blocks: list[int] = []
    t_begin = perf()
    started_calls = Started()
    hooks = {"request": [started_calls.sync_hook]}
    shared = httpx.Client(headers=FAST, timeout=10, event_hooks=hooks)
    shared2 = httpx2.Client(headers=FAST, timeout=10, event_hooks=hooks)
    try:
        workers_sync = []
        for seed, (lib, client) in enumerate(((httpx, shared), (httpx, shared), (httpx2, shared2))):
            tally = Tally()
            tallies.append(tally)
            workers_sync.append(ChaosSync(lib, client, base, tally, started_calls, seed))
        done = 0
        for share in ROUNDS:
            limit = int(TOTAL_CALLS * share)
            jobs = itertools.count()
            threads = [threading.Thread(target=w.run, args=(jobs, limit)) for w in workers_sync]
            threads.append(threading.Thread(target=_async_thread,
                                            args=(base, tallies, started_calls, jobs, limit, 100 + done)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
                assert not thread.is_alive(), "a chaos worker is stuck"
            done += limit
            gc.collect()
            gc.collect()
            blocks.append(sys.getallocatedblocks())
        elapsed = perf() - t_begin
    finally:
        shared.close()
        shared2.close()
        gc.collect()
        _settle(lambda: ledger.clients >= started_calls.count)
        telemetry = current_telemetry()
        metrics = reader.get_metrics_data()
        otel_llm.uninstrument()

    app = Tally()
    for tally in tallies:
        app.merge(tally)
    started = started_calls.count
    print(f"chaos: {app.calls} calls ({started} model calls) in {elapsed:.1f} s; "
          f"{ledger.clients} call spans, {ledger.children} phase spans; allocated blocks after rounds {blocks}")
    assert app.bad == [], app.bad[:5]
    assert app.leaks == [], app.leaks[:5]
    assert app.calls >= TOTAL_CALLS
    # every model call that reached the transport ended exactly once...
    assert ledger.overflow == 0 and ledger.orphans == 0
    assert ledger.clients == started
    ids = ledger.client_ids[:ledger.clients]
    assert len(set(ids)) == len(ids), "a call span was emitted twice"
    assert set(ledger.child_parents[:ledger.children]) <= set(ids), "a phase span without its call span"
    # ...the way the application saw it end
    assert _reason_mismatches(ledger.reasons, app.outcomes) == []
    assert {k: v for k, v in ledger.errors.items() if k[0] == "chaos-status"} == dict(app.statuses)
    assert all(reason in ("eof", "closed", "error", "cancelled", "garbage_collected") for _, reason in ledger.reasons)
    # one duration measurement per call
    durations = [point.count for rm in metrics.resource_metrics for scm in rm.scope_metrics for m in scm.metrics
                 if m.name == sc.METRIC_OPERATION_DURATION for point in m.data.data_points]
    assert sum(durations) == started
    # nothing left behind
    assert telemetry is not None
    assert open_calls() == []
    assert all(count == 0 for count in telemetry.in_flight.by_server.values()), telemetry.in_flight.by_server
    assert telemetry.in_flight._bodies == {} and telemetry.in_flight._unloaded == set()
    _settle(lambda: not _census() - census_before, 2.0)
    left = _census() - census_before
    assert left == Counter(), f"finished calls still alive after gc.collect(): {dict(left)}"
    growth = blocks[-1] - blocks[-2]
    assert growth < 3000, f"allocated blocks grew by {growth} over the last {int(TOTAL_CALLS * ROUNDS[-1])} calls"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_call_that_fails_mid_body_is_not_kept_alive(sim: Any, otel: Any) -> None:
    """A stream that ends in an exception (server abort, task cancellation) must not stay in memory.
    LlmCall.exception keeps the exception, whose traceback frames reach the response stream, whose
    weakref.finalize (a GC root) holds the call: the whole call, its request, response and
    connection objects would never be collected."""
    url = sim.base_url + CHAT
    gc.collect()
    before = _census()

    def aborted() -> None:  # in a function: no local of this test keeps a response
        with httpx.Client(headers=FAST, timeout=10) as client:
            for _ in range(3):
                with pytest.raises(httpx.RemoteProtocolError):
                    with client.stream("POST", url, json=chat("abort"),
                                       headers={"x-sim-tokens": "5", "x-sim-abort-after-tokens": "1"}) as response:
                        for _ in response.iter_raw():
                            pass

    aborted()

    async def cancelled() -> None:
        async with httpx.AsyncClient(headers=FAST, timeout=10) as client:
            for _ in range(3):
                first = asyncio.Event()

                async def consume() -> None:
                    async with client.stream("POST", url, json=chat("cancel"),
                                             headers={"x-sim-tokens": "50",
                                                      "x-sim-token-interval": "0.01"}) as response:
                        async for _ in response.aiter_raw():
                            first.set()

                task = asyncio.create_task(consume())
                await first.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(cancelled())
    reasons = sorted(str(c.attributes[sc.LLM_CLIENT_END_REASON]) for c in otel.calls())
    assert reasons == ["cancelled"] * 3 + ["error"] * 3
    gc.collect()
    _settle(lambda: not _census() - before, 1.0)
    assert _census() - before == Counter(), "finished calls are still alive after gc.collect()"


class _CollectingLock:
    """A lock whose holder runs the cyclic garbage collector once, as any allocation of a container
    inside the critical section may do (CPython collects synchronously at an allocation)."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.armed = False

    def __enter__(self) -> _CollectingLock:
        self.inner.acquire()
        if self.armed:
            self.armed = False
            gc.collect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


def _gc_inside_lock_child(sim_url: str) -> None:
    """An unconsumed response becomes garbage in a reference cycle; the next model call's
    admission (InFlight holds its lock) happens to be where the collector runs. Prints "finished"
    unless the thread deadlocks; never returns normally (a deadlock would leave the collector
    marked as running for the whole process)."""
    from otel_llm.instrumentor import current_telemetry
    from otel_llm_testing.otel import make_otel

    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider, **NO_PROBES)
    telemetry = current_telemetry()
    assert telemetry is not None
    lock = _CollectingLock()
    telemetry.in_flight._lock = lock  # type: ignore[assignment]
    url = sim_url + CHAT

    def app() -> None:
        gc.disable()  # the dropped response waits for the collector, as cycles do between collections
        client = httpx.Client(headers=FAST, timeout=10)
        response = client.send(client.build_request("POST", url, json=chat("dropped")), stream=True)
        del response, client
        lock.armed = True
        with httpx.Client(headers=FAST, timeout=10) as other:
            other.post(url, json=chat("next"))
        gc.enable()

    thread = threading.Thread(target=app, daemon=True)
    thread.start()
    thread.join(3)  # well under a second when nothing deadlocks
    _settle(lambda: len(state.calls()) >= 2, 2.0)
    reasons = sorted(str(c.attributes.get(sc.LLM_CLIENT_END_REASON)) for c in state.calls())
    print(json.dumps({"deadlocked": thread.is_alive(), "reasons": reasons}), flush=True)
    os._exit(0)


def test_garbage_collection_inside_otel_llm_does_not_deadlock(sim: Any) -> None:
    """The finalizer of an unconsumed response finishes its call synchronously, inside the garbage
    collector, which may run while the same thread holds InFlight's lock (or a span processor's, or
    a metric aggregation's): finishing needs that lock again and the thread (and every later model
    call, waiting for the lock) hangs. Fault injection: the collector runs inside admit()."""
    from otel_llm_testing.subprocesses import clean_env

    proc = subprocess.run([sys.executable, "-m", "tests.capture.test_torture", "gc-inside-lock", sim.base_url],
                          cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["deadlocked"], "a model call deadlocked finishing a garbage-collected call inside its own lock"
    assert result["reasons"] == ["eof", "garbage_collected"]


# =============================================================================================
# 3. Cross-talk under concurrency
# =============================================================================================

def _plan(k: int, prefix: str) -> dict[str, Any]:
    """Distinct, known parameters of call k."""
    return {
        "model": f"{prefix}-{k}",
        "tokens": 2 + (k * 7) % 17,
        "words": 1 + (k * 5) % 11,
        "headers_delay": 0.01 + 0.02 * (k % 8),
        "first_token_delay": 0.005 * (1 + (k * 3) % 5),
    }


def _plan_headers(plan: dict[str, Any]) -> dict[str, str]:
    return {**FAST, "x-sim-tokens": str(plan["tokens"]), "x-sim-headers-delay": str(plan["headers_delay"]),
            "x-sim-first-token-delay": str(plan["first_token_delay"]), "x-sim-token-interval": "0"}


SLACK = 0.3  # seconds a busy 2-core machine may add to any injected delay
EARLY = 0.002  # seconds a phase may look shorter than the injected delay (clock granularity)


def _check_own_call(otel: Any, plans: dict[str, dict[str, Any]]) -> None:
    calls = otel.calls()
    assert sorted(str(c.attributes[sc.GEN_AI_REQUEST_MODEL]) for c in calls) == sorted(plans)
    response_ids = set()
    excess: list[float] = []
    pairs: list[tuple[float, float]] = []
    for call in calls:
        attrs = call.attributes
        plan = plans[str(attrs[sc.GEN_AI_REQUEST_MODEL])]
        where = f"{plan['model']}: "
        assert call.name == f"chat {plan['model']}", where + call.name
        assert attrs[sc.GEN_AI_RESPONSE_MODEL] == plan["model"], where + str(attrs[sc.GEN_AI_RESPONSE_MODEL])
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == plan["tokens"], where
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == plan["words"] + 4, where
        assert attrs[sc.LLM_CLIENT_CHUNKS] == plan["tokens"], where
        assert attrs[sc.LLM_CLIENT_END_REASON] == "eof", where
        response_ids.add(attrs[sc.GEN_AI_RESPONSE_ID])  # the server's id for this call, no other's
        kids = otel.children(call)
        # the phases tile this call's own span
        assert kids[0].start_time == call.start_time, where
        assert all(a.end_time == b.start_time for a, b in zip(kids, kids[1:])), where
        assert kids[-1].end_time == call.end_time, where
        names = [k.name for k in kids]
        assert names[-4:] == [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE], \
            where + str(names)
        phase = {k.name: (k.end_time - k.start_time) / 1e9 for k in kids}
        wait, first = phase[sc.SPAN_SERVER_WAIT], phase[sc.SPAN_FIRST_TOKEN]
        # Lower bounds hold from the call's start only: the server starts its delay when the body
        # arrives, and the client may note "body sent" late when its thread or loop is busy.
        ttfb = attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE]
        assert ttfb >= plan["headers_delay"] - EARLY, (where, ttfb)
        assert wait <= plan["headers_delay"] + SLACK, (where, wait)
        excess.append(wait - plan["headers_delay"])
        pairs.append((plan["headers_delay"], wait))
        # (a late wake-up on the client shortens the phase after a late mark: only the sum is strict)
        assert first <= plan["first_token_delay"] + SLACK, (where, first)
        ttft = attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
        assert ttft >= plan["headers_delay"] + plan["first_token_delay"] - EARLY, (where, ttft)
        decode_start = next(k.start_time for k in kids if k.name == sc.SPAN_DECODE)
        assert (decode_start - call.start_time) / 1e9 == pytest.approx(ttft, abs=1e-6), where
    assert len(response_ids) == len(calls)
    # each server wait follows its own injected delay (10 to 150 ms): marks swapped between calls
    # would leave no rank correlation between the two
    correlation = _rank_correlation(pairs)
    print(f"server wait minus injected delay: median {statistics.median(excess) * 1e3:.1f} ms, "
          f"range {min(excess) * 1e3:.1f}..{max(excess) * 1e3:.1f} ms; rank correlation {correlation:.2f}")
    assert correlation > 0.6


def _rank_correlation(pairs: list[tuple[float, float]]) -> float:
    """Spearman's rho (average ranks for ties)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2
            i = j + 1
        return result

    xs, ys = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    return statistics.correlation(xs, ys)


def test_no_cross_talk_between_16_threads_on_one_client(sim: Any, otel: Any) -> None:
    plans = {p["model"]: p for p in (_plan(k, "thread") for k in range(48))}
    ordered = list(plans.values())
    url = sim.base_url + CHAT
    barrier = threading.Barrier(16)
    errors: list[str] = []

    def worker(t: int, client: httpx.Client) -> None:
        barrier.wait(10)
        for plan in ordered[t * 3:(t + 1) * 3]:
            try:
                with client.stream("POST", url, json=chat(plan["model"], words=plan["words"]),
                                   headers=_plan_headers(plan)) as response:
                    data = response.read()
                assert data.count(b'"content":"') == plan["tokens"] + 1  # role frame + tokens
                assert f'"model":"{plan["model"]}"'.encode() in data
            except Exception as exc:
                errors.append(f"{plan['model']}: {exc!r}")

    with httpx.Client(timeout=30) as client:
        threads = [threading.Thread(target=worker, args=(t, client)) for t in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    _check_own_call(otel, plans)


# One event loop running 100 streams on a 2-core machine now and then notes a call's headers more
# than SLACK late (0.46 s against 0.15 + 0.3 in a CI run); swapped marks, what this test is about,
# would fail every run (and the rank correlation), so a late run is run again.
@pytest.mark.timing
def test_no_cross_talk_between_100_tasks_on_one_async_client(sim: Any, otel: Any) -> None:
    plans = {p["model"]: p for p in (_plan(k, "task") for k in range(100))}
    url = sim.base_url + CHAT

    async def one(client: httpx.AsyncClient, k: int, plan: dict[str, Any]) -> None:
        await asyncio.sleep(k * 0.001)  # all in flight together, without a 100-connection accept burst
        async with client.stream("POST", url, json=chat(plan["model"], words=plan["words"]),
                                 headers=_plan_headers(plan)) as response:
            data = await response.aread()
        assert data.count(b'"content":"') == plan["tokens"] + 1
        leak = _context_leak()
        assert leak is None, leak

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as client:
            await asyncio.gather(*(one(client, k, plan) for k, plan in enumerate(plans.values())))

    asyncio.run(main())
    _check_own_call(otel, plans)


# =============================================================================================
# 5. instrument() / uninstrument() while other threads call
# =============================================================================================

TOGGLES = 200


class ToggleCaller:
    """Calls continuously, recording each call's [start, end] on the perf-counter clock."""

    def __init__(self, name: str, templates: dict[str, bytes]) -> None:
        self.name = name
        self.templates = templates
        self.records: list[tuple[str, float, float]] = []
        self.errors: list[str] = []

    def check(self, kind: str, model: str, data: bytes) -> None:
        want = self.templates[kind].replace(b"TEMPLATE", model.encode())
        if normalized(data) != want:
            self.errors.append(f"{model}: response altered: {data[:200]!r}")


def _templates(base: str) -> dict[str, bytes]:
    """Uninstrumented answers, normalized, with the model name as a placeholder."""
    with httpx.Client(headers=FAST, timeout=10) as client:
        stream = client.post(base + CHAT, json=chat("TEMPLATE")).content
        whole = client.post(base + CHAT, json=chat("TEMPLATE", stream=False)).content
    return {"stream": normalized(stream), "json": normalized(whole)}


def _covered(start: float, end: float, toggles: list[tuple[float, float, bool]]) -> bool | None:
    """True if instrumentation was on for the whole call (the last toggle before the call
    finished before it started, and turned it on; the next one began after the call ended),
    False if it was off for the whole call, None if a toggle overlapped the call."""
    state = False  # uninstrumented before the first toggle
    for begin, finish, on in toggles:
        if finish <= start:
            state = on
        elif begin >= end:
            return state
        else:
            return None
    return state


def test_toggling_instrumentation_while_calling(sim: Any) -> None:
    from otel_llm.capture.install import _is_ours, _layers
    from otel_llm_testing.otel import make_otel

    assert not otel_llm.is_instrumented()
    reset_log_once()
    hooks = _hooks_installed()
    originals = [owner.__dict__[name] for owner, name in hooks]
    base = sim.base_url
    templates = _templates(base)
    state = make_otel()
    stop = threading.Event()
    toggles: list[tuple[float, float, bool]] = []

    def sync_caller(caller: ToggleCaller, lib: Any, stream: bool, fresh: bool, host: str) -> None:
        client = None if fresh else lib.Client(headers=FAST, timeout=10)
        url = f"http://{host}:{sim.port}{CHAT}"
        for i in itertools.count():
            if stop.is_set():
                break
            model = f"{caller.name}-{i}"
            start = perf()
            try:
                if fresh:  # a new connection per call: the DNS and connect hooks toggle too
                    with lib.Client(headers=FAST, timeout=10) as one:
                        data = one.post(url, json=chat(model, stream=stream)).content
                else:
                    data = client.post(url, json=chat(model, stream=stream)).content
            except Exception as exc:
                caller.errors.append(f"{model}: {exc!r}")
                continue
            caller.records.append((model, start, perf()))
            caller.check("stream" if stream else "json", model, data)
        if client is not None:
            client.close()

    def async_caller(caller: ToggleCaller) -> None:
        async def task(client: httpx.AsyncClient, t: int) -> None:
            for i in itertools.count():
                if stop.is_set():
                    break
                model = f"{caller.name}{t}-{i}"
                start = perf()
                try:
                    async with client.stream("POST", base + CHAT, json=chat(model)) as response:
                        data = await response.aread()
                except Exception as exc:
                    caller.errors.append(f"{model}: {exc!r}")
                    continue
                caller.records.append((model, start, perf()))
                caller.check("stream", model, data)

        async def main() -> None:
            async with httpx.AsyncClient(headers=FAST, timeout=10) as client:
                await asyncio.gather(*(task(client, t) for t in range(4)))

        asyncio.run(main())

    callers = [ToggleCaller(name, templates) for name in ("sync", "sync2json", "fresh", "async")]
    threads = [
        threading.Thread(target=sync_caller, args=(callers[0], httpx, True, False, "127.0.0.1")),
        threading.Thread(target=sync_caller, args=(callers[1], httpx2, False, False, "127.0.0.1")),
        threading.Thread(target=sync_caller, args=(callers[2], httpx, True, True, "localhost")),
        threading.Thread(target=async_caller, args=(callers[3],)),
    ]
    rng = random.Random(7)
    toggle_errors: list[str] = []
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.05)
        for i in range(TOGGLES * 2 + 1):  # on, off, on, ..., on
            on = i % 2 == 0
            begin = perf()
            try:
                if on:
                    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                                        **NO_PROBES)
                else:
                    otel_llm.uninstrument()
            except Exception as exc:
                toggle_errors.append(repr(exc))
            toggles.append((begin, perf(), on))
            time.sleep(rng.choice((0.0, 0.002, 0.015)))  # some periods long enough to hold whole calls
        time.sleep(0.1)  # calls fully inside the final "on" period
        layers = {f"{owner.__name__}.{name}": sum(1 for layer in _layers(owner, name) if _is_ours(layer))
                  for owner, name in hooks}
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        otel_llm.uninstrument()
    restored = [owner.__dict__[name] for owner, name in hooks]

    assert toggle_errors == []
    assert layers == {key: 1 for key in layers}, layers
    assert all(now is before for now, before in zip(restored, originals)), "uninstrument() did not restore the hooks"
    for caller in callers:
        assert caller.errors == [], caller.errors[:5]
    spans = Counter(str(c.attributes[sc.GEN_AI_REQUEST_MODEL]) for c in state.calls())
    covered = Counter()
    for caller in callers:
        for model, start, end in caller.records:
            expect = _covered(start, end, toggles)
            covered[expect] += 1
            if expect is True:
                assert spans[model] == 1, f"{model} ran while instrumented but has {spans[model]} call spans"
            elif expect is False:
                assert spans[model] == 0, f"{model} ran while uninstrumented but has a call span"
            else:
                assert spans[model] <= 1, f"{model} has {spans[model]} call spans"
    made = {model for caller in callers for model, _, _ in caller.records}
    assert set(spans) <= made, "a span for a call that never completed"
    print(f"toggled {TOGGLES} times; calls fully instrumented {covered[True]}, fully uninstrumented "
          f"{covered[False]}, overlapping a toggle {covered[None]} ({sum(spans.values())} call spans)")
    assert covered[True] >= 30 and covered[False] >= 30  # both situations really happened


def test_active_requests_metric_survives_reinstrumentation(sim: Any) -> None:
    """llm.client.active_requests must count the current session's calls in flight after an
    uninstrument()/instrument() cycle on the same meter provider (the SDK returns the first
    registration of an observable instrument and ignores the new callback)."""
    from otel_llm.instrumentor import current_telemetry
    from otel_llm_testing.otel import make_otel

    assert not otel_llm.is_instrumented()
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider, **NO_PROBES)
    otel_llm.uninstrument()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider, **NO_PROBES)
    try:
        thread = threading.Thread(target=httpx.post, args=(sim.base_url + CHAT,),
                                  kwargs={"json": chat("slow"), "headers": {**FAST, "x-sim-headers-delay": "0.5"},
                                          "timeout": 10})
        thread.start()
        telemetry = current_telemetry()
        deadline = perf() + 5
        while telemetry is not None and not any(telemetry.in_flight.by_server.values()) and perf() < deadline:
            time.sleep(0.005)
        observed = {point.attributes[sc.SERVER_PORT]: point.value
                    for point in state.metrics().get(sc.METRIC_ACTIVE_REQUESTS, [])}
        thread.join(10)
    finally:
        otel_llm.uninstrument()
    assert observed.get(sim.port) == 1, f"active requests observed {observed} while one call was in flight"


if __name__ == "__main__":  # the exporter-down application, run in a child process
    if sys.argv[1:2] == ["exporter-down"]:
        _exporter_down_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6] == "1")
    elif sys.argv[1:2] == ["gc-inside-lock"]:
        _gc_inside_lock_child(sys.argv[2])
