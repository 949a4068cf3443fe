"""Metric instruments for model calls, created once per meter provider."""

from __future__ import annotations

from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider

from otel_llm import semconv as sc
from otel_llm.version import __version__

# Metric attributes: the GenAI common set (low cardinality; no ids, no URLs).
_METRIC_KEYS = (
    sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_RESPONSE_MODEL, sc.SERVER_ADDRESS, sc.SERVER_PORT, sc.ERROR_TYPE,
)
# The SDK cleans and hashes every attribute of every measurement, so the per-phase histogram
# (several records per call) carries only what a phase breakdown is sliced by.
_PHASE_KEYS = (sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL)
# Measurements are not made inside the call's span context: an empty context spares the SDK
# a context lookup per record.
_NO_CONTEXT = Context()


class CallMetrics:
    """The histograms one call records into."""

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_NAME, __version__)

        def histogram(name: str, unit: str, description: str, buckets: tuple[float, ...]) -> Any:
            return meter.create_histogram(name, unit=unit, description=description,
                                          explicit_bucket_boundaries_advisory=list(buckets))

        self.duration = histogram(sc.METRIC_OPERATION_DURATION, "s", "GenAI operation duration.",
                                  sc.DURATION_BUCKETS)
        self.tokens = histogram(sc.METRIC_TOKEN_USAGE, "{token}", "Number of input and output tokens used.",
                                sc.TOKEN_BUCKETS)
        self.first_chunk = histogram(sc.METRIC_TIME_TO_FIRST_CHUNK, "s",
                                     "Time to receive the first chunk carrying generated output.", sc.DURATION_BUCKETS)
        self.per_chunk = histogram(sc.METRIC_TIME_PER_OUTPUT_CHUNK, "s",
                                   "Mean time between output chunks after the first, per call.", sc.DURATION_BUCKETS)
        self.phase = histogram(sc.METRIC_PHASE_DURATION, "s",
                               "Duration of each phase of a model call (llm.phase = the phase span's name).",
                               sc.PHASE_BUCKETS)

    def record(self, span_attrs: dict[str, Any], timings: dict[str, Any], phases: list[tuple[str, float]]) -> None:
        """Record one finished call; ``timings`` holds the llm.client.* values."""
        attrs = {k: span_attrs[k] for k in _METRIC_KEYS if k in span_attrs}
        context = _NO_CONTEXT
        self.duration.record(timings["duration"], attrs, context)
        for token_type, key in (("input", sc.GEN_AI_USAGE_INPUT_TOKENS), ("output", sc.GEN_AI_USAGE_OUTPUT_TOKENS)):
            value = span_attrs.get(key)
            if isinstance(value, int):
                self.tokens.record(value, {**attrs, sc.GEN_AI_TOKEN_TYPE: token_type}, context)
        ttft = timings.get(sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN)
        if ttft is not None:
            self.first_chunk.record(ttft, attrs, context)
        per_chunk = timings.get("time_per_chunk")
        if per_chunk is not None:
            self.per_chunk.record(per_chunk, attrs, context)
        phase_attrs = {k: attrs[k] for k in _PHASE_KEYS if k in attrs}
        for name, seconds in phases:
            self.phase.record(seconds, {**phase_attrs, sc.LLM_PHASE: name}, context)
