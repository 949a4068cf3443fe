"""LM Studio: its processes (it serves neither ``/metrics`` nor ``/api/ps``: nothing to poll) and
``GET /api/v0/models``, its model listing, read once it lists a loaded model."""

from __future__ import annotations

from otel_llm.parse.runtimes import ModelInfo, positive_int, text_or_none
from otel_llm.parse.runtimes.lmstudio import NAME
from otel_llm.runtimes._common import Observed, Routes

__all__ = ["MODELS_PATH", "NAME", "OBSERVED", "model_info"]

OBSERVED = Observed(executables=("lm studio", "lm-studio", "lmstudio"), executable_names=("lms",))
MODELS_PATH = "/api/v0/models"


def model_info(routes: Routes, model: str | None) -> ModelInfo | None:
    """``GET /api/v0/models``: the entry of ``model`` (else the only loaded one), its context length
    (``loaded_context_length`` where listed, else ``max_context_length``) and quantization."""
    data = routes.json(MODELS_PATH)
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    chosen = next((e for e in entries if model is not None and e.get("id") == model), None)
    loaded = [e for e in entries if e.get("state") == "loaded"]
    if chosen is None and len(loaded) == 1:
        chosen = loaded[0]
    if chosen is None:
        return None
    context = positive_int(chosen.get("loaded_context_length")) or positive_int(chosen.get("max_context_length"))
    return ModelInfo(MODELS_PATH, context, text_or_none(chosen.get("id")), text_or_none(chosen.get("quantization")))
