"""``otel-llm proxy`` with ``OTEL_LLM_SAMPLE_RATE``: its SERVER span waits for the model call it
relays and is kept with it, else only for an error status. The caller is httpx, not instrumented:
the proxy's spans are the only record of each call. Real processes on loopback: the simulator and
the proxy (the real CLI, exporting to a JSON-lines file in ``tmp_path``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.proxy import KIND_CLIENT, KIND_SERVER, Proxy, children

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
CHAT = "/api/chat"
ORDINARY = 25  # more than the 20 calls a series needs before it judges anything slow


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(runtime="ollama", tokens=4, first_token_delay=0.004, token_interval=0.002) as process:
        yield process


def _proxy(sim: SimProcess, tmp_path: Path) -> Proxy:
    return Proxy(sim.base_url, tmp_path, "--access-log", str(tmp_path / "access.jsonl"),
                 env={"OTEL_LLM_SAMPLE_RATE": "0", "OTEL_LLM_CONSOLE_SUMMARY": "false"})


def _access(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "access.jsonl").read_text().splitlines()]


def test_at_rate_0_the_proxy_exports_only_the_failed_call_with_its_whole_tree(sim: SimProcess,
                                                                               tmp_path: Path) -> None:
    with _proxy(sim, tmp_path) as proxy, httpx.Client(base_url=proxy.url, timeout=30) as client:
        for _ in range(10):
            assert client.post(CHAT, json=BODY).status_code == 200
        assert client.post(CHAT, json=BODY, headers={"x-sim-error-status": "500"}).status_code == 500
    assert proxy.exit_code == 0, proxy.log()
    spans = proxy.spans()
    (server,) = [s for s in spans if s["kind"] == KIND_SERVER]
    (call,) = [s for s in spans if s["kind"] == KIND_CLIENT]
    assert {s["traceId"] for s in spans} == {server["traceId"]}, "nothing of the ordinary calls"
    # the failed request's trace id, from the access log: the one exported
    records = _access(tmp_path)
    assert [r["status"] for r in records] == [200] * 10 + [500]
    assert server["traceId"] == records[-1]["trace_id"]
    assert call["parentSpanId"] == server["spanId"]
    assert server["attributes"][sc.HTTP_RESPONSE_STATUS_CODE] == 500
    phases = [k["name"] for k in children(spans, call)]
    assert {sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT} <= set(phases), phases
    for span in (server, call):
        assert list(span["attributes"][sc.LLM_SAMPLING_REASON]) == ["failed"], span["name"]
        assert span["attributes"][sc.LLM_SAMPLING_ADJUSTED_COUNT] == 1.0


def _trickled(body: bytes, pause: float) -> Iterator[bytes]:
    """The request body in two halves, ``pause`` seconds apart (a slow upload)."""
    yield body[: len(body) // 2]
    time.sleep(pause)
    yield body[len(body) // 2:]


def test_a_request_slow_only_outside_the_model_call_keeps_no_tree_without_the_call(sim: SimProcess,
                                                                                    tmp_path: Path) -> None:
    """A slow upload makes the request slow, not the model call it relays (which starts once the
    body is in): the call is dropped at rate 0, and the SERVER span must not be kept alone, a tree
    without its model call (it was, by the slow rule judging the SERVER span's own duration)."""
    body = json.dumps(BODY).encode()
    with _proxy(sim, tmp_path) as proxy, httpx.Client(base_url=proxy.url, timeout=30) as client:
        for _ in range(ORDINARY):
            assert client.post(CHAT, json=BODY).status_code == 200
        slow = client.post(CHAT, content=_trickled(body, 0.5), headers={"content-type": "application/json"})
        assert slow.status_code == 200
        # the upload did make the request slow (half a second against a few milliseconds)
        assert slow.elapsed.total_seconds() >= 0.5
    assert proxy.exit_code == 0, proxy.log()
    records = _access(tmp_path)
    assert len(records) == ORDINARY + 1 and records[-1]["total_ms"] >= 500
    assert proxy.spans() == [], [(s["name"], s["attributes"].get(sc.LLM_SAMPLING_REASON)) for s in proxy.spans()]
