"""Fixtures shared by the request and response parser tests."""

from __future__ import annotations

from pathlib import Path

from otel_llm.parse import routes as r

FIXTURES = Path(__file__).parents[1] / "fixtures" / "parse"
ALL_APIS = [
    r.API_OPENAI_CHAT, r.API_OPENAI_COMPLETIONS, r.API_OPENAI_RESPONSES,
    r.API_ANTHROPIC_MESSAGES, r.API_OLLAMA_CHAT, r.API_OLLAMA_GENERATE,
    r.API_LLAMACPP_COMPLETION, r.API_TGI_GENERATE, r.API_TGI_GENERATE_STREAM,
    r.API_LMSTUDIO_V1_CHAT, r.API_GENERIC, "unknown.api",
]


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()
