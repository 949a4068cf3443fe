"""Which request flavour (``--api``) and runtime a target speaks, from side-effect-free GET routes.

Each runtime's module proves itself (``probe`` in ``otel_llm.runtimes``); they run in the
order of ``PROBES`` and the first proof wins, never generating tokens and never loading a model:

1. llama.cpp: ``GET /props`` with ``default_generation_settings`` (api ``"llamacpp"``).
2. Ollama: ``GET /api/version`` with a version, or ``GET /`` answering "Ollama is running" (api
   ``"ollama"``); before ``/v1/models``, because Ollama serves the OpenAI-compatible routes too.
3. vLLM: a model of ``GET /v1/models`` ``"owned_by": "vllm"`` and ``GET /version`` with a version
   (api ``"openai"``).
4. any other OpenAI-compatible server: ``GET /v1/models`` with a ``"data"`` list (api
   ``"openai"``, runtime ``None``: not proven).

Each route is fetched once. Anything else (refused connection, timeouts, 404s, HTML) -> ``None``.
HTTP instrumentation is suppressed while probing, so probes leave no spans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from otel_llm.parse.runtimes import ModelInfo, ollama
from otel_llm.runtimes import PROBES, model_info

__all__ = ["Detection", "detect", "detect_api", "loaded_model", "runtime_hint", "server_root"]

_NO_ANSWER = object()


@dataclass(frozen=True)
class Detection:
    api: str | None = None  # "ollama" | "llamacpp" | "openai" | None
    runtime: str | None = None  # "ollama" | "llama.cpp" | "vllm" | None (not proven)
    version: str | None = None
    model: ModelInfo | None = None  # from the runtime's metadata route, when the model was named


def server_root(base_url: str) -> str:
    """The server's own base URL: ``base_url`` without a trailing ``/v1``."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class _Prober:
    def __init__(self, base_url: str, headers: Mapping[str, str] | None, timeout: float) -> None:
        self.base = server_root(base_url)
        self.client = httpx.Client(timeout=httpx.Timeout(timeout), headers=dict(headers or {}), trust_env=False)
        self.unreachable = False
        self.answers: dict[str, tuple[int, Any, str] | None] = {}

    def get(self, path: str) -> tuple[int, Any, str] | None:
        """(status, parsed JSON or _NO_ANSWER, text); None when there was no HTTP answer."""
        if self.unreachable:
            return None
        try:
            response = self.client.get(self.base + path)
        except httpx.ConnectError:
            self.unreachable = True  # nothing listens: skip the remaining probes
            return None
        except httpx.HTTPError:
            return None
        try:
            body: Any = response.json()
        except ValueError:
            body = _NO_ANSWER
        return response.status_code, body, response.text

    def json(self, path: str) -> Any:
        """The JSON body of a 200 answer (the ``Routes`` a runtime's probe reads), else None."""
        answer = self._answer(path)
        if answer is None or answer[0] != 200 or answer[1] is _NO_ANSWER:
            return None
        return answer[1]

    def text(self, path: str) -> str | None:
        answer = self._answer(path)
        return answer[2] if answer is not None and answer[0] == 200 else None

    def post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        """The JSON body of a 200 answer to ``POST path`` (a side-effect-free metadata route such as
        Ollama's /api/show), else None."""
        if self.unreachable:
            return None
        try:
            response = self.client.post(self.base + path, json=dict(body))
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def _answer(self, path: str) -> tuple[int, Any, str] | None:
        if path not in self.answers:
            self.answers[path] = self.get(path)
        return self.answers[path]


def _suppressed() -> Any:
    try:
        from opentelemetry.instrumentation.utils import suppress_http_instrumentation

        return suppress_http_instrumentation()
    except ImportError:  # pragma: no cover - the instrumentation package is a dependency
        import contextlib

        return contextlib.nullcontext()


def detect(base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0,
           model: str | None = None) -> Detection:
    """Probe ``base_url`` (see the module docstring), then read what the proven runtime's
    metadata route says about ``model`` (its context length...); never raises for network
    errors."""
    prober = _Prober(base_url, headers, timeout)
    try:
        with _suppressed():
            return _detect(prober, model)
    finally:
        prober.client.close()


def _detect(p: _Prober, model: str | None) -> Detection:
    for probe in PROBES:
        proof = probe(p)
        if proof is not None:
            return Detection(proof.api, proof.runtime, proof.version, model_info(p, proof.runtime, proof.api, model))
        if p.unreachable:
            break
    return Detection()


def loaded_model(base_url: str, runtime: str | None, api: str | None, model: str | None,
                 headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> ModelInfo | None:
    """The metadata route read again, once the trials have loaded ``model`` (Ollama's /api/ps lists
    only loaded models), and for Ollama the model's shape from ``POST /api/show`` (parameters, KV
    cache per token); None where nothing says. Never raises for network errors."""
    prober = _Prober(base_url, headers, timeout)
    try:
        with _suppressed():
            info = model_info(prober, runtime, api, model)
            if runtime == ollama.NAME and model:
                info = _with_shape(info, ollama.show_model(prober.post_json(ollama.SHOW_PATH, {"model": model})))
            return info
    finally:
        prober.client.close()


def _with_shape(info: ModelInfo | None, shape: ModelInfo | None) -> ModelInfo | None:
    """The loaded model's figures, with the shape's where it has none of its own."""
    if shape is None or info is None:
        return info or shape
    return dataclasses.replace(info, context_length=info.context_length or shape.context_length,
                               quantization=info.quantization or shape.quantization,
                               parameter_count=shape.parameter_count, kv_bytes_per_token=shape.kv_bytes_per_token)


def detect_api(base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> str | None:
    """The request flavour for ``--api auto``: "ollama", "llamacpp", "openai", or None (unknown)."""
    return detect(base_url, headers, timeout).api


def runtime_hint(base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> str | None:
    """The runtime's name when a route proves it ("ollama", "llama.cpp", "vllm"), else None."""
    return detect(base_url, headers, timeout).runtime
