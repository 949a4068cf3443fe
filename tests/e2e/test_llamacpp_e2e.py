"""The product on a runtime nobody here wrote: the real llama.cpp server with Gemma 3 270M.

The server is built and started by the tests themselves (otel_llm_testing.LlamaServer), with one
slot (-np 1) so that concurrent requests queue inside it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from otel_llm import semconv as sc
from otel_llm_testing import LlamaServer
from otel_llm_testing.otel import Otel

pytestmark = [pytest.mark.timeout(900), pytest.mark.runtime]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(slots=1, context=4096) as running:
        yield running


def _client(server: LlamaServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _chat(server: LlamaServer, prompt: str, max_tokens: int = 16, stream: bool = True,
          ignore_eos: bool = False) -> None:
    kwargs = {"extra_body": {"ignore_eos": True}} if ignore_eos else {}
    messages = [{"role": "user", "content": prompt}]
    client = _client(server)
    if stream:
        for _ in client.chat.completions.create(model="gemma", messages=messages, max_tokens=max_tokens,
                                                stream=True, stream_options={"include_usage": True}, **kwargs):
            pass
    else:
        client.chat.completions.create(model="gemma", messages=messages, max_tokens=max_tokens, **kwargs)


def _fresh(text: str) -> str:
    """A prompt no earlier request shares a prefix with, so nothing comes from the KV cache."""
    return f"[{uuid.uuid4().hex}] {text}"


def _tiles(otel: Otel, call) -> None:
    kids = otel.children(call)
    assert kids[0].start_time == call.start_time and kids[-1].end_time == call.end_time
    for before, after in zip(kids, kids[1:]):
        assert before.end_time == after.start_time


def _consistent(otel: Otel, call) -> None:
    """What the client saw agrees with what the runtime reported."""
    attrs = call.attributes
    assert attrs[sc.LLM_RUNTIME_NAME] == "llama.cpp"
    assert attrs[sc.GEN_AI_PROVIDER_NAME] == "llama.cpp"
    if sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN in attrs:
        assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] >= attrs[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION]
    _tiles(otel, call)
    synthesized = otel.children(call, synthesized=True)
    assert [s.name for s in synthesized][-2:] == [sc.SPAN_RUNTIME_PREFILL, sc.SPAN_RUNTIME_DECODE]
    for span in synthesized:
        assert call.start_time <= span.start_time < span.end_time <= call.end_time


@pytest.mark.parametrize("stream", [True, False])
def test_openai_client_gets_native_timings(server: LlamaServer, otel: Otel, stream: bool) -> None:
    _chat(server, _fresh("Name three colours."), max_tokens=16, stream=stream)
    call, _ = otel.one_call()
    attrs = call.attributes
    for key in (sc.LLM_RUNTIME_PROMPT_TOKENS, sc.LLM_RUNTIME_PROMPT_EVAL_DURATION, sc.LLM_RUNTIME_PROMPT_EVAL_RATE,
                sc.LLM_RUNTIME_GENERATION_TOKENS, sc.LLM_RUNTIME_GENERATION_DURATION, sc.LLM_RUNTIME_GENERATION_RATE):
        assert attrs[key] > 0, key
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == attrs[sc.LLM_RUNTIME_GENERATION_TOKENS]
    _consistent(otel, call)


def test_repeated_prompt_reads_from_the_cache(server: LlamaServer, otel: Otel) -> None:
    prompt = _fresh("Explain in one sentence what a kilometre is. " * 4)
    _chat(server, prompt, max_tokens=4)
    _chat(server, prompt, max_tokens=4)
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    for call in (first, second):
        _consistent(otel, call)
    # the first call can reuse only the chat template's opening tokens; the second, the whole prompt
    assert first.attributes.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, 0) < 5
    assert second.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] > 30
    assert second.attributes[sc.LLM_RUNTIME_PROMPT_TOKENS] < first.attributes[sc.LLM_RUNTIME_PROMPT_TOKENS]


@pytest.mark.timing
def test_client_generation_rate_matches_the_native_rate(server: LlamaServer, otel: Otel) -> None:
    _chat(server, _fresh("Count slowly."), max_tokens=64, ignore_eos=True)
    call, _ = otel.one_call()
    attrs = call.attributes
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 64
    client, native = attrs[sc.LLM_CLIENT_GENERATION_RATE], attrs[sc.LLM_RUNTIME_GENERATION_RATE]
    assert abs(client - native) / native <= 0.15, (client, native)
    _consistent(otel, call)


def test_raw_httpx_completion_stream(server: LlamaServer, otel: Otel) -> None:
    body = {"prompt": _fresh("The sky is"), "n_predict": 12, "stream": True}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{server.base_url}/completion", json=body) as response:
            response.read()
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_API] == "llamacpp.completion"
    assert call.attributes[sc.LLM_RUNTIME_GENERATION_TOKENS] == call.attributes[sc.LLM_CLIENT_CHUNKS]
    _consistent(otel, call)


@pytest.mark.timing
def test_second_concurrent_call_queues_in_the_single_slot(server: LlamaServer, otel: Otel) -> None:
    # a long first generation and a short second one: the second call spends most of its time queued
    threads = [threading.Thread(target=_chat, args=(server, _fresh("Write a short poem.")),
                                kwargs={"max_tokens": tokens, "ignore_eos": True}) for tokens in (80, 12)]
    threads[0].start()
    threading.Event().wait(0.3)  # the first one is generating by now
    threads[1].start()
    for thread in threads:
        thread.join()
    first, second = sorted(otel.calls(), key=lambda c: c.start_time)
    assert first.attributes[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 0
    assert second.attributes[sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS] == 1
    queued = second.attributes[sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT]
    assert queued > 0.5 * first.attributes[sc.LLM_RUNTIME_GENERATION_DURATION]
    assert second.attributes[sc.LLM_DIAGNOSIS_BOTTLENECK] == "queue"
    for call in (first, second):
        _consistent(otel, call)


@pytest.mark.timing
def test_long_prompt_costs_prefill_time(server: LlamaServer, otel: Otel) -> None:
    _chat(server, _fresh("Say hi."), max_tokens=4)
    long_text = " ".join(f"item {i} is a small blue stone." for i in range(110))  # ~1,000 tokens
    _chat(server, _fresh(long_text + " How many items?"), max_tokens=4)
    short, long = sorted(otel.calls(), key=lambda c: c.start_time)
    assert long.attributes[sc.LLM_RUNTIME_PROMPT_TOKENS] >= 900
    ratio = long.attributes[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] / short.attributes[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION]
    assert ratio > 5
    assert (long.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] - short.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
            >= 0.8 * (long.attributes[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION]
                      - short.attributes[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION]))
    for call in (short, long):
        _consistent(otel, call)


def test_a_server_that_cannot_start_says_why() -> None:
    from otel_llm_testing import LlamaServerError

    with pytest.raises(LlamaServerError) as failure:
        LlamaServer(extra_args=["--no-such-option"], startup_timeout=60).start()
    assert "llama-server exited" in str(failure.value)
    assert "no-such-option" in str(failure.value)  # the server's own complaint is in the message


def test_the_build_is_portable() -> None:
    from otel_llm_testing.llama_server import cmake_args

    assert "-DGGML_NATIVE=OFF" in cmake_args()
    assert "AVX512" not in cmake_args() and "AMX" not in cmake_args()


def test_one_trace_through_the_gateway_to_llama_server(server: LlamaServer, otel: Otel, tmp_path) -> None:
    """openai client -> otel-llm gateway -> llama-server: one tree, with llama.cpp's own timings
    on the gateway's upstream call."""
    from otel_llm.tools.gateway.process import GatewayProcess
    from otel_llm_testing.collectors import OtlpHttpCollector, attributes_of

    env = {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
           "OTEL_LLM_TRACES_FILE": str(tmp_path / "unused.jsonl")}
    with OtlpHttpCollector() as collector:
        with GatewayProcess(server.base_url, {"app": {"routes": ["/v1/*"]}},
                            env={**env, "OTEL_LLM_ENDPOINT": collector.endpoint}) as gateway:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.secrets["app"], max_retries=0)
            stream = client.chat.completions.create(
                model="gemma", messages=[{"role": "user", "content": _fresh("Name a colour.")}], max_tokens=8,
                stream=True, stream_options={"include_usage": True})
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        exported = [span for _, span in collector.received.spans()]
    call, _ = otel.one_call()
    assert call.attributes[sc.LLM_RUNTIME_NAME] == "llama.cpp"  # timings pass through the gateway unchanged
    server_span = next(s for s in exported if s.kind == 2)
    assert server_span.trace_id == call.context.trace_id.to_bytes(16, "big")
    assert server_span.parent_span_id == call.context.span_id.to_bytes(8, "big")
    upstream = next(s for s in exported if s.kind == 3 and s.parent_span_id == server_span.span_id)
    attrs = attributes_of(upstream.attributes)
    assert attrs[sc.LLM_RUNTIME_NAME] == "llama.cpp"
    assert attrs[sc.LLM_RUNTIME_GENERATION_TOKENS] > 0 and attrs[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] > 0
    # the client and the gateway read the same native counters from the same bytes
    assert attrs[sc.LLM_RUNTIME_GENERATION_TOKENS] == call.attributes[sc.LLM_RUNTIME_GENERATION_TOKENS]
