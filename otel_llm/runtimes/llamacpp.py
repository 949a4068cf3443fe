"""llama.cpp's server: its processes and state series, ``GET /props`` as proof and metadata."""

from __future__ import annotations

from otel_llm.parse.runtimes import (
    STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING, ModelInfo, positive_int, text_or_none,
)
from otel_llm.parse.runtimes.llamacpp import NAME
from otel_llm.runtimes._common import Observed, Proof, Routes

__all__ = ["ADMIN_PATH", "API", "NAME", "OBSERVED", "READY_PATH", "model_info", "probe"]

OBSERVED = Observed(
    executables=("llama-server",), python_modules=("llama_cpp",), state_paths=("/metrics",),  # needs --metrics
    metric_prefix="llamacpp:",
    normalized={STATE_REQUESTS_RUNNING: ("llamacpp:requests_processing",),
                STATE_REQUESTS_WAITING: ("llamacpp:requests_deferred",),
                STATE_KV_CACHE_USAGE: ("llamacpp:kv_cache_usage_ratio",)},
)
# for diagnose, by the request flavour its own API is: the route that answers once it is up, and
# an admin route an authenticating gateway should refuse
API = "llamacpp"
READY_PATH = "/health"
ADMIN_PATH = "/props"


def probe(routes: Routes) -> Proof | None:
    """``GET /props`` with ``default_generation_settings``: specific to llama.cpp's server."""
    props = routes.json("/props")
    if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
        build = props.get("build_info")
        return Proof("llamacpp", NAME, str(build) if build else None)
    return None


def model_info(routes: Routes, model: str | None) -> ModelInfo | None:
    """``GET /props``: the context each slot holds (``n_ctx``), the model file, its type, slots."""
    props = routes.json("/props")
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    context = positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return ModelInfo("/props", context, text_or_none(props.get("model_path")),
                     text_or_none(props.get("model_ftype")), positive_int(props.get("total_slots")))
