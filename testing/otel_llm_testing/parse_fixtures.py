"""The recorded request and response bodies the parser tests share (``tests/fixtures/parse/``), and
every API name they run through."""

from __future__ import annotations

from otel_llm.parse import routes as r
from otel_llm_testing.subprocesses import REPO

__all__ = ["ALL_APIS", "FIXTURES", "load"]

FIXTURES = REPO / "tests" / "fixtures" / "parse"
ALL_APIS = [
    r.API_OPENAI_CHAT, r.API_OPENAI_COMPLETIONS, r.API_OPENAI_RESPONSES,
    r.API_ANTHROPIC_MESSAGES, r.API_OLLAMA_CHAT, r.API_OLLAMA_GENERATE,
    r.API_LLAMACPP_COMPLETION, r.API_TGI_GENERATE, r.API_TGI_GENERATE_STREAM,
    r.API_LMSTUDIO_V1_CHAT, r.API_GENERIC, "unknown.api",
]


def load(name: str) -> bytes:
    """The recorded fixture ``name``."""
    return (FIXTURES / name).read_bytes()
