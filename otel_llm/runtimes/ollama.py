"""Ollama: its processes, ``GET /api/ps`` polled for its state and read for the loaded model, and
``GET /api/version`` (or ``GET /``) as proof."""

from __future__ import annotations

from otel_llm.parse.runtimes import ModelInfo
from otel_llm.parse.runtimes.ollama import NAME, PS_PATH, loaded_model, ps_model
from otel_llm.runtimes._common import Observed, Proof, Routes

__all__ = ["ADMIN_PATH", "API", "NAME", "OBSERVED", "READY_PATH", "model_info", "probe"]

OBSERVED = Observed(executables=("ollama",),  # "ollama serve" and its "ollama runner" children
                    state_paths=(PS_PATH,))
# for diagnose, by the request flavour its own API is: the route that answers once it is up, and
# an admin route an authenticating gateway should refuse
API = "ollama"
READY_PATH = "/api/version"
ADMIN_PATH = "/api/tags"


def probe(routes: Routes) -> Proof | None:
    """``GET /api/version`` with a version, or ``GET /`` answering "Ollama is running"."""
    version = routes.json("/api/version")
    if isinstance(version, dict) and version.get("version"):
        return Proof("ollama", NAME, str(version["version"]))
    root = routes.text("/")
    if root is not None and root.strip().startswith("Ollama is running"):
        return Proof("ollama", NAME)
    return None


def model_info(routes: Routes, model: str | None) -> ModelInfo | None:
    """``GET /api/ps``: the loaded model ``model`` runs on (None while it is not loaded)."""
    data = routes.json(PS_PATH)
    entries = data.get("models") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    found = [info for info in (ps_model(e) for e in entries if isinstance(e, dict)) if info is not None]
    return loaded_model(found, model)
