"""One configuration of ``benchmarks/peers.py``, in its own process (and, for peers, its own
virtualenv): instrument once, then run the workloads the parent asks for against the simulator,
one at a time, for the whole run (so the parent can alternate configurations workload by
workload while every process keeps its warm connections).

This file imports only the standard library, the clients (httpx, openai with httpx2) and the
OpenTelemetry SDK, plus the configuration's own package (otel_llm, openlit or traceloop-sdk), so
it runs under any of the virtualenvs that ``peers.py`` prepares.

    python _peers_worker.py COMMAND_FD REPLY_FD

Commands are JSON lines on COMMAND_FD, replies JSON lines on REPLY_FD (stdout stays free for
whatever the peers print): ``setup`` {"spec": {"config", "base_url", "model", "content"}} first,
then ``run`` {"workload": {"name", "client": "httpx"|"openai", "kind": "call"|"stream"|"async",
"tokens", "count" (calls, streams or batches), "concurrency"}, "warmup"}, ``tracemalloc``,
``soak``, ``profile``, and ``finish`` (peak RSS, metric names) last.

CPU is ``time.process_time()`` of this whole process, so export threads and any background thread
a configuration starts are included; every measured block ends with a flush of the span pipeline.
TTFT is client-side: from just before the request is made to the first chunk that carries
generated text ("tok0" on raw streams, a non-empty ``delta.content`` through openai); for
non-streamed calls it is the time to the complete answer.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import resource
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Callable

perf = time.perf_counter
SHORT = 16
CLIENTS = ("httpx", "openai")
MESSAGES = [{"role": "user", "content": "hi"}]
TTFT_PATTERN = re.compile(r"time_to_first_(token|chunk)|ttft|first_token", re.I)
PHASE_PATTERN = re.compile(r"connect|upload|server_wait|first_token|decode|prefill|queue|ttfb|dns|tls", re.I)
NATIVE_PATTERN = re.compile(
    r"^llm\.runtime\.|timings|prompt_eval|eval_duration|predicted_|prompt_ms|load_duration|queue_time"
    r"|inference_time|time_per_token", re.I)


def rss_now_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# -- the common sink -----------------------------------------------------------------------------

class Pipeline:
    """Spans go through a BatchSpanProcessor to a no-op exporter that counts them (and keeps them
    while ``recording``); metrics into an in-memory reader or a no-op periodic exporter."""

    def __init__(self) -> None:
        self.count = 0
        self.recording: list[Any] | None = None
        self.tracer_provider: Any = None
        self.meter_provider: Any = None
        self.metric_reader: Any = None
        self.metric_names: set[str] = set()
        self.notes: list[str] = []

    def exporter(self) -> Any:
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        pipeline = self

        class SinkExporter(SpanExporter):
            def export(self, spans: Any) -> Any:
                pipeline.count += len(spans)
                if pipeline.recording is not None:
                    pipeline.recording.extend(spans)
                return SpanExportResult.SUCCESS

            def shutdown(self) -> None:
                pass

        return SinkExporter()

    def metric_exporter(self) -> Any:
        from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

        pipeline = self

        class NamesMetricExporter(MetricExporter):
            def __init__(self) -> None:
                super().__init__()

            def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
                pipeline.metric_names.update(_metric_names(metrics_data))
                return MetricExportResult.SUCCESS

            def force_flush(self, timeout_millis: float = 10_000) -> bool:
                return True

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                pass

        return NamesMetricExporter()

    def sdk_providers(self) -> tuple[Any, Any]:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(BatchSpanProcessor(self.exporter()))
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])
        return self.tracer_provider, self.meter_provider

    def flush(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()

    def collect_metric_names(self) -> list[str]:
        if self.metric_reader is not None:
            self.metric_names.update(_metric_names(self.metric_reader.get_metrics_data()))
        elif self.meter_provider is not None:
            try:
                self.meter_provider.force_flush()
            except Exception as exc:  # a peer's provider: report, do not fail the run
                self.notes.append(f"meter flush failed: {exc!r}")
        return sorted(self.metric_names)


def _metric_names(data: Any) -> set[str]:
    names: set[str] = set()
    for resource_metrics in getattr(data, "resource_metrics", None) or []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                names.add(metric.name)
    return names


# -- configurations ------------------------------------------------------------------------------

def setup(config: str, pipeline: Pipeline, content: bool) -> dict[str, str | None]:
    """Instrument this process as ``config`` does by default; returns the versions in use."""
    versions = {"openai": version("openai"), "httpx": version("httpx"), "httpx2": version("httpx2")}
    if config == "none":
        return versions
    versions["opentelemetry-sdk"] = version("opentelemetry-sdk")
    if config == "httpx-official":
        from opentelemetry.instrumentation import httpx as official

        tracer_provider, meter_provider = pipeline.sdk_providers()
        official.HTTPXClientInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        if hasattr(official, "HTTPX2ClientInstrumentor"):  # openai 3.x sends through httpx2
            official.HTTPX2ClientInstrumentor().instrument(tracer_provider=tracer_provider,
                                                           meter_provider=meter_provider)
        else:
            pipeline.notes.append("this opentelemetry-instrumentation-httpx has no httpx2 instrumentor")
        versions["opentelemetry-instrumentation-httpx"] = version("opentelemetry-instrumentation-httpx")
    elif config == "otel_llm":
        import otel_llm

        tracer_provider, meter_provider = pipeline.sdk_providers()
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        versions["otel-llm"] = getattr(otel_llm, "__version__", None)
    elif config == "openlit":
        _setup_openlit(pipeline, content)
        versions["openlit"] = version("openlit")
        versions["opentelemetry-instrumentation-httpx"] = version("opentelemetry-instrumentation-httpx")
    elif config == "openllmetry":
        _setup_traceloop(pipeline)
        versions["traceloop-sdk"] = version("traceloop-sdk")
        versions["opentelemetry-instrumentation-openai"] = version("opentelemetry-instrumentation-openai")
    else:
        raise SystemExit(f"unknown configuration {config!r}")
    return versions


def _setup_openlit(pipeline: Pipeline, content: bool) -> None:
    """openlit reuses SDK providers already installed globally, so ours are installed first;
    events (log records) go to a no-op exporter through a batch processor, pricing comes from an
    empty local file (the default downloads it), no GPU or system metrics."""
    from opentelemetry import _logs, metrics, trace
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter

    class NoopLogExporter(LogRecordExporter):
        def export(self, batch: Any) -> Any:
            from opentelemetry.sdk._logs.export import LogRecordExportResult

            return LogRecordExportResult.SUCCESS

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return True

        def shutdown(self) -> None:
            pass

    tracer_provider, meter_provider = pipeline.sdk_providers()
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(NoopLogExporter()))
    _logs.set_logger_provider(logger_provider)
    with tempfile.TemporaryDirectory(prefix="peers-openlit-") as tmp:
        pricing = os.path.join(tmp, "pricing.json")
        with open(pricing, "w") as handle:
            handle.write("{}")
        import openlit

        openlit.init(pricing_json=pricing, collect_gpu_stats=False, collect_system_metrics=False,
                     capture_message_content=content)


def _setup_traceloop(pipeline: Pipeline) -> None:
    """Traceloop adds the given processor to the global SDK tracer provider if there is one, and
    builds its own MeterProvider around the given metric exporter (a periodic reader); its
    anonymous telemetry is off (also TRACELOOP_TELEMETRY=false in the environment)."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    pipeline.tracer_provider = TracerProvider()
    trace.set_tracer_provider(pipeline.tracer_provider)
    from traceloop.sdk import Traceloop

    Traceloop.init(app_name="peers-bench", processor=BatchSpanProcessor(pipeline.exporter()),
                   metrics_exporter=pipeline.metric_exporter(), telemetry_enabled=False, disable_batch=False)
    provider = metrics.get_meter_provider()
    if hasattr(provider, "force_flush"):
        pipeline.meter_provider = provider


# -- workloads -----------------------------------------------------------------------------------

class Clients:
    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.url = f"{base_url}/v1/chat/completions"
        self.model = model
        self._httpx: Any = None
        self._openai: Any = None

    def body(self, tokens: int, stream: bool) -> dict[str, Any]:
        return {"model": self.model, "messages": MESSAGES, "max_tokens": tokens, "stream": stream}

    @property
    def httpx(self) -> Any:
        if self._httpx is None:
            import httpx

            self._httpx = httpx.Client(timeout=60)
        return self._httpx

    @property
    def openai(self) -> Any:
        if self._openai is None:
            import openai

            self._openai = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="sim", max_retries=0, timeout=60)
        return self._openai

    # each returns (ttft seconds, chunks received by the application)
    def httpx_call(self, tokens: int) -> tuple[float, int]:
        start = perf()
        response = self.httpx.post(self.url, json=self.body(tokens, False))
        response.read()
        return perf() - start, 1

    def httpx_stream(self, tokens: int) -> tuple[float, int]:
        start = perf()
        first = 0.0
        chunks = 0
        with self.httpx.stream("POST", self.url, json=self.body(tokens, True)) as response:
            for chunk in response.iter_raw():
                chunks += 1
                if not first and b"tok0" in chunk:
                    first = perf() - start
        return first, chunks

    def openai_call(self, tokens: int) -> tuple[float, int]:
        start = perf()
        self.openai.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=tokens)
        return perf() - start, 1

    def openai_stream(self, tokens: int) -> tuple[float, int]:
        start = perf()
        first = 0.0
        chunks = 0
        stream = self.openai.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=tokens,
                                                     stream=True)
        for chunk in stream:
            chunks += 1
            if not first and chunk.choices and chunk.choices[0].delta.content:
                first = perf() - start
        return first, chunks

    def close(self) -> None:
        if self._httpx is not None:
            self._httpx.close()
        if self._openai is not None:
            self._openai.close()


def _async_runner(clients: Clients, client: str) -> tuple[Any, Callable[[Any, int], Any], Callable[[Any], Any]]:
    """(factory of the async client, one stream coroutine, closer)."""
    if client == "httpx":
        import httpx

        def make() -> Any:
            return httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1000,
                                                                        max_keepalive_connections=1000))

        async def one(session: Any, tokens: int) -> tuple[float, int]:
            start = perf()
            first = 0.0
            chunks = 0
            async with session.stream("POST", clients.url, json=clients.body(tokens, True)) as response:
                async for chunk in response.aiter_raw():
                    chunks += 1
                    if not first and b"tok0" in chunk:
                        first = perf() - start
            return first, chunks

        async def close(session: Any) -> None:
            await session.aclose()

        return make, one, close

    import openai

    def make() -> Any:
        return openai.AsyncOpenAI(base_url=f"{clients.base_url}/v1", api_key="sim", max_retries=0, timeout=60)

    async def one(session: Any, tokens: int) -> tuple[float, int]:
        start = perf()
        first = 0.0
        chunks = 0
        stream = await session.chat.completions.create(model=clients.model, messages=MESSAGES, max_tokens=tokens,
                                                       stream=True)
        async for chunk in stream:
            chunks += 1
            if not first and chunk.choices and chunk.choices[0].delta.content:
                first = perf() - start
        return first, chunks

    async def close(session: Any) -> None:
        await session.close()

    return make, one, close


def _spans_summary(spans: list[Any], calls: int) -> dict[str, Any]:
    """What one (or a few) probe call(s) produced."""
    ids = {span.context.span_id for span in spans}
    names: dict[str, int] = {}
    keys: set[str] = set()
    children: list[str] = []
    for span in spans:
        names[span.name] = names.get(span.name, 0) + 1
        keys.update((span.attributes or {}).keys())
        parent = getattr(span, "parent", None)
        if parent is not None and parent.span_id in ids:
            children.append(span.name)
    phase_children = sorted({name for name in children if PHASE_PATTERN.search(name)})
    return {
        "probe_calls": calls,
        "span_names": names,
        "attribute_keys": sorted(keys),
        "child_spans": sorted(set(children)),
        "phase_spans": phase_children,
        "ttft_keys": sorted(k for k in keys if TTFT_PATTERN.search(k)),
        "native_keys": sorted(k for k in keys if NATIVE_PATTERN.search(k)),
    }


class Worker:
    """The instrumented process: runs one command at a time, for as long as the parent wants."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.pipeline = Pipeline()
        started = perf()
        self.versions = setup(spec["config"], self.pipeline, bool(spec.get("content", True)))
        self.clients = Clients(spec["base_url"], spec.get("model", "sim-model"))
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, Any] = {}  # async client per kind, kept (with its pool) across runs
        self.clients.httpx_call(SHORT)  # imports and first connections before the RSS reference point
        self.clients.openai_call(SHORT)
        self.setup = {"config": spec["config"], "versions": self.versions, "python": sys.version.split()[0],
                      "setup_seconds": perf() - started, "rss_after_setup_mb": rss_now_mb()}

    def session(self, client: str) -> tuple[Any, Callable[[Any, int], Any], bool]:
        make, one, _ = _async_runner(self.clients, client)
        fresh = client not in self.sessions
        if fresh:
            self.sessions[client] = make()
        return self.sessions[client], one, fresh

    def probe(self, call: Callable[[], Any], calls: int) -> dict[str, Any]:
        """Run ``call`` with the exported spans kept: what the configuration produced."""
        self.pipeline.flush()
        self.pipeline.recording = []
        call()
        self.pipeline.flush()
        spans, self.pipeline.recording = self.pipeline.recording, None
        return _spans_summary(spans, calls)

    def run(self, work: dict[str, Any], warmup: int) -> dict[str, Any]:
        tokens, count = int(work["tokens"]), int(work["count"])
        if work["kind"] == "async":
            return self._run_async(work, warmup)
        one = {("httpx", "call"): self.clients.httpx_call, ("httpx", "stream"): self.clients.httpx_stream,
               ("openai", "call"): self.clients.openai_call, ("openai", "stream"): self.clients.openai_stream}[
            (work["client"], work["kind"])]
        probe = self.probe(lambda: one(tokens), 1)
        for _ in range(warmup):
            one(tokens)
        return self._timed(lambda: [one(tokens) for _ in range(count)], count, probe)

    def _run_async(self, work: dict[str, Any], warmup: int) -> dict[str, Any]:
        tokens, batches, concurrency = int(work["tokens"]), int(work["count"]), int(work["concurrency"])
        session, one, fresh = self.session(work["client"])

        def batch(size: int) -> list[tuple[float, int]]:
            async def gather() -> list[tuple[float, int]]:
                return list(await asyncio.gather(*(one(session, tokens) for _ in range(size))))

            return self.loop.run_until_complete(gather())

        probe_calls = min(concurrency, 4)
        probe = self.probe(lambda: batch(probe_calls), probe_calls)
        if fresh:  # one full batch first: the pool then holds a connection per stream
            batch(concurrency)
        for _ in range(warmup // 3):
            batch(probe_calls)
        return self._timed(lambda: [item for _ in range(batches) for item in batch(concurrency)],
                           batches * concurrency, probe)

    def _timed(self, work: Callable[[], list[tuple[float, int]]], requests: int,
               probe: dict[str, Any]) -> dict[str, Any]:
        self.pipeline.flush()
        gc.collect()
        spans_before = self.pipeline.count
        cpu_start = time.process_time()
        wall_start = perf()
        done = work()
        self.pipeline.flush()
        cpu = time.process_time() - cpu_start
        wall = perf() - wall_start
        return {"requests": requests, "cpu": cpu, "wall": wall, "chunks": sum(n for _, n in done),
                "ttfts": [round(t, 7) for t, _ in done], "spans": self.pipeline.count - spans_before, "probe": probe}

    def tracemalloc_peaks(self, concurrency: int, tokens: int) -> dict[str, float]:
        """Peak Python allocations during one batch of concurrent streams, per client (asked for
        after the timed work, so tracing slows nothing that is measured)."""
        peaks = {}
        for client in CLIENTS:
            session, one, fresh = self.session(client)

            async def gather() -> None:
                await asyncio.gather(*(one(session, tokens) for _ in range(concurrency)))

            if fresh:
                self.loop.run_until_complete(gather())
            self.pipeline.flush()
            gc.collect()
            tracemalloc.start()
            try:
                self.loop.run_until_complete(gather())
                self.pipeline.flush()
                peaks[client] = tracemalloc.get_traced_memory()[1] / 2**20
            finally:
                tracemalloc.stop()
        return peaks

    def soak(self, calls: int, checkpoints: list[int], tokens: int) -> dict[str, Any]:
        """``calls`` calls cycling through non-streamed and streamed calls with raw httpx and
        openai; RSS and traced Python memory at each checkpoint (after a flush and a full
        collection), and where traced memory grew between the first and the last checkpoint."""
        clients, pipeline = self.clients, self.pipeline
        kinds = [clients.httpx_call, clients.httpx_stream, clients.openai_call, clients.openai_stream]
        for _ in range(50):  # warm every path before tracing starts
            for kind in kinds:
                kind(tokens)
        pipeline.flush()
        gc.collect()
        tracemalloc.start(1)
        points = []
        first_snapshot: Any = None
        started = perf()

        def record(done: int) -> None:
            pipeline.flush()
            gc.collect()
            current, _ = tracemalloc.get_traced_memory()
            points.append({"calls": done, "rss_mb": rss_now_mb(), "max_rss_mb": peak_rss_mb(),
                           "traced_mb": current / 2**20, "elapsed": perf() - started})
            print(f"soak: {done} calls, RSS {points[-1]['rss_mb']:.1f} MB, traced {points[-1]['traced_mb']:.2f} MB",
                  file=sys.stderr, flush=True)

        record(0)
        done = 0
        for checkpoint in sorted(int(c) for c in checkpoints if int(c) <= calls):
            while done < checkpoint:
                kinds[done % len(kinds)](tokens)
                done += 1
            record(done)
            if first_snapshot is None:
                first_snapshot = tracemalloc.take_snapshot()
        growth = []
        if first_snapshot is not None and len(points) > 2:
            for stat in tracemalloc.take_snapshot().compare_to(first_snapshot, "lineno")[:8]:
                if stat.size_diff > 0:
                    frame = stat.traceback[0]
                    growth.append({"where": f"{frame.filename}:{frame.lineno}", "size_diff": stat.size_diff,
                                   "count_diff": stat.count_diff})
        tracemalloc.stop()
        return {"points": points, "top_growth": growth, "spans": pipeline.count}

    def profile(self, works: list[dict[str, Any]], warmup: int, path: str) -> dict[str, Any]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        for work in works:
            self.run(work, warmup)
        profiler.disable()
        profiler.dump_stats(path)
        return {"path": path}

    def finish(self) -> dict[str, Any]:
        return {**self.setup, "peak_rss_mb": peak_rss_mb(), "rss_now_mb": rss_now_mb(),
                "metric_names": self.pipeline.collect_metric_names(), "notes": self.pipeline.notes}


def serve(commands: Any, replies: Any) -> None:
    """One JSON command per line in, one JSON reply per line out: {"ok": true, "result": ...} or
    {"ok": false, "error": ...}. The first command is the setup."""
    worker: Worker | None = None
    for line in commands:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "setup":
                worker = Worker(command["spec"])
                result: Any = worker.setup
            else:
                assert worker is not None, "setup first"
                if op == "run":
                    result = worker.run(command["workload"], int(command.get("warmup", 3)))
                elif op == "tracemalloc":
                    result = worker.tracemalloc_peaks(int(command["concurrency"]), int(command["tokens"]))
                elif op == "soak":
                    result = worker.soak(int(command["calls"]), command["checkpoints"], int(command["tokens"]))
                elif op == "profile":
                    result = worker.profile(command["workloads"], int(command.get("warmup", 3)), command["path"])
                elif op == "finish":
                    result = worker.finish()
                else:
                    raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "result": result}
        except Exception as exc:  # reported to the parent, which decides
            import traceback

            reply = {"ok": False, "error": f"{exc!r}\n{traceback.format_exc()[-3000:]}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        if op == "finish" or (op == "setup" and not reply["ok"]):
            break


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: _peers_worker.py COMMAND_FD REPLY_FD (driven by benchmarks/peers.py)")
    commands = os.fdopen(int(argv[1]), "r")
    replies = os.fdopen(int(argv[2]), "w")
    serve(commands, replies)
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: the peers' exit handlers (final exports) are not part of any figure
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
