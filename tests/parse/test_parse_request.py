from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_llm.parse import routes as r
from otel_llm.parse.request import MAX_PARSE_BYTES, RequestInfo, parse_request

from otel_llm_testing.parse_fixtures import ALL_APIS, load


def test_openai_chat() -> None:
    info = parse_request(r.API_OPENAI_CHAT, load("req_openai_chat.json"))
    assert info.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert info.stream is True and info.include_usage is True
    assert info.max_tokens == 128
    assert info.temperature == 0.7 and info.top_p == 0.9
    assert info.seed == 42 and info.top_k is None
    assert info.stop_sequences == ["\n\n", "END"]
    assert info.messages is not None and info.messages[1]["content"] == "Hello"
    assert info.system is None and info.keep_alive is None


def test_openai_completions() -> None:
    info = parse_request(r.API_OPENAI_COMPLETIONS, load("req_openai_completions.json"))
    assert info.max_tokens == 16
    assert info.temperature == 0.0 and isinstance(info.temperature, float)
    assert info.stop_sequences == ["\n"]
    assert info.stream is None
    assert info.messages == [{"role": "user", "content": "The capital of France is"}]


def test_openai_responses() -> None:
    info = parse_request(r.API_OPENAI_RESPONSES, load("req_openai_responses.json"))
    assert info.model == "gpt-oss-20b" and info.max_tokens == 256
    assert info.system == "You are terse."
    assert info.messages == [{"role": "user", "content": "Write a haiku"}]
    assert info.stream is True


def test_anthropic() -> None:
    info = parse_request(r.API_ANTHROPIC_MESSAGES, load("req_anthropic.json"))
    assert info.model == "claude-sonnet-4-5" and info.max_tokens == 1024
    assert info.stop_sequences == ["###"] and info.top_k == 50
    assert isinstance(info.system, list) and info.system[0]["text"] == "You are a poet."


def test_ollama_chat_defaults_stream_true() -> None:
    info = parse_request(r.API_OLLAMA_CHAT, load("req_ollama_chat.json"))
    assert info.stream is True  # absent -> Ollama native default
    assert info.max_tokens == 64 and info.temperature == 0.2
    assert info.top_k == 40 and info.top_p == 0.95 and info.seed == 7
    assert info.stop_sequences == ["<|im_end|>"]
    assert info.keep_alive == "5m"


def test_ollama_generate() -> None:
    info = parse_request(r.API_OLLAMA_GENERATE, load("req_ollama_generate.json"))
    assert info.stream is False
    assert info.max_tokens is None  # num_predict -1 = unlimited
    assert info.system == "Answer in one sentence."
    assert info.keep_alive == 0
    assert info.messages == [{"role": "user", "content": "Why is the sky blue?"}]


def test_ollama_stream_default_without_body() -> None:
    assert parse_request(r.API_OLLAMA_GENERATE, None).stream is True
    assert parse_request(r.API_OPENAI_CHAT, None) == RequestInfo()


def test_llamacpp_completion() -> None:
    info = parse_request(r.API_LLAMACPP_COMPLETION, load("req_llamacpp_completion.json"))
    assert info.model is None and info.stream is True
    assert info.max_tokens == 20 and info.top_k == 40 and info.seed == -1
    assert info.stop_sequences == ["</s>"]


def test_tgi_generate_parameters() -> None:
    info = parse_request(r.API_TGI_GENERATE, load("req_tgi_generate.json"))
    assert info.max_tokens == 20 and info.temperature == 0.5
    assert info.top_k == 10 and info.top_p == 0.95 and info.seed == 1234
    assert info.stop_sequences == ["\n"]
    assert info.stream is None
    assert info.messages == [{"role": "user", "content": "What is Deep Learning?"}]


def test_tgi_generate_stream_is_always_stream() -> None:
    body = json.dumps({"inputs": "x", "stream": False}).encode()
    assert parse_request(r.API_TGI_GENERATE_STREAM, body).stream is True
    assert parse_request(r.API_TGI_GENERATE_STREAM, b"garbage").stream is True


def test_sglang_sampling_params() -> None:
    info = parse_request(r.API_TGI_GENERATE, load("req_sglang_generate.json"))
    assert info.max_tokens == 16 and info.temperature == 0.0
    assert info.top_p == 1.0 and info.top_k == -1
    assert info.stop_sequences == ["."] and info.stream is True


def test_lmstudio_v1_chat() -> None:
    info = parse_request(r.API_LMSTUDIO_V1_CHAT, load("req_lmstudio_v1_chat.json"))
    assert info.model == "qwen/qwen3-4b" and info.max_tokens == 200
    assert info.system == "You are friendly." and info.top_k == 20
    assert info.messages == [{"role": "user", "content": "Say hello"}]


def test_bools_are_not_numbers() -> None:
    body = b'{"max_tokens": true, "temperature": false, "top_k": true, "seed": false, "stream": 1}'
    info = parse_request(r.API_OPENAI_CHAT, body)
    assert info.max_tokens is None and info.temperature is None
    assert info.top_k is None and info.seed is None and info.stream is None


def test_non_finite_and_huge_numbers_dropped() -> None:
    body = (
        b'{"model": "m", "temperature": NaN, "top_p": Infinity, "max_tokens": 1e999,'
        b' "seed": 99999999999999999999999, "top_k": -Infinity, "keep_alive": NaN}'
    )
    info = parse_request(r.API_OLLAMA_CHAT, body)
    assert info.model == "m"
    assert info.temperature is None and info.top_p is None and info.max_tokens is None
    assert info.seed is None and info.top_k is None and info.keep_alive is None


def test_nan_in_nested_falls_through_to_next_source() -> None:
    body = b'{"temperature": NaN, "options": {"temperature": 0.3}}'
    assert parse_request(r.API_OLLAMA_CHAT, body).temperature == 0.3


def test_integral_floats_accepted_for_ints() -> None:
    info = parse_request(r.API_OPENAI_CHAT, b'{"max_tokens": 64.0, "top_k": 5.5}')
    assert info.max_tokens == 64 and isinstance(info.max_tokens, int)
    assert info.top_k is None


def test_wrong_types() -> None:
    body = json.dumps({
        "model": 5, "stream": "yes", "stream_options": [1], "max_tokens": "100",
        "temperature": "0.5", "stop": [1, None, "ok"], "messages": "hi", "options": "x",
        "parameters": [1], "system": 3,
    }).encode()
    info = parse_request(r.API_OPENAI_CHAT, body)
    assert info.model is None and info.stream is None and info.include_usage is None
    assert info.max_tokens is None and info.temperature is None
    assert info.stop_sequences == ["ok"]
    assert info.messages is None
    assert info.system is None


@pytest.mark.parametrize(
    "body",
    [
        b"", b"null", b"[]", b"[1,2]", b'"str"', b"42", b"{", b'{"model": "x"', b"\xff\xfe\x00",
        b'{"model": "\xff\xfe"}', b"[" * 100_000, b"{}" * 3, b"\x00" * 10,
        b'{"model": "m", "max_tokens": 1' + b"9" * 5000 + b"}",
    ],
)
def test_malformed_bodies_never_raise(body: bytes) -> None:
    for api in ALL_APIS:
        assert isinstance(parse_request(api, body), RequestInfo)


def test_non_bytes_body() -> None:
    assert parse_request(r.API_OPENAI_CHAT, '{"model": "s"}').model == "s"  # type: ignore[arg-type]
    body = bytearray(b'{"model": "b"}')
    assert parse_request(r.API_OPENAI_CHAT, body).model == "b"  # type: ignore[arg-type]
    assert parse_request(r.API_OPENAI_CHAT, 12345).model is None  # type: ignore[arg-type]


def _huge_body(model_first: bool = True) -> bytes:
    image = "A" * (5 * 1024 * 1024)
    doc: dict = {}
    if model_first:
        doc["model"] = "llava:7b"
    doc["messages"] = [{"role": "user", "content": "what is this", "images": [image]}]
    doc["max_tokens"] = 12
    doc["stream"] = False
    if not model_first:
        doc["model"] = 'we"ird/mo\u00e9del'  # json.dumps escapes both
    return json.dumps(doc).encode()


def test_huge_body_scans_head_and_tail_only() -> None:
    body = _huge_body()
    assert len(body) > MAX_PARSE_BYTES
    start = time.perf_counter()
    info = parse_request(r.API_OLLAMA_CHAT, body)
    elapsed = time.perf_counter() - start
    assert info.model == "llava:7b"
    assert info.stream is False  # found in the tail
    assert info.max_tokens is None and info.messages is None  # not parsed
    assert elapsed < 0.005


def test_huge_body_model_in_tail_with_escapes() -> None:
    info = parse_request(r.API_OPENAI_CHAT, _huge_body(model_first=False))
    assert info.model == 'we"ird/mo\u00e9del'
    assert info.stream is False


def test_huge_body_without_fields_and_ollama_default() -> None:
    body = b"{" + b" " * (MAX_PARSE_BYTES + 10) + b"}"
    info = parse_request(r.API_OLLAMA_CHAT, body)
    assert info.model is None and info.stream is True


def test_body_at_limit_is_parsed() -> None:
    pad = MAX_PARSE_BYTES - 100
    body = json.dumps({"model": "m", "prompt": "x" * pad, "max_tokens": 3}).encode()
    assert len(body) <= MAX_PARSE_BYTES
    assert parse_request(r.API_OPENAI_COMPLETIONS, body).max_tokens == 3


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(ALL_APIS), body=st.binary(max_size=2048))
def test_random_bytes_never_raise(api: str, body: bytes) -> None:
    assert isinstance(parse_request(api, body), RequestInfo)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_request_keys = st.sampled_from([
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n_predict",
    "options", "parameters", "sampling_params", "temperature", "top_p", "top_k", "seed",
    "stop", "stop_sequences", "messages", "prompt", "input", "system", "keep_alive",
])


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(ALL_APIS), doc=st.dictionaries(_request_keys, _json_values, max_size=8))
def test_random_json_shapes_never_raise(api: str, doc: dict) -> None:
    info = parse_request(api, json.dumps(doc).encode())
    assert info.max_tokens is None or (type(info.max_tokens) is int and info.max_tokens >= 0)
    assert info.temperature is None or type(info.temperature) is float
