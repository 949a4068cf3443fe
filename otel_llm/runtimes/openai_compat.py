"""Any OpenAI-compatible server: ``GET /v1/models`` proves the flavour and lists the model."""

from __future__ import annotations

from otel_llm.parse.runtimes import ModelInfo, positive_int, text_or_none
from otel_llm.runtimes._common import Proof, Routes

__all__ = ["ADMIN_PATH", "API", "READY_PATH", "model_info", "probe"]

# for diagnose, by the request flavour: the route that answers once it is up, and an admin route
# an authenticating gateway should refuse
API = "openai"
READY_PATH = "/v1/models"
ADMIN_PATH = "/metrics"


def probe(routes: Routes) -> Proof | None:
    """``GET /v1/models`` answering a ``data`` list: an OpenAI-compatible server, runtime unknown."""
    models = routes.json("/v1/models")
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        return Proof("openai", None)
    return None


# where OpenAI-compatible servers put a model's context length in ``GET /v1/models`` (vLLM and
# SGLang: max_model_len)
_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length")


def model_info(routes: Routes, model: str | None) -> ModelInfo | None:
    """``GET /v1/models``: the entry of ``model`` (else the only one), and its context length."""
    models = routes.json("/v1/models")
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    chosen = next((e for e in entries if model is not None and e.get("id") == model), None)
    if chosen is None and len(entries) == 1:
        chosen = entries[0]
    if chosen is None:
        return None
    context = next((n for n in (positive_int(chosen.get(k)) for k in _CONTEXT_KEYS) if n is not None), None)
    return ModelInfo("/v1/models", context, text_or_none(chosen.get("id")))
