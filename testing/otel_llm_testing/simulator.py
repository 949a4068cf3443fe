"""Driving the simulator a test runs (``otel_llm.tools.sim``) over its control endpoints, and the
raw-socket reference timeline that accuracy is judged against."""

from __future__ import annotations

import json
import socket
import statistics
import time
from typing import Any

import httpx

__all__ = ["configure_sim", "raw_timeline", "sim_stats"]


def configure_sim(sim: Any, **fields: Any) -> None:
    """Change the running simulator's configuration (``/sim/config``)."""
    httpx.post(f"{sim.base_url}/sim/config", json=fields, timeout=10).raise_for_status()


def sim_stats(sim: Any) -> dict[str, Any]:
    """What the simulator counted (``/sim/stats``)."""
    return httpx.get(f"{sim.base_url}/sim/stats", timeout=10).json()


def raw_timeline(sim: Any, body: dict, calls: int = 9, path: str = "/v1/chat/completions",
                 spread: list[float] | None = None) -> tuple[float, float, float]:
    """What the simulator actually did: median (first byte, first token, last token) times after
    the request was sent, seen by a raw socket client with no httpx and no otel_llm in the path.
    On a busy machine the simulator's wake-ups run late; accuracy is judged against this."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{sim.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    samples = []
    for _ in range(calls):
        with socket.create_connection(("127.0.0.1", sim.port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(head.encode() + payload)
            sent = time.perf_counter()
            data, first_byte, tokens = b"", None, []
            while True:
                chunk = conn.recv(65536)
                now = time.perf_counter() - sent
                if not chunk:
                    break
                first_byte = now if first_byte is None else first_byte
                tokens += [now] * chunk.count(b'"content": "tok') + [now] * chunk.count(b'"content":"tok') \
                    + [now] * chunk.count(b'"content": " tok') + [now] * chunk.count(b'"content":" tok')
                data += chunk
        samples.append((first_byte, tokens[0], tokens[-1]))
    if spread is not None:  # how far single answers stray from the median: the simulator's own jitter
        spread.extend(abs(s[0] - statistics.median(x[0] for x in samples)) for s in samples)
    return tuple(statistics.median(s[i] for s in samples) for i in range(3))  # type: ignore[return-value]
