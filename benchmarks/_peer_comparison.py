"""``instructions.py --peers``: the workloads of ``peers.py`` under callgrind, for every
configuration (no instrumentation, the official httpx instrumentation, otel_llm, openlit,
OpenLLMetry), each in the virtualenv ``peers.py`` prepares for it, set up as its worker does.

Every figure is the difference of two runs (N and 2N calls after the same warm-up) over N, so
start-up and imports cancel; the main thread and all threads are reported apart, because a
thread that wakes on a timer counts more the slower callgrind makes the run (about 50x).

otel_llm runs with its observers on, as by default, but with their sampling interval stretched
(``OBSERVER_INTERVAL``) so that no timer of theirs fires inside the measured calls: under
callgrind a call lasts about 50 times longer, so a 1-second timer would land about 50 times more
often per call than in a real run, and whether its /proc scans fall in the N-call or the 2N-call
run decided the other threads' figure (from -2.4 M to +1 M per call in runs of two calls). What
the observers cost per call on the call path is still counted; what their threads cost per
second is ``benchmarks/observers.py``'s figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_peer_callgrind_run.py"
CONFIGS = ("none", "httpx-official", "otel_llm", "sdk-floor", "openlit", "openllmetry")
LOCAL = ("none", "httpx-official", "otel_llm", "sdk-floor")
# sdk-floor makes no model call: its figure is what the SDK alone spends on otel_llm's spans and
# records for one call (see _peer_callgrind_run.py), not an addition to the client's own
CHEAPER_OF = ("openlit", "openllmetry")
# (client, kind): non-streamed calls, streams on a sync client, streams on the async client
WORKLOADS = (("httpx", "call"), ("openai", "call"), ("httpx", "stream"), ("openai", "stream"), ("openai", "async"))
TARGET_PER_CALL = 0.8  # otel_llm / the cheaper peer, added per non-streamed call
TARGET_PER_STREAM = 1 / 3  # otel_llm / either peer, added per stream
TARGET_CHUNK_SHARE = 0.01  # otel_llm's added instructions per chunk / the client's own
# A peer that exports no span for a workload does not trace it (OpenLLMetry wraps the openai
# client, not raw httpx): it is left out of the ratios rather than made a reference of noise.
SPANS_FILE = "INSTRUCTIONS_SPANS_FILE"  # where the child writes how many spans it exported
OBSERVER_INTERVAL = 3600.0  # otel_llm's sample interval in the children (seconds; see above)
# The span pipeline's export thread wakes every 5 s by default; under callgrind that is every few
# calls, and how many wake-ups fall in the N-call and the 2N-call run moved otel_llm's other
# threads' figure by -0.32 M per call (six spans a call, each wake-up exporting some). Stretched
# for every configuration, the spans are exported at the final flush: all of them, counted, once.
EXPORT_DELAY_MS = 3_600_000


@dataclass(frozen=True)
class Job:
    config: str
    client: str
    kind: str
    tokens: int
    count: int


Counts = tuple[float, float, float]  # (main thread, all threads, spans exported) per call


def jobs(configs: list[str], calls: int, streams: int, tokens: int, short: int,
         workloads: tuple[tuple[str, str], ...] = WORKLOADS) -> list[Job]:
    found = []  # workload by workload, so an interrupted run has every configuration of the first
    for client, kind in workloads:
        lengths = (short,) if kind == "call" else (short, tokens)
        count = calls if kind == "call" else streams
        found += [Job(config, client, kind, length, count) for length in lengths for config in configs]
    return found


def measure(job: Job, runner: Any, base_url: str, content: bool, counts: Callable[..., tuple[int, int]],
            valgrind: str, source: Path) -> Counts:
    """Instructions of one call of ``job`` (main thread, all threads)."""
    env = dict(runner.env)
    if job.config in LOCAL:
        env["PYTHONPATH"] = str(source)
    if job.config == "otel_llm":
        env["OTEL_LLM_SAMPLE_INTERVAL"] = str(OBSERVER_INTERVAL)
    env["OTEL_BSP_SCHEDULE_DELAY"] = str(EXPORT_DELAY_MS)  # every configuration: see EXPORT_DELAY_MS
    runs, spans = [], []
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        env[SPANS_FILE] = str(Path(tmp) / "spans")
        for n in (job.count, 2 * job.count):
            command = [str(runner.python), str(CHILD), job.config, job.client, job.kind, str(job.tokens), str(n),
                       base_url, "1" if content else "0"]
            runs.append(counts(valgrind, command, env, Path(tmp)))
            spans.append(_spans_written(Path(env[SPANS_FILE])))
    return ((runs[1][0] - runs[0][0]) / job.count, (runs[1][1] - runs[0][1]) / job.count,
            (spans[1] - spans[0]) / job.count)


def _spans_written(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def run_all(todo: list[Job], runners: dict[str, Any], base_url: str, content: bool, parallel: int,
            counts: Callable[..., tuple[int, int]], valgrind: str, source: Path) -> dict[Job, Counts]:
    def one(job: Job) -> tuple[Job, Counts]:
        figure = measure(job, runners[job.config], base_url, content, counts, valgrind, source)
        print(f"  {job.config:14s} {job.client:6s} {job.kind:6s} {job.tokens:4d} tokens: "
              f"{figure[1] / 1e6:9.3f} M per call ({figure[0] / 1e6:.3f} M main thread)", file=sys.stderr, flush=True)
        return job, figure

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return dict(pool.map(one, todo))


class Table:
    """Added instructions by configuration and workload, from the measured figures."""

    def __init__(self, figures: dict[Job, Counts], short: int, tokens: int) -> None:
        self.figures = {(j.config, j.client, j.kind, j.tokens): v for j, v in figures.items()}
        self.short, self.tokens = short, tokens

    def own(self, client: str, kind: str, tokens: int, thread: int = 1) -> float | None:
        value = self.figures.get(("none", client, kind, tokens))
        return None if value is None else value[thread]

    def added(self, config: str, client: str, kind: str, tokens: int, thread: int = 1) -> float | None:
        if config == "sdk-floor":
            value = self.figures.get((config, client, kind, tokens))
            return None if value is None else value[thread]
        mine, base = self.figures.get((config, client, kind, tokens)), self.figures.get(("none", client, kind, tokens))
        return None if mine is None or base is None else mine[thread] - base[thread]

    def traces(self, config: str, client: str, kind: str, tokens: int) -> bool:
        """Whether ``config`` exported spans for the workload's calls."""
        value = self.figures.get((config, client, kind, tokens))
        return value is not None and value[2] > 0

    def per_chunk(self, config: str, client: str, kind: str) -> float | None:
        """Added (config) or own ("none") instructions per chunk: long minus short, per token."""
        if config == "none":
            long, short = self.own(client, kind, self.tokens), self.own(client, kind, self.short)
        else:
            long, short = self.added(config, client, kind, self.tokens), self.added(config, client, kind, self.short)
        return None if long is None or short is None else (long - short) / (self.tokens - self.short)


def _m(value: float | None, sign: str = "+") -> str:
    return "-" if value is None else f"{value / 1e6:{sign}.2f} M"


def report(table: Table, configs: list[str], missing: dict[str, str]) -> list[str]:
    """Print the tables; return the ratio lines (also printed)."""
    others = [c for c in configs if c != "none"]
    rows = [(client, kind, table.short if kind == "call" else table.tokens) for client, kind in WORKLOADS]
    print("== instructions per call: the client's own, and what each configuration adds (all threads;"
          " for otel_llm, its other threads' part in brackets: the observers' timers; spans are exported"
          " on the application's thread, at the final flush)")
    print(f"{'workload':22s}{'client itself':>15s}" + "".join(f"{c:>20s}" for c in others))
    for client, kind, tokens in rows:
        if table.own(client, kind, tokens) is None and all(table.added(c, client, kind, tokens) is None
                                                           for c in others):
            continue  # not measured in this run
        label = f"{client} {'call' if kind == 'call' else f'{kind} {tokens}'}"
        cells = []
        for config in others:
            total = table.added(config, client, kind, tokens)
            text = _m(total)
            if config == "otel_llm" and total is not None:
                main = table.added(config, client, kind, tokens, thread=0) or 0.0
                text += f" ({(total - main) / 1e6:.2f})"
            elif config in CHEAPER_OF and total is not None and not table.traces(config, client, kind, tokens):
                text += " no span"
            cells.append(f"{text:>20s}")
        print(f"{label:22s}{_m(table.own(client, kind, tokens), ''):>15s}" + "".join(cells))
    header = f"== per chunk ({table.tokens}-token stream minus {table.short}-token, per token; k instructions)"
    for client, kind in WORKLOADS:
        if kind == "call":
            continue
        values = [table.per_chunk(c, client, kind) for c in ["none", *others]]
        if all(v is None for v in values):
            continue
        if header:
            print(header)
            header = ""
        print(f"{client + ' ' + kind:22s}"
              + "".join(f"{'-' if v is None else f'{v / 1e3:.1f}':>15s}" for v in values[:1])
              + "".join(f"{'-' if v is None else f'{v / 1e3:+.1f}':>20s}" for v in values[1:]))
    for name, why in missing.items():
        print(f"not measured: {name}: {why}")
    lines = ratios(table)
    for line in lines:
        print(line)
    return lines


def ratios(table: Table) -> list[str]:
    lines = []
    for client in ("httpx", "openai"):
        ours = table.added("otel_llm", client, "call", table.short)
        peers = [v for p in CHEAPER_OF if (v := table.added(p, client, "call", table.short)) is not None
                 and table.traces(p, client, "call", table.short)]
        if ours is not None and peers:
            ratio = ours / min(peers)
            lines.append(f"otel_llm / the cheaper of openlit and openllmetry (of those that trace it), added per call "
                         f"({client}): {ratio:.2f}x "
                         f"(target <= {TARGET_PER_CALL}x) {'ok' if ratio <= TARGET_PER_CALL else 'OFF'}")
            # the observers' timers fire by the wall clock, which callgrind slows about 50x: how
            # many land in the N-call and the 2N-call run varies (-0.32 M to +0.96 M per call seen)
            main = table.added("otel_llm", client, "call", table.short, thread=0)
            main_peers = [table.added(p, client, "call", table.short, thread=0) for p in CHEAPER_OF
                          if table.traces(p, client, "call", table.short)]
            if main is not None and all(v is not None for v in main_peers):
                lines.append(f"  on the application's thread alone (span export included, the observers' timers "
                             f"not): {main / min(main_peers):.2f}x")  # type: ignore[type-var]
        floor = table.added("sdk-floor", client, "call", table.short)
        if floor is not None and ours:
            # on the application's thread both do the same span and record calls; the export
            # thread's work is in both totals, otel_llm's observers only in its own
            own = (table.added("otel_llm", client, "call", table.short, thread=0) or 0.0) - (
                table.added("sdk-floor", client, "call", table.short, thread=0) or 0.0)
            line = (f"the SDK's part of what otel_llm adds per call ({client}): {floor / 1e6:.2f} M of "
                    f"{ours / 1e6:.2f} M ({floor / ours:.0%}); otel_llm's own code on the application's thread "
                    f"{own / 1e6:.2f} M")
            if peers:
                line += f"; the SDK's part alone is {floor / min(peers):.2f}x the cheaper peer"
            lines.append(line)
    for client, kind in (("httpx", "stream"), ("openai", "stream"), ("openai", "async")):
        ours = table.added("otel_llm", client, kind, table.tokens)
        for peer in CHEAPER_OF:
            theirs = table.added(peer, client, kind, table.tokens)
            if ours is not None and theirs is not None and table.traces(peer, client, kind, table.tokens):
                ratio = ours / theirs
                lines.append(f"otel_llm / {peer}, added per {table.tokens}-token stream ({client} {kind}): "
                             f"{ratio:.2f}x (target <= {TARGET_PER_STREAM:.2f}x) "
                             f"{'ok' if ratio <= TARGET_PER_STREAM else 'OFF'}")
    ours, own = table.per_chunk("otel_llm", "openai", "async"), table.per_chunk("none", "openai", "async")
    if ours is not None and own:
        share = ours / own
        lines.append(f"otel_llm added per chunk (openai async): {ours / 1e3:.1f} k instructions, {share:.1%} of the "
                     f"client's own {own / 1e3:.0f} k (target <= {TARGET_CHUNK_SHARE:.0%}) "
                     f"{'ok' if share <= TARGET_CHUNK_SHARE else 'OFF'}")
    return lines


def main(args: argparse.Namespace, counts: Callable[..., tuple[int, int]], valgrind: str, source: Path,
         short: int) -> int:
    sys.path.insert(0, str(HERE))
    import peers

    from otel_llm.tools.sim import SimProcess
    from otel_llm_testing.llama_server import DEFAULT_CACHE

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "none" not in configs:
        configs.insert(0, "none")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configuration(s): {', '.join(sorted(unknown))} (known: {', '.join(CONFIGS)})")
    found, missing = peers.prepare([c for c in configs if c != "sdk-floor"], DEFAULT_CACHE, not args.no_install,
                                   not args.no_content)
    runners = {r.name: r for r in found}
    if "sdk-floor" in configs:
        runners["sdk-floor"] = runners["none"]
    configs = [c for c in configs if c in runners]
    wanted = tuple(tuple(w.strip().split("/", 1)) for w in args.peer_workloads.split(",") if w.strip())
    if not wanted or set(wanted) - set(WORKLOADS):
        raise SystemExit(f"--peer-workloads must be among {', '.join('/'.join(w) for w in WORKLOADS)}")
    todo = jobs(configs, args.calls, args.streams, args.tokens, short, wanted)
    with SimProcess(runtime=args.runtime, headers_delay=0.0, first_token_delay=0.0, token_interval=0.0,
                    tokens=args.tokens) as sim:
        figures = run_all(todo, runners, sim.base_url, not args.no_content, args.parallel, counts, valgrind, source)
    table = Table(figures, short, args.tokens)
    report(table, configs, missing)
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"config": j.config, "client": j.client, "kind": j.kind, "tokens": j.tokens, "main": v[0], "total": v[1],
              "spans": v[2]}
             for j, v in figures.items()], indent=1))
    return 0
