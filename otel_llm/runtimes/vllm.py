"""vLLM: its processes and state series; ``GET /v1/models`` and ``GET /version`` as proof."""

from __future__ import annotations

from otel_llm.parse.runtimes import STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING, ModelInfo
from otel_llm.parse.runtimes.vllm import NAME
from otel_llm.runtimes import openai_compat
from otel_llm.runtimes._common import Observed, Proof, Routes

__all__ = ["NAME", "OBSERVED", "model_info", "probe"]

OBSERVED = Observed(
    executable_names=("vllm",), python_modules=("vllm",),
    process_titles=("vllm::",),  # its engine core and workers: "VLLM::EngineCore", "VLLM::Worker"
    state_paths=("/metrics",), metric_prefix="vllm:",
    normalized={STATE_REQUESTS_RUNNING: ("vllm:num_requests_running",),
                STATE_REQUESTS_WAITING: ("vllm:num_requests_waiting",),
                # gpu_cache_usage_perc: the name before vLLM 0.10
                STATE_KV_CACHE_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
)


def probe(routes: Routes) -> Proof | None:
    """A model of ``GET /v1/models`` ``"owned_by": "vllm"`` and ``GET /version`` with a version:
    other OpenAI-compatible servers may copy the first, not both."""
    models = routes.json("/v1/models")
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return None
    if "vllm" not in {m.get("owned_by") for m in models["data"] if isinstance(m, dict)}:
        return None
    version = routes.json("/version")
    if isinstance(version, dict) and version.get("version"):
        return Proof("openai", NAME, str(version["version"]))
    return None


def model_info(routes: Routes, model: str | None) -> ModelInfo | None:
    """``GET /v1/models``: vLLM gives each model's ``max_model_len`` there."""
    return openai_compat.model_info(routes, model)
