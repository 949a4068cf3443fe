"""Instructions otel_llm adds per model call and per streamed call, counted by callgrind.

Wall-clock CPU on a shared virtual machine cannot resolve a few microseconds; instruction counts
can: callgrind gives the same total twice for the same interpreter and inputs, whatever else the
machine does. Each (stack, configuration, workload) runs in a child process under
``valgrind --tool=callgrind --separate-threads=yes`` twice, with N and 2N calls after the same
warm-up; the difference of the two totals (every thread summed), divided by N, is the cost of
one call, start-up and imports cancelling out. The simulator answers from another process, not
counted. Observers are off: their timer-driven threads would count more the slower callgrind
makes the run. Spans go through a BatchSpanProcessor to a no-op exporter, metrics to an SDK
MeterProvider, as in ``overhead.py``.

    python benchmarks/instructions.py [--stacks httpx,aiohttp,requests] [--calls 30] [--streams 6] [--tokens 256]
    python benchmarks/instructions.py --peers [--configs none,httpx-official,otel_llm,sdk-floor,openlit,openllmetry]
    python benchmarks/instructions.py --records [--calls 200]
    python benchmarks/instructions.py --replay [--streams 6] [--tokens 256] [--repeat 3]
    python benchmarks/instructions.py --seam [--calls 100] [--sample-rate 0]

``--peers`` runs the workloads of ``peers.py`` instead (raw httpx and the openai client,
non-streamed calls and streams, the async openai client for per chunk) for each configuration in
its own virtualenv, and prints otel_llm's ratios to the cheaper peer (see ``_peer_comparison``).

``--records`` counts what the OpenTelemetry SDK alone spends on one histogram record, by the
number of attributes it carries and with an exemplar (recorded in a sampled span's context): the
unit cost under each of the records a model call makes.

``--seam`` counts otel_llm's own work alone: calls driven straight through capture's seam
(``LlmCall`` on the session's sink; no HTTP stack, socket or simulator, see ``_seam_cost.py``),
per call (N and 3N calls of 20 chunks) and per chunk (20 and 220 chunks a call). It moves only
when otel_llm's call path does: the figure to compare before and after a change to it. With
``--sample-rate R`` otel_llm decides after each call: 1 keeps every call, 0 drops every one (what a
dropped call still costs: capture, the build, the metrics).

``--replay`` gives the per-chunk figure of the async openai client without a live stream: the
simulator's stream is recorded once and split into its events, and each child replays them
through httpx2's real transport (see ``_chunk_replay``), so the figure moves little between runs.

Twelve child processes per stack, each about a minute. Needs valgrind. Per chunk is the slope
between a 16-token and a ``--tokens`` stream (the simulator sends one network chunk per token).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STACKS = ("httpx", "aiohttp", "requests")
SHORT = 16
_TOTAL = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)
_MAIN_THREAD = re.compile(r"^thread:\s+1$", re.MULTILINE)

CHILD = r'''
import asyncio, json, sys
config, stack, count, tokens, url = sys.argv[1:6]
count, tokens = int(count), int(tokens)  # tokens 0: a non-streamed call
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
body = {**body, "stream": True, "max_tokens": tokens} if tokens else {**body, "max_tokens": 16}
if config == "otel_llm":
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    import otel_llm
    class Noop(SpanExporter):
        def export(self, spans): return SpanExportResult.SUCCESS
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Noop()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider,
                        host_metrics=False, gpu_metrics=False, runtime_metrics=False)
if stack == "httpx":
    import httpx
    client = httpx.Client()
    def one():
        with client.stream("POST", url, json=body) as response:
            for _ in response.iter_raw():
                pass
    def run(n):
        for _ in range(n):
            one()
elif stack == "requests":
    import requests
    session = requests.Session()
    def run(n):
        for _ in range(n):
            with session.post(url, json=body, stream=True) as response:
                for _ in response.iter_content(None):
                    pass
else:
    import aiohttp
    async def block(n):
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                async with session.post(url, json=body) as response:
                    async for _ in response.content.iter_any():
                        pass
    loop = asyncio.new_event_loop()
    def run(n):
        loop.run_until_complete(block(n))
run(3)
run(count)
if config == "otel_llm":
    tracer_provider.force_flush()
    otel_llm.uninstrument()
'''

# One histogram record into an SDK MeterProvider, as otel_llm's records are made (advisory
# buckets, a context without a span unless the record is to offer an exemplar).
RECORDS_CHILD = r'''
import sys
attributes, exemplar, count = map(int, sys.argv[1:4])
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("records")
histogram = meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=[0.01, 0.1, 1.0, 10.0])
pairs = [("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", "llama.cpp"), ("gen_ai.request.model", "m"),
         ("gen_ai.response.model", "m"), ("server.address", "127.0.0.1"), ("server.port", 8080),
         ("gen_ai.token.type", "input"), ("llm.phase", "llm.server_wait")]
attrs = dict(pairs[:attributes])
context = Context({"otel_llm.no_span": True})
if exemplar:
    span = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(TraceFlags.SAMPLED)))
    context = trace.set_span_in_context(span, context)
def run(n):
    for _ in range(n):
        histogram.record(0.5, attrs, context)
run(3)
run(count)
'''
RECORD_CASES = ((0, 0), (3, 0), (7, 0), (6, 1))  # (attributes, exemplar): 6 + exemplar is the call duration's


SOURCE = ROOT  # the otel_llm the children import (--source: compare two checkouts)


def _counts(valgrind: str, command: list[str], env: dict[str, str], workdir: Path) -> tuple[int, int]:
    """(main thread, every thread) instructions of ``command`` run under callgrind."""
    for old in workdir.glob("callgrind.out*"):
        old.unlink()
    command = [valgrind, "--tool=callgrind", "--separate-threads=yes",
               f"--callgrind-out-file={workdir}/callgrind.out", *command]
    result = subprocess.run(command, capture_output=True, text=True, env={**env, "PYTHONHASHSEED": "0"}, check=False,
                            timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"child failed ({' '.join(command[4:])}):\n{result.stderr[-3000:]}")
    main = total = 0
    for path in workdir.glob("callgrind.out*"):
        text = path.read_text()
        found = sum(int(m) for m in _TOTAL.findall(text))
        total += found
        if _MAIN_THREAD.search(text):
            main += found
    if not total:
        raise SystemExit(f"no callgrind totals in {workdir}")
    return main, total


def _instructions(valgrind: str, args: list[str], workdir: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    return _counts(valgrind, [sys.executable, "-c", CHILD, *args], env, workdir)[1]


def per_call(valgrind: str, config: str, stack: str, count: int, tokens: int, url: str, workdir: Path) -> float:
    """Instructions of one call (``tokens`` 0: non-streamed): the difference between 2N and N
    calls, over N."""
    runs = [_instructions(valgrind, [config, stack, str(n), str(tokens), url], workdir) for n in (count, 2 * count)]
    return (runs[1] - runs[0]) / count


SEAM_CHUNKS = (20, 220)


def seam_costs(valgrind: str, count: int, workdir: Path, sample_rate: float | None = None) -> dict[str, float]:
    """otel_llm's instructions per call and per chunk through capture's seam (``_seam_cost.py``),
    with ``sample_rate`` set when given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SOURCE), str(SOURCE / "testing")])}
    script = str(Path(__file__).resolve().parent / "_seam_cost.py")

    def total(calls: int, chunks: int, chunk_metric: bool = True) -> int:
        rate = [] if sample_rate is None else [str(sample_rate)]
        child_env = env if chunk_metric else {**env, "OTEL_LLM_CHUNK_METRIC": "false"}
        return _counts(valgrind, [sys.executable, script, str(calls), str(chunks), *rate], child_env, workdir)[1]

    few, many = SEAM_CHUNKS
    base = total(count, few)
    figures = {"call": (total(3 * count, few) - base) / (2 * count),
               "chunk": (total(count, many) - base) / (count * (many - few))}
    rate = "" if sample_rate is None else f" (sample_rate {sample_rate:g})"
    print(f"through the seam{rate}: {figures['call'] / 1e3:8.1f} k instructions per call ({few} chunks), "
          f"{figures['chunk'] / 1e3:6.2f} k per chunk", flush=True)
    if sample_rate is None:  # the stream path alone, without the per-chunk histogram records
        figures["chunk_path"] = (total(count, many, False) - total(count, few, False)) / (count * (many - few))
        print(f"  with chunk_metric off: {figures['chunk_path'] / 1e3:6.2f} k per chunk; the time_per_output_chunk "
              f"records: {(figures['chunk'] - figures['chunk_path']) / 1e3:6.2f} k per chunk", flush=True)
    return figures


def record_costs(valgrind: str, count: int, workdir: Path) -> dict[str, float]:
    """Instructions of one histogram record per case of ``RECORD_CASES``, and per attribute."""
    figures = {}
    for attributes, exemplar in RECORD_CASES:
        runs = [_counts(valgrind, [sys.executable, "-c", RECORDS_CHILD, str(attributes), str(exemplar), str(n)],
                        dict(os.environ), workdir)[1] for n in (count, 2 * count)]
        key = f"{attributes}+exemplar" if exemplar else str(attributes)
        figures[key] = (runs[1] - runs[0]) / count
        label = f"{attributes} attributes" + (", with an exemplar" if exemplar else "")
        print(f"SDK histogram record, {label:30s} {figures[key] / 1e3:7.1f} k instructions", flush=True)
    figures["per_attribute"] = (figures["7"] - figures["0"]) / 7
    print(f"per attribute: {figures['per_attribute'] / 1e3:.1f} k instructions (0 to 7 attributes)")
    return figures


def _recorded(sim: object, tokens: int, path: Path) -> int:
    """The simulator's answer to a ``tokens``-token openai stream, split into its events (one
    network chunk per token, as a server flushing every token sends it), written to ``path``;
    returns the number of chunks."""
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": tokens}
    with httpx.Client(timeout=60) as client:
        response = client.post(f"{sim.base_url}/v1/chat/completions", json=body)  # type: ignore[attr-defined]
    events = [event + b"\n\n" for event in response.content.split(b"\n\n") if event.strip()]
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
               if k.lower() not in (b"content-length", b"transfer-encoding")]
    path.write_text(json.dumps({"headers": headers, "chunks": [e.decode("latin-1") for e in events]}))
    return len(events)


def chunk_replay(valgrind: str, streams: int, tokens: int, repeat: int, workdir: Path) -> dict[str, float]:
    """Instructions per chunk of the async openai client, and what otel_llm adds, from replayed
    streams: the slope between a ``SHORT``- and a ``tokens``-token stream, each run ``repeat``
    times and its median taken."""
    from otel_llm.tools.sim import SimProcess

    with SimProcess(headers_delay=0.0, first_token_delay=0.0, token_interval=0.0, tokens=tokens,
                    runtime="llama.cpp") as sim:
        lengths = {n: _recorded(sim, n, workdir / f"stream-{n}.json") for n in (SHORT, tokens)}
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}  # the child runs no thread beside the streams
    child = str(Path(__file__).resolve().parent / "_chunk_replay.py")
    chunks = streams * (lengths[tokens] - lengths[SHORT])
    slope: dict[str, float] = {}
    # otel_llm as set up by default, and without the per-chunk histogram records (the stream path)
    for name, config, extra in (("none", "none", {}), ("otel_llm", "otel_llm", {}),
                                ("path", "otel_llm", {"OTEL_LLM_CHUNK_METRIC": "false"})):
        main_thread = {}
        for n in (SHORT, tokens):
            runs = [_counts(valgrind, [sys.executable, child, config, str(workdir / f"stream-{SHORT}.json"),
                                       str(workdir / f"stream-{n}.json"), str(streams)], {**env, **extra}, workdir)[0]
                    for _ in range(repeat)]
            main_thread[n] = statistics.median(runs)
        slope[name] = (main_thread[tokens] - main_thread[SHORT]) / chunks
    figures = {"client": slope["none"], "added": slope["otel_llm"] - slope["none"],
               "path_added": slope["path"] - slope["none"]}
    figures["share"] = figures["added"] / figures["client"]
    figures["path_share"] = figures["path_added"] / figures["client"]
    print(f"per chunk, replayed ({lengths[tokens]}- minus {lengths[SHORT]}-chunk streams, {streams} each, median of "
          f"{repeat} runs, main thread): the async openai client {figures['client'] / 1e3:.1f} k instructions, "
          f"otel_llm adds {figures['added'] / 1e3:.2f} k ({100 * figures['share']:.2f} %), "
          f"{figures['path_added'] / 1e3:.2f} k with chunk_metric off ({100 * figures['path_share']:.2f} %; "
          f"target <= 1 %)")
    return figures


def _compare(figures: dict[str, dict[str, float]], tokens: int) -> None:
    """Per chunk, and each stack against the httpx path (where both were measured)."""
    reference = figures.get("httpx", {})
    if any("chunk_added" in row for row in figures.values()):
        print(f"per chunk (a {tokens}-token stream minus a {SHORT}-token one, per token):")
    for stack, row in figures.items():
        parts = []
        if "chunk_added" in row:
            parts.append(f"  {stack:9s} {row['chunk_added'] / 1e3:8.1f} k instructions added")
        if stack != "httpx":
            for key, label in (("call_added", "per call"), ("chunk_added", "per chunk")):
                if key in row and reference.get(key):
                    parts.append(f"{stack} vs the httpx path, {label}: "
                                 f"{row[key] / reference[key]:.2f}x (target <= 1.5x)")
        for part in parts:
            print(part)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default=",".join(STACKS))
    parser.add_argument("--calls", type=int, default=30, help="N non-streamed calls (and 2N)")
    parser.add_argument("--streams", type=int, default=6, help="N streamed calls (and 2N)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--workloads", default="call,short,long",
                        help="among call (non-streamed), short and long (streams; both give the per-chunk figure)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="checkout whose otel_llm the children import (default: this one)")
    parser.add_argument("--peers", action="store_true",
                        help="peers.py's workloads (raw httpx and openai) for every configuration instead of --stacks")
    parser.add_argument("--configs", default="none,httpx-official,otel_llm,sdk-floor,openlit,openllmetry",
                        help="with --peers: the configurations (peers are installed on first use)")
    parser.add_argument("--peer-workloads", default="httpx/call,openai/call,httpx/stream,openai/stream,openai/async",
                        help="with --peers: among these (streams are measured at 16 and --tokens tokens)")
    parser.add_argument("--no-install", action="store_true", help="with --peers: skip peers not installed yet")
    parser.add_argument("--no-content", action="store_true",
                        help="with --peers: the peers without prompt and completion capture (their default is on)")
    parser.add_argument("--parallel", type=int, default=2, help="with --peers: children run at once")
    parser.add_argument("--replay", action="store_true",
                        help="per chunk of the async openai client, from recorded streams replayed "
                             "(--streams, --tokens)")
    parser.add_argument("--repeat", type=int, default=3, help="with --replay: runs of each child, the median kept")
    parser.add_argument("--seam", action="store_true",
                        help="otel_llm's own cost per call and per chunk through capture's seam (no HTTP stack)")
    parser.add_argument("--sample-rate", type=float, default=None,
                        help="with --seam: instrument with this sample_rate (0: every call dropped, 1: every one kept)")
    parser.add_argument("--records", action="store_true",
                        help="the SDK's instructions per histogram record by attribute count (--calls records, and 2x)")
    parser.add_argument("--runtime", default="llama.cpp",
                        help="with --peers: the simulator's flavour (llama.cpp answers carry native counters)")
    args = parser.parse_args(argv)
    global SOURCE
    SOURCE = args.source.resolve()
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        parser.error("valgrind is not installed")
    if args.replay or args.records or args.seam:
        with tempfile.TemporaryDirectory() as tmp:
            if args.seam:
                figures = seam_costs(valgrind, args.calls, Path(tmp), args.sample_rate)
            elif args.replay:
                figures = chunk_replay(valgrind, args.streams, args.tokens, args.repeat, Path(tmp))
            else:
                figures = record_costs(valgrind, args.calls, Path(tmp))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return 0
    if args.peers:
        import _peer_comparison

        return _peer_comparison.main(args, _counts, valgrind, SOURCE, SHORT)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - {"call", "short", "long"}:
        parser.error("workloads must be among call, short, long")
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    if not stacks or set(stacks) - set(STACKS):
        parser.error(f"stacks must be among {', '.join(STACKS)}")
    from otel_llm.tools.sim import SimProcess

    figures: dict[str, dict[str, float]] = {}
    with SimProcess(headers_delay=0.0, first_token_delay=0.0, token_interval=0.0, tokens=args.tokens) as sim, \
            tempfile.TemporaryDirectory() as tmp:
        url = f"{sim.base_url}/v1/chat/completions"
        for stack in stacks:
            row = {}
            for workload, count, tokens in (("call", args.calls, 0), ("short", args.streams, SHORT),
                                            ("long", args.streams, args.tokens)):
                if workload not in workloads:
                    continue
                base = per_call(valgrind, "none", stack, count, tokens, url, Path(tmp))
                ours = per_call(valgrind, "otel_llm", stack, count, tokens, url, Path(tmp))
                row[f"{workload}_base"], row[f"{workload}_added"] = base, ours - base
                print(f"{stack:9s} {workload:6s} client {base / 1e6:8.3f} M instructions per call, "
                      f"otel_llm adds {(ours - base) / 1e6:7.3f} M", flush=True)
            if "short" in workloads and "long" in workloads:
                row["chunk_added"] = (row["long_added"] - row["short_added"]) / (args.tokens - SHORT)
            figures[stack] = row
    _compare(figures, args.tokens)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
