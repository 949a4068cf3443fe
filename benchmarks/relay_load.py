"""``otel-llm proxy`` (or the gateway) at production volume, beside Debian's nginx relaying the
same work: chunks delivered, time to first token, inter-chunk gaps and the relay's CPU, with the
ratios to nginx per level.

The load is compiled, so that it stays small and steady beside the relay it measures
(``benchmarks/relayload/main.go``, Go's standard library, built once with Debian's ``golang-go``
into ``~/.cache/otel-llm/``): an upstream that streams OpenAI chat chunks at a fixed pace (one
content event per token, each flushed on its own, then a usage event and ``[DONE]``), an OTLP
sink that accepts everything, and a closed-loop client (one goroutine per stream, a new request
as soon as the previous answer ended; time to first token is to the first content event, gaps are
between content events). Upstream, sink and client share the load CPUs (``--load-cpus``, CPU 0 by
default); the relay runs alone on the relay CPUs (``--relay-cpus``, CPU 1), both with
``sched_setaffinity`` as ``taskset`` would. ``--no-pin`` leaves placement to the kernel (what
``--workers`` on a 2-core machine needs: the relay's workers and the load then share the cores;
the load's CPU is reported too).

Each level (``STREAMS x TOKENS_PER_S``) runs every way in turn on a fresh relay: ``direct`` (the
client to the upstream), ``nginx`` (``proxy_buffering off``, HTTP/1.1 and kept-alive upstream
connections, one worker, no access log) and ``proxy`` (``otel-llm proxy`` as a user runs it:
default telemetry, exported over OTLP/HTTP to the sink, the summary line to a log file); on
request ``gateway`` (``otel-llm gateway`` with one key the client presents, its upstream slots
and queue out of the way, its access log to a file).
A relay's CPU is the run time of all its processes' threads over the measured window.

    python benchmarks/relay_load.py [--levels 256x50,1024x10] [--ways direct,nginx,proxy]
        [--tokens 64] [--warmup 3] [--duration 15] [--proxy-args "--workers 2"] [--proxy-env K=V]
        [--no-pin] [--json FILE]

It prints one table per level and, for the proxy, its ratios to nginx beside the targets: chunks
at least 0.98x, TTFT p99 within 5 ms, gap p99 within 2 ms, CPU at most 2.5x, no error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from otel_llm.tools.gateway.process import GatewayProcess, ProxyProcess
from otel_llm_testing.markers import need
from otel_llm_testing.nginx import NginxServer, ensure_nginx
from otel_llm_testing.net import free_port

SOURCE = Path(__file__).resolve().parent / "relayload" / "main.go"
CACHE = Path(os.environ.get("OTEL_LLM_CACHE", Path.home() / ".cache" / "otel-llm"))
WAYS = ("direct", "nginx", "proxy")
EXTRA_WAYS = ("gateway",)  # on request: the gateway with a key, its queue out of the way
PATH = "/v1/chat/completions"
# One scheduler thread each: Go's idle threads spinning for work cost the relay's cores CPU when
# the load is not pinned apart, and a pinned process gets one anyway (its CPU count)
LOAD_ENV = {**os.environ, "GOMAXPROCS": "1"}
RSS_EVERY = 10.0  # seconds between samples of the relay's memory
TARGETS = {"chunks": 0.98, "ttft_p99_ms": 5.0, "gap_p99_ms": 2.0, "cpu": 2.5}
_NGINX_SITE = """upstream model {{
    server 127.0.0.1:{upstream};
    keepalive 4096;
}}
server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_requests 100000;
    location / {{
        proxy_pass http://model;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        keepalive_requests 100000;
    }}
}}
"""


def build_load() -> Path:
    """The compiled load generator, built when its source changed (Debian's Go, installed with
    apt-get when missing, as root)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    binary = CACHE / f"relayload-{digest}" / "relayload"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "golang-go"]):
            subprocess.run(command, check=True, capture_output=True, timeout=900, env=env)
        go = shutil.which("go") or "/usr/bin/go"
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, GO111MODULE="off", GOFLAGS="", GOCACHE=str(Path(work) / "cache"),
                   GOPATH=str(Path(work) / "path"))
        built = Path(work) / "relayload"
        subprocess.run([go, "build", "-o", str(built), str(SOURCE)], check=True, capture_output=True,
                       timeout=600, env=env)
        shutil.move(str(built), binary)
    return binary


def _cpus(text: str) -> set[int]:
    return {int(part) for part in text.split(",") if part.strip()}


def _pin(pid: int, cpus: set[int] | None) -> None:
    """``taskset -p``: the process and every thread it has now (children inherit it)."""
    if cpus is None:
        return
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(task.name), cpus)
    except OSError:
        os.sched_setaffinity(pid, cpus)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """Run time of every thread of ``processes`` so far (``/proc/PID/task/*/schedstat``, ns)."""
    total = 0
    for proc in processes:
        try:
            for task in os.scandir(f"/proc/{proc.pid}/task"):
                with open(f"{task.path}/schedstat") as stat:
                    total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


class Upstream:
    """The compiled upstream and OTLP sink, on the load CPUs."""

    def __init__(self, binary: Path, tokens: int, pace: float, cpus: set[int] | None) -> None:
        self.proc = subprocess.Popen([str(binary), "upstream", "-listen", "127.0.0.1:0", "-sink", "127.0.0.1:0",
                                      "-tokens", str(tokens), "-pace", str(pace)], env=LOAD_ENV,
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        _pin(self.proc.pid, cpus)
        assert self.proc.stdout is not None
        ports = {}
        for _ in range(2):
            kind, address = self.proc.stdout.readline().split()
            ports[kind] = int(address.rsplit(":", 1)[1])
        self.port, self.sink_port = ports["upstream"], ports["sink"]
        self.processes = [psutil.Process(self.proc.pid)]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Level:
    streams: int
    pace: float

    @classmethod
    def parse(cls, text: str) -> Level:
        streams, _, pace = text.partition("x")
        return cls(int(streams), float(pace))

    def __str__(self) -> str:
        return f"{self.streams} x {self.pace:g} tok/s"


class Relay:
    """One way in front of the upstream: its port and processes; ``stop()`` ends it."""

    def __init__(self, way: str, upstream: Upstream, cpus: set[int] | None, log_dir: Path,
                 proxy_args: list[str], proxy_env: dict[str, str]) -> None:
        self.way = way
        self._stop: Any = None
        self.log = ""
        self.header = ""  # what the client must send (the gateway's key)
        if way == "direct":
            self.port, self.pid = upstream.port, None
            return
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{upstream.sink_port}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", **proxy_env}
        if way == "nginx":
            need("backend", "nginx")
            self.port = free_port()
            server = NginxServer(_NGINX_SITE.format(upstream=upstream.port, port=self.port), self.port,
                                 ensure_nginx(), worker_connections=16384).start()
            self.pid, self._stop, self.log = server.pid, server.stop, str(server.dir)
        elif way == "proxy":
            server = ProxyProcess(f"http://127.0.0.1:{upstream.port}", "--max-connections", "65536",
                                  "--max-connections-per-client", "65536", *proxy_args, env=env,
                                  log_path=log_dir / "proxy.log", startup_timeout=60).start()
            self.port = int(server.url.rsplit(":", 1)[1])
            self.pid, self._stop, self.log = server.pid, server.stop, str(server.log_path)
        elif way == "gateway":
            gateway = GatewayProcess(f"http://127.0.0.1:{upstream.port}", env=env, startup_timeout=60,
                                     max_connections=65536, max_connections_per_client=65536,
                                     max_concurrency=65536, max_queue=0, **_settings(proxy_args))
            gateway.start()
            self.port = int(gateway.url.rsplit(":", 1)[1])
            self.header = f"Authorization: Bearer {gateway.secrets['default']}"
            self.pid, self._stop, self.log = gateway.pid, gateway.stop, str(gateway.log_path)
        else:
            raise SystemExit(f"relay_load: unknown way {way!r} (one of {', '.join(WAYS + EXTRA_WAYS)})")
        for proc in _tree(self.pid):
            _pin(proc.pid, cpus)

    def processes(self) -> list[psutil.Process]:
        return _tree(self.pid) if self.pid is not None else []

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()


def run_way(binary: Path, upstream: Upstream, level: Level, way: str, args: argparse.Namespace,
            log_dir: Path) -> dict[str, Any]:
    stagger = args.stagger if args.stagger is not None else args.tokens / level.pace
    warmup = args.warmup if args.warmup is not None else stagger + 2.0
    relay_cpus = None if args.no_pin else _cpus(args.relay_cpus)
    load_cpus = None if args.no_pin else _cpus(args.load_cpus)
    relay = Relay(way, upstream, relay_cpus, log_dir, shlex.split(args.proxy_args), dict(args.proxy_env))
    try:
        client = subprocess.Popen([str(binary), "client", "-url", f"http://127.0.0.1:{relay.port}{PATH}",
                                   "-streams", str(level.streams), "-warmup", f"{warmup}s", "-stagger", f"{stagger}s",
                                   "-header", relay.header,
                                   "-duration", f"{args.duration}s"],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=LOAD_ENV)
        _pin(client.pid, load_cpus)
        time.sleep(warmup)
        relay_procs = relay.processes()  # a worker replaced during the run is counted from then on
        load_procs = [*upstream.processes, psutil.Process(client.pid)]
        relay_before, load_before = cpu_seconds(relay_procs), cpu_seconds(load_procs)
        rss_before = _rss(relay_procs)
        started = time.monotonic()
        rss_samples = []  # (seconds into the window, MiB): memory over a long run
        while (left := args.duration - (time.monotonic() - started)) > 0:
            time.sleep(min(left, RSS_EVERY))
            rss_samples.append((round(time.monotonic() - started, 1), round(_rss(relay_procs) / 2**20, 1)))
        relay_after, load_after = cpu_seconds(relay_procs), cpu_seconds(load_procs)
        wall = time.monotonic() - started
        rss_after = _rss(relay_procs)
        out, _ = client.communicate(timeout=args.duration + 120)
        result: dict[str, Any] = json.loads(out)
        result.update(way=way, level=str(level), relay_cpu=(relay_after - relay_before) / wall,
                      load_cpu=(load_after - load_before) / wall, relay_rss_mib=rss_after / 2**20,
                      relay_rss_growth_mib=(rss_after - rss_before) / 2**20,
                      relay_processes=len(relay_procs), relay_rss_mib_over_time=rss_samples)
        return result
    finally:
        relay.stop()


def _settings(proxy_args: list[str]) -> dict[str, str]:
    """``--workers 2`` and the like as the gateway's settings (``workers="2"``)."""
    settings = {}
    for flag, value in zip(proxy_args[::2], proxy_args[1::2]):
        settings[flag.lstrip("-").replace("-", "_")] = value
    return settings


def _rss(processes: list[psutil.Process]) -> int:
    total = 0
    for proc in processes:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def compare(results: dict[str, dict[str, Any]], relay: str = "proxy") -> dict[str, Any] | None:
    """The relay's figures against nginx's on the same level, with each target's verdict."""
    if relay not in results or "nginx" not in results:
        return None
    ours, nginx = results[relay], results["nginx"]
    ratios = {
        "chunks": ours["chunks_per_s"] / nginx["chunks_per_s"] if nginx["chunks_per_s"] else 0.0,
        "ttft_p99_ms": ours["ttft_ms"].get("p99", float("inf")) - nginx["ttft_ms"].get("p99", 0.0),
        "gap_p99_ms": ours["gap_ms"].get("p99", float("inf")) - nginx["gap_ms"].get("p99", 0.0),
        "cpu": ours["relay_cpu"] / nginx["relay_cpu"] if nginx["relay_cpu"] else float("inf"),
    }
    met = {
        "chunks": ratios["chunks"] >= TARGETS["chunks"],
        "ttft_p99_ms": ratios["ttft_p99_ms"] <= TARGETS["ttft_p99_ms"],
        "gap_p99_ms": ratios["gap_p99_ms"] <= TARGETS["gap_p99_ms"],
        "cpu": ratios["cpu"] <= TARGETS["cpu"],
        "errors": ours["errors"] == 0,
    }
    return {"vs_nginx": ratios, "met": met}


def table(level: str, results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{level}:",
             f"  {'way':<8} {'chunks/s':>9} {'TTFT p50/p99 ms':>17} {'gap p50/p99 ms':>16} {'relay CPU':>10} "
             f"{'load CPU':>9} {'RSS MiB':>8} {'done':>7} {'errors':>6}"]
    for way, r in results.items():
        ttft, gap = r["ttft_ms"], r["gap_ms"]
        lines.append(f"  {way:<8} {r['chunks_per_s']:>9.0f} {ttft.get('p50', 0):>8.1f}/{ttft.get('p99', 0):<8.1f}"
                     f" {gap.get('p50', 0):>7.1f}/{gap.get('p99', 0):<8.1f} {r['relay_cpu']:>10.2f} "
                     f"{r['load_cpu']:>9.2f} {r['relay_rss_mib']:>8.0f} {r['requests']:>7} {r['errors']:>6}")
        if r.get("first_error"):
            lines.append(f"           first error: {r['first_error']}")
    for relay in ("proxy", "gateway"):
        verdict = compare(results, relay)
        if verdict is None:
            continue
        v, met = verdict["vs_nginx"], verdict["met"]

        def mark(key: str) -> str:
            return "ok" if met[key] else "NOT MET"

        lines.append(f"  {relay} vs nginx: chunks {v['chunks']:.3f}x ({mark('chunks')}, >= {TARGETS['chunks']}x), "
                     f"TTFT p99 {v['ttft_p99_ms']:+.1f} ms ({mark('ttft_p99_ms')}, <= +{TARGETS['ttft_p99_ms']:g}), "
                     f"gap p99 {v['gap_p99_ms']:+.1f} ms ({mark('gap_p99_ms')}, <= +{TARGETS['gap_p99_ms']:g}), "
                     f"CPU {v['cpu']:.2f}x ({mark('cpu')}, <= {TARGETS['cpu']}x), errors {mark('errors')}")
    return "\n".join(lines)


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="256x50,1024x10", help="STREAMSxTOKENS_PER_S, comma-separated")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"of {', '.join(WAYS + EXTRA_WAYS)}")
    parser.add_argument("--tokens", type=int, default=64, help="content events per answer")
    parser.add_argument("--warmup", type=float, help="seconds before the measured window (default: the stagger "
                        "and 2 s more)")
    parser.add_argument("--stagger", type=float, help="seconds over which the streams' first requests spread "
                        "(default: one answer's length, as independent callers; 0.02 makes them end and restart "
                        "in waves)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured")
    parser.add_argument("--relay-cpus", default="1")
    parser.add_argument("--load-cpus", default="0")
    parser.add_argument("--no-pin", action="store_true", help="let the kernel place relay and load")
    parser.add_argument("--proxy-args", default="",
                        help="more flags for otel-llm proxy (and the gateway's settings), e.g. '--workers 2'")
    parser.add_argument("--proxy-env", type=_env_pair, action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))  # 2 sockets a stream
    binary = build_load()
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    report: dict[str, Any] = {"levels": {}, "args": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory(prefix="otel-llm-relay-load-") as tmp:
        for level in map(Level.parse, args.levels.split(",")):
            upstream = Upstream(binary, args.tokens, level.pace, None if args.no_pin else _cpus(args.load_cpus))
            try:
                results = {way: run_way(binary, upstream, level, way, args, Path(tmp)) for way in ways}
            finally:
                upstream.stop()
            report["levels"][str(level)] = {"ways": results, "verdict": compare(results),
                                            "gateway_verdict": compare(results, "gateway")}
            print(table(str(level), results), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
