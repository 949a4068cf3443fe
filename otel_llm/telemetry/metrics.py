"""Metric instruments for model calls, created once per meter provider."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext
from opentelemetry.metrics import MeterProvider, Observation

from otel_llm import semconv as sc
from otel_llm._types import Attributes
from otel_llm.config import GENAI_DEFAULT, GENAI_DUP, GENAI_LATEST
from otel_llm.telemetry.inflight import InFlight
from otel_llm.version import __version__

if TYPE_CHECKING:
    from otel_llm.parse.runtimes import RuntimeCounters
    from otel_llm.telemetry.phases import Phase

__all__ = ["CallMetrics", "call_metrics"]

# Metric attributes: the GenAI common set (low cardinality; no ids, no URLs).
_METRIC_KEYS = (
    sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_RESPONSE_MODEL, sc.SERVER_ADDRESS, sc.SERVER_PORT, sc.ERROR_TYPE, sc.LLM_GATEWAY_RELAYED,
)
# The SDK cleans and hashes every attribute of every measurement, so the per-phase histogram
# (several records per call) carries only what a phase breakdown is sliced by.
_PHASE_KEYS = (sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL, sc.LLM_GATEWAY_RELAYED)
# The runtime's own latencies and rates (four records per call) are charted by model and runtime;
# the operation name is the one attribute the GenAI server metrics require beyond those.
_RUNTIME_KEYS = (sc.GEN_AI_OPERATION_NAME,) + _PHASE_KEYS
# The diagnosis tally counts calls by these verdicts, beside the phase keys ("none": no bottleneck).
_VERDICT_DEFAULTS = ((sc.LLM_DIAGNOSIS_BOTTLENECK, "none"), (sc.LLM_DIAGNOSIS_COLD_START, None),
                     (sc.LLM_DIAGNOSIS_STREAM_BUFFERED, None))
_VERDICT_KEYS = tuple(key for key, _ in _VERDICT_DEFAULTS)
# Distinct metric attribute sets whose record dictionaries are kept (see CallMetrics._sets).
_SETS_LIMIT = 256
# Most measurements are not made inside the call's span context: a context without a span spares
# the SDK an exemplar offer per record. Not an empty one: the SDK takes ``context or
# get_current()``, and an empty Context is falsy, so the application's current span (if any)
# would get the exemplars.
_NO_CONTEXT = Context({"otel_llm.no_span": True})
# Distinct attribute sets the diagnosis tally keeps before folding new ones into an overflow set,
# as the SDK does past its own cardinality limit.
_TALLY_LIMIT = 2000
_OVERFLOW = ((sc.OTEL_METRIC_OVERFLOW, True),)
_DURATION_HELP = "GenAI operation duration."
_FIRST_CHUNK_HELP = "Time to receive the first chunk carrying generated output."
_PER_CHUNK_HELP = "Time per output chunk, recorded for each output chunk after the first."


class _Tally:
    """Calls counted by attribute set and reported by an observable counter at collection time:
    one dict increment per call instead of an SDK measurement (about 10 us of a call's CPU here).
    The counts are cumulative and never reset, as a monotonic counter's must be."""

    def __init__(self) -> None:
        self._counts: dict[tuple[tuple[str, Any], ...], int] = {}
        self._lock = threading.Lock()

    def add(self, key: tuple[tuple[str, Any], ...]) -> None:
        with self._lock:
            counts = self._counts
            if key not in counts and len(counts) >= _TALLY_LIMIT:
                key = _OVERFLOW
            counts[key] = counts.get(key, 0) + 1

    def observe(self) -> list[Observation]:
        with self._lock:
            items = list(self._counts.items())
        return [Observation(count, dict(key)) for key, count in items]


class _Shared:
    """What the observable instruments of one meter read. The SDK keeps the first registration of
    an instrument name per meter and ignores the callbacks of later ones: after uninstrument() /
    instrument() on the same meter provider, the active-requests callback must read the new
    session's in-flight table, and the diagnosis counts must go on from where they were."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight
        self.diagnosed = _Tally()
        self.relaying = False  # a gateway's: its calls in flight are counted marked relayed and not


_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()


def call_metrics(meter_provider: MeterProvider, in_flight: InFlight, semconv: str = GENAI_DEFAULT) -> CallMetrics:
    """The instruments of model calls, under the names ``semconv`` (otel_llm.config.genai_semconv)
    chooses: the default mode's records are CallMetrics' own, unchanged."""
    if semconv in (GENAI_LATEST, GENAI_DUP):
        return InferenceCallMetrics(meter_provider, in_flight, dup=semconv == GENAI_DUP)
    return CallMetrics(meter_provider, in_flight)


class CallMetrics:
    """The histograms one call records into."""

    def __init__(self, meter_provider: MeterProvider, in_flight: InFlight) -> None:
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_NAME, __version__)
        self._attribute_sets: dict[tuple[Any, ...], _AttributeSets] = {}

        def histogram(name: str, unit: str, description: str, buckets: tuple[float, ...]) -> Any:
            return meter.create_histogram(name, unit=unit, description=description,
                                          explicit_bucket_boundaries_advisory=list(buckets))

        self._client_instruments(meter, histogram)
        self.phase = histogram(sc.METRIC_PHASE_DURATION, "s",
                               "Duration of each phase of a model call (llm.phase = the phase span's name).",
                               sc.PHASE_BUCKETS)
        self.server_ttft = histogram(sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN, "s",
                                     "Time to first token as the runtime reports it (queue, load, prefill).",
                                     sc.SERVER_TTFT_BUCKETS)
        self.server_tpot = histogram(sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN, "s",
                                     "Time per output token after the first, as the runtime reports it.",
                                     sc.SERVER_TPOT_BUCKETS)
        self.prompt_rate = histogram(sc.METRIC_RUNTIME_PROMPT_EVAL_RATE, "{token}/s",
                                     "Prompt evaluation rate reported by the runtime.", sc.RATE_BUCKETS)
        self.generation_rate = histogram(sc.METRIC_RUNTIME_GENERATION_RATE, "{token}/s",
                                         "Generation rate reported by the runtime.", sc.RATE_BUCKETS)
        self.unaccounted = histogram(sc.METRIC_DIAGNOSIS_UNACCOUNTED_WAIT, "s",
                                     "Wait before the first token that the runtime's own counters do not explain.",
                                     sc.PHASE_BUCKETS)
        # Observed at collection time from the in-flight table and the diagnosis tally.
        try:
            shared = _SHARED.get(meter)
        except TypeError:  # a meter that cannot be weakly referenced
            shared = None
        if shared is not None:
            shared.in_flight, shared.relaying = in_flight, False
            self.diagnosed = shared.diagnosed
            self._shared = shared
            return
        shared = self._shared = _Shared(in_flight)
        self.diagnosed = shared.diagnosed
        try:
            _SHARED[meter] = shared
        except TypeError:
            pass
        meter.create_observable_up_down_counter(
            sc.METRIC_ACTIVE_REQUESTS, callbacks=[lambda options: _active(shared)], unit="{request}",
            description="Model calls in flight, by server.",
        )
        meter.create_observable_counter(
            sc.METRIC_DIAGNOSIS_CALLS, callbacks=[lambda options: shared.diagnosed.observe()], unit="{call}",
            description="Model calls by diagnosis: bottleneck, cold start, buffered stream.",
        )

    def _client_instruments(self, meter: Any, histogram: Callable[[str, str, str, tuple[float, ...]], Any]) -> None:
        """gen_ai.client.operation.* and gen_ai.client.token.usage (semantic conventions v1.41)."""
        self.duration = histogram(sc.METRIC_OPERATION_DURATION, "s", _DURATION_HELP, sc.DURATION_BUCKETS)
        self.tokens = histogram(sc.METRIC_TOKEN_USAGE, "{token}", "Number of input and output tokens used.",
                                sc.TOKEN_BUCKETS)
        self.first_chunk = histogram(sc.METRIC_TIME_TO_FIRST_CHUNK, "s", _FIRST_CHUNK_HELP, sc.DURATION_BUCKETS)
        self.per_chunk = histogram(sc.METRIC_TIME_PER_OUTPUT_CHUNK, "s", _PER_CHUNK_HELP, sc.DURATION_BUCKETS)

    def _record_client(self, span_attrs: Attributes, sets: _AttributeSets, duration: float,
                       chunk_gaps: Sequence[int], span_context: SpanContext | None, left: frozenset[str]) -> None:
        """The call's gen_ai.client.* records, but those in ``left`` (see ``record``)."""
        attrs = sets.call
        linked = _NO_CONTEXT
        if span_context is not None and span_context.trace_flags.sampled:
            linked = trace.set_span_in_context(trace.NonRecordingSpan(span_context), _NO_CONTEXT)
        if sc.METRIC_OPERATION_DURATION not in left:
            self.duration.record(duration, attrs, linked)
        if sc.METRIC_TOKEN_USAGE not in left:
            value = span_attrs.get(sc.GEN_AI_USAGE_INPUT_TOKENS)
            if value.__class__ is int:
                self.tokens.record(value, sets.input, _NO_CONTEXT)
            value = span_attrs.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
            if value.__class__ is int:
                self.tokens.record(value, sets.output, _NO_CONTEXT)
        ttft = span_attrs.get(sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN)
        if ttft is not None and sc.METRIC_TIME_TO_FIRST_CHUNK not in left:
            self.first_chunk.record(ttft, attrs, linked)
        if chunk_gaps and sc.METRIC_TIME_PER_OUTPUT_CHUNK not in left:
            record = self.per_chunk.record
            for gap in chunk_gaps:
                record(gap * 1e-9, attrs, _NO_CONTEXT)

    def _record_diagnosis(self, span_attrs: Attributes, sets: _AttributeSets) -> None:
        """Count the call under its per-call verdicts, so dashboards can chart them exactly."""
        verdicts = tuple(map(span_attrs.get, _VERDICT_KEYS))
        key = sets.tallied.get(verdicts)
        if key is None:
            key = sets.tallied[verdicts] = sets.phase_pairs + tuple(
                (name, value if value is not None else default)
                for (name, default), value in zip(_VERDICT_DEFAULTS, verdicts)
                if value is not None or default is not None)
        self.diagnosed.add(key)
        unaccounted = span_attrs.get(sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT)
        if unaccounted is not None:
            self.unaccounted.record(unaccounted, sets.phase, _NO_CONTEXT)

    def _record_runtime(self, attrs: Attributes, counters: RuntimeCounters, left: frozenset[str]) -> None:
        """The runtime-reported latencies (``gen_ai.server.*``, but those in ``left``) and rates,
        when it reported them."""
        ttft = counters.time_to_first_token
        if ttft is None and counters.prompt_eval_duration is not None:
            ttft = sum(v for v in (counters.queue_duration, counters.load_duration,
                                   counters.prompt_eval_duration) if v is not None)
        if ttft is not None and sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN not in left:
            self.server_ttft.record(ttft, attrs, _NO_CONTEXT)
        if counters.time_per_output_token is not None and sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN not in left:
            self.server_tpot.record(counters.time_per_output_token, attrs, _NO_CONTEXT)
        for histogram, value in ((self.prompt_rate, counters.prompt_eval_rate),
                                 (self.generation_rate, counters.generation_rate)):
            if value is not None:
                histogram.record(value, attrs, _NO_CONTEXT)

    def relaying(self) -> None:
        """The in-flight gauge counts the gateway's relayed calls (their callers recorded them
        too) apart, marked ``llm.gateway.relayed``: each server has both series."""
        self._shared.relaying = True

    def _sets(self, span_attrs: Attributes) -> _AttributeSets:
        """The attribute dictionaries of this call's records, built once per distinct set of
        metric attributes (an application calls the same few models at the same few servers)."""
        values = tuple(map(span_attrs.get, _METRIC_KEYS))
        sets = self._attribute_sets.get(values)
        if sets is None:
            if len(self._attribute_sets) >= _SETS_LIMIT:  # ever-changing models or errors
                self._attribute_sets.clear()
            sets = self._attribute_sets[values] = _AttributeSets(
                {k: v for k, v in zip(_METRIC_KEYS, values) if v is not None})
        return sets

    def record(self, span_attrs: Attributes, duration: float, chunk_gaps: Sequence[int], phases: list[Phase],
               span_context: SpanContext | None = None, counters: RuntimeCounters | None = None,
               left: frozenset[str] = frozenset()) -> None:
        """Record one finished call of ``duration`` seconds (``chunk_gaps``: a stream's nanoseconds
        between consecutive output chunks, one ``time_per_output_chunk`` value each, as the
        convention defines it): the llm.client.* values and the diagnosis come from
        ``span_attrs``, ``counters`` are the runtime's own (when it reported any). ``left``: the
        gen_ai metrics (default names) another instrumentation records for this call
        (``beside.metrics_left_to``), which otel_llm does not record again, under any naming.

        The call's duration and time to first token are recorded in the call span's context so
        the SDK keeps exemplars (trace ids) on them: a latency panel links to its slow traces.
        The other records skip that (two exemplar offers per call, not twelve)."""
        sets = self._sets(span_attrs)
        self._record_client(span_attrs, sets, duration, chunk_gaps, span_context, left)
        context = _NO_CONTEXT
        by_phase = sets.by_phase
        for name, start_ns, end_ns, _ in phases:
            phase_attrs = by_phase.get(name)
            if phase_attrs is None:
                phase_attrs = by_phase[name] = {**sets.phase, sc.LLM_PHASE: name}
            self.phase.record((end_ns - start_ns) * 1e-9, phase_attrs, context)
        self._record_diagnosis(span_attrs, sets)
        if counters is not None:
            self._record_runtime(sets.runtime, counters, left)


class InferenceCallMetrics(CallMetrics):
    """CallMetrics under the names of open-telemetry/semantic-conventions-genai
    (``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``), or under both those and the
    default ones (``dup``). The durations are the same histograms renamed (client-inference.md);
    token usage is counters by ``gen_ai.token.modality`` plus per-operation histograms recorded
    for successful calls only (gen-ai-token-metrics.md)."""

    def __init__(self, meter_provider: MeterProvider, in_flight: InFlight, dup: bool = False) -> None:
        self._dup = dup
        super().__init__(meter_provider, in_flight)

    def _client_instruments(self, meter: Any, histogram: Callable[[str, str, str, tuple[float, ...]], Any]) -> None:
        duration = histogram(sc.METRIC_INFERENCE_DURATION, "s", "GenAI client inference operation duration.",
                             sc.DURATION_BUCKETS)
        first_chunk = histogram(sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK, "s", _FIRST_CHUNK_HELP, sc.DURATION_BUCKETS)
        per_chunk = histogram(sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK, "s", _PER_CHUNK_HELP, sc.DURATION_BUCKETS)

        def counter(name: str, description: str) -> Any:
            return meter.create_counter(name, unit="{token}", description=description)

        operation_input = histogram(sc.METRIC_INFERENCE_OPERATION_INPUT_TOKENS, "{token}",
                                    "The number of input (prompt) tokens used per inference operation.",
                                    sc.TOKEN_BUCKETS)
        operation_output = histogram(sc.METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS, "{token}",
                                     "The number of output (completion) tokens used per inference operation.",
                                     sc.TOKEN_BUCKETS)
        # (span attribute, usage counter, per-operation histogram or None)
        self._usage = (
            (sc.GEN_AI_USAGE_INPUT_TOKENS,
             counter(sc.METRIC_INFERENCE_USAGE_INPUT_TOKENS,
                     "The number of input (prompt) tokens used, including cached tokens."), operation_input),
            (sc.GEN_AI_USAGE_OUTPUT_TOKENS,
             counter(sc.METRIC_INFERENCE_USAGE_OUTPUT_TOKENS,
                     "The number of output (completion) tokens used, including reasoning tokens."), operation_output),
            (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
             counter(sc.METRIC_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS,
                     "The number of input tokens served from a provider-managed cache."), None),
            (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
             counter(sc.METRIC_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS,
                     "The number of output tokens used for reasoning."), None),
        )
        if self._dup:
            super()._client_instruments(meter, histogram)
            self.duration = _Both(self.duration, duration)
            self.first_chunk = _Both(self.first_chunk, first_chunk)
            self.per_chunk = _Both(self.per_chunk, per_chunk)
        else:
            self.duration, self.first_chunk, self.per_chunk = duration, first_chunk, per_chunk
            self.tokens = _NO_RECORD

    def record(self, span_attrs: Attributes, duration: float, chunk_gaps: Sequence[int], phases: list[Phase],
               span_context: SpanContext | None = None, counters: RuntimeCounters | None = None,
               left: frozenset[str] = frozenset()) -> None:
        super().record(span_attrs, duration, chunk_gaps, phases, span_context, counters, left)
        if sc.METRIC_TOKEN_USAGE in left:
            return
        sets = self._sets(span_attrs)
        succeeded = sc.ERROR_TYPE not in sets.call
        for key, counter, histogram in self._usage:
            value = span_attrs.get(key)
            if value.__class__ is int:
                counter.add(value, sets.usage, _NO_CONTEXT)
                if histogram is not None and succeeded:
                    histogram.record(value, sets.call, _NO_CONTEXT)


class _Both:
    """One histogram under its default and its semantic-conventions-genai name (``/dup``)."""

    __slots__ = ("_old", "_new")

    def __init__(self, old: Any, new: Any) -> None:
        self._old, self._new = old, new

    def record(self, amount: float, attributes: Attributes | None = None, context: Context | None = None) -> None:
        self._old.record(amount, attributes, context)
        self._new.record(amount, attributes, context)


class _NoRecord:
    """gen_ai.client.token.usage where only the new names are emitted."""

    def record(self, amount: float, attributes: Attributes | None = None, context: Context | None = None) -> None:
        pass


_NO_RECORD = _NoRecord()


class _AttributeSets:
    """The attributes of each record of a call, for one set of metric attribute values. The SDK
    copies what it keeps, so the same dictionaries are handed over call after call."""

    __slots__ = ("call", "input", "output", "usage", "phase", "phase_pairs", "by_phase", "runtime", "tallied")

    def __init__(self, call: Attributes) -> None:
        self.call = call
        self.input = {**call, sc.GEN_AI_TOKEN_TYPE: "input"}
        self.output = {**call, sc.GEN_AI_TOKEN_TYPE: "output"}
        # the inference usage counters (gen-ai-token-metrics.md): no error.type, and the modality
        # "unknown", as the document says when the response gives no breakdown by modality
        self.usage = {**{k: v for k, v in call.items() if k != sc.ERROR_TYPE}, sc.GEN_AI_TOKEN_MODALITY: "unknown"}
        self.phase = {k: call[k] for k in _PHASE_KEYS if k in call}
        self.phase_pairs = tuple(self.phase.items())
        self.by_phase: dict[str, Attributes] = {}
        self.runtime = {k: call[k] for k in _RUNTIME_KEYS if k in call}
        self.tallied: dict[tuple[Any, ...], tuple[tuple[str, Any], ...]] = {}  # verdicts -> tally key


def _active(shared: _Shared) -> list[Observation]:
    in_flight = shared.in_flight
    servers = list(in_flight.by_server.items())
    if not shared.relaying:
        return [Observation(count, {sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port}) for (host, port), count in servers]
    relayed = in_flight.relayed_by_server
    observations = []
    for (host, port), count in servers:
        marked = min(count, relayed.get((host, port), 0))
        observations.append(Observation(count - marked, {sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port}))
        observations.append(Observation(marked, {sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port,
                                                 sc.LLM_GATEWAY_RELAYED: True}))
    return observations
