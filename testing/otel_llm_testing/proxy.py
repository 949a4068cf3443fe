"""``otel-llm proxy`` driven as the tests drive it: the proxy in a child process exporting to a
JSON-lines file, a streamed call by Debian's curl, and readers of the SSE stream and spans."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from otel_llm.export.jsonl import read_jsonl
from otel_llm.tools.gateway.process import ProxyProcess

__all__ = ["CHAT", "KIND_CLIENT", "KIND_INTERNAL", "KIND_SERVER", "Proxy", "children", "curl", "events", "framing",
           "skeleton", "text_of"]

KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3  # OTLP numbering
CHAT = "/v1/chat/completions"


class Proxy(ProxyProcess):
    """``otel-llm proxy`` in a child process, exporting spans to ``traces``; a context manager.
    The spans are complete once ``stop()`` returned (the exporter flushes at shutdown)."""

    def __init__(self, upstream: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.traces = tmp_path / "proxy-traces.jsonl"
        super().__init__(upstream, *args, log_path=tmp_path / "proxy.log", env={
            "OTEL_LLM_TRACES_FILE": str(self.traces), "OTEL_LLM_HOST_METRICS": "false",
            "OTEL_LLM_GPU_METRICS": "false", **(env or {})})

    def spans(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.traces)) if self.traces.exists() else []


def curl(url: str, body: dict[str, Any], *headers: str) -> tuple[bytes, dict[str, float]]:
    """A streamed POST by curl: the bytes it received and its own timings (seconds)."""
    write_out = "%{stderr}%{time_connect} %{time_starttransfer} %{time_total} %{http_code}"
    args = ["curl", "-sS", "-N", "-H", "content-type: application/json", "--write-out", write_out,
            "--data-binary", json.dumps(body)]
    for header in headers:
        args += ["-H", header]
    done = subprocess.run([*args, url], capture_output=True, timeout=30, check=True)
    connect, start, total, status = done.stderr.decode().split()[-4:]
    return done.stdout, {"connect": float(connect), "starttransfer": float(start), "total": float(total),
                         "status": float(status)}


def events(stream: bytes) -> list[Any]:
    """The SSE events, each call's own values (id, creation time, measured timings) left out."""
    out: list[Any] = []
    for line in stream.decode().splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            out.append(data)
            continue
        event = json.loads(data)
        event.pop("id", None)
        event.pop("created", None)
        if "timings" in event:
            event["timings"] = sorted(event["timings"])
        out.append(event)
    return out


def skeleton(value: Any) -> Any:
    """A JSON value's shape: the keys and the value types, and each object's ``object`` name."""
    if isinstance(value, dict):
        return {k: (v if k == "object" else skeleton(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [skeleton(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return type(value).__name__


def framing(stream: bytes) -> list[Any]:
    """A stream's events by shape, each run of same-shaped events (the tokens) as one."""
    shapes: list[Any] = []
    for line in stream.decode().splitlines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        shape = data if data == "[DONE]" else skeleton(json.loads(data))
        if not shapes or shapes[-1] != shape:
            shapes.append(shape)
    return shapes


def text_of(stream: bytes) -> str:
    """The text a chat stream carried."""
    return "".join(choice["delta"].get("content") or "" for event in events(stream) if isinstance(event, dict)
                   for choice in event["choices"])


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    """``parent``'s child spans (OTLP/JSON) in time order."""
    return sorted((s for s in spans if s["parentSpanId"] == parent["spanId"]), key=lambda s: s["startTimeUnixNano"])
