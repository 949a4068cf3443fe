"""The client matrix: every client path the tests drive, what it runs on, and what it sees.

The clients page's table (docs/clients.md) is generated from ``CASES`` and checked against it
(``tests/project/test_doc_tables.py``); ``tests/capture/test_client_matrix.py`` drives each case against the
simulator and the real llama.cpp server. A driver makes one chat call the way an application
would and returns the text the application received.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Callable

__all__ = ["CASES", "MESSAGES", "OLLAMA", "OPENAI", "TRANSPORT_PHASES", "Case", "Driver", "post_with_each_transport"]

OPENAI, OLLAMA = "openai", "ollama"  # the API a case speaks: OpenAI chat or Ollama /api/chat

# The phases each transport gives a call. The matrix test checks the plain-HTTP ones for every
# case (DNS, connect, upload, server wait, first token, decode); tests/capture/test_transports.py and
# tests/capture/test_tls.py the TLS and pool-wait ones per transport.
TRANSPORT_PHASES = {
    "httpcore": "pool wait, DNS, connect, TLS, upload, server wait, first token, decode",
    "aiohttp": "pool wait, DNS, connect (TLS inside it), upload, server wait, first token, decode",
    "urllib3": "pool wait, DNS, connect, TLS, upload, server wait, first token, decode",
}

Driver = Callable[[str, str, bool, int], str]  # (server base URL, model, streamed, max tokens) -> text


@dataclass(frozen=True)
class Case:
    id: str
    label: str  # the table's first column
    packages: tuple[str, ...]  # distributions whose installed versions the table names
    transport: str  # a key of TRANSPORT_PHASES
    underneath: str  # the table's words for the transport
    api: str
    drive: Driver

    def versions(self) -> str:
        return ", ".join(f"{name} {version(name)}" for name in self.packages)

    def table_row(self) -> str:
        return f"| {self.label} | {self.versions()} | {self.underneath} | {TRANSPORT_PHASES[self.transport]} |"


MESSAGES = [{"role": "user", "content": "Say hi."}]


def post_with_each_transport(url: str, body: dict[str, Any]) -> None:
    """One POST of ``body`` each through httpx, requests and aiohttp (capture's three adapters:
    httpcore, urllib3, aiohttp), each response read to its end."""
    import aiohttp
    import httpx
    import requests

    httpx.post(url, json=body, timeout=10).read()
    requests.post(url, json=body, timeout=10).close()

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body) as response:
                await response.read()

    asyncio.run(run())


def _sse_text(lines: Any) -> str:
    """The generated text of OpenAI chat SSE lines (bytes or str)."""
    text = []
    for line in lines:
        line = line.decode() if isinstance(line, bytes) else line
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        for choice in event.get("choices") or []:
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def _ndjson_text(lines: Any) -> str:
    text = []
    for line in lines:
        line = line.decode() if isinstance(line, bytes) else line
        if line.strip():
            text.append(json.loads(line).get("message", {}).get("content") or "")
    return "".join(text)


def _body(model: str, streamed: bool, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "stream": streamed, "max_tokens": max_tokens}


def _openai_sync(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import openai

    with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0) as client:
        if not streamed:
            return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens) \
                .choices[0].message.content or ""
        stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, stream=True,
                                                stream_options={"include_usage": True})
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


async def _openai_async_call(client: Any, model: str, streamed: bool, max_tokens: int) -> str:
    if not streamed:
        result = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens)
        return result.choices[0].message.content or ""
    stream = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens,
                                                  stream=True, stream_options={"include_usage": True})
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def _openai_async(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import openai

    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0) as client:
            return await _openai_async_call(client, model, streamed, max_tokens)

    return asyncio.run(run())


def _openai_aiohttp(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import openai

    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0,
                                      http_client=openai.DefaultAioHttpClient()) as client:
            return await _openai_async_call(client, model, streamed, max_tokens)

    return asyncio.run(run())


def _ollama_sync(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import ollama

    client = ollama.Client(host=base)
    options = {"num_predict": max_tokens}
    if not streamed:
        return client.chat(model=model, messages=MESSAGES, options=options)["message"]["content"]
    return "".join(p["message"]["content"] for p in client.chat(model=model, messages=MESSAGES, options=options,
                                                                 stream=True))


def _ollama_async(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import ollama

    async def run() -> str:
        client = ollama.AsyncClient(host=base)
        options = {"num_predict": max_tokens}
        if not streamed:
            return (await client.chat(model=model, messages=MESSAGES, options=options))["message"]["content"]
        parts = await client.chat(model=model, messages=MESSAGES, options=options, stream=True)
        return "".join([p["message"]["content"] async for p in parts])

    return asyncio.run(run())


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from GitHub at import
    import litellm

    litellm.telemetry = False
    return litellm


def _litellm_target(base: str, model: str, api: str) -> dict[str, Any]:
    if api == OLLAMA:
        return {"model": f"ollama_chat/{model}", "api_base": base}
    return {"model": f"openai/{model}", "api_base": f"{base}/v1", "api_key": "sk-test"}


def _litellm_async(api: str) -> Driver:
    def drive(base: str, model: str, streamed: bool, max_tokens: int) -> str:
        litellm = _litellm()

        async def run() -> str:
            target = _litellm_target(base, model, api)
            if not streamed:
                result = await litellm.acompletion(messages=MESSAGES, max_tokens=max_tokens, **target)
                return result.choices[0].message.content or ""
            stream = await litellm.acompletion(messages=MESSAGES, max_tokens=max_tokens, stream=True, **target)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        return asyncio.run(run())

    return drive


def _litellm_sync(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    litellm = _litellm()
    target = _litellm_target(base, model, OPENAI)
    if not streamed:
        return litellm.completion(messages=MESSAGES, max_tokens=max_tokens, **target).choices[0].message.content or ""
    stream = litellm.completion(messages=MESSAGES, max_tokens=max_tokens, stream=True, **target)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def _httpx_sync(module: str) -> Driver:
    def drive(base: str, model: str, streamed: bool, max_tokens: int) -> str:
        httpx = __import__(module)
        with httpx.Client(timeout=30) as client:
            body = _body(model, streamed, max_tokens)
            if not streamed:
                return client.post(f"{base}/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
            with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
                return _sse_text(response.iter_lines())

    return drive


def _httpx_async(transport: Callable[[], Any] | None = None) -> Driver:
    def drive(base: str, model: str, streamed: bool, max_tokens: int) -> str:
        import httpx

        async def run() -> str:
            options = {"transport": transport()} if transport is not None else {}
            async with httpx.AsyncClient(timeout=30, **options) as client:
                body = _body(model, streamed, max_tokens)
                if not streamed:
                    response = await client.post(f"{base}/v1/chat/completions", json=body)
                    return response.json()["choices"][0]["message"]["content"]
                async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
                    return _sse_text([line async for line in response.aiter_lines()])

        return asyncio.run(run())

    return drive


def _aiohttp_transport() -> Any:
    import httpx_aiohttp

    return httpx_aiohttp.AiohttpTransport()


def _aiohttp(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import aiohttp

    async def run() -> str:
        async with aiohttp.ClientSession() as session:
            body = _body(model, streamed, max_tokens)
            async with session.post(f"{base}/v1/chat/completions", json=body) as response:
                if not streamed:
                    return (await response.json())["choices"][0]["message"]["content"]
                return _sse_text([line async for line in response.content])

    return asyncio.run(run())


def _requests(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import requests

    with requests.Session() as session:
        response = session.post(f"{base}/v1/chat/completions", json=_body(model, streamed, max_tokens), stream=streamed,
                                timeout=30)
        if not streamed:
            return response.json()["choices"][0]["message"]["content"]
        with response:
            return _sse_text(response.iter_lines())


def _urllib3(base: str, model: str, streamed: bool, max_tokens: int) -> str:
    import urllib3

    with urllib3.PoolManager() as pool:
        response = pool.request("POST", f"{base}/v1/chat/completions", json=_body(model, streamed, max_tokens),
                                preload_content=not streamed)
        if not streamed:
            return response.json()["choices"][0]["message"]["content"]
        lines = b"".join(response.stream(1024)).split(b"\n")
        response.release_conn()
        return _sse_text(lines)


CASES = (
    Case("openai", "openai `OpenAI`", ("openai", "httpx2"), "httpcore", "httpx2 on httpcore2", OPENAI, _openai_sync),
    Case("openai-async", "openai `AsyncOpenAI`", ("openai", "httpx2"), "httpcore", "httpx2 on httpcore2", OPENAI,
         _openai_async),
    Case("openai-aiohttp", "openai `AsyncOpenAI(http_client=DefaultAioHttpClient())`", ("openai", "aiohttp"),
         "aiohttp", "aiohttp (openai's httpx2 transport on it)", OPENAI, _openai_aiohttp),
    Case("ollama", "ollama `Client`", ("ollama", "httpx"), "httpcore", "httpx on httpcore", OLLAMA, _ollama_sync),
    Case("ollama-async", "ollama `AsyncClient`", ("ollama", "httpx"), "httpcore", "httpx on httpcore", OLLAMA,
         _ollama_async),
    Case("litellm-async-openai", "litellm `acompletion` (`openai/`)", ("litellm", "aiohttp"), "aiohttp",
         "aiohttp (`LiteLLMAiohttpTransport`, litellm's default)", OPENAI, _litellm_async(OPENAI)),
    Case("litellm-async-ollama", "litellm `acompletion` (`ollama_chat/`)", ("litellm", "aiohttp"), "aiohttp",
         "aiohttp (`LiteLLMAiohttpTransport`, litellm's default)", OLLAMA, _litellm_async(OLLAMA)),
    Case("litellm-sync", "litellm `completion` (`openai/`)", ("litellm", "httpx"), "httpcore", "httpx on httpcore",
         OPENAI, _litellm_sync),
    Case("httpx", "httpx `Client`", ("httpx",), "httpcore", "httpcore", OPENAI, _httpx_sync("httpx")),
    Case("httpx-async", "httpx `AsyncClient`", ("httpx",), "httpcore", "httpcore (anyio)", OPENAI, _httpx_async()),
    Case("httpx2", "httpx2 `Client`", ("httpx2",), "httpcore", "httpcore2", OPENAI, _httpx_sync("httpx2")),
    Case("httpx-aiohttp", "httpx `AsyncClient(transport=httpx_aiohttp.AiohttpTransport())`",
         ("httpx-aiohttp", "aiohttp"), "aiohttp", "aiohttp", OPENAI, _httpx_async(_aiohttp_transport)),
    Case("aiohttp", "aiohttp `ClientSession`", ("aiohttp",), "aiohttp", "aiohttp", OPENAI, _aiohttp),
    Case("requests", "requests", ("requests", "urllib3"), "urllib3", "urllib3", OPENAI, _requests),
    Case("urllib3", "urllib3 `PoolManager`", ("urllib3",), "urllib3", "urllib3", OPENAI, _urllib3),
)
