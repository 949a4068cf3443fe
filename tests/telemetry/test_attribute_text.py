"""Strings from a response reach span attributes as valid UTF-8, so no exporter drops them."""

from __future__ import annotations

from otel_llm import semconv as sc
from otel_llm.telemetry.attributes import response_attributes
from otel_llm.parse.response import parse_body


def test_lone_surrogates_from_json_escapes_become_encodable() -> None:
    body = (b'{"id": "chatcmpl-\\ud800x", "model": "m\\udfff", "object": "chat.completion",'
            b' "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},'
            b' "finish_reason": "stop\\ud834"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}')
    info = parse_body("openai.chat", body, {}, want_text=False)
    attrs: dict = {}
    response_attributes(info, attrs, capture_content=False)
    for key in (sc.GEN_AI_RESPONSE_ID, sc.GEN_AI_RESPONSE_MODEL):
        attrs[key].encode("utf-8")  # raises on a lone surrogate
    assert attrs[sc.GEN_AI_RESPONSE_ID].startswith("chatcmpl-") and attrs[sc.GEN_AI_RESPONSE_ID].endswith("x")
    for reason in attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]:
        reason.encode("utf-8")
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
