"""Each model runtime as a server: how the observers recognize its processes and which of its
routes and series tell its state (``OBSERVED``), what proves it is there (``PROBES``, for
``diagnose``) and what its metadata route says of its model (``model_info``).

One module per runtime, beside its reader in ``parse.runtimes`` (how its answers are read).
Nothing here sends a request or reads ``/proc`` itself: the probes and metadata readers ask
through the ``Routes`` they are given (the runtime-state poller's, ``diagnose``'s prober), and the
observers look for the processes ``OBSERVED`` names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from otel_llm.parse.runtimes import ModelInfo
from otel_llm.runtimes import llamacpp, lmstudio, ollama, openai_compat, sglang, tgi, vllm
from otel_llm.runtimes._common import Observed, Proof, Routes

__all__ = ["ADMIN_PATHS", "MODEL_RUNTIMES", "OBSERVED", "PROBES", "READY_PATHS", "Observed", "Proof", "Routes",
           "model_info"]

_log = logging.getLogger("otel_llm.runtimes")

# runtime name -> what the observers know about it, in the order of parse.runtimes.KNOWN_RUNTIMES
OBSERVED: dict[str, Observed] = {m.NAME: m.OBSERVED for m in (ollama, llamacpp, vllm, tgi, sglang, lmstudio)}
# diagnose's detection, first proof wins: llama.cpp's /props first (specific to it), Ollama
# before /v1/models (it serves the OpenAI-compatible routes too), vLLM before any other
# OpenAI-compatible server
PROBES: tuple[Callable[[Routes], Proof | None], ...] = (
    llamacpp.probe, ollama.probe, vllm.probe, openai_compat.probe,
)
# the model's metadata (context length...) by proven runtime; any other OpenAI-compatible server
# is read as one
_MODEL_INFO: dict[str | None, Callable[[Routes, str | None], ModelInfo | None]] = {
    llamacpp.NAME: llamacpp.model_info, vllm.NAME: vllm.model_info, ollama.NAME: ollama.model_info,
    lmstudio.NAME: lmstudio.model_info,
}


MODEL_RUNTIMES = frozenset(r for r in _MODEL_INFO if r is not None)  # runtimes with a metadata reader


def model_info(routes: Routes, runtime: str | None, api: str | None, model: str | None) -> ModelInfo | None:
    """What the server's side-effect-free routes say about ``model``; None when none does.
    Never raises."""
    reader = _MODEL_INFO.get(runtime)
    if reader is None and api == openai_compat.API:
        reader = openai_compat.model_info
    try:
        return reader(routes, model) if reader is not None else None
    except Exception:  # noqa: BLE001 - an odd answer gives no metadata, never an error
        _log.debug("otel_llm: reading model metadata failed", exc_info=True)
        return None


# diagnose's routes by request flavour (``--api``): ready once the server is up, admin to be refused
READY_PATHS: dict[str, str] = {a.API: a.READY_PATH for a in (llamacpp, ollama, openai_compat)}
ADMIN_PATHS: dict[str, str] = {a.API: a.ADMIN_PATH for a in (llamacpp, ollama, openai_compat)}
