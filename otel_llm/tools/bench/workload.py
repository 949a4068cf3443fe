"""What one benchmark request is: the route, the streamed JSON payload, how its stream is framed.

Shared with ``diagnose`` (its trials send the same requests).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from otel_llm.parse import routes

__all__ = ["APIS", "OPENAI_APIS", "Workload", "prompt_of", "prompt_with", "request_for"]

# "openai" is chat completions; "openai-completions" the text completions route, the default
# workload of ``vllm bench serve`` (its ``--endpoint /v1/completions``)
APIS = ("openai", "openai-completions", "ollama", "llamacpp")
OPENAI_APIS = ("openai", "openai-completions")  # the same server, spoken to on two routes
# each flavour's route API id (otel_llm.parse.routes) and whether its stream is NDJSON (else SSE)
STREAM_API = {"openai": (routes.API_OPENAI_CHAT, False), "openai-completions": (routes.API_OPENAI_COMPLETIONS, False),
              "ollama": (routes.API_OLLAMA_CHAT, True), "llamacpp": (routes.API_LLAMACPP_COMPLETION, False)}
_FILLER = ("the shipment left the harbour on time and reached the depot before noon while the crew "
           "counted every crate twice and wrote the totals in the log").split()
_TOKENS_PER_WORD = 1.3  # about, for the tokenizers of the common small models, until calibrated
_BASE_TOKENS = 12
_ASK = "Write a long story about the shipment."


def request_for(api: str, base_url: str, model: str, max_tokens: int, prompt: str,
                exact_output: bool = False) -> tuple[str, dict[str, Any]]:
    """The generation URL and streaming JSON payload of ``api``; ``exact_output`` asks the runtime
    to generate exactly ``max_tokens`` (``ignore_eos``, as ``vllm bench serve`` does) where it can."""
    base = base_url.rstrip("/")
    if api in OPENAI_APIS:
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        chat = api == "openai"
        payload: dict[str, Any] = {
            "model": model, **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
            "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
        }
        if exact_output:
            payload.update(ignore_eos=True)
        return base + ("/v1/chat/completions" if chat else "/v1/completions"), payload
    if api == "ollama":  # no way to ignore the end of sequence: the actual count is recorded
        return base + "/api/chat", {
            "model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "options": {"num_predict": max_tokens},
        }
    if api == "llamacpp":
        payload = {"model": model, "prompt": prompt, "stream": True, "n_predict": max_tokens}
        if exact_output:
            payload["ignore_eos"] = True
        return base + "/completion", payload
    raise ValueError(f"unknown api {api!r}; one of {APIS}")


def prompt_with(words: int, nonce: str | None = None) -> str:
    """A prompt of ``words`` filler words, opened by a random nonce so no two requests share a
    cached prefix (a benchmark whose prompts hit the prefix cache measures the cache, not prefill)."""
    nonce = nonce or secrets.token_hex(4)
    filler = " ".join(_FILLER[i % len(_FILLER)] for i in range(max(0, words)))
    return f"[{nonce}] {filler} {_ASK}".replace("  ", " ")


def prompt_of(tokens: int, nonce: str | None = None, word_tokens: float = _TOKENS_PER_WORD,
              base_tokens: float = _BASE_TOKENS) -> str:
    """A prompt of about ``tokens`` tokens, for a tokenizer that counts ``word_tokens`` per filler
    word and ``base_tokens`` for the rest (template included)."""
    return prompt_with(round((tokens - base_tokens) / word_tokens), nonce)


@dataclass(frozen=True)
class Workload:
    """The fixed workload of a benchmark run (recorded in its JSON)."""

    url: str
    api: str
    model: str
    prompt_tokens: int = 128
    output_tokens: int = 64
    exact_output: bool = True
    timeout: float = 120.0
    prompt: str | None = None  # this prompt every time, instead of ~prompt_tokens with a fresh nonce
    word_tokens: float = _TOKENS_PER_WORD  # the runtime's tokens per filler word (calibrated)
    base_tokens: float = _BASE_TOKENS

    def request(self) -> tuple[str, dict[str, Any]]:
        """One request of the workload."""
        prompt = self.prompt if self.prompt is not None else prompt_of(
            self.prompt_tokens, word_tokens=self.word_tokens, base_tokens=self.base_tokens)
        return request_for(self.api, self.url, self.model, self.output_tokens, prompt, self.exact_output)

    @property
    def stream_api(self) -> str:
        return STREAM_API[self.api][0]

    @property
    def ndjson(self) -> bool:
        return STREAM_API[self.api][1]
