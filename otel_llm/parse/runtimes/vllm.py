"""vLLM OpenAI server: no per-response timings exist, so only usage and finish reasons.

No response field proves vLLM; this adapter runs when ``info.runtime == "vllm"`` (e.g. the
caller copied a configured runtime name into it).
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_llm.parse._merge import ResponseInfo
from otel_llm.parse.runtimes import openai_compat
from otel_llm.parse.runtimes._common import (
    ModelInfo, Observed, Proof, Routes, RuntimeCounters, STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING,
    STATE_REQUESTS_WAITING, map_reasons, reasons_of,
)

NAME = "vllm"
NATIVE_KEYS: tuple[str, ...] = ()
SOURCE = (
    "no per-response timings: OpenAI `usage` (prompt_tokens, completion_tokens, "
    "prompt_tokens_details.cached_tokens with --enable-prompt-tokens-details) and finish_reason"
)
OBSERVED = Observed(
    executable_names=("vllm",), python_modules=("vllm",),
    process_titles=("vllm::",),  # its engine core and workers: "VLLM::EngineCore", "VLLM::Worker"
    state_paths=("/metrics",), metric_prefix="vllm:",
    normalized={STATE_REQUESTS_RUNNING: ("vllm:num_requests_running",),
                STATE_REQUESTS_WAITING: ("vllm:num_requests_waiting",),
                # gpu_cache_usage_perc: the name before vLLM 0.10
                STATE_KV_CACHE_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
)
REASONS: dict[str, str] = {}  # already OpenAI-style; "abort" kept as-is


def read(info: ResponseInfo, headers: Mapping[str, str] | None = None) -> RuntimeCounters:
    """Finish reasons only; usage is merged by the caller."""
    return RuntimeCounters(runtime=NAME, finish_reasons=map_reasons(reasons_of(info), REASONS))


# --- proving it (diagnose) ------------------------------------------------------------------
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
