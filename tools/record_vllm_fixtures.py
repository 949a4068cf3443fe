"""Record a real vLLM's answers as test fixtures: ``tests/fixtures/runtimes/vllm/`` (responses)
and ``tests/fixtures/observers/vllm_real_metrics.txt`` (its ``/metrics`` after those calls).

    python tools/record_vllm_fixtures.py                       # start the test vLLM and record
    python tools/record_vllm_fixtures.py --base-url URL --out DIR --model NAME   # a running server

Without ``--base-url`` it starts ``otel_llm_testing.vllm.VllmServer`` (the tiny local model, with
``--enable-prompt-tokens-details`` so cached prompt tokens are reported) and writes into the
repository, so a new vLLM version is one command away from fresh fixtures. Output lengths are
fixed (``ignore_eos``); the text is the tiny model's noise. ``error_stream.sse`` is not recorded
(a mid-stream engine failure cannot be provoked on purpose) and stays hand-written.

    python tools/record_vllm_fixtures.py --per-request-metrics [--base-url URL]

records only the answers of a server started with ``--enable-per-request-metrics`` (its
``metrics`` object): ``chat_metrics.json`` and ``chat_stream_metrics.sse``, both n=1 (vLLM gives
none for n > 1), the stream with ``stream_options.include_usage`` (the object rides the usage
chunk). Their requests also carry ``include_metrics: true``, which vLLM 0.32 does not define and
ignores: the server's flag alone decides.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# long enough to fill a KV-cache block, so that the second identical request reuses it
PROMPT = " ".join(["Where did the time go between the request and the first token?"] * 12)
FIXED = {"ignore_eos": True, "seed": 7}  # n=2 needs sampling: seeded instead of greedy


def _chat(model: str, tokens: int, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens, **FIXED, **extra}


def _stream(client: httpx.Client, path: str, body: dict[str, object]) -> bytes:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        data = response.read()
        if response.status_code != 200:
            raise SystemExit(f"POST {path} answered {response.status_code}: {data[:500]!r}")
        return data


def record(base_url: str, model: str, responses: Path, metrics: Path) -> list[Path]:
    """Make the calls and write the files; the paths written."""
    responses.mkdir(parents=True, exist_ok=True)
    written = []
    with httpx.Client(base_url=base_url, timeout=120) as client:
        client.post("/v1/chat/completions", json=_chat(model, 4)).raise_for_status()  # warms the prefix cache
        files = {
            "chat.json": client.post("/v1/chat/completions", json=_chat(model, 12, n=2)).content,
            "chat_stream.sse": _stream(client, "/v1/chat/completions",
                                       _chat(model, 8, stream_options={"include_usage": True})),
            "chat_stream_continuous_usage.sse": _stream(
                client, "/v1/chat/completions",
                _chat(model, 5, stream_options={"include_usage": True, "continuous_usage_stats": True})),
            "completions_stream.sse": _stream(client, "/v1/completions", {
                "model": model, "prompt": PROMPT, "max_tokens": 6, "n": 2,
                "stream_options": {"include_usage": True}, **FIXED}),
        }
        for name, body in files.items():
            path = responses / name
            path.write_bytes(body)
            written.append(path)
        metrics.write_bytes(client.get("/metrics").content)
        written.append(metrics)
    json.loads(files["chat.json"])  # a non-JSON answer is an error worth stopping for
    return written


def record_metrics(base_url: str, model: str, responses: Path) -> list[Path]:
    """The ``--per-request-metrics`` answers (the server must run with the flag); the paths written."""
    responses.mkdir(parents=True, exist_ok=True)
    asked = {"include_metrics": True}  # not a vLLM 0.32 field: ignored, recorded to show it
    with httpx.Client(base_url=base_url, timeout=120) as client:
        client.post("/v1/chat/completions", json=_chat(model, 4)).raise_for_status()  # warms the prefix cache
        files = {
            "chat_metrics.json": client.post("/v1/chat/completions", json=_chat(model, 12, **asked)).content,
            "chat_stream_metrics.sse": _stream(client, "/v1/chat/completions",
                                               _chat(model, 8, stream_options={"include_usage": True}, **asked)),
        }
    if "metrics" not in json.loads(files["chat_metrics.json"]):
        raise SystemExit("no `metrics` in the answer: is the server running with --enable-per-request-metrics?")
    written = []
    for name, body in files.items():
        path = responses / name
        path.write_bytes(body)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="a running vLLM (default: start the test one)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "runtimes" / "vllm")
    parser.add_argument("--metrics-out", type=Path,
                        default=ROOT / "tests" / "fixtures" / "observers" / "vllm_real_metrics.txt")
    parser.add_argument("--per-request-metrics", action="store_true",
                        help="record only the answers of a server run with --enable-per-request-metrics")
    args = parser.parse_args(argv)

    def recorded(base_url: str, model: str) -> list[Path]:
        if args.per_request_metrics:
            return record_metrics(base_url, model, args.out)
        return record(base_url, model, args.out, args.metrics_out)

    if args.base_url:
        written = recorded(args.base_url, args.model)
    else:
        sys.path.insert(0, str(ROOT))
        from otel_llm_testing.vllm import VllmServer

        extra = ["--enable-prompt-tokens-details"]
        if args.per_request_metrics:
            extra.append("--enable-per-request-metrics")
        with VllmServer(extra_args=extra) as server:
            written = recorded(server.base_url, server.model_name)
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
