"""The real client libraries, sync and async, streaming and not, against the simulator."""

from __future__ import annotations

import asyncio

import httpx
import httpx2
import ollama
import openai

from otel_llm import semconv as sc
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim

STREAMED = [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE]
NON_STREAMED = [sc.SPAN_UPLOAD, sc.SPAN_SERVER_WAIT, sc.SPAN_DOWNLOAD]


def _phase_names(otel: Otel, call) -> list[str]:
    return [k.name for k in otel.children(call) if k.name not in (sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_POOL_WAIT)]


def _check(otel: Otel, streamed: bool, tokens: int, model: str = "m") -> None:
    call, _ = otel.one_call()
    assert call.name == f"chat {model}"
    assert call.attributes[sc.GEN_AI_REQUEST_MODEL] == model
    assert call.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert _phase_names(otel, call) == (STREAMED if streamed else NON_STREAMED)
    if streamed:
        assert call.attributes[sc.LLM_CLIENT_CHUNKS] == tokens
        assert call.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] > 0
    assert call.attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS) == tokens
    otel.clear()


def test_openai_sync_streaming_and_not(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=6, first_token_delay=0.01, token_interval=0.002)
    client = openai.OpenAI(base_url=f"{sim.base_url}/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}) if c.choices)
    assert text
    _check(otel, streamed=True, tokens=6)
    result = client.chat.completions.create(model="m", messages=messages)
    assert result.choices[0].message.content
    _check(otel, streamed=False, tokens=6)


def test_openai_async_streaming_and_not(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=5, first_token_delay=0.01, token_interval=0.002)

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=f"{sim.base_url}/v1", api_key="sk-test", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True})
        async for _ in stream:
            pass
        _check(otel, streamed=True, tokens=5)
        await client.completions.create(model="m", prompt="hi")
        call, _ = otel.one_call()
        assert call.name == "text_completion m"
        await client.close()

    asyncio.run(run())


def test_ollama_chat_and_generate(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=4, first_token_delay=0.01, token_interval=0.002)
    client = ollama.Client(host=sim.base_url)
    parts = [p["message"]["content"]
             for p in client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert "".join(parts)
    _check(otel, streamed=True, tokens=4, model="llama3")
    client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=False)
    _check(otel, streamed=False, tokens=4, model="llama3")
    client.generate(model="llama3", prompt="hi", stream=False)
    call, _ = otel.one_call()
    assert call.name == "generate_content llama3" or call.name == "text_completion llama3"
    assert call.attributes[sc.GEN_AI_PROVIDER_NAME] == "ollama"


def test_ollama_async_streaming(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=3, first_token_delay=0.01, token_interval=0.002)

    async def run() -> None:
        client = ollama.AsyncClient(host=sim.base_url)
        async for _ in await client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True):
            pass

    asyncio.run(run())
    _check(otel, streamed=True, tokens=3, model="llama3")


def test_raw_httpx2_sync_and_async(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=3, first_token_delay=0.01, token_interval=0.002)
    body = {"model": "m", "stream": True, "messages": [], "stream_options": {"include_usage": True}}
    with httpx2.Client() as client:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body) as response:
            response.read()
    _check(otel, streamed=True, tokens=3)

    async def run() -> None:
        async with httpx2.AsyncClient() as client:
            async with client.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body) as response:
                await response.aread()

    asyncio.run(run())
    _check(otel, streamed=True, tokens=3)


def test_raw_httpx_async_on_every_streamed_format(sim, otel: Otel) -> None:
    """Each runtime's own stream format gets a first token and a token count."""
    configure_sim(sim, tokens=5, first_token_delay=0.01, token_interval=0.002)
    cases = [
        ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, {}),
        ("/api/generate", {"model": "m", "prompt": "x"}, {}),
        ("/completion", {"prompt": "x", "stream": True}, {}),
        ("/generate_stream", {"inputs": "x", "parameters": {"details": True}}, {"x-sim-runtime": "tgi"}),
        ("/generate", {"text": "x", "stream": True}, {"x-sim-runtime": "sglang"}),
        ("/v1/messages", {"model": "m", "stream": True, "max_tokens": 5,
                          "messages": [{"role": "user", "content": "x"}]}, {}),
        ("/v1/responses", {"model": "m", "stream": True, "input": "x"}, {}),
        ("/api/v1/chat", {"model": "m", "input": "x", "stream": True}, {}),
        ("/v1/completions", {"model": "m", "stream": True, "prompt": "x"}, {}),
    ]

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            for path, body, headers in cases:
                async with client.stream("POST", f"{sim.base_url}{path}", json=body, headers=headers) as response:
                    assert response.status_code == 200, (path, await response.aread())
                    async for _ in response.aiter_bytes():
                        pass

    asyncio.run(run())
    calls = otel.calls()
    assert len(calls) == len(cases)
    for (path, _, _), call in zip(cases, sorted(calls, key=lambda c: c.start_time)):
        assert call.attributes.get(sc.LLM_CLIENT_CHUNKS) == 5, (path, dict(call.attributes))
        names = [k.name for k in otel.children(call)]
        assert names[-2:] == [sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE], (path, names)
