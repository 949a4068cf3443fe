"""``otel-llm proxy`` in front of the real llama.cpp server: curl, which knows nothing of
OpenTelemetry, gets a call span with llama.cpp's own timings, as an instrumented client would,
and reads the same events and text as when it calls llama.cpp directly."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_llm import semconv as sc
from otel_llm_testing import LlamaServer
from otel_llm_testing.proxy import CHAT, KIND_CLIENT, KIND_SERVER, Proxy, children, curl, events, framing, text_of

pytestmark = [pytest.mark.timeout(900), pytest.mark.runtime, pytest.mark.slow]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(slots=1, context=4096) as running:
        yield running


def test_curl_through_the_proxy_gets_llamacpps_timings(server: LlamaServer, tmp_path: Path) -> None:
    body = {"model": "gemma", "stream": True, "max_tokens": 12, "temperature": 0, "cache_prompt": False,
            "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex}] Count from one to ten."}]}
    with Proxy(server.base_url, tmp_path) as proxy:
        stream, timing = curl(proxy.url + CHAT, body)
    assert proxy.exit_code == 0, proxy.log()
    assert timing["status"] == 200 and text_of(stream), stream[-500:]
    assert events(stream)[-1] == "[DONE]"
    direct, _ = curl(server.base_url + CHAT, body)
    assert text_of(stream) == text_of(direct) and framing(stream) == framing(direct), (stream, direct)

    spans = proxy.spans()
    (server_span,) = [s for s in spans if s["kind"] == KIND_SERVER]
    (call,) = [s for s in spans if s["kind"] == KIND_CLIENT]
    assert children(spans, server_span) == [call]
    assert server_span["attributes"][sc.USER_AGENT_ORIGINAL].startswith("curl/")
    attrs = call["attributes"]
    assert sc.LLM_GATEWAY_RELAYED not in attrs
    assert attrs[sc.LLM_RUNTIME_NAME] == "llama.cpp"
    assert attrs[sc.LLM_RUNTIME_PROMPT_TOKENS] > 0 and attrs[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] > 0
    assert 0 < attrs[sc.LLM_RUNTIME_GENERATION_TOKENS] <= 12 and attrs[sc.LLM_RUNTIME_GENERATION_DURATION] > 0
    assert attrs[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN] >= attrs[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION]
    assert timing["starttransfer"] >= attrs[sc.LLM_CLIENT_TIME_TO_FIRST_BYTE] - 0.002
    names = {k["name"] for k in children(spans, call)}
    assert {sc.SPAN_SERVER_WAIT, sc.SPAN_FIRST_TOKEN, sc.SPAN_DECODE, sc.SPAN_RUNTIME_PREFILL,
            sc.SPAN_RUNTIME_DECODE} <= names, names
