"""llama.cpp server: /completion (SSE without [DONE]), the ``timings`` object and ``GET /props``."""

from __future__ import annotations

from typing import Any

from .base import Timeline, Wire, ms, piece, prompt_text, sse

__all__ = ["CONTEXT", "CompletionWire", "props", "timings"]

CONTEXT = 4096  # the context each simulated slot holds, as /props says


def _ratio(numerator: float, denominator: float) -> float | None:
    # llama.cpp divides plainly; inf/NaN become JSON null.
    return numerator / denominator if denominator else None


def timings(tl: Timeline) -> dict[str, Any]:
    """``timings``: prompt_ms = headers -> first token, predicted_ms = first -> last token."""
    prompt_ms, predicted_ms = ms(tl.prefill), ms(tl.decode)
    prompt_n, predicted_n = tl.evaluated, tl.tokens
    return {
        "cache_n": tl.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": _ratio(prompt_ms, prompt_n),
        "prompt_per_second": _ratio(1000.0 * prompt_n, prompt_ms),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": _ratio(predicted_ms, predicted_n),
        "predicted_per_second": _ratio(1000.0 * predicted_n, predicted_ms),
    }


def props(model: str, serialized: bool) -> dict[str, Any]:
    """``GET /props`` in llama-server's shape: what tells a client (``otel-llm diagnose``, the
    runtime poller) that the server is llama.cpp, and the context, model file and slots."""
    answer: dict[str, Any] = {
        "default_generation_settings": {"id": 0, "n_ctx": CONTEXT, "params": {"n_predict": -1}},
        "model_path": f"/models/{model}.gguf",
        "build_info": "otel-llm sim",
    }
    if serialized:  # one slot; in parallel mode the simulator has no slot count to give
        answer["total_slots"] = 1
    return answer


class CompletionWire(Wire):
    """POST /completion."""

    limit_keys = ("n_predict", "max_tokens")

    def _event(self, content: str, **fields: Any) -> dict[str, Any]:
        return {"index": 0, "content": content, "tokens": [], "id_slot": 0, **fields}

    def token(self, index: int) -> list[bytes]:
        event = self._event(
            piece(index), stop=False, tokens_predicted=index + 1, tokens_evaluated=self.tl.prompt_tokens
        )
        return [sse(event)]

    def _final(self, content: str) -> dict[str, Any]:
        tl = self.tl
        return self._event(
            content,
            stop=True,
            model=self.model,
            tokens_predicted=tl.tokens,
            tokens_evaluated=tl.prompt_tokens,
            generation_settings={"n_predict": self.token_limit() or -1, "temperature": 0.8},
            prompt=prompt_text(self.body),
            has_new_line=False,
            truncated=False,
            stop_type="limit" if tl.capped else "eos",
            stopping_word="",
            tokens_cached=tl.prompt_tokens + tl.tokens - 1,
            timings=timings(tl),
        )

    def closing(self) -> list[bytes]:
        return [sse(self._final(""))]

    def unary(self) -> tuple[dict[str, str], Any]:
        return {}, self._final(self.text())

    def error_body(self, status: int) -> Any:
        kind = "unavailable_error" if status == 503 else "server_error"
        return {"error": {"code": status, "message": f"simulated error {status}", "type": kind}}
