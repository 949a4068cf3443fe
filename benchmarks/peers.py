"""Overhead of otel_llm next to its peers: no instrumentation, the official httpx instrumentation,
otel_llm, openlit and OpenLLMetry (traceloop-sdk), measured in one run.

On loopback, against the simulator in its own process (llama.cpp flavour unless ``--runtime``
says otherwise, zero injected delays, so CPU dominates). Each configuration runs in its own worker
process (``_peers_worker.py``), started once and kept for the whole run: the local ones (none,
httpx-official, otel_llm) with this virtualenv's Python, each peer with the Python of its own
virtualenv under ``~/.cache/otel-llm/peers-<name>-<version>`` (created with pip on first use: the peers' pins
conflict with this project's), with the same client versions as here (openai, httpx, httpx2 and
their parsers pinned to this environment's). Every configuration exports spans through a
BatchSpanProcessor to the same no-op exporter, and metrics into the SDK (an in-memory reader, or
for traceloop-sdk a no-op exporter behind its own periodic reader); nothing leaves the machine
(openlit gets an empty local pricing file, Traceloop's telemetry is off). Each peer runs with
its own defaults otherwise (content capture on for both peers; ``--no-content`` turns it off).

Workloads, each with raw httpx and with the openai client (openai 3.x sends through httpx2):
non-streamed calls; streamed calls of 256 tokens; 100 concurrent async streams of 256 tokens.
Added CPU per request is the configuration's CPU (``time.process_time()`` of the worker, export
threads included) minus that of "none" in the same round; per chunk is the slope between the
256-token and the 16-token variant of the same workload, over the difference in chunks the
application received (network chunks for raw httpx, ``ChatCompletionChunk`` objects for openai),
so per-request costs cancel out. TTFT is client-side, to the first chunk with generated text.
In every round each workload is run by every configuration in turn (the order rotates from one
workload to the next), so compared figures are taken seconds apart; every figure is a median over
rounds, ratios are medians of per-round ratios. Peak RSS is the worker's ``ru_maxrss``;
tracemalloc peaks are taken after all timed work, during one more batch of concurrent streams.

    python benchmarks/peers.py                      # full run, ~5 min (installs the peers once, ~30 s each)
    python benchmarks/peers.py --quick              # smoke run
    python benchmarks/peers.py --configs none,httpx-official,otel_llm   # no peer installed
    python benchmarks/peers.py --runtime vllm       # a runtime whose answers carry no native counters
    python benchmarks/peers.py --soak 20000         # memory flat over 20,000 calls with otel_llm
    python benchmarks/peers.py --profile            # and otel_llm's worker once more under cProfile
    python benchmarks/peers.py --json run.json      # keep the raw figures; --from-json run.json reprints
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import select
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from otel_llm_testing.subprocesses import MARKER, private_venv  # noqa: E402
from otel_llm.tools.bench.stats import percentile  # noqa: E402
from otel_llm.tools.sim import SimProcess  # noqa: E402
from otel_llm_testing.llama_server import DEFAULT_CACHE  # noqa: E402

WORKER = Path(__file__).resolve().with_name("_peers_worker.py")
LOCAL_CONFIGS = ("none", "httpx-official", "otel_llm")
CONFIGS = (*LOCAL_CONFIGS, "openlit", "openllmetry")
CLIENTS = ("httpx", "openai")
SHORT = 16
TARGET_VS_OFFICIAL = 1.5  # otel_llm added CPU per non-streamed call / official httpx instrumentation
TARGET_PER_CHUNK_US = 2.0
# settings of the caller's environment that must not reach a worker
_DROPPED_PREFIXES = ("OTEL_", "TRACELOOP_", "OPENLIT_", "PYTHON", "VIRTUAL_ENV")


@dataclass(frozen=True)
class Peer:
    name: str
    package: str
    version: str
    module: str  # imported once after the install, as a check

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PEERS = {
    "openlit": Peer("openlit", "openlit", "1.45.0", "openlit"),
    # The full OpenLLMetry SDK (its OpenAI instrumentation is opentelemetry-instrumentation-openai).
    "openllmetry": Peer("openllmetry", "traceloop-sdk", "0.62.4", "traceloop.sdk"),
}
# Without these, pip finds no consistent set for either peer: their many contrib instrumentations
# are not all published at the newest contrib release (0.66b2), and the resolver backtracks to
# ResolutionImpossible. 0.66b1 / 1.45.1 has every package both peers need.
OTEL_PINS = ("opentelemetry-api==1.45.1", "opentelemetry-sdk==1.45.1", "opentelemetry-instrumentation==0.66b1",
             "opentelemetry-semantic-conventions==0.66b1")
# Installed in every peer virtualenv at exactly this environment's versions, so that every
# configuration drives the same client code and only the instrumentation differs.
CLIENT_DISTS = ("openai", "httpx", "httpcore", "httpx2", "httpcore2", "pydantic", "pydantic-core", "anyio", "h11",
                "jiter", "sniffio")


# -- peer virtualenvs ----------------------------------------------------------------------------

def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_DROPPED_PREFIXES)}
    env.update(extra)
    return env


def client_pins() -> list[str]:
    pins = []
    for dist in CLIENT_DISTS:
        try:
            pins.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def peer_venv(peer: Peer, cache_dir: Path) -> Path:
    return Path(cache_dir) / f"peers-{peer.name}-{peer.version}"


def _wanted(peer: Peer) -> dict[str, list[str]]:
    return {"peer": [peer.requirement], "constraints": list(OTEL_PINS), "clients": client_pins()}


def _read_marker(venv: Path) -> dict[str, Any] | None:
    try:
        return json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _is_wanted(marker_text: str, wanted: dict[str, list[str]]) -> bool:
    try:
        return bool(json.loads(marker_text).get("wanted") == wanted)
    except (ValueError, AttributeError):
        return False


def peer_python(peer: Peer, cache_dir: Path, install: bool) -> tuple[Path | None, dict[str, Any]]:
    """The peer virtualenv's Python (installed on first use, or again when the pins changed) and
    its install record; (None, {"error": ...}) when it is not there and may not be installed."""
    venv = peer_venv(peer, cache_dir)
    python = venv / "bin" / "python"
    wanted = _wanted(peer)
    marker = _read_marker(venv)
    if marker is not None and marker.get("wanted") == wanted and python.is_file():
        return python, marker
    if not install:
        return None, {"error": f"not installed in {venv} (run without --no-install to install it)"}
    env = _clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1")
    constraints = venv.with_name(venv.name + ".constraints.txt")

    def steps(python: str) -> list[list[str]]:
        constraints.write_text("\n".join(wanted["constraints"]) + "\n")
        pip = [python, "-m", "pip", "install", "--progress-bar", "off", "-c", str(constraints)]
        # the same clients as the other configurations, even where the peer declares otherwise
        return [pip + wanted["peer"], pip + wanted["clients"], [python, "-c", f"import {peer.module}, httpx, openai"]]

    started = time.monotonic()

    def finish(python: str, log: IO[str]) -> str:
        return json.dumps(_install_record(python, log, env, wanted, started), indent=1)

    try:
        private_venv(venv, "python", peer.requirement, steps, env,
                     lambda why: RuntimeError(f"installing {peer.requirement} {why}"), "once; about a minute",
                     who="peers", current=lambda text: _is_wanted(text, wanted), finish=finish)
    except RuntimeError as exc:
        print(f"peers: {exc}", file=sys.stderr, flush=True)
        return None, {"error": str(exc).splitlines()[0]}
    return python, _read_marker(venv) or {}


def _install_record(python: str, log: IO[str], env: dict[str, str], wanted: dict[str, list[str]],
                    started: float) -> dict[str, Any]:
    """What went into a freshly installed peer virtualenv: pip check's conflicts (printed too) and
    every package's version."""
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, env=env)
    conflicts = [line for line in check.stdout.splitlines() if line.strip() and "No broken" not in line]
    log.write("$ pip check\n" + check.stdout)
    freeze = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            env=env)
    try:
        installed = {item["name"].lower(): item["version"] for item in json.loads(freeze.stdout)}
    except ValueError:
        installed = {}
    for line in conflicts:
        print(f"peers:   pip check: {line}", file=sys.stderr, flush=True)
    return {"wanted": wanted, "seconds": round(time.monotonic() - started, 1), "conflicts": conflicts,
            "packages": len(installed), "installed": installed}


# -- running the workers -------------------------------------------------------------------------

@dataclass
class Runner:
    name: str
    python: Path
    env: dict[str, str]
    install: dict[str, Any]


def prepare(configs: list[str], cache_dir: Path, install: bool, content: bool) -> tuple[list[Runner], dict[str, str]]:
    runners: list[Runner] = []
    missing: dict[str, str] = {}
    base = _clean_env(TRACELOOP_TELEMETRY="false", TRACELOOP_TRACE_CONTENT="true" if content else "false",
                      PYTHONDONTWRITEBYTECODE="1")
    for name in configs:
        if name in LOCAL_CONFIGS:
            runners.append(Runner(name, Path(sys.executable), {**base, "PYTHONPATH": str(ROOT)}, {}))
            continue
        python, record = peer_python(PEERS[name], cache_dir, install)
        if python is None:
            missing[name] = record.get("error", "unavailable")
        else:
            runners.append(Runner(name, python, dict(base), record))
    return runners, missing


class WorkerProcess:
    """A worker process for one configuration, alive for the whole run; commands go one at a
    time over a pipe (its stdout is left to whatever the peers print)."""

    def __init__(self, runner: Runner, spec: dict[str, Any], stderr: Any = "capture") -> None:
        self.runner = runner
        command_read, self._command_write = os.pipe()
        self._reply_read, reply_write = os.pipe()
        self._stderr = tempfile.TemporaryFile(mode="w+") if stderr == "capture" else None
        self.proc = subprocess.Popen(
            [str(runner.python), str(WORKER), str(command_read), str(reply_write)], env=runner.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            pass_fds=(command_read, reply_write))
        os.close(command_read)
        os.close(reply_write)
        self._commands = os.fdopen(self._command_write, "w")
        self._replies = os.fdopen(self._reply_read, "r")
        self.setup = self.call("setup", timeout=300, spec={**spec, "config": runner.name})

    def call(self, op: str, timeout: float = 1800, **fields: Any) -> Any:
        try:
            self._commands.write(json.dumps({"op": op, **fields}) + "\n")
            self._commands.flush()
        except BrokenPipeError:
            raise RuntimeError(f"{self.runner.name} worker is gone{self._stderr_tail()}") from None
        ready, _, _ = select.select([self._replies], [], [], timeout)
        line = self._replies.readline() if ready else ""
        if not line:
            self.kill()
            why = "timed out" if not ready else f"exited ({self.proc.poll()})"
            raise RuntimeError(f"{self.runner.name} worker {why} during {op}{self._stderr_tail()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"{self.runner.name} worker failed during {op}: {reply['error']}")
        return reply["result"]

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        tail = "\n".join(self._stderr.read().strip().splitlines()[-15:])
        return f":\n{tail}" if tail else ""

    def finish(self) -> dict[str, Any]:
        try:
            return self.call("finish", timeout=120)
        finally:
            self.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def close(self) -> None:
        for handle in (self._commands, self._replies):
            try:
                handle.close()
            except OSError:
                pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._stderr is not None:
            self._stderr.close()


def workloads(args: argparse.Namespace) -> list[dict[str, Any]]:
    found = []
    for client in CLIENTS:
        found += [
            {"name": f"{client}/call", "client": client, "kind": "call", "tokens": SHORT, "count": args.calls},
            {"name": f"{client}/stream-short", "client": client, "kind": "stream", "tokens": SHORT,
             "count": args.streams},
            {"name": f"{client}/stream", "client": client, "kind": "stream", "tokens": args.tokens,
             "count": args.streams},
            {"name": f"{client}/async-short", "client": client, "kind": "async", "tokens": SHORT,
             "count": args.batches, "concurrency": args.concurrency},
            {"name": f"{client}/async", "client": client, "kind": "async", "tokens": args.tokens,
             "count": args.batches, "concurrency": args.concurrency},
        ]
    return found


def measure(runners: list[Runner], base_url: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """All workers are started first and stay up; then, round after round, every workload is run
    by each configuration in turn (the order rotates from one workload to the next), so the
    figures compared with each other are taken seconds apart."""
    spec = {"base_url": base_url, "model": "sim-model", "content": not args.no_content}
    workers: list[WorkerProcess] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        for runner in runners:
            started = time.monotonic()
            try:
                worker = WorkerProcess(runner, spec)
            except RuntimeError as exc:
                print(f"peers: {exc}", file=sys.stderr, flush=True)
                continue
            workers.append(worker)
            results[runner.name] = {"setup": worker.setup, "rounds": []}
            print(f"peers: {runner.name} worker ready in {time.monotonic() - started:.1f} s", file=sys.stderr,
                  flush=True)
        plan = workloads(args)
        step = 0
        for round_index in range(args.rounds):
            started = time.monotonic()
            rounds = {worker.runner.name: {} for worker in workers}
            for work in plan:
                shift = step % len(workers)
                step += 1
                for worker in workers[shift:] + workers[:shift]:
                    try:
                        rounds[worker.runner.name][work["name"]] = worker.call("run", workload=work,
                                                                               warmup=args.warmup)
                    except RuntimeError as exc:  # that configuration is out of this run, the others go on
                        print(f"peers: {exc}", file=sys.stderr, flush=True)
                        worker.kill()
                        workers.remove(worker)
                        results[worker.runner.name]["failed"] = str(exc).splitlines()[0]
                        rounds.pop(worker.runner.name, None)
            for name, values in rounds.items():
                if len(values) == len(plan):
                    results[name]["rounds"].append(values)
            print(f"peers: round {round_index + 1}/{args.rounds} done in {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
        for worker in workers:  # after the timed work: traced allocations slow everything down
            results[worker.runner.name]["tracemalloc_peak_mb"] = worker.call(
                "tracemalloc", concurrency=args.concurrency, tokens=args.tokens)
        for worker in list(workers):
            workers.remove(worker)
            results[worker.runner.name]["finish"] = worker.finish()
    finally:
        for worker in workers:
            worker.kill()
    return results


# -- figures -------------------------------------------------------------------------------------

def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _percentile(values: list[float], p: float) -> float:
    """``otel_llm.tools.bench.stats.percentile`` (p from 0 to 100), NaN for no values: the figure stays a float."""
    found = percentile(values, p)
    return float("nan") if found is None else found


def per_round(values: dict[str, Any], workload: str) -> dict[str, float]:
    w = values[workload]
    ttfts = [t for t in w["ttfts"] if t]
    return {"cpu": w["cpu"] / w["requests"], "chunks": w["chunks"] / w["requests"],
            "spans": w["spans"] / w["requests"], "p50": _percentile(ttfts, 50), "p99": _percentile(ttfts, 99)}


class Figures:
    """Per-round values of every configuration, paired with "none" of the same round."""

    def __init__(self, results: dict[str, dict[str, Any]]) -> None:
        self.results = {name: r for name, r in results.items() if r.get("rounds") and "failed" not in r}
        self.configs = [c for c in CONFIGS if c in self.results]
        self.rounds = min((len(r["rounds"]) for r in self.results.values()), default=0)

    def values(self, config: str, workload: str, key: str) -> list[float]:
        return [per_round(r, workload)[key] for r in self.results[config]["rounds"][: self.rounds]]

    def absolute(self, config: str, workload: str, key: str) -> float | None:
        return _median(self.values(config, workload, key))

    def added_rounds(self, config: str, workload: str, key: str) -> list[float]:
        return [c - n for c, n in zip(self.values(config, workload, key), self.values("none", workload, key))]

    def per_chunk_rounds(self, config: str, long: str, short: str, baseline: bool = False) -> list[float]:
        """Added (or, with ``baseline``, absolute) CPU per extra chunk, per round."""
        cpu_long, cpu_short = self.values(config, long, "cpu"), self.values(config, short, "cpu")
        if not baseline:
            cpu_long = [c - n for c, n in zip(cpu_long, self.values("none", long, "cpu"))]
            cpu_short = [c - n for c, n in zip(cpu_short, self.values("none", short, "cpu"))]
        chunks = [a - b for a, b in zip(self.values(config, long, "chunks"), self.values(config, short, "chunks"))]
        return [(a - b) / d for a, b, d in zip(cpu_long, cpu_short, chunks) if d > 0]

    def ratio(self, ours: list[float], theirs: list[float]) -> tuple[float | None, list[float]]:
        """The median of per-round ratios, over the rounds where both sides added CPU: a round in
        which noise outweighed one side's cost (a figure <= 0) has no meaningful ratio."""
        pairs = sorted(a / b for a, b in zip(ours, theirs) if a > 0 and b > 0)
        return (statistics.median(pairs) if pairs else None), pairs

    def probe(self, config: str, workload: str) -> dict[str, Any]:
        return self.results[config]["rounds"][0][workload]["probe"]

    def metric_names(self, config: str) -> list[str]:
        return self.results[config].get("finish", {}).get("metric_names", [])


GROUPS = [  # (title, measured workload, short variant for the per-chunk slope or None)
    ("non-streamed call, {client}", "{client}/call", None),
    ("streamed call of {tokens} tokens, {client}", "{client}/stream", "{client}/stream-short"),
    ("{concurrency} concurrent async streams of {tokens} tokens, {client}", "{client}/async", "{client}/async-short"),
]


def _us(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 1e6:+.1f} us" if signed else f"{value * 1e6:.1f} us"


def _us2(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value * 1e6:+.2f} us" if signed else f"{value * 1e6:.2f} us"


def _ms(value: float | None, signed: bool = False) -> str:
    if value is None or value != value:
        return "-"
    return f"{value * 1e3:+.3f} ms" if signed else f"{value * 1e3:.3f} ms"


def seen(fig: Figures, config: str, workload: str) -> str:
    """How the configuration saw the calls of a workload: as model calls, as HTTP requests, or not."""
    if config == "none":
        return "-"
    spans = fig.absolute(config, workload, "spans") or 0
    if spans <= 0:
        return "not seen"
    keys = fig.probe(config, workload)["attribute_keys"]
    return "model call" if any(k.startswith(("gen_ai.", "llm.")) for k in keys) else "HTTP only"


def report_tables(fig: Figures, args: argparse.Namespace) -> None:
    for client in CLIENTS:
        for title, long_t, short_t in GROUPS:
            long = long_t.format(client=client)
            short = short_t.format(client=client) if short_t else None
            label = "raw httpx" if client == "httpx" else "openai client (httpx2)"
            name = title.format(client=label, tokens=args.tokens, concurrency=args.concurrency)
            requests = fig.results["none"]["rounds"][0][long]["requests"] if "none" in fig.results else 0
            chunks = fig.absolute(fig.configs[0], long, "chunks")
            print(f"\n== {name}: {requests} requests per round, {chunks:.0f} chunks per request")
            print(f"{'configuration':16s} {'seen as':>10s} {'CPU/request':>12s} {'added/request':>14s} "
                  f"{'added/chunk':>12s} {'TTFT p50':>10s} {'TTFT p99':>10s} {'added p50':>11s} {'added p99':>11s} "
                  f"{'spans/req':>9s} {'attr keys':>9s}")
            for config in fig.configs:
                cpu = fig.absolute(config, long, "cpu")
                if config == "none":
                    added = per_chunk = add50 = add99 = None
                    chunk_text = (_us2(_median(fig.per_chunk_rounds("none", long, short, baseline=True)), False)
                                  + "*") if short else "-"
                else:
                    added = _median(fig.added_rounds(config, long, "cpu"))
                    per_chunk = _median(fig.per_chunk_rounds(config, long, short)) if short else None
                    chunk_text = _us2(per_chunk)
                    add50 = _median(fig.added_rounds(config, long, "p50"))
                    add99 = _median(fig.added_rounds(config, long, "p99"))
                probe = fig.probe(config, long)
                keys = len(probe["attribute_keys"])
                print(f"{config:16s} {seen(fig, config, long):>10s} {_us(cpu):>12s} {_us(added, True):>14s} "
                      f"{chunk_text:>12s} {_ms(fig.absolute(config, long, 'p50')):>10s} "
                      f"{_ms(fig.absolute(config, long, 'p99')):>10s} {_ms(add50, True):>11s} {_ms(add99, True):>11s} "
                      f"{fig.absolute(config, long, 'spans'):>9.1f} {keys:>9d}")
    print("\n(* CPU per chunk of the uninstrumented client itself; added figures are medians over rounds of "
          "configuration minus none in the same round; TTFT of a non-streamed call is the time to the answer)")


def report_memory(fig: Figures, args: argparse.Namespace) -> None:
    print(f"\n== memory (worker process; tracemalloc peak = Python allocations during one batch of "
          f"{args.concurrency} concurrent {args.tokens}-token streams, after the timed work)")
    print(f"{'configuration':16s} {'RSS after setup':>16s} {'peak RSS':>10s} {'added peak':>11s} "
          f"{'tracemalloc httpx':>18s} {'tracemalloc openai':>19s}")
    def peak(config: str) -> float:
        return fig.results[config].get("finish", {}).get("peak_rss_mb", float("nan"))

    base_peak = peak("none")
    for config in fig.configs:
        setup = fig.results[config]["setup"].get("rss_after_setup_mb", float("nan"))
        traced = fig.results[config].get("tracemalloc_peak_mb", {})
        print(f"{config:16s} {setup:>13.1f} MB {peak(config):>7.1f} MB {peak(config) - base_peak:>+8.1f} MB "
              f"{traced.get('httpx', float('nan')):>15.2f} MB {traced.get('openai', float('nan')):>16.2f} MB")


def capabilities(fig: Figures, config: str) -> dict[str, str]:
    stream_probes = [fig.probe(config, f"{c}/stream") for c in CLIENTS]
    ttft_keys = sorted({k for p in stream_probes for k in p["ttft_keys"]})
    ttft_metrics = [m for m in fig.metric_names(config) if "first_token" in m or "first_chunk" in m or "ttft" in m]
    if ttft_keys:
        ttft = "yes: span " + ", ".join(ttft_keys)
    elif ttft_metrics:
        ttft = "metric only: " + ", ".join(ttft_metrics)
    else:
        ttft = "no"
    phases = sorted({name for p in stream_probes for name in p["phase_spans"]})
    native = sorted({k for p in stream_probes for k in p["native_keys"]})
    return {
        "raw httpx": seen(fig, config, "httpx/stream"),
        "openai 3.x": seen(fig, config, "openai/stream"),
        "TTFT": ttft if config != "none" else "-",
        "phases": (f"yes ({len(phases)}): " + ", ".join(phases)) if phases else "no",
        "native counters": (f"yes ({len(native)}): " + ", ".join(native)) if native else "no",
        "metrics": str(len(fig.metric_names(config))),
    }


def report_produced(fig: Figures) -> None:
    print("\n== what each configuration produced (one probe call per workload)")
    print(f"{'configuration':16s} {'workload':20s} {'spans':>5s}  span names")
    for config in fig.configs:
        if config == "none":
            continue
        for workload in ("httpx/call", "httpx/stream", "openai/call", "openai/stream"):
            probe = fig.probe(config, workload)
            names = ", ".join(f"{n}" + (f" x{c}" if c > 1 else "") for n, c in sorted(probe["span_names"].items()))
            print(f"{config:16s} {workload:20s} {sum(probe['span_names'].values()):>5d}  {names or '-'}")
    print("\nattribute keys (streamed call through the openai client, else raw httpx), and metric names:")
    for config in fig.configs:
        if config == "none":
            continue
        keys = fig.probe(config, "openai/stream")["attribute_keys"] or fig.probe(config, "httpx/stream")[
            "attribute_keys"]
        print(textwrap.fill(", ".join(keys) or "-", width=118, initial_indent=f"  {config} spans ({len(keys)}): ",
                            subsequent_indent="      "))
        metrics = fig.metric_names(config)
        print(textwrap.fill(", ".join(metrics) or "-", width=118,
                            initial_indent=f"  {config} metrics ({len(metrics)}): ", subsequent_indent="      "))

    print("\n== capability matrix")
    columns = ("raw httpx", "openai 3.x", "TTFT", "phases", "native counters", "metrics")
    rows = {config: capabilities(fig, config) for config in fig.configs if config != "none"}
    short = {c: {k: (v.split(":")[0] if k in ("TTFT", "phases", "native counters") else v) for k, v in r.items()}
             for c, r in rows.items()}
    print(f"{'configuration':16s} " + " ".join(f"{c:>12s}" for c in columns))
    for config, row in short.items():
        print(f"{config:16s} " + " ".join(f"{row[c]:>12s}" for c in columns))
    for config, row in rows.items():
        details = [f"{k}: {v}" for k, v in row.items() if k in ("TTFT", "phases", "native counters") and v != "no"]
        for line in details:
            print(textwrap.fill(line, width=118, initial_indent=f"  {config} ", subsequent_indent="      "))


def _ratio_text(fig: Figures, ours: list[float], theirs: list[float], unit_us: float) -> str:
    """The median of per-round ratios, unless either side adds about nothing (under ``unit_us``):
    then the two added figures themselves, as a ratio of noise says nothing."""
    ratio, pairs = fig.ratio(ours, theirs)
    ours_median, theirs_median = _median(ours) or 0.0, _median(theirs) or 0.0
    fmt = _us2 if unit_us < 1 else (lambda v: _us(v, True))
    if theirs_median * 1e6 < unit_us or ours_median * 1e6 < unit_us or ratio is None:
        return f"{fmt(ours_median)} vs {fmt(theirs_median)}"
    spread = f" [{pairs[0]:.2f}-{pairs[-1]:.2f}]" if len(pairs) > 1 else ""
    return f"{ratio:.2f}x{spread}"


def report_ratios(fig: Figures) -> list[str]:
    """Prints the ratios and the targets; returns the failed targets."""
    failed: list[str] = []
    if "otel_llm" not in fig.results or "none" not in fig.results:
        return failed
    others = [c for c in fig.configs if c not in ("none", "otel_llm")]
    print("\n== otel_llm / other configuration: added CPU (median of per-round ratios [range of rounds]; "
          "'A vs B' = both added figures where either adds under 1 us per request / 0.05 us per chunk)")
    print(f"{'workload':34s} " + " ".join(f"{c:>28s}" for c in others))
    rows = []
    for client in CLIENTS:
        for title, long_t, short_t in GROUPS:
            long = long_t.format(client=client)
            rows.append((f"{long} per request", long, None))
            if short_t:
                rows.append((f"{long} per chunk", long, short_t.format(client=client)))
    for label, long, short in rows:
        cells = []
        for other in others:
            if seen(fig, other, long) == "not seen":
                cells.append("not seen")
                continue
            if short:
                ours, theirs = fig.per_chunk_rounds("otel_llm", long, short), fig.per_chunk_rounds(other, long, short)
                cells.append(_ratio_text(fig, ours, theirs, 0.05))
            else:
                ours, theirs = fig.added_rounds("otel_llm", long, "cpu"), fig.added_rounds(other, long, "cpu")
                cells.append(_ratio_text(fig, ours, theirs, 1.0))
        print(f"{label:34s} " + " ".join(f"{c:>28s}" for c in cells))

    print("\n== targets")
    for other in [c for c in others if c in PEERS]:
        worse = []
        compared = 0
        for label, long, short in rows:
            if seen(fig, other, long) != "model call":
                continue  # the peer does not trace these calls as model calls: nothing to compare
            compared += 1
            if short:
                ours = _median(fig.per_chunk_rounds("otel_llm", long, short))
                theirs = _median(fig.per_chunk_rounds(other, long, short))
                if ours is not None and theirs is not None and ours > theirs:
                    worse.append(f"{label} ({_us2(ours)} vs {_us2(theirs)})")
            else:
                ours = _median(fig.added_rounds("otel_llm", long, "cpu"))
                theirs = _median(fig.added_rounds(other, long, "cpu"))
                if ours is not None and theirs is not None and ours > theirs:
                    worse.append(f"{label} ({_us(ours, True)} vs {_us(theirs, True)})")
        status = "PASS" if not worse else "FAIL"
        print(f"otel_llm adds less CPU than {other} (on the {compared} figures where {other} traces model calls): "
              f"{status}" + ("" if not worse else "; more on: " + "; ".join(worse)))
        if worse:
            failed.append(f"vs {other}")
    if "httpx-official" in fig.results:
        for client in CLIENTS:
            workload = f"{client}/call"
            ratio, pairs = fig.ratio(fig.added_rounds("otel_llm", workload, "cpu"),
                                     fig.added_rounds("httpx-official", workload, "cpu"))
            ok = ratio is not None and ratio <= TARGET_VS_OFFICIAL
            spread = f"rounds {pairs[0]:.2f}-{pairs[-1]:.2f}" if pairs else "no valid round"
            text = f"{ratio:.2f}x" if ratio is not None else "n/a"
            print(f"otel_llm / httpx-official, added CPU per call ({client}): {text} ({spread}; target <= "
                  f"{TARGET_VS_OFFICIAL}x): {'PASS' if ok else 'FAIL'}")
            if not ok:
                failed.append(f"per call vs httpx-official ({client})")
    for client in CLIENTS:
        for _, long_t, short_t in GROUPS[1:]:
            long, short = long_t.format(client=client), short_t.format(client=client)
            value = _median(fig.per_chunk_rounds("otel_llm", long, short))
            ok = value is not None and value * 1e6 <= TARGET_PER_CHUNK_US
            print(f"otel_llm added CPU per chunk ({long}): {_us2(value)} (target <= {TARGET_PER_CHUNK_US:g} us): "
                  f"{'PASS' if ok else 'FAIL'}")
            if not ok:
                failed.append(f"per chunk {long}")
    return failed


def report_header(fig: Figures, runners: list[Runner], missing: dict[str, str], args: argparse.Namespace) -> None:
    print(f"peers benchmark: {fig.rounds} round(s), configurations alternated; simulator {args.runtime} flavour, "
          f"zero injected delays, loopback; content capture in peers: {'off' if args.no_content else 'default (on)'}")
    for runner in runners:
        if runner.name not in fig.results:
            print(f"  {runner.name:16s} FAILED: see stderr")
            continue
        result = fig.results[runner.name]
        versions = ", ".join(f"{k} {v}" for k, v in result["setup"]["versions"].items() if v)
        extra = ""
        if runner.install:
            extra = (f"; own venv {runner.python.parent.parent} ({runner.install.get('packages', '?')} packages, "
                     f"installed in {runner.install.get('seconds', '?')} s)")
        print(f"  {runner.name:16s} {versions}{extra}")
        for line in runner.install.get("conflicts", []):
            print(f"  {'':16s} pip check: {line}")
        for note in result.get("finish", {}).get("notes", []):
            print(f"  {'':16s} note: {note}")
    for name, why in missing.items():
        print(f"  {name:16s} not measured: {why}")


def report(results: dict[str, list[dict[str, Any]]], runners: list[Runner], missing: dict[str, str],
           args: argparse.Namespace) -> list[str]:
    fig = Figures(results)
    report_header(fig, runners, missing, args)
    if "none" not in fig.results:
        print("no baseline (none) measured: nothing to compare")
        return ["no baseline"]
    report_tables(fig, args)
    report_memory(fig, args)
    report_produced(fig)
    return report_ratios(fig)


# -- soak and profile ----------------------------------------------------------------------------

def soak(runner: Runner, base_url: str, calls: int) -> dict[str, Any]:
    checkpoints = sorted({max(1, calls // 20), max(1, calls // 2), calls})
    worker = WorkerProcess(runner, {"base_url": base_url, "model": "sim-model"}, stderr=None)
    try:
        data = worker.call("soak", timeout=7200, calls=calls, checkpoints=checkpoints, tokens=SHORT)
        worker.finish()
    finally:
        worker.kill()
    print(f"soak: {runner.name}, {calls} calls cycling non-streamed and {SHORT}-token streamed calls through raw "
          f"httpx and the openai client; tracemalloc on throughout")
    print(f"{'calls':>7s} {'RSS':>10s} {'max RSS':>10s} {'traced':>10s} {'elapsed':>9s}")
    for point in data["points"]:
        print(f"{point['calls']:>7d} {point['rss_mb']:>7.1f} MB {point['max_rss_mb']:>7.1f} MB "
              f"{point['traced_mb']:>7.2f} MB {point['elapsed']:>7.1f} s")
    first, last = data["points"][1], data["points"][-1]
    rss_growth, traced_growth = last["rss_mb"] - first["rss_mb"], last["traced_mb"] - first["traced_mb"]
    per_call = traced_growth * 2**20 / max(1, last["calls"] - first["calls"])
    print(f"growth from {first['calls']} to {last['calls']} calls: RSS {rss_growth:+.2f} MB, traced "
          f"{traced_growth:+.3f} MB ({per_call:+.1f} bytes per call); spans exported: {data['spans']}")
    # the host sampler keeps a 300-sample ring buffer (one sample a second): it grows with time for
    # its first 5 minutes, not with calls
    for item in data["top_growth"][:5]:
        print(f"  traced growth at {item['where']}: {item['size_diff'] / 1024:+.1f} KiB ({item['count_diff']:+d} "
              f"blocks)")
    return {"rss_growth_mb": rss_growth, "traced_growth_mb": traced_growth, **data}


def profile(runner: Runner, base_url: str, args: argparse.Namespace) -> None:
    """The workloads once more under cProfile; the functions with the most own time."""
    with tempfile.TemporaryDirectory(prefix="peers-profile-") as tmp:
        path = str(Path(tmp) / "profile.out")
        worker = WorkerProcess(runner, {"base_url": base_url, "model": "sim-model"})
        try:
            worker.call("profile", workloads=workloads(args), warmup=args.warmup, path=path)
            worker.finish()
        finally:
            worker.kill()
        print(f"\n== cProfile of the {runner.name} worker (all workloads, one round): top functions by own time "
              f"in the instrumentation and the OpenTelemetry SDK (times inflated by the profiler)")
        stats = pstats.Stats(path)
        rows = []
        for (filename, line, func), entry in stats.stats.items():  # type: ignore[attr-defined]
            calls, tottime, cumtime = entry[1], entry[2], entry[3]
            if any(part in filename for part in ("otel_llm", "opentelemetry", "openlit", "traceloop", "wrapt")):
                rows.append((tottime, calls, cumtime, f"{Path(filename).parent.name}/{Path(filename).name}:{line}"
                                                     f" {func}"))
        for tottime, calls, cumtime, where in sorted(rows, reverse=True)[:25]:
            print(f"  {tottime * 1e3:9.1f} ms own {cumtime * 1e3:9.1f} ms cum {calls:>9d} calls  {where}")


# -- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="non-streamed calls per client per round")
    parser.add_argument("--streams", type=int, default=40, help="sequential streams per variant per round")
    parser.add_argument("--batches", type=int, default=1, help="batches of concurrent async streams per round")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runtime", default="llama.cpp",
                        help="the simulator's flavour: llama.cpp puts native counters in every answer; "
                             "vllm puts none in its answers")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from: " + ", ".join(CONFIGS))
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, few calls, 20 concurrent streams")
    parser.add_argument("--no-install", action="store_true", help="skip peers whose virtualenv is not there yet")
    parser.add_argument("--no-content", action="store_true", help="turn the peers' prompt/completion capture off")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--json", type=Path, help="write every raw per-round result here")
    parser.add_argument("--from-json", type=Path, help="print the report of a run saved with --json; measure nothing")
    parser.add_argument("--soak", type=int, metavar="CALLS", help="memory over CALLS calls with otel_llm instead")
    parser.add_argument("--soak-config", default="otel_llm", choices=CONFIGS)
    parser.add_argument("--profile", action="store_true", help="also run otel_llm's worker once under cProfile")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.streams, args.batches = 1, 20, 3, 1
        args.concurrency, args.warmup = min(args.concurrency, 20), 1
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configuration(s): {', '.join(unknown)}")
    if args.soak is None and "none" not in configs:
        configs.insert(0, "none")
    if args.from_json:  # the report again, from a run saved with --json
        saved = json.loads(args.from_json.read_text())
        for name in ("concurrency", "tokens"):
            setattr(args, name, int(saved["args"][name]))
        args.no_content = saved["args"]["no_content"] == "True"
        args.runtime = saved["args"].get("runtime", "llama.cpp")
        runners = [Runner(r["name"], Path(r["python"]), {}, r["install"]) for r in saved.get("runners", [])] or [
            Runner(name, Path(sys.executable), {}, {}) for name in saved["results"]]
        failed = report(saved["results"], runners, saved["missing"], args)
        return 1 if failed and args.strict else 0
    with SimProcess(runtime=args.runtime, headers_delay=0.0, first_token_delay=0.0, token_interval=0.0,
                    tokens=max(args.tokens, SHORT)) as sim:
        if args.soak is not None:
            runners, missing = prepare([args.soak_config], args.cache_dir, not args.no_install, not args.no_content)
            if not runners:
                print(f"soak: {args.soak_config} unavailable: {missing}", file=sys.stderr)
                return 2
            data = soak(runners[0], sim.base_url, args.soak)
            if args.json:
                args.json.write_text(json.dumps(data, indent=1))
            return 0
        runners, missing = prepare(configs, args.cache_dir, not args.no_install, not args.no_content)
        results = measure(runners, sim.base_url, args)
        if args.json:
            args.json.write_text(json.dumps({
                "args": {k: str(v) for k, v in vars(args).items()}, "results": results, "missing": missing,
                "runners": [{"name": r.name, "python": str(r.python), "install": r.install} for r in runners]},
                indent=1))
        failed = report(results, runners, missing, args)
        if args.profile:
            local = [r for r in runners if r.name == "otel_llm"]
            if local:
                profile(local[0], sim.base_url, args)
    if failed:
        print("\nmissed targets: " + "; ".join(failed))
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
