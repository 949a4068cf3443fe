"""SGLang: its processes and the state series of its ``/metrics``."""

from __future__ import annotations

from otel_llm.parse.runtimes import STATE_KV_CACHE_USAGE, STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING
from otel_llm.parse.runtimes.sglang import NAME
from otel_llm.runtimes._common import Observed

__all__ = ["NAME", "OBSERVED"]

OBSERVED = Observed(
    executable_names=("sglang",), python_modules=("sglang",), process_titles=("sglang::",),
    state_paths=("/metrics",), metric_prefix="sglang:",
    normalized={STATE_REQUESTS_RUNNING: ("sglang:num_running_reqs",),
                STATE_REQUESTS_WAITING: ("sglang:num_queue_reqs",),
                STATE_KV_CACHE_USAGE: ("sglang:token_usage",)},
)
