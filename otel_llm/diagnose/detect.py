"""Which request flavour (``--api``) and runtime a target speaks, from side-effect-free GET routes.

Probes, in order, never generating tokens and never loading a model:

1. ``GET /props`` answering JSON with ``default_generation_settings`` -> llama.cpp's server
   (api ``"llamacpp"``, runtime ``"llama.cpp"``). Checked first: it is specific to llama.cpp.
2. ``GET /api/version`` answering JSON with ``"version"``, or ``GET /`` answering
   "Ollama is running" -> Ollama (api ``"ollama"``, runtime ``"ollama"``). Checked before
   ``/v1/models`` because Ollama also serves the OpenAI-compatible routes.
3. ``GET /v1/models`` answering JSON with a ``"data"`` list -> OpenAI-compatible (api ``"openai"``).
   The runtime is named only when proven: ``"vllm"`` when ``GET /version`` answers JSON with
   ``"version"`` and a listed model is ``"owned_by": "vllm"``; otherwise ``None``.

Anything else (refused connection, timeouts, 404s, HTML) -> ``None``. HTTP instrumentation is
suppressed while probing, so probes leave no spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["Detection", "detect", "detect_api", "runtime_hint", "server_root"]

_NO_ANSWER = object()


@dataclass(frozen=True)
class Detection:
    api: str | None = None  # "ollama" | "llamacpp" | "openai" | None
    runtime: str | None = None  # "ollama" | "llama.cpp" | "vllm" | None (not proven)
    version: str | None = None


def server_root(base_url: str) -> str:
    """The server's own base URL: ``base_url`` without a trailing ``/v1``."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class _Prober:
    def __init__(self, base_url: str, headers: Mapping[str, str] | None, timeout: float) -> None:
        self.base = server_root(base_url)
        self.client = httpx.Client(timeout=httpx.Timeout(timeout), headers=dict(headers or {}), trust_env=False)
        self.unreachable = False

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

    def json_ok(self, path: str) -> Any:
        answer = self.get(path)
        if answer is None or answer[0] != 200 or answer[1] is _NO_ANSWER:
            return None
        return answer[1]


def _suppressed() -> Any:
    try:
        from opentelemetry.instrumentation.utils import suppress_http_instrumentation

        return suppress_http_instrumentation()
    except ImportError:  # pragma: no cover - the instrumentation package is a dependency
        import contextlib

        return contextlib.nullcontext()


def detect(base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> Detection:
    """Probe ``base_url`` (see the module docstring); never raises for network errors."""
    prober = _Prober(base_url, headers, timeout)
    try:
        with _suppressed():
            return _detect(prober)
    finally:
        prober.client.close()


def _detect(p: _Prober) -> Detection:
    props = p.json_ok("/props")
    if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
        build = props.get("build_info")
        return Detection("llamacpp", "llama.cpp", str(build) if build else None)
    if p.unreachable:
        return Detection()
    version = p.json_ok("/api/version")
    if isinstance(version, dict) and version.get("version"):
        return Detection("ollama", "ollama", str(version["version"]))
    root = p.get("/")
    if root is not None and root[0] == 200 and root[2].strip().startswith("Ollama is running"):
        return Detection("ollama", "ollama", None)
    models = p.json_ok("/v1/models")
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        owners = {m.get("owned_by") for m in models["data"] if isinstance(m, dict)}
        if "vllm" in owners:
            vllm = p.json_ok("/version")
            if isinstance(vllm, dict) and vllm.get("version"):
                return Detection("openai", "vllm", str(vllm["version"]))
        return Detection("openai", None, None)
    return Detection()


def detect_api(base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> str | None:
    """The request flavour for ``--api auto``: "ollama", "llamacpp", "openai", or None (unknown)."""
    return detect(base_url, headers, timeout).api


def runtime_hint(base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> str | None:
    """The runtime's name when a route proves it ("ollama", "llama.cpp", "vllm"), else None."""
    return detect(base_url, headers, timeout).runtime
