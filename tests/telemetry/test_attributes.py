"""Span attributes of a model call (otel_llm.telemetry.attributes): the URL as recorded, the
provider name, and what the request, its shape and the response add."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.capture.call import CallRequest
from otel_llm.parse.request import RequestInfo
from otel_llm.parse.request_shape import RequestShape
from otel_llm.parse.response import ResponseInfo
from otel_llm.parse.routes import API_ANTHROPIC_MESSAGES, API_OLLAMA_CHAT, API_OPENAI_CHAT, Route
from otel_llm.telemetry.attributes import (
    REDACTED,
    endpoint_attributes,
    provider_name,
    request_attributes,
    response_attributes,
    sanitize_url,
    span_name,
)


def call_request(url: str, scheme: str = "http", host: str = "127.0.0.1", port: int | None = 8080) -> CallRequest:
    return CallRequest("POST", scheme, host, port, "/v1/chat/completions", url, {}, b"{}")


# --- sanitize_url -----------------------------------------------------------------------------


def test_sanitize_url_drops_user_info() -> None:
    assert sanitize_url("https://user:pa55@api.example.com:8443/v1/chat") == "https://api.example.com:8443/v1/chat"
    assert sanitize_url("http://token@localhost/v1") == "http://localhost/v1"


def test_sanitize_url_redacts_secret_looking_query_values_only() -> None:
    url = "https://h/v1/chat?api_key=sk-123&Token=t&model=llama3&X-Amz-Signature=abc&page=2"
    assert sanitize_url(url) == f"https://h/v1/chat?api_key={REDACTED}&Token={REDACTED}&model=llama3" \
                                f"&X-Amz-Signature={REDACTED}&page=2"


def test_sanitize_url_keeps_blank_values_and_drops_the_fragment() -> None:
    assert sanitize_url("http://h/p?flag=&model=m#section") == "http://h/p?flag=&model=m"
    assert sanitize_url("http://h/p#frag") == "http://h/p"
    assert sanitize_url("http://h/p?") == "http://h/p"


def test_sanitize_url_quotes_the_query_it_rebuilds() -> None:
    assert sanitize_url("http://h/p?q=a b&x=1/2") == "http://h/p?q=a%20b&x=1%2F2"


# --- provider_name and span_name ----------------------------------------------------------------


@pytest.mark.parametrize(("runtime", "host", "api", "expected"), [
    ("ollama", "api.openai.com", API_OPENAI_CHAT, "ollama"),  # the runtime wins
    (None, "api.openai.com", API_OPENAI_CHAT, "openai"),
    (None, "api.anthropic.com", API_ANTHROPIC_MESSAGES, "anthropic"),
    (None, "api.mistral.ai", API_OPENAI_CHAT, "mistral_ai"),
    (None, "api.groq.com", API_OPENAI_CHAT, "groq"),
    (None, "api.deepseek.com", API_OPENAI_CHAT, "deepseek"),
    (None, "api.x.ai", API_OPENAI_CHAT, "x_ai"),
    (None, "proxy.internal", API_ANTHROPIC_MESSAGES, "anthropic"),  # the API family
    (None, "127.0.0.1", API_OPENAI_CHAT, "openai_compatible"),
    (None, "127.0.0.1", API_OLLAMA_CHAT, "_OTHER"),
    ("", "127.0.0.1", "tgi.generate", "_OTHER"),
])
def test_provider_name(runtime: str | None, host: str, api: str, expected: str) -> None:
    assert provider_name(runtime, host, api) == expected


def test_span_name_is_the_operation_then_the_model() -> None:
    assert span_name("chat", "llama3") == "chat llama3"
    assert span_name("chat", None) == "chat"
    assert span_name("text_completion", "") == "text_completion"


# --- endpoint_attributes ----------------------------------------------------------------------


def test_endpoint_attributes() -> None:
    route = Route(API_OPENAI_CHAT, "chat", None)
    attrs = endpoint_attributes(route, call_request("http://u:p@127.0.0.1:8080/v1/chat/completions?key=s"),
                                "llama.cpp", "llama.cpp")
    assert attrs == {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "llama.cpp",
        sc.LLM_API: API_OPENAI_CHAT,
        sc.HTTP_REQUEST_METHOD: "POST",
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: 8080,
        sc.URL_FULL: f"http://127.0.0.1:8080/v1/chat/completions?key={REDACTED}",
        sc.LLM_RUNTIME_NAME: "llama.cpp",
    }


def test_endpoint_attributes_default_port_per_scheme_and_no_runtime() -> None:
    route = Route(API_OPENAI_CHAT, "chat", None)
    https = endpoint_attributes(route, call_request("https://api.openai.com/v1/chat/completions", "https",
                                                    "api.openai.com", None), None, "openai")
    plain = endpoint_attributes(route, call_request("http://gpu-box/v1/chat/completions", "http", "gpu-box", None),
                                None, "openai_compatible")
    assert https[sc.SERVER_PORT] == 443 and plain[sc.SERVER_PORT] == 80
    assert sc.LLM_RUNTIME_NAME not in https and sc.LLM_RUNTIME_NAME not in plain


# --- request_attributes -----------------------------------------------------------------------


ENDPOINT = {sc.GEN_AI_OPERATION_NAME: "chat", sc.SERVER_ADDRESS: "127.0.0.1"}


def test_request_attributes_copy_the_endpoint_and_add_the_parameters() -> None:
    info = RequestInfo(model="llama3", stream=True, max_tokens=64, temperature=0.2, top_p=0.9, top_k=40, seed=7,
                       stop_sequences=["\n\n"], body_bytes=321)
    attrs = request_attributes(ENDPOINT, info, capture_content=False)
    assert attrs == {**ENDPOINT, sc.GEN_AI_REQUEST_MODEL: "llama3", sc.GEN_AI_REQUEST_MAX_TOKENS: 64,
                     sc.GEN_AI_REQUEST_TEMPERATURE: 0.2, sc.GEN_AI_REQUEST_TOP_P: 0.9, sc.GEN_AI_REQUEST_TOP_K: 40,
                     sc.GEN_AI_REQUEST_SEED: 7, sc.GEN_AI_REQUEST_STOP_SEQUENCES: ["\n\n"],
                     sc.GEN_AI_REQUEST_STREAM: True, sc.HTTP_REQUEST_BODY_SIZE: 321}
    assert ENDPOINT == {sc.GEN_AI_OPERATION_NAME: "chat", sc.SERVER_ADDRESS: "127.0.0.1"}  # not modified
    assert attrs[sc.GEN_AI_REQUEST_STOP_SEQUENCES] is not info.stop_sequences


def test_request_attributes_leave_out_what_the_body_did_not_say() -> None:
    attrs = request_attributes(ENDPOINT, RequestInfo(stream=False, stop_sequences=[]), capture_content=True)
    assert attrs == ENDPOINT  # no stream=False, no empty stop list, no content without messages


def test_request_attributes_drop_non_finite_numbers() -> None:
    info = RequestInfo(model="m", temperature=math.nan, top_p=math.inf)
    attrs = request_attributes(ENDPOINT, info, capture_content=False)
    assert sc.GEN_AI_REQUEST_TEMPERATURE not in attrs and sc.GEN_AI_REQUEST_TOP_P not in attrs
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == "m"


def test_request_attributes_make_a_model_name_valid_utf8() -> None:
    attrs = request_attributes(ENDPOINT, RequestInfo(model="llamä\ud800"), capture_content=False)
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == "llamä?"
    attrs[sc.GEN_AI_REQUEST_MODEL].encode("utf-8")


def test_request_attributes_capture_content_only_when_asked() -> None:
    messages = [{"role": "user", "content": "héllo"}]
    info = RequestInfo(model="m", messages=messages, system="be brief")
    assert sc.GEN_AI_INPUT_MESSAGES not in request_attributes(ENDPOINT, info, capture_content=False)
    attrs = request_attributes(ENDPOINT, info, capture_content=True)
    assert json.loads(attrs[sc.GEN_AI_INPUT_MESSAGES]) == messages
    assert "héllo" in attrs[sc.GEN_AI_INPUT_MESSAGES]  # not \u-escaped
    assert json.loads(attrs[sc.GEN_AI_SYSTEM_INSTRUCTIONS]) == "be brief"


def test_captured_content_is_cut_at_64_kib_and_unserializable_content_is_left_out() -> None:
    big = RequestInfo(messages=[{"role": "user", "content": "x" * 100_000}])
    assert len(request_attributes(ENDPOINT, big, capture_content=True)[sc.GEN_AI_INPUT_MESSAGES]) == 65536
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    attrs = request_attributes(ENDPOINT, RequestInfo(messages=cyclic), capture_content=True)
    assert sc.GEN_AI_INPUT_MESSAGES not in attrs


def test_request_shape_attributes() -> None:
    shape = RequestShape(messages=3, by_role={"system": 1, "user": 2}, system_bytes=40, largest_message_bytes=120,
                         tools=2, tools_bytes=900, attachments=1)
    attrs = request_attributes(ENDPOINT, RequestInfo(shape=shape), capture_content=False)
    assert {k: v for k, v in attrs.items() if k not in ENDPOINT} == {
        sc.LLM_REQUEST_MESSAGES: 3,
        sc.LLM_REQUEST_MESSAGES_PREFIX + "system": 1,
        sc.LLM_REQUEST_MESSAGES_PREFIX + "user": 2,
        sc.LLM_REQUEST_SYSTEM_BYTES: 40,
        sc.LLM_REQUEST_LARGEST_MESSAGE_BYTES: 120,
        sc.LLM_REQUEST_TOOLS: 2,
        sc.LLM_REQUEST_TOOLS_BYTES: 900,
        sc.LLM_REQUEST_ATTACHMENTS: 1,
    }


def test_an_empty_request_shape_adds_nothing() -> None:
    attrs = request_attributes(ENDPOINT, RequestInfo(shape=RequestShape()), capture_content=False)
    assert attrs == ENDPOINT


# --- response_attributes ----------------------------------------------------------------------


def test_response_attributes() -> None:
    info = ResponseInfo(response_id="chatcmpl-1", response_model="llama3:8b", finish_reasons=["stop", "length"],
                        input_tokens=12, output_tokens=5, cached_input_tokens=8, reasoning_output_tokens=2,
                        output_text="hello")
    attrs: dict[str, Any] = {"kept": 1}
    response_attributes(info, attrs, capture_content=False)
    assert attrs == {"kept": 1, sc.GEN_AI_RESPONSE_ID: "chatcmpl-1", sc.GEN_AI_RESPONSE_MODEL: "llama3:8b",
                     sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop", "length"], sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
                     sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 8,
                     sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: 2}


def test_response_attributes_without_a_response_or_with_an_empty_one() -> None:
    attrs: dict[str, Any] = {"kept": 1}
    response_attributes(None, attrs, capture_content=True)
    response_attributes(ResponseInfo(finish_reasons=[]), attrs, capture_content=True)
    assert attrs == {"kept": 1}


def test_response_output_is_captured_only_when_asked() -> None:
    info = ResponseInfo(output_text="bonjour à tous")
    attrs: dict[str, Any] = {}
    response_attributes(info, attrs, capture_content=False)
    assert attrs == {}
    response_attributes(info, attrs, capture_content=True)
    assert json.loads(attrs[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "bonjour à tous"}]}]
    empty: dict[str, Any] = {}
    response_attributes(ResponseInfo(output_text=""), empty, capture_content=True)
    assert empty == {}
