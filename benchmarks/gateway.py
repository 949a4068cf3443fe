"""Time to first byte that ``otel-llm gateway`` adds in front of a model server, and the gateway's
CPU per request; side by side with ``otel-llm proxy`` and Debian's nginx.

One run, on loopback: the simulator in one process (zero injected delays), each relay in its own
process in front of it, this client in another. The relays: the gateway (the real CLI, default
telemetry: spans to a JSON-lines file in a temporary directory, access log to a file), the proxy
(the real CLI, the same span file, its summary line per call to a log file) and nginx with a plain
``proxy_pass`` (``proxy_buffering off``, HTTP/1.1 with kept-alive upstream connections, no access
log; left out when ``/usr/sbin/nginx`` is missing or with ``--relays``). Requests go directly to
the simulator and through each relay in turn, each over its own kept-alive raw socket with
TCP_NODELAY, so no HTTP client library sits in the measurement. Time to first byte is from the
moment the request was written to the first byte of the response head. Workloads: non-streamed
chat calls, and small streamed chat calls (TTFB is the response head; the whole stream is read
before the next request).

Three things keep one way's cost out of another's figure:

- the measuring client runs on a CPU of its own, the servers on the others (``--no-pin`` leaves
  placement to the kernel). On a machine with few CPUs, a client woken while the relay and the
  simulator still work through the rest of a stream waits for a CPU, and its time to first byte
  then reads as the time of the whole stream: the client's lack of a CPU, not the relay's latency;
- after each answer the client waits ``--settle-ms`` (busy, on its own CPU, so that CPU does not
  go idle) before the next request, so a relay's work after its answer (span export, summary or
  access line) is not paid by whichever way comes next;
- the order of the ways is shuffled every round (seeded), so no way always follows the same other.

The "added" figures are the median (p90) through a relay minus the median (p90) direct;
"paired" is the median of per-round differences. "complete answer" is the median time until the
whole answer was read: a relay whose writes wait for TCP acknowledgements (Nagle with delayed
ACKs) shows there as ~40 ms, as the client here, like an SDK in a loop, sends its next request
right after the last answer. CPU per request is the relay's CPU time (the run time of all its
threads, from ``/proc/PID/task/*/schedstat`` in nanoseconds: span export and access log included;
nginx: its master and worker processes) over the measured requests, divided by their number. CPU
per streamed token is the same over a run of long streams (``--long-tokens`` tokens each, one
chunk per token, the relays in turn), divided by the tokens relayed. Run it on a quiet machine:
other processes on the same cores add to every figure.

    python benchmarks/gateway.py [--requests 300] [--tokens 8] [--quick] [--relays gateway,proxy,nginx]
        [--settle-ms 0.5] [--no-pin]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from otel_llm.tools.bench.stats import percentile
from otel_llm.tools.gateway.process import GatewayProcess, ProxyProcess
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.nginx import NGINX, NginxServer
from otel_llm_testing.net import free_port

TARGET_ADDED_MEDIAN_MS = 1.0
PROXY_TARGET_ADDED_MEDIAN_MS = 0.5
PATH = "/v1/chat/completions"
RELAYS = ("gateway", "proxy", "nginx")
SEED = 20261205  # the order of the ways in each round: the same sequence in every run
_NGINX_SITE = """upstream model {{
    server 127.0.0.1:{upstream};
    keepalive 16;
}}
server {{
    listen 127.0.0.1:{port};
    location / {{
        proxy_pass http://model;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
    }}
}}
"""



class Relay:
    """A relay in its own process(es): where to send requests, the headers it needs, its CPU."""

    name = ""
    port = 0
    headers: dict[str, str] = {}

    def processes(self) -> list[psutil.Process]:
        raise NotImplementedError

    def cpu(self) -> float:
        """CPU seconds of all its processes' threads so far (see ``_cpu_seconds``)."""
        return sum(_cpu_seconds(proc) for proc in self.processes())


def _cpu_seconds(proc: psutil.Process) -> float:
    """The process's CPU time: the sum of its threads' run time from ``/proc/PID/task/*/schedstat``
    (nanoseconds; ``/proc/PID/stat`` counts whole 10 ms ticks, too coarse for nginx's share of a
    run), else psutil's user + system."""
    total = 0
    try:
        for task in os.scandir(f"/proc/{proc.pid}/task"):
            with open(f"{task.path}/schedstat") as stat:
                total += int(stat.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        times = proc.cpu_times()
        return float(times.user + times.system)


class ChildRelay(Relay):
    """``otel-llm gateway`` (with its key's header) or ``otel-llm proxy`` (no keys, loopback):
    one process of its own."""

    def __init__(self, name: str, server: GatewayProcess | ProxyProcess, headers: dict[str, str]) -> None:
        self.name, self.headers = name, headers
        self.port = int(server.url.rsplit(":", 1)[1])
        self._proc = psutil.Process(server.pid)

    def processes(self) -> list[psutil.Process]:
        return [self._proc]


class NginxRelay(Relay):
    """Debian's nginx, one worker, in its own temporary prefix."""

    name = "nginx"

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self._server = NginxServer(_NGINX_SITE.format(upstream=upstream_port, port=self.port), self.port).start()
        self._master = psutil.Process(self._server.pid)

    def processes(self) -> list[psutil.Process]:
        return [self._master, *self._master.children(recursive=True)]

    def stop(self) -> None:
        self._server.stop()


class RawConnection:
    """One kept-alive HTTP/1.1 connection; reads Content-Length and chunked responses."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.port = port
        self.extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def request(self, body: bytes) -> tuple[float, float, int]:
        """Send one POST and read the answer whole: (seconds to its first byte, seconds until it
        was complete, status)."""
        head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{self.extra}\r\n").encode()
        assert not self.buf, "unread bytes from the previous response"
        started = time.perf_counter()
        self.sock.sendall(head + body)
        self._fill()
        ttfb = time.perf_counter() - started
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        raw_head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", ""):
            self._read_chunked()
        else:
            length = int(headers.get("content-length", "0"))
            while len(self.buf) < length:
                self._fill()
            self.buf = self.buf[length:]
        return ttfb, time.perf_counter() - started, status

    def _read_chunked(self) -> None:
        while True:
            while (end := self.buf.find(b"\r\n")) < 0:
                self._fill()
            size = int(self.buf[:end].split(b";")[0], 16)
            need = end + 2 + size + 2  # size line, data, CRLF (the last chunk: no trailers)
            while len(self.buf) < need:
                self._fill()
            self.buf = self.buf[need:]
            if size == 0:
                return


def settle(seconds: float) -> None:
    """Wait ``seconds`` without sleeping: a sleeping CPU in a VM takes tens of microseconds to wake,
    which the next request would pay."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(sim: SimProcess, relays: list[Relay], body: bytes, requests: int, warmup: int,
            settle_s: float = 0.0) -> dict[str, Any]:
    """Rounds of one request direct and one through each relay, the order shuffled each round;
    TTFB and complete-answer lists in seconds, by way, and each relay's CPU per request."""
    ways: dict[str, RawConnection] = {"direct": RawConnection(sim.port)}
    for relay in relays:
        ways[relay.name] = RawConnection(relay.port, relay.headers)
    names = list(ways)
    order = random.Random(SEED)
    try:
        for _ in range(warmup):
            for connection in ways.values():
                connection.request(body)
                settle(settle_s)
        ttfb: dict[str, list[float]] = {name: [] for name in names}
        complete: dict[str, list[float]] = {name: [] for name in names}
        cpu_before = {relay.name: relay.cpu() for relay in relays}
        for _ in range(requests):
            order.shuffle(names)
            for name in names:
                first, whole, status = ways[name].request(body)
                if status != 200:
                    raise RuntimeError(f"{name} request answered {status}")
                ttfb[name].append(first)
                complete[name].append(whole)
                settle(settle_s)
        cpu = {relay.name: (relay.cpu() - cpu_before[relay.name]) / requests for relay in relays}
    finally:
        for connection in ways.values():
            connection.close()
    return {"ttfb": ttfb, "complete": complete, "cpu_per_request": cpu}


def measure_tokens(sim: SimProcess, relays: list[Relay], body: bytes, tokens: int, streams: int) -> dict[str, float]:
    """Long streams through each relay in turn (the order rotating); each relay's CPU seconds over
    the whole run (what its threads did meanwhile included) per streamed token."""
    ways = {relay.name: RawConnection(relay.port, relay.headers) for relay in relays}
    try:
        for connection in ways.values():  # warm-up
            connection.request(body)
        before = {relay.name: relay.cpu() for relay in relays}
        for index in range(streams):
            shift = index % len(relays)
            for relay in relays[shift:] + relays[:shift]:
                status = ways[relay.name].request(body)[2]
                if status != 200:
                    raise RuntimeError(f"{relay.name} long stream answered {status}")
        cpu = {relay.name: relay.cpu() - before[relay.name] for relay in relays}
    finally:
        for connection in ways.values():
            connection.close()
    return {name: seconds / (streams * tokens) for name, seconds in cpu.items()}


def _rows(result: dict[str, Any], what: str) -> dict[str, list[float]]:
    return {k: [v * 1e3 for v in values] for k, values in result[what].items()}


def report(name: str, result: dict[str, Any]) -> bool:
    rows = {"TTFB": _rows(result, "ttfb"), "complete answer": _rows(result, "complete")}
    print(f"{name} ({len(result['ttfb']['direct'])} requests each way)")
    print(f"  {'':32s} {'median':>9s} {'p90':>9s}")
    added: dict[str, dict[str, tuple[float, float]]] = {}
    relays = [way for way in result["ttfb"] if way != "direct"]
    for what, ms in rows.items():
        med = {k: statistics.median(v) for k, v in ms.items()}
        p90 = {k: percentile(v, 90) for k, v in ms.items()}
        added[what] = {}
        print(f"  {'direct ' + what:32s} {med['direct']:7.3f}ms {p90['direct']:7.3f}ms")
        for relay in relays:
            paired = statistics.median(g - d for g, d in zip(ms[relay], ms["direct"]))
            added[what][relay] = (med[relay] - med["direct"], p90[relay] - p90["direct"])
            # the gateway's lines keep their original wording ("added TTFB")
            label = "added " + what if relay == "gateway" else f"added by {relay} " + what
            print(f"  {'via ' + relay + ' ' + what:32s} {med[relay]:7.3f}ms {p90[relay]:7.3f}ms")
            print(f"  {label:32s} {added[what][relay][0]:7.3f}ms {added[what][relay][1]:7.3f}ms"
                  f"   (paired median {paired:.3f}ms)")
    result["added_ttfb"] = added["TTFB"]
    for relay in relays:
        print(f"  {relay} CPU per request: {result['cpu_per_request'][relay] * 1e3:.3f} ms")
    passed = True
    if "gateway" in relays:
        passed = added["TTFB"]["gateway"][0] <= TARGET_ADDED_MEDIAN_MS
        print(f"  target: added median TTFB <= {TARGET_ADDED_MEDIAN_MS:g} ms on loopback: "
              f"{'PASS' if passed else 'MISS'}")
    return passed


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "n/a"


def summary(results: dict[str, dict[str, Any]], per_token: dict[str, float], long_tokens: int, streams: int) -> bool:
    """The relays side by side; the proxy's target and its ratios to nginx's."""
    relays = [r for r in RELAYS if r in next(iter(results.values()))["added_ttfb"]]
    workloads = list(results)
    print(f"side by side: TTFB added, median / p90 (ms); CPU per streamed token (us, {streams} streams of "
          f"{long_tokens} tokens per relay)")
    print(f"  {'relay':8s}" + "".join(f" {w:>19s}" for w in workloads) + f" {'CPU/token':>10s}")
    for relay in relays:
        cells = "".join(f" {results[w]['added_ttfb'][relay][0]:9.3f} / {results[w]['added_ttfb'][relay][1]:5.3f}"
                        for w in workloads)
        print(f"  {relay:8s}{cells} {per_token[relay] * 1e6:10.2f}")
    if "proxy" not in relays:
        return True
    proxy = {w: results[w]["added_ttfb"]["proxy"][0] for w in workloads}
    passed = all(v <= PROXY_TARGET_ADDED_MEDIAN_MS for v in proxy.values())
    if "nginx" in relays:
        nginx = {w: results[w]["added_ttfb"]["nginx"][0] for w in workloads}
        ratios = ", ".join(f"{w} {_ratio(proxy[w], nginx[w])}" for w in workloads)
        print(f"  proxy / nginx: added median TTFB {ratios}; CPU per streamed token "
              f"{_ratio(per_token['proxy'], per_token['nginx'])}")
    else:
        print("  proxy / nginx: n/a (nginx left out)")
    print(f"  target: proxy's added median TTFB <= {PROXY_TARGET_ADDED_MEDIAN_MS:g} ms on loopback: "
          f"{'PASS' if passed else 'MISS'}")
    return passed


def cpu_placement(pin: bool) -> tuple[set[int], set[int]] | None:
    """(the client's CPU, the servers' CPUs), or None where there is one CPU or no pinning."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else None


def _cpus(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests per way and workload")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per answer")
    parser.add_argument("--long-tokens", type=int, default=256, help="tokens per long stream (CPU per token)")
    parser.add_argument("--streams", type=int, default=40, help="long streams per relay")
    parser.add_argument("--quick", action="store_true", help="60 requests, 10 long streams, short warm-up (smoke run)")
    parser.add_argument("--relays", default=",".join(RELAYS),
                        help="which relays to measure beside direct (default: all; nginx only where installed)")
    parser.add_argument("--max-concurrency", type=int, default=64, help="gateway upstream slots")
    parser.add_argument("--settle-ms", type=float, default=0.5,
                        help="busy wait after each answer, before the next request (default 0.5)")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave the client and the servers wherever the kernel puts them (default: the client "
                             "on a CPU of its own)")
    args = parser.parse_args(argv)
    requests, warmup, streams = (60, 10, 10) if args.quick else (args.requests, 30, args.streams)
    wanted = [r.strip() for r in args.relays.split(",") if r.strip()]
    unknown = set(wanted) - set(RELAYS)
    if unknown:
        parser.error(f"unknown relay(s) {', '.join(sorted(unknown))}: choose from {', '.join(RELAYS)}")
    if "nginx" in wanted and not os.path.exists(NGINX):
        print(f"nginx: {NGINX} is missing (apt-get install nginx-light): left out", file=sys.stderr)
        wanted.remove("nginx")
    chat = {"model": "sim-model", "max_tokens": args.tokens, "messages": [{"role": "user", "content": "hi"}]}
    workloads = {
        "non-streamed chat": json.dumps(chat).encode(),
        "streamed chat": json.dumps({**chat, "stream": True}).encode(),
    }
    long_stream = json.dumps({**chat, "max_tokens": args.long_tokens, "stream": True}).encode()
    placement = cpu_placement(not args.no_pin)
    if placement:
        os.sched_setaffinity(0, placement[1])  # every server started below inherits it
    with tempfile.TemporaryDirectory(prefix="otel-llm-gateway-bench-") as scratch, ExitStack() as running:
        env = {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
               "OTEL_LLM_TRACES_FILE": str(Path(scratch) / "traces.jsonl")}
        sim = running.enter_context(SimProcess(runtime="openai", headers_delay=0.0, first_token_delay=0.0,
                                               token_interval=0.0, tokens=max(args.tokens, args.long_tokens)))
        relays: list[Relay] = []
        for name in (r for r in RELAYS if r in wanted):
            if name == "gateway":
                gateway = running.enter_context(GatewayProcess(sim.base_url, env=env,
                                                               max_concurrency=args.max_concurrency))
                relays.append(ChildRelay(name, gateway, gateway.headers()))
            elif name == "proxy":
                proxy = running.enter_context(ProxyProcess(sim.base_url, env=env))
                relays.append(ChildRelay(name, proxy, {}))
            else:
                nginx = NginxRelay(sim.port)
                running.callback(nginx.stop)
                relays.append(nginx)
        if placement:
            os.sched_setaffinity(0, placement[0])
        results = {}
        for name, body in workloads.items():
            results[name] = measure(sim, relays, body, requests, warmup, max(0.0, args.settle_ms) / 1e3)
            print(f"{name} done", file=sys.stderr)
        per_token = measure_tokens(sim, relays, long_stream, args.long_tokens, streams) if relays else {}
        print("long streams done", file=sys.stderr)
    where = (f"client on CPU {_cpus(placement[0])}, servers on CPU {_cpus(placement[1])}" if placement
             else "client and servers unpinned")
    print(f"loopback, {psutil.cpu_count()} CPU(s), {where}, {args.settle_ms:g} ms between requests, "
          f"{requests} measured requests per way and workload")
    passed = [report(name, result) for name, result in results.items()]
    if relays:
        passed.append(summary(results, per_token, args.long_tokens, streams))
    print(f"overall: {'PASS' if all(passed) else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
