"""Time to first byte that ``otel-llm gateway`` adds in front of a model server, and the gateway's
CPU per request.

One run, on loopback: the simulator in one process (zero injected delays, a few tokens), the
gateway (the real CLI, default telemetry: spans to a JSON-lines file in a temporary directory,
access log to a file) in another, this client in a third. Requests go directly to the simulator
and through the gateway alternately (the order flips every pair), each over its own kept-alive
raw socket with TCP_NODELAY, so no HTTP client library sits in the measurement. Time to first
byte is from the moment the request was written to the first byte of the response head.
Workloads: non-streamed chat calls, and small streamed chat calls (TTFB is the response head;
the whole stream is read before the next request).

The "added" figures are the median (p90) through the gateway minus the median (p90) direct;
"paired" is the median of per-pair differences. "complete answer" is the median time until the
whole answer was read: a relay whose writes wait for TCP acknowledgements (Nagle with delayed
ACKs) shows there as ~40 ms, as the client here, like an SDK in a loop, sends its next request
right after the last answer. Gateway CPU per request is the gateway process's user+system CPU
(psutil, all threads: span export and access log included) over the measured requests, divided
by their number. Run it on a quiet machine: other processes on the same cores add to every figure.

    python benchmarks/gateway.py [--requests 300] [--tokens 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm.tools.sim import SimProcess

TARGET_ADDED_MEDIAN_MS = 1.0
PATH = "/v1/chat/completions"


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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(sim: SimProcess, gateway: GatewayProcess, body: bytes, requests: int,
            warmup: int) -> dict[str, Any]:
    """Interleaved direct / gateway requests; TTFB lists in seconds and the gateway's CPU."""
    direct = RawConnection(sim.port)
    via = RawConnection(int(gateway.url.rsplit(":", 1)[1]), gateway.headers())
    proc = psutil.Process(gateway.pid)
    try:
        for _ in range(warmup):
            direct.request(body)
            via.request(body)
        ttfb: dict[str, list[float]] = {"direct": [], "gateway": []}
        complete: dict[str, list[float]] = {"direct": [], "gateway": []}
        cpu_before = proc.cpu_times()
        for index in range(requests):
            order = (("direct", direct), ("gateway", via))
            for name, connection in order if index % 2 == 0 else order[::-1]:
                first, whole, status = connection.request(body)
                if status != 200:
                    raise RuntimeError(f"{name} request answered {status}")
                ttfb[name].append(first)
                complete[name].append(whole)
        cpu_after = proc.cpu_times()
    finally:
        direct.close()
        via.close()
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {**ttfb, "complete": complete, "cpu_per_request": cpu / requests}


def report(name: str, result: dict[str, Any]) -> bool:
    rows = {"TTFB": {k: [v * 1e3 for v in result[k]] for k in ("direct", "gateway")},
            "complete answer": {k: [v * 1e3 for v in result["complete"][k]] for k in ("direct", "gateway")}}
    print(f"{name} ({len(result['direct'])} requests each way)")
    print(f"  {'':28s} {'median':>9s} {'p90':>9s}")
    added = {}
    for what, ms in rows.items():
        med = {k: statistics.median(v) for k, v in ms.items()}
        p90 = {k: percentile(v, 0.9) for k, v in ms.items()}
        paired = statistics.median(g - d for g, d in zip(ms["gateway"], ms["direct"]))
        added[what] = med["gateway"] - med["direct"]
        print(f"  {'direct ' + what:28s} {med['direct']:7.3f}ms {p90['direct']:7.3f}ms")
        print(f"  {'via gateway ' + what:28s} {med['gateway']:7.3f}ms {p90['gateway']:7.3f}ms")
        print(f"  {'added ' + what:28s} {added[what]:7.3f}ms {p90['gateway'] - p90['direct']:7.3f}ms"
              f"   (paired median {paired:.3f}ms)")
    print(f"  gateway CPU per request: {result['cpu_per_request'] * 1e3:.3f} ms")
    passed = added["TTFB"] <= TARGET_ADDED_MEDIAN_MS
    print(f"  target: added median TTFB <= {TARGET_ADDED_MEDIAN_MS:g} ms on loopback: {'PASS' if passed else 'MISS'}")
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests per way and workload")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per answer")
    parser.add_argument("--quick", action="store_true", help="60 requests, short warm-up (smoke run)")
    parser.add_argument("--max-concurrency", type=int, default=64, help="gateway upstream slots")
    args = parser.parse_args(argv)
    requests, warmup = (60, 10) if args.quick else (args.requests, 30)
    chat = {"model": "sim-model", "max_tokens": args.tokens, "messages": [{"role": "user", "content": "hi"}]}
    workloads = {
        "non-streamed chat": json.dumps(chat).encode(),
        "streamed chat": json.dumps({**chat, "stream": True}).encode(),
    }
    with tempfile.TemporaryDirectory(prefix="otel-llm-gateway-bench-") as scratch:
        env = {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
               "OTEL_LLM_TRACES_FILE": str(Path(scratch) / "traces.jsonl")}
        with SimProcess(runtime="openai", headers_delay=0.0, first_token_delay=0.0, token_interval=0.0,
                        tokens=args.tokens) as sim, \
                GatewayProcess(sim.base_url, env=env, max_concurrency=args.max_concurrency) as gateway:
            results = {}
            for name, body in workloads.items():
                results[name] = measure(sim, gateway, body, requests, warmup)
                print(f"{name} done", file=sys.stderr)
    print(f"loopback, {psutil.cpu_count()} CPU(s), {requests} measured requests per way and workload")
    passed = [report(name, result) for name, result in results.items()]
    print(f"overall: {'PASS' if all(passed) else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
