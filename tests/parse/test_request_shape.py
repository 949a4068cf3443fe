"""Request size without content: each call records how big its body is and what it is made of
(messages by role, system instructions, tool schemas, the largest message, attachments), so a
conversation that resends its history and tools shows its growth turn over turn."""

from __future__ import annotations

import json

import openai
import pytest

from otel_llm import semconv as sc
from otel_llm.tools.view import group_calls, render_call
from otel_llm.export.jsonl import flatten_spans
from otel_llm.parse import routes as r
from otel_llm.parse.request import parse_request
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim

SYSTEM = "You are a careful assistant for the accounts team. Answer briefly. " * 8
TOOLS = [
    {"type": "function", "function": {
        "name": f"lookup_{i}", "description": f"Look up record kind {i} by its identifier.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}, "limit": {"type": "integer"}},
                       "required": ["id"]}}}
    for i in range(20)
]
SECRET_WORD = "zanzibar-quokka"  # in every user message: must never reach an attribute


@pytest.mark.slow
def test_forty_turns_with_twenty_tools_show_the_history_growing(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=4)
    client = openai.OpenAI(base_url=f"{sim.base_url}/v1", api_key="sk-test-shape", max_retries=0)
    history: list[dict] = [{"role": "system", "content": SYSTEM}]
    for turn in range(40):
        history.append({"role": "user", "content": f"Turn {turn}: what about {SECRET_WORD} number {turn}?"})
        answer = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=32)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    calls = sorted(otel.calls(), key=lambda s: s.start_time)
    assert len(calls) == 40
    tools_bytes = len(json.dumps(TOOLS, separators=(",", ":")))
    sizes = []
    for turn, call in enumerate(calls):
        a = call.attributes
        assert a[sc.LLM_REQUEST_MESSAGES] == 2 + 2 * turn
        assert a[sc.LLM_REQUEST_MESSAGES_PREFIX + "system"] == 1
        assert a[sc.LLM_REQUEST_MESSAGES_PREFIX + "user"] == turn + 1
        assert a.get(sc.LLM_REQUEST_MESSAGES_PREFIX + "assistant", 0) == turn
        assert a[sc.LLM_REQUEST_SYSTEM_BYTES] == len(SYSTEM)
        assert a[sc.LLM_REQUEST_LARGEST_MESSAGE_BYTES] == len(SYSTEM)  # the instructions outweigh any turn
        assert a[sc.LLM_REQUEST_TOOLS] == 20 and a[sc.LLM_REQUEST_TOOLS_BYTES] == tools_bytes
        assert a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 32
        assert sc.LLM_REQUEST_ATTACHMENTS not in a
        assert not any(SECRET_WORD in str(v) for v in a.values())  # sizes, never content
        sizes.append(a[sc.HTTP_REQUEST_BODY_SIZE])
    # the body is the whole request as sent: it always carries the tools and instructions, and
    # grows by each turn's pair of messages
    assert sizes[0] > tools_bytes + len(SYSTEM)
    assert all(later > earlier for earlier, later in zip(sizes, sizes[1:]))
    assert sizes[-1] - sizes[0] > 39 * 2 * len("Turn 10: what about ")
    view = render_call(group_calls(flatten_spans(otel.spans()))[-1], width=200)
    assert "80 messages (1 system, 40 user, 39 assistant)" in view, view
    assert f"20 tools {tools_bytes / 1024:.1f} KiB" in view and "max_tokens 32" in view, view


def test_parts_attachments_tool_calls_and_other_apis() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "Be exact."},
            {"role": "user", "content": [{"type": "text", "text": "What is in these? é"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                         {"type": "input_audio", "input_audio": {"data": "AAAA"}}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "42"},
            {"role": "narrator", "content": "?"},
        ],
        "functions": [{"name": "f", "parameters": {}}],
    }
    info = parse_request(r.API_OPENAI_CHAT, json.dumps(body).encode())
    shape = info.shape
    assert shape is not None and info.body_bytes == len(json.dumps(body).encode())
    assert shape.messages == 5
    assert shape.by_role == {"developer": 1, "user": 1, "assistant": 1, "tool": 1, "other": 1}
    assert shape.system_bytes == len("Be exact.")
    assert shape.largest_message_bytes == len("What is in these? é".encode())  # é is two bytes
    assert shape.attachments == 2 and shape.tools == 1
    # Ollama: images beside the text; Anthropic: a top-level system prompt and nested tool results
    ollama = parse_request(r.API_OLLAMA_CHAT, json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "see", "images": ["AAAA", "BBBB"]}]}).encode())
    assert ollama.shape.attachments == 2 and ollama.shape.largest_message_bytes == 3
    anthropic = parse_request(r.API_GENERIC, json.dumps(
        {"model": "m", "system": "Rules.", "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": [{"type": "text", "text": "result text"}]}]}]}).encode())
    assert anthropic.shape.system_bytes == len("Rules.") and anthropic.shape.largest_message_bytes == len("result text")


def test_odd_bodies_give_fewer_figures_never_an_error() -> None:
    for body in (b"", b"[1, 2]", b'{"messages": 5}', b'{"messages": [1, null, {"role": 3}], "tools": "x"}',
                 b'{"messages": [{"role": "user", "content": {"type": "text", "text": 7}}]}', b"\xff\xfe",
                 json.dumps({"messages": [{"role": "user", "content": [[[[[[[[[[["deep"]]]]]]]]]]]}]}).encode()):
        info = parse_request(r.API_OPENAI_CHAT, body)
        assert info.body_bytes == len(body)
        if info.shape is not None:
            assert info.shape.attachments >= 0 and (info.shape.messages is None or info.shape.messages >= 0)
    assert parse_request(r.API_OPENAI_CHAT, None).body_bytes is None
    huge = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * (300 * 1024) + b'"}]}'
    info = parse_request(r.API_OPENAI_CHAT, huge)
    assert info.body_bytes == len(huge) and info.shape is None and info.model == "m"  # too big to parse
