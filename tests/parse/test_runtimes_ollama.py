"""Ollama native API counters: integer nanoseconds -> seconds."""

from __future__ import annotations

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.response import ResponseInfo
from otel_llm.parse.runtimes import ollama, runtime_counters
from otel_llm_testing.runtime_fixtures import expect, from_body, from_stream, stream, window

RT = "ollama"


def test_chat_body_cold_load() -> None:
    _, c = from_body(r.API_OLLAMA_CHAT, RT, "chat.json")
    expect(c, runtime="ollama", load_duration=1.5, total_duration=2.012345678,
           prompt_tokens=26, prompt_eval_duration=0.13, prompt_eval_rate=200.0,
           generation_tokens=8, generation_duration=0.32, generation_rate=25.0,
           time_per_output_token=0.04, finish_reasons=["stop"])


def test_generate_stream_final_line() -> None:
    _, c = from_stream(r.API_OLLAMA_GENERATE, RT, "generate_stream.ndjson")
    expect(c, runtime="ollama", load_duration=1.5, total_duration=3.25, prompt_tokens=30,
           prompt_eval_duration=0.12, prompt_eval_rate=250.0, generation_tokens=16,
           generation_duration=0.4, generation_rate=40.0, time_per_output_token=0.025,
           finish_reasons=["length"])


def test_chat_stream_with_thinking_window() -> None:
    events = stream(RT, "chat_stream.ndjson")
    assert len(window(events)) < len(events)  # the window really drops events
    _, c = from_stream(r.API_OLLAMA_CHAT, RT, "chat_stream.ndjson")
    expect(c, runtime="ollama", load_duration=0.002, total_duration=0.812, prompt_tokens=12,
           prompt_eval_duration=0.06, prompt_eval_rate=200.0, generation_tokens=32,
           generation_duration=0.64, generation_rate=50.0, time_per_output_token=0.02,
           finish_reasons=["stop"])


def test_missing_prompt_counters_stay_none() -> None:
    """Older Ollama omitted prompt_eval_count on cached prompts: None, never 0."""
    _, c = from_body(r.API_OLLAMA_GENERATE, RT, "generate_cached_prompt.json")
    expect(c, runtime="ollama", load_duration=0.001345678, total_duration=0.412345678,
           generation_tokens=9, generation_duration=0.3, generation_rate=30.0,
           time_per_output_token=1 / 30, finish_reasons=["stop"])


@pytest.mark.parametrize("name, reason", [("load.json", "load"), ("unload.json", "unload")])
def test_load_and_unload_have_no_counters(name: str, reason: str) -> None:
    _, c = from_body(r.API_OLLAMA_GENERATE, RT, name)
    expect(c, runtime="ollama", finish_reasons=[reason])


def test_bad_values_dropped() -> None:
    """2e16 ns (> 1e7 s), negative, 2e9 tokens, a string count and NaN are all dropped;
    an integral float (1.5e8 ns) is fine."""
    _, c = from_stream(r.API_OLLAMA_GENERATE, RT, "bad_values.ndjson")
    expect(c, runtime="ollama", prompt_eval_duration=0.15, finish_reasons=["stop"])


def test_bad_values_built_directly() -> None:
    native = {"ollama": {
        "total_duration": "1500000000", "load_duration": True, "eval_count": 3.5,
        "eval_duration": float("nan"), "prompt_eval_count": None,
        "prompt_eval_duration": -1, "extra": {"nested": [1, 2]},
    }}
    expect(runtime_counters(ResponseInfo(native=native, runtime="ollama")),
           runtime="ollama", total_duration=1.5)


def test_error_mid_stream() -> None:
    info, c = from_stream(r.API_OLLAMA_GENERATE, RT, "error_stream.ndjson")
    assert info.error.startswith("an error was encountered")
    expect(c)


def test_truncated_final_line() -> None:
    info, c = from_stream(r.API_OLLAMA_GENERATE, RT, "truncated_stream.ndjson")
    assert info.response_model == "llama3.2:1b"
    expect(c)


def test_route_runtime_without_counters() -> None:
    """A caller that knows the runtime (route /api/chat) but got no final line."""
    expect(runtime_counters(ResponseInfo(runtime="ollama")), runtime="ollama")


def test_show_gives_the_models_shape_and_odd_answers_give_none() -> None:
    gemma = {"details": {"quantization_level": "Q8_0"}, "model_info": {
        "general.architecture": "gemma3", "general.parameter_count": 268_098_176, "gemma3.block_count": 18,
        "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1, "gemma3.embedding_length": 640,
        "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256, "gemma3.context_length": 32768}}
    info = ollama.show_model(gemma)
    assert info is not None and info.source == "/api/show" and info.quantization == "Q8_0"
    # key/value widths win over embedding_length / head_count (160 here)
    assert info.kv_bytes_per_token == 18 * 1 * (256 + 256) * 2 and info.parameter_count == 268_098_176
    assert info.context_length == 32768
    for odd in (None, [], {"model_info": []}, {"model_info": {"general.architecture": 7}},
                {"model_info": {"general.architecture": "llama", "llama.block_count": "16"}}):
        shape = ollama.show_model(odd)
        assert shape is None or shape.kv_bytes_per_token is None
    no_heads = ollama.show_model({"model_info": {"general.architecture": "llama", "llama.block_count": 16,
                                                 "llama.embedding_length": 2048, "llama.attention.head_count": 0}})
    assert no_heads is not None and no_heads.kv_bytes_per_token is None


def test_ps_entry_gives_sizes_parameter_size_and_expiry() -> None:
    """An /api/ps entry as Ollama 0.x writes it; odd values are dropped one by one, not the entry."""
    entry = {"name": "llama3.2:latest", "model": "llama3.2:latest", "size": 3_200_000_000,
             "size_vram": 1_600_000_000, "expires_at": "2026-12-03T07:41:04.123456-07:00", "context_length": 8192,
             "details": {"format": "gguf", "parameter_size": "3.2B", "quantization_level": "Q4_K_M"}}
    info = ollama.ps_model(entry)
    assert info is not None and info.model == "llama3.2:latest" and info.context_length == 8192
    assert (info.parameter_size, info.quantization, info.expires_at) == ("3.2B", "Q4_K_M", entry["expires_at"])
    assert info.partial_offload is True
    odd = ollama.ps_model({"name": "m", "size": -1, "expires_at": 5, "details": ["3B"], "context_length": "8k"})
    assert odd is not None and (odd.size, odd.expires_at, odd.parameter_size, odd.context_length) == (None,) * 4
    assert ollama.ps_model({"size": 1}) is None
