"""Hugging Face TGI: its processes and the state series of its ``/metrics``."""

from __future__ import annotations

from otel_llm.parse.runtimes import STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING
from otel_llm.parse.runtimes.tgi import NAME
from otel_llm.runtimes._common import Observed

__all__ = ["NAME", "OBSERVED"]

OBSERVED = Observed(
    executables=("text-generation-launcher", "text-generation-router", "text-generation-server"),
    python_modules=("text_generation_server",), state_paths=("/metrics",), metric_prefix="tgi_",
    normalized={STATE_REQUESTS_RUNNING: ("tgi_batch_current_size",),
                STATE_REQUESTS_WAITING: ("tgi_queue_size",)},
)
