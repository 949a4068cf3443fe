"""Runtime counters and diagnosis against the simulator's injected truth."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otel_llm
from otel_llm import semconv as sc
from otel_llm.telemetry.runtime import synthesized_spans
from otel_llm.parse.runtimes import RuntimeCounters
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.simulator import configure_sim, raw_timeline, sim_stats

# the tests marked timing measure wall-clock time (or need concurrent calls to overlap) on a shared
# 2-core machine: one bad scheduling moment is not a regression; the others are exact

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi there"}]}
TOLERANCE = 0.005


def _stream(url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
            client: httpx.Client | None = None) -> None:
    own = client is None
    client = client or httpx.Client()
    try:
        with client.stream("POST", url, json={**(body or CHAT), "stream": True}, headers=headers or {}) as response:
            response.read()
    finally:
        if own:
            client.close()


def _assert_synthesized_inside(otel: Otel, call) -> None:
    spans = otel.children(call, synthesized=True)
    for span in spans:
        assert call.start_time <= span.start_time < span.end_time <= call.end_time
    for before, after in zip(spans, spans[1:]):
        assert before.end_time <= after.start_time


@pytest.mark.timing
def test_cold_load_is_flagged_and_drawn(sim, otel: Otel) -> None:
    configure_sim(sim, runtime="ollama", cold_delay=0.4, first_token_delay=0.05, token_interval=0.005, tokens=5)
    _stream(f"{sim.base_url}/api/chat")
    _stream(f"{sim.base_url}/api/chat")
    cold, warm = sorted(otel.calls(), key=lambda c: c.start_time)
    assert cold.attributes[sc.LLM_DIAGNOSIS_COLD_START] is True
    assert abs(cold.attributes[sc.LLM_RUNTIME_LOAD_DURATION] - 0.4) < 0.02
    assert cold.attributes[sc.LLM_DIAGNOSIS_BOTTLENECK] == "load"
    assert warm.attributes.get(sc.LLM_DIAGNOSIS_COLD_START) in (None, False)
    names = [s.name for s in otel.children(cold, synthesized=True)]
    assert names == [sc.SPAN_RUNTIME_LOAD, sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE]
    load = otel.children(cold, synthesized=True)[0]
    assert abs((load.end_time - load.start_time) / 1e9 - 0.4) < 0.02
    _assert_synthesized_inside(otel, cold)


def test_call_after_an_unload_is_cold(sim, otel: Otel) -> None:
    configure_sim(sim, runtime="ollama", cold_delay=0.0, first_token_delay=0.01, token_interval=0.001, tokens=3)
    _stream(f"{sim.base_url}/api/chat", {**CHAT, "keep_alive": 0})
    _stream(f"{sim.base_url}/api/chat")
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    assert first.attributes.get(sc.LLM_DIAGNOSIS_COLD_START) is not True
    assert second.attributes[sc.LLM_DIAGNOSIS_COLD_START] is True


@pytest.mark.slow
@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.timing
def test_unaccounted_wait_matches_an_injected_delay(sim, otel: Otel, streamed: bool) -> None:
    """llama.cpp reports prompt and generation time; a delay before the response is nobody's."""
    configure_sim(sim, runtime="llama.cpp", headers_delay=0.08, first_token_delay=0.05, token_interval=0.005, tokens=8)
    url = f"{sim.base_url}/v1/chat/completions"
    with httpx.Client() as client:
        for _ in range(5):
            if streamed:
                _stream(url, client=client)
            else:
                client.post(url, json=CHAT).raise_for_status()
    # the delay the simulator really spent before its headers (it runs late on a busy machine)
    actual, _, _ = raw_timeline(sim, {**CHAT, "stream": True})
    assert abs(actual - 0.08) < 0.015
    errors = sorted(abs(c.attributes[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT] - actual) for c in otel.calls())
    assert errors[-2] <= TOLERANCE, errors  # the 4 best of 5: one noisy call is allowed
    call = otel.calls()[-1]
    assert call.attributes[sc.LLM_RUNTIME_NAME] == "llama.cpp"  # evidence: the `timings` object
    assert abs(call.attributes[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] - 0.05) < 0.01
    _assert_synthesized_inside(otel, call)


@pytest.mark.timing
def test_serialized_runtime_shows_the_second_call_queued(sim, otel: Otel) -> None:
    # the first call's prefill (0.3 s) keeps the second one's queue well above its own decode (0.19 s)
    configure_sim(sim, runtime="ollama", concurrency="serialized", first_token_delay=0.3,
                  token_interval=0.01, tokens=20)
    threads = [threading.Thread(target=_stream, args=(f"{sim.base_url}/api/chat",)) for _ in range(2)]
    received = sim_stats(sim)["requests"]
    threads[0].start()
    # the second call goes once the simulator holds the first (a loaded machine may start the
    # first thread's request late): it then waits for most of the first one's 0.49 s
    deadline = time.monotonic() + 10
    while sim_stats(sim)["requests"] == received and time.monotonic() < deadline:
        time.sleep(0.005)
    threads[1].start()
    for thread in threads:
        thread.join()
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    assert first.attributes[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 0
    assert second.attributes[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 1
    waited = second.attributes[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT]
    assert waited > 0.2  # the rest of the first call's generation, which Ollama does not report
    assert first.attributes[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT] < 0.02
    assert second.attributes[sc.LLM_DIAGNOSIS_BOTTLENECK] == "queue"


def _buffered_runs(sim, otel: Otel, runs: int, **fields: Any) -> list[bool]:
    configure_sim(sim, first_token_delay=0.0, tokens=24, **fields)
    with httpx.Client() as client:
        for _ in range(runs):
            _stream(f"{sim.base_url}/v1/chat/completions", client=client)
    return [c.attributes.get(sc.LLM_DIAGNOSIS_STREAM_BUFFERED) for c in otel.calls()]


@pytest.mark.slow
@pytest.mark.timing
def test_buffering_proxy_is_flagged_every_time(sim, otel: Otel) -> None:
    flags = _buffered_runs(sim, otel, 20, token_interval=0.01, buffering=True, buffer_flush_interval=0.08)
    assert flags == [True] * 20


@pytest.mark.slow
@pytest.mark.parametrize("interval", [0.01, 0.004])
@pytest.mark.timing
def test_healthy_stream_is_never_flagged(sim, otel: Otel, interval: float) -> None:
    flags = _buffered_runs(sim, otel, 20, token_interval=interval)
    assert flags == [False] * 20


def test_configured_runtime_beats_evidence_and_evidence_beats_route(sim) -> None:
    configure_sim(sim, runtime="llama.cpp", first_token_delay=0.0, token_interval=0.0, tokens=2)
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        runtimes={f"http://localhost:{sim.port}": "vllm"})
    try:
        with httpx.Client() as client:
            client.post(f"{sim.base_url}/v1/chat/completions", json=CHAT)  # evidence: llama.cpp timings
            client.post(f"http://localhost:{sim.port}/v1/chat/completions", json=CHAT)  # configured: vllm
            client.post(f"{sim.base_url}/api/chat", json={**CHAT, "stream": False},
                        headers={"x-sim-runtime": "tgi"})  # route says ollama; no counters contradict it
    finally:
        otel_llm.uninstrument()
    evidence, configured, route = sorted(state.calls(), key=lambda c: c.start_time)
    assert evidence.attributes[sc.GEN_AI_PROVIDER_NAME] == "llama.cpp"
    assert configured.attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"
    assert route.attributes[sc.LLM_RUNTIME_NAME] == "ollama"


@pytest.mark.timing  # a duplicate is a retry only while the first is still in flight
def test_retries_are_marked(sim, otel: Otel) -> None:
    configure_sim(sim, first_token_delay=0.15, token_interval=0.0, tokens=2)
    url = f"{sim.base_url}/v1/chat/completions"
    with httpx.Client() as client:
        client.post(url, json=CHAT, headers={"x-stainless-retry-count": "1"})
    threads = [threading.Thread(target=httpx.post, args=(url,), kwargs={"json": CHAT}) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls = sorted(otel.calls(), key=lambda c: c.start_time)
    assert calls[0].attributes[sc.LLM_DIAGNOSIS_RETRY] is True
    assert [c.attributes.get(sc.LLM_DIAGNOSIS_RETRY) for c in calls[1:]] == [None, True]


@pytest.mark.timing  # TTFT within 10 ms of the injected delay
def test_runtime_metrics(sim, otel: Otel) -> None:
    configure_sim(sim, runtime="llama.cpp", first_token_delay=0.02, token_interval=0.002, tokens=6)
    with httpx.Client() as client:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                           json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}) as response:
            during = [p.value for p in otel.metrics()[sc.METRIC_ACTIVE_REQUESTS]]
            response.read()
    assert during == [1]
    metrics = otel.metrics()
    for name in (sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN, sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN,
                 sc.METRIC_RUNTIME_PROMPT_EVAL_RATE, sc.METRIC_RUNTIME_GENERATION_RATE):
        assert metrics.get(name), name
    assert abs(metrics[sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN][0].sum - 0.02) < 0.01
    assert [p.value for p in metrics[sc.METRIC_ACTIVE_REQUESTS]] == [0]  # nothing in flight any more


@settings(max_examples=300, deadline=None)
@given(prefill=st.one_of(st.none(), st.floats(0, 5)), load=st.one_of(st.none(), st.floats(0, 5)),
       queue=st.one_of(st.none(), st.floats(0, 5)), decode=st.one_of(st.none(), st.floats(0, 5)),
       anchor=st.integers(0, 10**10), lower=st.integers(0, 10**10), length=st.integers(0, 10**10),
       streaming=st.booleans())
def test_synthesized_spans_stay_inside_and_never_overlap(prefill, load, queue, decode, anchor, lower, length,
                                                        streaming) -> None:
    counters = RuntimeCounters(prompt_eval_duration=prefill, load_duration=load, queue_duration=queue,
                               generation_duration=decode)
    upper = lower + length
    spans = synthesized_spans(counters, anchor, streaming, lower, upper)
    for span in spans:
        assert lower <= span.start_ns < span.end_ns <= upper
    for before, after in zip(spans, spans[1:]):
        assert before.end_ns <= after.start_ns


def _phases(**durations_ms: float) -> list:
    from otel_llm.telemetry.phases import Phase

    names = {"dns": sc.SPAN_DNS, "connect": sc.SPAN_CONNECT, "tls": sc.SPAN_TLS, "upload": sc.SPAN_UPLOAD,
             "pool": sc.SPAN_POOL_WAIT, "wait": sc.SPAN_SERVER_WAIT, "first": sc.SPAN_FIRST_TOKEN,
             "decode": sc.SPAN_DECODE, "download": sc.SPAN_DOWNLOAD}
    phases, cursor = [], 0
    for key, ms in durations_ms.items():
        phases.append(Phase(names[key], cursor, cursor + int(ms * 1e6), True))
        cursor += int(ms * 1e6)
    return phases


def test_bottleneck_categories() -> None:
    from otel_llm.telemetry.diagnosis import bottleneck

    slow_tls = _phases(dns=5, connect=80, tls=300, upload=5, wait=50, first=100, decode=200)
    assert bottleneck(slow_tls, None, None, True, False, 0) == "network"
    bursty = _phases(upload=1, wait=10, first=50, decode=900)
    assert bottleneck(bursty, None, None, True, True, 0) == "buffering"
    assert bottleneck(bursty, None, None, True, False, 0) == "decode"
    no_counters_busy = _phases(upload=1, wait=800, first=100, decode=300)
    assert bottleneck(no_counters_busy, None, None, True, False, 2) == "queue"
    assert bottleneck(no_counters_busy, None, None, True, False, 0) == "prefill"
    big_body = _phases(upload=1, wait=100, download=700)
    assert bottleneck(big_body, None, None, False, None, 0) == "download"
    counters = RuntimeCounters(prompt_eval_duration=0.6, generation_duration=0.2, load_duration=0.05)
    assert bottleneck(_phases(upload=1, wait=900, download=1), 0.05, counters, False, None, 0) == "prefill"


def _diagnosis_counts(otel: Otel) -> dict[tuple[Any, ...], int]:
    return {(p.attributes.get(sc.LLM_DIAGNOSIS_BOTTLENECK), p.attributes.get(sc.LLM_DIAGNOSIS_COLD_START)): p.value
            for p in otel.metrics()[sc.METRIC_DIAGNOSIS_CALLS]}


def test_diagnosis_counter_counts_calls_by_verdict_across_sessions(sim) -> None:
    """The counter is cumulative and exact: every call counted once under its own verdicts, and a
    new instrument() session on the same meter provider goes on from the previous counts."""
    configure_sim(sim, runtime="ollama", cold_delay=0.3, first_token_delay=0.0, token_interval=0.0, tokens=2)
    state = make_otel()
    url = f"{sim.base_url}/api/chat"
    for _ in range(2):
        otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                            host_metrics=False, gpu_metrics=False, runtime_metrics=False)
        try:
            _stream(url)
            _stream(url)
        finally:
            otel_llm.uninstrument()
    expected = Counter((c.attributes.get(sc.LLM_DIAGNOSIS_BOTTLENECK, "none"),
                        c.attributes.get(sc.LLM_DIAGNOSIS_COLD_START)) for c in state.calls())
    assert ("load", True) in expected  # the first call of the simulator loads the model
    assert _diagnosis_counts(state) == expected
    assert sum(expected.values()) == 4
    points = state.metrics()[sc.METRIC_DIAGNOSIS_CALLS]
    assert all(p.attributes[sc.GEN_AI_PROVIDER_NAME] == "ollama" for p in points)


def test_diagnosis_tally_is_bounded() -> None:
    from otel_llm.telemetry import metrics

    tally = metrics._Tally()
    for index in range(metrics._TALLY_LIMIT + 50):
        tally.add(((sc.GEN_AI_REQUEST_MODEL, f"model-{index}"),))
    tally.add(((sc.GEN_AI_REQUEST_MODEL, "model-0"),))  # a set already kept is still counted as itself
    observed = {tuple(o.attributes.items()): o.value for o in tally.observe()}
    assert len(observed) == metrics._TALLY_LIMIT + 1
    assert observed[((sc.OTEL_METRIC_OVERFLOW, True),)] == 50
    assert observed[((sc.GEN_AI_REQUEST_MODEL, "model-0"),)] == 2


def test_a_known_runtime_that_reports_no_durations_leaves_the_whole_wait_unaccounted() -> None:
    """vLLM's responses carry tokens but no durations: once the runtime is known, none of the
    wait is explained (its queue, prefill and transit); an unknown server's wait stays unsplit."""
    from otel_llm.telemetry import diagnosis
    from otel_llm.telemetry.phases import Phase

    vllm = RuntimeCounters(runtime="vllm", generation_tokens=8)
    assert diagnosis.unaccounted_wait(0.3, vllm, True) == 0.3
    assert diagnosis.unaccounted_wait(0.3, vllm, False) == 0.3
    assert diagnosis.unaccounted_wait(0.3, RuntimeCounters(), True) is None
    assert diagnosis.unaccounted_wait(0.3, RuntimeCounters(runtime="llama.cpp", prompt_eval_duration=0.1),
                                      True) == pytest.approx(0.2)
    # nothing reported to split the wait by: queue only while other calls were in flight
    phases = [Phase(sc.SPAN_SERVER_WAIT, 0, 300_000_000, False)]
    assert diagnosis.bottleneck(phases, 0.3, vllm, True, None, 0) == "prefill"
    assert diagnosis.bottleneck(phases, 0.3, vllm, False, None, 0) == "decode"
    assert diagnosis.bottleneck(phases, 0.3, vllm, True, None, 1) == "queue"
