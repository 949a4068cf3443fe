"""The runtime's own account of each benchmark request, read from its model-call span.

otel_llm already records what the runtime reported (``llm.runtime.*``: its queue time, prompt
evaluation, generation rate...) on every call span; a span processor keeps those attributes by
trace id, so each request's record carries them beside the client's figures.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanKind

from otel_llm import semconv as sc

__all__ = ["NATIVE_KEYS", "NativeCollector"]

# what a request's record keeps: the runtime's name and its own durations and rates
NATIVE_KEYS = (
    sc.LLM_RUNTIME_NAME, sc.LLM_RUNTIME_LOAD_DURATION, sc.LLM_RUNTIME_QUEUE_DURATION,
    sc.LLM_RUNTIME_PROMPT_TOKENS, sc.LLM_RUNTIME_PROMPT_EVAL_DURATION, sc.LLM_RUNTIME_PROMPT_EVAL_RATE,
    sc.LLM_RUNTIME_GENERATION_TOKENS, sc.LLM_RUNTIME_GENERATION_DURATION, sc.LLM_RUNTIME_GENERATION_RATE,
    sc.LLM_RUNTIME_TOTAL_DURATION, sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE,
)
MAX_KEPT = 100_000  # calls whose record was never taken (warm-up, calibration) are dropped oldest first


class NativeCollector(SpanProcessor):
    """Keeps the ``NATIVE_KEYS`` of every finished model-call span, by trace id (hex)."""

    def __init__(self) -> None:
        self._by_trace: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        if span.kind != SpanKind.CLIENT or sc.GEN_AI_OPERATION_NAME not in attrs or span.context is None:
            return
        found = {key: attrs[key] for key in NATIVE_KEYS if key in attrs}
        with self._lock:
            self._by_trace[format(span.context.trace_id, "032x")] = found
            while len(self._by_trace) > MAX_KEPT:
                self._by_trace.popitem(last=False)

    def take(self, trace_id: str | None) -> dict[str, Any]:
        """The runtime's figures of the call in ``trace_id`` ({} when it reported none)."""
        if trace_id is None:
            return {}
        with self._lock:
            return self._by_trace.pop(trace_id, {})
