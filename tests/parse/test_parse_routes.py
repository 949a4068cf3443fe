from __future__ import annotations

import time

import pytest

from otel_llm.parse import routes as r
from otel_llm.parse.routes import _QUICK, Route, match_route


@pytest.mark.parametrize(
    ("path", "api", "operation", "runtime"),
    [
        ("/v1/chat/completions", r.API_OPENAI_CHAT, "chat", None),
        ("/v1/chat/completions/", r.API_OPENAI_CHAT, "chat", None),
        ("/openai/deployments/gpt4o/chat/completions", r.API_OPENAI_CHAT, "chat", None),
        ("/proxy/chat/completions", r.API_OPENAI_CHAT, "chat", None),
        ("/api/v0/chat/completions", r.API_OPENAI_CHAT, "chat", "lmstudio"),
        ("/v1/completions", r.API_OPENAI_COMPLETIONS, "text_completion", None),
        ("/openai/deployments/x/completions", r.API_OPENAI_COMPLETIONS, "text_completion", None),
        ("/api/v0/completions", r.API_OPENAI_COMPLETIONS, "text_completion", "lmstudio"),
        ("/v1/responses", r.API_OPENAI_RESPONSES, "chat", None),
        ("/openai/v1/responses/", r.API_OPENAI_RESPONSES, "chat", None),
        ("/v1/messages", r.API_ANTHROPIC_MESSAGES, "chat", None),
        ("/api/chat", r.API_OLLAMA_CHAT, "chat", "ollama"),
        ("/ollama/api/chat", r.API_OLLAMA_CHAT, "chat", "ollama"),
        ("/api/generate", r.API_OLLAMA_GENERATE, "text_completion", "ollama"),
        ("/completion", r.API_LLAMACPP_COMPLETION, "text_completion", "llama.cpp"),
        ("/completions", r.API_LLAMACPP_COMPLETION, "text_completion", "llama.cpp"),
        ("/generate", r.API_TGI_GENERATE, "text_completion", None),
        ("/generate_stream", r.API_TGI_GENERATE_STREAM, "text_completion", "tgi"),
        ("/generate_stream/", r.API_TGI_GENERATE_STREAM, "text_completion", "tgi"),
        ("/api/v1/chat", r.API_LMSTUDIO_V1_CHAT, "chat", "lmstudio"),
    ],
)
def test_builtin_routes(path: str, api: str, operation: str, runtime: str | None) -> None:
    assert match_route(path) == Route(api, operation, runtime)


@pytest.mark.parametrize(
    "path",
    [
        "/", "", "/users/42", "/v1/models", "/api/tags", "/api/ps", "/health", "/metrics",
        "/v1/embeddings", "/api/embed", "/v1/messages/count_tokens", "/surveys/1/responses",
        "/inbox/messages", "/foo/completions", "/v1/chat/completions/abc", "/api/v1/models",
        "/chat", "/tokenize",
    ],
)
def test_misses(path: str) -> None:
    assert match_route(path) is None


def test_extra_routes_exact_and_suffix() -> None:
    extra = ["/my/infer", "/v1beta/models/gemma:generateContent", "/bot/completion-ish/"]
    assert match_route("/my/infer", extra) == Route(r.API_GENERIC, "chat", None)
    assert match_route("/tenant/7/my/infer/", extra) == Route(r.API_GENERIC, "chat", None)
    gen = match_route("/v1beta/models/gemma:generateContent", extra)
    assert gen == Route(r.API_GENERIC, "generate_content", None)
    comp = match_route("/bot/completion-ish", extra)
    assert comp == Route(r.API_GENERIC, "text_completion", None)
    assert match_route("/my/other", extra) is None


def test_builtin_wins_over_extra() -> None:
    assert match_route("/v1/chat/completions", ["/chat/completions"]).api == r.API_OPENAI_CHAT


def test_extra_routes_bad_entries_never_match_everything() -> None:
    assert match_route("/users/42", ["", "/", 5, None]) is None  # type: ignore[list-item]
    assert match_route("/users/42", "/42") == Route(r.API_GENERIC, "chat", None)
    assert match_route("/users/42", [["unhashable"]]) is None  # type: ignore[list-item]


def test_non_str_path() -> None:
    expected = Route(r.API_OLLAMA_CHAT, "chat", "ollama")
    assert match_route(b"/api/chat") == expected  # type: ignore[arg-type]
    assert match_route(None) is None  # type: ignore[arg-type]
    assert match_route(42) is None  # type: ignore[arg-type]


def _per_call(fn, n: int = 100_000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def test_miss_is_fast() -> None:
    """A miss costs about one ``str.endswith`` over the suffixes (measured against exactly that,
    interleaved, so a busy machine slows both: 2.4x and 4.6x here, for the call overhead)."""
    extra = ("/my/infer",)
    path = "/users/42"
    for _ in range(3):
        reference = _per_call(lambda: path.endswith(_QUICK))
        plain, with_extra = _per_call(lambda: match_route(path)), _per_call(lambda: match_route(path, extra))
        if plain < 5 * reference and with_extra < 10 * reference:
            return
    raise AssertionError(f"a miss costs {plain / reference:.1f}x / {with_extra / reference:.1f}x one endswith")
