from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_llm.parse import routes as r
from otel_llm.parse.response import (
    MAX_BODY_BYTES,
    MAX_ERROR_CHARS,
    MAX_TEXT_CHARS,
    ResponseInfo,
    parse_body,
    parse_events,
    parse_sse_event,
)

from otel_llm_testing.parse_fixtures import ALL_APIS, load


def split_events(raw: bytes, ndjson: bool = False) -> list[bytes]:
    """Frame a captured stream the way the capture layer does."""
    parts = raw.splitlines(keepends=True) if ndjson else re.split(rb"(?<=\n)\r?\n", raw)
    return [p for p in parts if p.strip()]


def window(events: list[bytes]) -> list[bytes]:
    """The first event and the last (<= 6) events."""
    return events[:1] + events[max(1, len(events) - 6):]


def stream(name: str) -> list[bytes]:
    return split_events(load(name), ndjson=name.endswith(".ndjson"))


# --- parse_sse_event ------------------------------------------------------------------------


def test_sse_event_basic() -> None:
    assert parse_sse_event(b'data: {"a":1}\n\n') == (None, b'{"a":1}')
    assert parse_sse_event(b'data:{"a":1}') == (None, b'{"a":1}')
    assert parse_sse_event(b"event: chat.end\r\ndata: {}\r\n\r\n") == ("chat.end", b"{}")


def test_sse_event_multiline_comments_and_unknown_fields() -> None:
    block = b": keep-alive\nid: 7\nretry: 10\nevent: x\ndata: {\"a\":\ndata:  1}\n"
    assert parse_sse_event(block) == ("x", b'{"a":\n 1}')


def test_sse_event_without_data() -> None:
    assert parse_sse_event(b": ping\n\n") == (None, None)
    assert parse_sse_event(b"event: message_stop\n") == ("message_stop", None)
    assert parse_sse_event(b"") == (None, None)


def test_sse_event_legacy_error_field() -> None:
    assert parse_sse_event(b'error: {"message":"boom"}\n\n') == ("error", b'{"message":"boom"}')


def test_sse_event_bad_input() -> None:
    assert parse_sse_event(None) == (None, None)  # type: ignore[arg-type]
    assert parse_sse_event("data: 1") == (None, b"1")  # type: ignore[arg-type]
    assert parse_sse_event(b"event: \xff\xfe\ndata: \xff") == ("\ufffd\ufffd", b"\xff")


# --- streams --------------------------------------------------------------------------------

STREAMS = [
    # fixture, api, id, model, finish, input, output, cached, reasoning, runtime
    ("llamacpp_chat_stream.sse", r.API_OPENAI_CHAT, "chatcmpl-...", "/path/gemma.gguf",
     ["length"], 30, 40, 0, None, "llama.cpp"),
    ("llamacpp_completion_stream.sse", r.API_LLAMACPP_COMPLETION, None, "gemma-3-270m",
     ["limit"], 4, 20, 1, None, "llama.cpp"),
    ("vllm_chat_stream.sse", r.API_OPENAI_CHAT, "chatcmpl-9f1c2b", "Qwen/Qwen2.5-0.5B-Instruct",
     ["stop"], 21, 2, 16, None, None),
    ("vllm_completions_stream.sse", r.API_OPENAI_COMPLETIONS, "cmpl-7d0e", "Qwen/Qwen2.5-0.5B",
     ["length", "stop"], 5, 8, None, None, None),
    ("ollama_openai_chat_stream.sse", r.API_OPENAI_CHAT, "chatcmpl-512", "llama3.2:1b",
     ["stop"], 26, 2, None, None, None),
    ("ollama_chat_stream.ndjson", r.API_OLLAMA_CHAT, None, "qwen3:0.6b",
     ["stop"], 14, 9, None, None, "ollama"),
    ("ollama_generate_stream.ndjson", r.API_OLLAMA_GENERATE, None, "llama3.2:1b",
     ["length"], 30, 16, None, None, "ollama"),
    ("tgi_generate_stream.sse", r.API_TGI_GENERATE_STREAM, None, None,
     ["length"], 7, 3, None, None, "tgi"),
    ("tgi_chat_stream.sse", r.API_OPENAI_CHAT, None, "HuggingFaceTB/SmolLM2-135M-Instruct",
     ["stop"], 31, 2, None, None, None),
    ("sglang_generate_stream.sse", r.API_TGI_GENERATE, "a1b2c3d4e5", None,
     ["stop"], 6, 5, 2, None, "sglang"),
    ("lmstudio_v1_chat_stream.sse", r.API_LMSTUDIO_V1_CHAT, "resp_02b2017dbc06c12b",
     "qwen/qwen3-4b", None, 19, 7, None, 3, "lmstudio"),
    ("anthropic_messages_stream.sse", r.API_ANTHROPIC_MESSAGES, "msg_01XFDUDYJgAACzvnptvVoYEL",
     "claude-sonnet-4-5", ["end_turn"], 125, 15, 100, None, None),
    ("openai_responses_stream.sse", r.API_OPENAI_RESPONSES, "resp_67ccd2bed1ec8190",
     "gpt-oss-20b", ["completed"], 37, 11, 0, 9, None),
]


def _check(info: ResponseInfo, row: tuple) -> None:
    _, _, rid, model, finish, inp, out, cached, reasoning, runtime = row
    assert info.response_id == rid
    assert info.response_model == model
    assert info.finish_reasons == finish
    assert (info.input_tokens, info.output_tokens) == (inp, out)
    assert info.cached_input_tokens == cached
    assert info.reasoning_output_tokens == reasoning
    assert info.runtime == runtime
    assert info.error is None and info.output_text is None


@pytest.mark.parametrize("row", STREAMS, ids=[row[0] for row in STREAMS])
def test_stream_window(row: tuple) -> None:
    _check(parse_events(row[1], window(stream(row[0]))), row)


@pytest.mark.parametrize("row", STREAMS, ids=[row[0] for row in STREAMS])
def test_stream_all_events_same_result(row: tuple) -> None:
    _check(parse_events(row[1], stream(row[0])), row)


@pytest.mark.parametrize("row", STREAMS, ids=[row[0] for row in STREAMS])
def test_stream_crlf(row: tuple) -> None:
    raw = load(row[0]).replace(b"\n", b"\r\n")
    events = window(split_events(raw, ndjson=row[0].endswith(".ndjson")))
    _check(parse_events(row[1], events), row)


def test_llamacpp_live_sample_exact() -> None:
    """The last event seen live from llama.cpp (runtime-formats.md, "Seen live")."""
    last = stream("llamacpp_chat_stream.sse")[-2]
    assert last.startswith(b'data: {"choices":[]')
    payload = json.loads(last[len(b"data: "):])
    info = parse_events(r.API_OPENAI_CHAT, [last, b"data: [DONE]\n\n"])
    assert info.native["llamacpp.timings"] == payload["timings"]
    assert (info.input_tokens, info.output_tokens, info.cached_input_tokens) == (30, 40, 0)
    assert info.runtime == "llama.cpp" and info.response_model == "/path/gemma.gguf"


def test_native_counters_collected() -> None:
    info = parse_events(r.API_OLLAMA_CHAT, window(stream("ollama_chat_stream.ndjson")))
    assert info.native == {"ollama": {
        "total_duration": 612345678, "load_duration": 12345678, "prompt_eval_count": 14,
        "prompt_eval_duration": 45678901, "eval_count": 9, "eval_duration": 498765432,
    }}
    info = parse_events(r.API_TGI_GENERATE, stream("sglang_generate_stream.sse"))
    assert info.native["sglang.meta_info"]["e2e_latency"] == 0.1834
    info = parse_events(r.API_LMSTUDIO_V1_CHAT, stream("lmstudio_v1_chat_stream.sse"))
    assert info.native["lmstudio.stats"]["model_load_time_seconds"] == 3.21
    info = parse_events(r.API_TGI_GENERATE_STREAM, stream("tgi_generate_stream.sse"))
    assert info.native["tgi.details"]["input_length"] == 7


def test_stream_headers_tgi() -> None:
    headers = {"x-compute-type": "gpu+optimized", "x-compute-characters": "12"}
    info = parse_events(r.API_OPENAI_CHAT, stream("tgi_chat_stream.sse"), headers)
    assert info.runtime == "tgi"
    assert info.native["tgi.headers"] == headers
    assert (info.input_tokens, info.output_tokens) == (31, 2)


def test_stream_error_frames() -> None:
    info = parse_events(r.API_OLLAMA_GENERATE, stream("ollama_error_stream.ndjson"))
    assert info.error == "an error was encountered while running the model: unexpected EOF"
    assert info.response_model == "llama3.2:1b" and info.finish_reasons is None
    events = [
        b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n',
        b'data: {"error":{"code":500,"message":"context shift disabled",'
        b'"type":"server_error"}}\n\n',
    ]
    assert parse_events(r.API_OPENAI_CHAT, events).error == "context shift disabled"
    legacy = [b'error: {"code":500,"message":"slot unavailable","type":"server_error"}\n\n']
    assert parse_events(r.API_LLAMACPP_COMPLETION, legacy).error == "slot unavailable"
    tgi = [b'data:{"error":"Request failed during generation: OOM","error_type":"generation"}\n\n']
    assert parse_events(r.API_TGI_GENERATE_STREAM, tgi).error.startswith("Request failed")


def test_stream_error_events_named() -> None:
    anthropic = [
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n',
    ]
    assert parse_events(r.API_ANTHROPIC_MESSAGES, anthropic).error == "Overloaded"
    lmstudio = [
        b'event: error\ndata: {"type":"error","error":{"type":"model_not_found",'
        b'"message":"No model"}}\n\n',
    ]
    assert parse_events(r.API_LMSTUDIO_V1_CHAT, lmstudio).error == "No model"
    responses = [
        b'event: response.failed\ndata: {"type":"response.failed","response":{"id":"resp_9",'
        b'"object":"response","status":"failed","model":"m","error":{"code":"server_error",'
        b'"message":"The model crashed"},"usage":null}}\n\n',
    ]
    info = parse_events(r.API_OPENAI_RESPONSES, responses)
    assert info.error == "The model crashed" and info.finish_reasons == ["failed"]
    assert info.response_id == "resp_9"
    plain = [b'event: error\ndata: {"type":"error","code":"bad","message":"Bad input"}\n\n']
    assert parse_events(r.API_OPENAI_RESPONSES, plain).error == "Bad input"


def test_sglang_abort_is_error() -> None:
    ev = (b'data: {"text":"","meta_info":{"id":"x","finish_reason":{"type":"abort",'
          b'"message":"Client disconnected"},"prompt_tokens":3,"completion_tokens":0}}\n\n')
    info = parse_events(r.API_TGI_GENERATE, [ev])
    assert info.finish_reasons == ["abort"] and info.error == "Client disconnected"


def test_done_and_comments_ignored() -> None:
    events = [b": keep-alive\n\n", b"data: [DONE]\n\n", b"data:[DONE]", b"\n", b""]
    assert parse_events(r.API_OPENAI_CHAT, events) == ResponseInfo()


def test_two_json_values_in_one_block() -> None:
    block = (b'data: {"id":"a","model":"m","choices":[{"index":0,"finish_reason":"stop"}]}\n'
             b'data: {"id":"a","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n')
    info = parse_events(r.API_OPENAI_CHAT, [block])
    assert info.finish_reasons == ["stop"] and info.input_tokens == 3 and info.output_tokens == 4


def test_llamacpp_timings_twice_takes_last_and_nulls() -> None:
    partial = (b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],'
               b'"id":"c","model":"m","timings":{"prompt_n":5,"predicted_n":1,'
               b'"predicted_per_second":null}}\n\n')
    final = (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"id":"c",'
             b'"model":"m","timings":{"cache_n":2,"prompt_n":5,"predicted_n":9,'
             b'"predicted_per_second":NaN}}\n\n')
    info = parse_events(r.API_OPENAI_CHAT, [partial, final])
    assert info.native["llamacpp.timings"] == {"cache_n": 2, "prompt_n": 5, "predicted_n": 9}
    assert (info.input_tokens, info.output_tokens, info.cached_input_tokens) == (7, 9, 2)
    assert info.finish_reasons == ["stop"]


def test_llamacpp_old_stop_flags() -> None:
    body = b'{"content":"x","stop":true,"tokens_predicted":3,"tokens_evaluated":5,' \
           b'"stopped_eos":false,"stopped_word":true,"stopped_limit":false,"tokens_cached":8}'
    info = parse_body(r.API_LLAMACPP_COMPLETION, body)
    assert info.finish_reasons == ["word"]
    assert (info.input_tokens, info.output_tokens) == (5, 3)
    assert info.cached_input_tokens is None  # tokens_cached is the KV fill (n_past), not reuse


def test_anthropic_message_delta_with_full_usage() -> None:
    events = stream("anthropic_messages_stream.sse")
    events[-2] = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
                  b'"max_tokens"},"usage":{"input_tokens":30,"cache_creation_input_tokens":10,'
                  b'"cache_read_input_tokens":100,"output_tokens":64}}\n\n')
    info = parse_events(r.API_ANTHROPIC_MESSAGES, events)
    assert info.input_tokens == 140 and info.cached_input_tokens == 100
    assert info.output_tokens == 64 and info.finish_reasons == ["max_tokens"]


def test_events_bad_container_items() -> None:
    events = [None, 5, "data: {\"model\":\"s\"}", bytearray(b'{"done":true,"eval_count":2}'),
              memoryview(b"data: {}")]
    info = parse_events(r.API_OLLAMA_CHAT, events)  # type: ignore[arg-type]
    assert info.response_model == "s" and info.output_tokens == 2
    assert parse_events(r.API_OPENAI_CHAT, None) == ResponseInfo()  # type: ignore[arg-type]
    assert parse_events(r.API_OPENAI_CHAT, 7) == ResponseInfo()  # type: ignore[arg-type]
    assert parse_events(r.API_OPENAI_CHAT, b'data: {"id":"x"}').response_id == "x"


def test_parse_events_is_cheap() -> None:
    events = window(stream("llamacpp_chat_stream.sse"))
    start = time.perf_counter()
    for _ in range(200):
        parse_events(r.API_OPENAI_CHAT, events)
    assert (time.perf_counter() - start) / 200 < 0.001


# --- bodies ---------------------------------------------------------------------------------

BODIES = [
    # fixture, api, id, model, finish, input, output, cached, reasoning, runtime, text
    ("llamacpp_completion.json", r.API_LLAMACPP_COMPLETION, None, "gemma-3-270m", ["limit"],
     4, 20, 1, None, "llama.cpp", " Paris. It is the largest city in France and one of the most"),
    ("llamacpp_chat.json", r.API_OPENAI_CHAT, "chatcmpl-Xk2wq9", "gemma-3-270m", ["stop"],
     12, 8, 10, None, "llama.cpp", "Hi! How can I help?"),
    ("vllm_chat.json", r.API_OPENAI_CHAT, "chatcmpl-b7e1", "Qwen/Qwen3-0.6B", ["stop", "length"],
     18, 22, 16, 5, None, "Paris.\nIt is Paris"),
    ("lmstudio_v0_chat.json", r.API_OPENAI_CHAT, "chatcmpl-i3gkjwthhw96whukek9tz",
     "granite-3.0-2b-instruct", ["stop"], 24, 53, None, None, "lmstudio",
     "Greetings, I'm a helpful AI, here to assist."),
    ("lmstudio_v1_chat.json", r.API_LMSTUDIO_V1_CHAT, "resp_02b2017dbc06c12bfc35",
     "openai/gpt-oss-20b", None, 359, 218, None, 24, "lmstudio", "Hello! How can I help?"),
    ("ollama_chat.json", r.API_OLLAMA_CHAT, None, "llama3.2:1b", ["stop"], 26, 8, None, None,
     "ollama", "Hello! How are you today?"),
    ("ollama_generate.json", r.API_OLLAMA_GENERATE, None, "llama3.2:1b", ["stop"], None, 9, None,
     None, "ollama", "Blue, because of Rayleigh scattering."),
    ("ollama_load.json", r.API_OLLAMA_GENERATE, None, "llama3.2:1b", ["load"], None, None, None,
     None, "ollama", None),
    ("tgi_generate.json", r.API_TGI_GENERATE, None, None, ["length"], None, 5, None, None, "tgi",
     " The sky is blue because"),
    ("sglang_generate.json", r.API_TGI_GENERATE, "f0e1d2c3b4", None, ["length"], 6, 7, 5, 0,
     "sglang", "The capital of France is Paris."),
    ("anthropic_message.json", r.API_ANTHROPIC_MESSAGES, "msg_013Zva2CMHLNnXjNJJKqJ2EF",
     "claude-sonnet-4-5", ["end_turn"], 1212, 9, 1000, None, None, "Hi! How can I help?"),
    ("openai_responses.json", r.API_OPENAI_RESPONSES, "resp_67ccd3a9da748190", "gpt-oss-20b",
     ["completed"], 36, 87, 12, 40, None, "In a peaceful grove..."),
    ("openai_responses_incomplete.json", r.API_OPENAI_RESPONSES, "resp_inc1", "gpt-oss-20b",
     ["max_output_tokens"], 10, 16, None, None, None, None),
]


@pytest.mark.parametrize("row", BODIES, ids=[row[0] for row in BODIES])
def test_body(row: tuple) -> None:
    info = parse_body(row[1], load(row[0]), want_text=True)
    _check_body(info, row)
    assert info.output_text == row[10]
    assert parse_body(row[1], load(row[0])).output_text is None


def _check_body(info: ResponseInfo, row: tuple) -> None:
    _, _, rid, model, finish, inp, out, cached, reasoning, runtime, _ = row
    assert info.response_id == rid
    assert info.response_model == model
    assert info.finish_reasons == finish
    assert (info.input_tokens, info.output_tokens) == (inp, out)
    assert info.cached_input_tokens == cached
    assert info.reasoning_output_tokens == reasoning
    assert info.runtime == runtime
    assert info.error is None


def test_body_llamacpp_live_values() -> None:
    info = parse_body(r.API_LLAMACPP_COMPLETION, load("llamacpp_completion.json"))
    timings = info.native["llamacpp.timings"]
    assert (timings["cache_n"], timings["prompt_n"], timings["predicted_n"]) == (1, 3, 20)
    assert timings["predicted_per_second"] == 43.59


def test_body_tgi_headers() -> None:
    headers = json.loads(load("tgi_headers.json"))
    info = parse_body(r.API_TGI_GENERATE, load("tgi_generate.json"), headers)
    assert info.runtime == "tgi"
    assert info.input_tokens == 7 and info.output_tokens == 5  # input from x-prompt-tokens
    assert info.native["tgi.headers"]["x-compute-time"] == "0.208"
    assert "content-type" not in info.native["tgi.headers"]
    assert "tokens" not in info.native["tgi.details"]  # lists dropped
    bare = parse_body(r.API_TGI_GENERATE, b'{"generated_text":"hi"}', headers)
    assert (bare.input_tokens, bare.output_tokens, bare.finish_reasons) == (7, 5, None)


def test_body_tgi_headers_bad_values() -> None:
    headers = {"x-prompt-tokens": "\u00b2", "x-generated-tokens": "-3", "x-compute-time": "nan"}
    info = parse_body(r.API_TGI_GENERATE, b'{"generated_text":"hi"}', headers)
    assert info.input_tokens is None and info.output_tokens is None and info.runtime == "tgi"
    assert parse_body(r.API_TGI_GENERATE, b"{}", {"x-prompt-tokens": "9" * 40}).input_tokens is None
    not_a_mapping = [("a", "b")]
    assert parse_body(r.API_TGI_GENERATE, b"{}", not_a_mapping).runtime is None


def test_sglang_vs_tgi_on_generate() -> None:
    assert parse_body(r.API_TGI_GENERATE, load("sglang_generate.json")).runtime == "sglang"
    assert parse_body(r.API_TGI_GENERATE, load("tgi_generate.json")).runtime == "tgi"
    info = parse_body(r.API_TGI_GENERATE, b'{"generated_text":"x"}')
    assert info.runtime == "tgi" and "sglang.meta_info" not in info.native


def test_sglang_meta_info_drops_lists() -> None:
    info = parse_body(r.API_TGI_GENERATE, load("sglang_generate.json"))
    assert "output_token_logprobs" not in info.native["sglang.meta_info"]


def test_sglang_single_item_batch_list() -> None:
    body = b"[" + load("sglang_generate.json").strip() + b"]"
    assert parse_body(r.API_TGI_GENERATE, body).input_tokens == 6


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("error_openai.json", "The model `gpt-x` does not exist."),
        ("error_vllm_legacy.json", "This model's maximum context length is 2048 tokens. "
                                   "However, you requested 4096 tokens."),
        ("error_anthropic.json", "Overloaded"),
        ("error_ollama.json", 'model "llama9" not found, try pulling it first'),
        ("error_llamacpp.json", "Loading model"),
    ],
)
def test_error_bodies(name: str, message: str) -> None:
    info = parse_body(r.API_OPENAI_CHAT, load(name))
    assert info.error == message
    assert info.input_tokens is None and info.finish_reasons is None


def test_error_truncated() -> None:
    info = parse_body(r.API_TGI_GENERATE, load("error_tgi.json"))
    assert info.error is not None and info.error.startswith("Input validation error")
    long = json.dumps({"error": "x" * 5000}).encode()
    assert len(parse_body(r.API_OLLAMA_CHAT, long).error) == MAX_ERROR_CHARS
    assert parse_body(r.API_GENERIC, b'{"detail":"Not Found"}').error == "Not Found"


def test_output_text_bounded() -> None:
    body = json.dumps({"model": "m", "response": "y" * (MAX_TEXT_CHARS * 2), "done": True})
    info = parse_body(r.API_OLLAMA_GENERATE, body.encode(), want_text=True)
    assert info.output_text is not None and len(info.output_text) == MAX_TEXT_CHARS


def test_nan_infinite_huge_and_wrong_types() -> None:
    body = (b'{"id": 5, "model": ["m"], "choices": [{"finish_reason": 3}, "x", {"index": true,'
            b' "finish_reason": "stop"}], "usage": {"prompt_tokens": NaN, "completion_tokens":'
            b' Infinity, "prompt_tokens_details": {"cached_tokens": -4},'
            b' "completion_tokens_details": {"reasoning_tokens": 99999999999999999999999}},'
            b' "timings": {"prompt_n": true, "predicted_n": 1e400, "cache_n": "3"}}')
    info = parse_body(r.API_OPENAI_CHAT, body)
    assert info.response_id is None and info.response_model is None
    assert info.finish_reasons == ["stop"]
    assert info.input_tokens is None and info.output_tokens is None
    assert info.cached_input_tokens is None and info.reasoning_output_tokens is None
    assert info.native["llamacpp.timings"] == {"prompt_n": True, "cache_n": "3"}


def test_integral_float_counts_accepted() -> None:
    body = b'{"usage":{"prompt_tokens":12.0,"completion_tokens":3.5}}'
    info = parse_body(r.API_OPENAI_CHAT, body)
    assert info.input_tokens == 12 and type(info.input_tokens) is int
    assert info.output_tokens is None


@pytest.mark.parametrize(
    "body",
    [
        b"", b"null", b"[]", b"[1, 2]", b'"text"', b"3.5", b"{", b'{"choices": [', b"\xff\xfe\xfd",
        b'{"model": "\xff"}', b"[" * 50_000, b'{"usage": {"prompt_tokens": 1' + b"9" * 5000 + b"}}",
        b"Ollama is running", b"<html>502</html>",
        b'{"choices": 5, "usage": [], "timings": 1, "meta_info": "x", "details": [], "stats": 1,'
        b' "output": 3, "content": {}, "done": "yes", "stop": 1, "error": 7}',
    ],
)
def test_malformed_bodies_never_raise(body: bytes) -> None:
    for api in ALL_APIS:
        info = parse_body(api, body, {"x-prompt-tokens": "abc"}, want_text=True)
        assert isinstance(info, ResponseInfo)
        info = parse_events(api, [body, b"data: " + body])
        assert isinstance(info, ResponseInfo)


def test_truncated_stream_json() -> None:
    events = stream("vllm_chat_stream.sse")
    events[-2] = events[-2][:60]  # usage chunk cut off mid-object
    info = parse_events(r.API_OPENAI_CHAT, events)
    assert info.finish_reasons == ["stop"] and info.input_tokens is None


def test_huge_body_not_parsed() -> None:
    pad = "z" * (MAX_BODY_BYTES + 1)
    body = json.dumps({"model": "m", "response": pad, "done": True, "eval_count": 3}).encode()
    start = time.perf_counter()
    info = parse_body(r.API_OLLAMA_GENERATE, body, {"x-generated-tokens": "4"}, want_text=True)
    assert time.perf_counter() - start < 0.05
    assert info.response_model is None and info.output_text is None
    assert info.output_tokens == 4  # headers still read


def test_non_bytes_body() -> None:
    assert parse_body(r.API_OPENAI_CHAT, '{"id":"s"}').response_id == "s"  # type: ignore[arg-type]
    assert parse_body(r.API_OPENAI_CHAT, None) == ResponseInfo()  # type: ignore[arg-type]


# --- property tests -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(ALL_APIS), body=st.binary(max_size=2048), text=st.booleans())
def test_parse_body_random_bytes(api: str, body: bytes, text: bool) -> None:
    assert isinstance(parse_body(api, body, None, want_text=text), ResponseInfo)


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(ALL_APIS), events=st.lists(st.binary(max_size=512), max_size=8))
def test_parse_events_random_bytes(api: str, events: list[bytes]) -> None:
    assert isinstance(parse_events(api, events), ResponseInfo)


_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
_keys = st.sampled_from([
    "id", "model", "choices", "usage", "prompt_tokens", "completion_tokens", "input_tokens",
    "output_tokens", "cache_read_input_tokens", "prompt_tokens_details", "cached_tokens",
    "finish_reason", "index", "message", "content", "text", "type", "delta", "stop_reason",
    "done", "done_reason", "eval_count", "stop", "stop_type", "timings", "prompt_n", "cache_n",
    "details", "generated_text", "meta_info", "stats", "model_info", "model_instance_id",
    "response", "result", "output", "status", "incomplete_details", "error", "object", "detail",
])
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(api=st.sampled_from(ALL_APIS), doc=st.dictionaries(_keys, _json, max_size=6),
       name=st.sampled_from([None, "message_start", "message_delta", "chat.end", "error",
                             "response.completed"]))
def test_random_json_shapes_never_raise(api: str, doc: dict, name: str | None) -> None:
    raw = json.dumps(doc).encode()
    event = (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + raw + b"\n\n"
    for info in (parse_body(api, raw, want_text=True), parse_events(api, [event, raw])):
        for count in (info.input_tokens, info.output_tokens, info.cached_input_tokens,
                      info.reasoning_output_tokens):
            assert count is None or (type(count) is int and count >= 0)
        assert info.finish_reasons is None or all(isinstance(f, str) for f in info.finish_reasons)
        assert info.error is None or (isinstance(info.error, str) and len(info.error) <= 200)
