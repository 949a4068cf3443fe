"""Which calls' spans are kept, decided after each call (``sample_rate``, ``sample_keep``).

otel_llm builds a call's spans from its record when the call ends, so it can look at the finished
call before any span exists: the calls worth looking at (failed, slow, cold, buffered, queued,
after a runtime restart, retried) are always kept, and the ordinary ones at the rate. Nothing is
buffered beyond the calls in flight; the metrics record every call whatever the decision.

* **Ordinary calls** are kept by their trace id's randomness (W3C Trace Context level 2: the
  rightmost 56 bits, or the ``rv`` of the ``ot`` tracestate entry): kept when that value is at
  least the rejection threshold ``(1 - rate) * 2**56``, so every process with the same rate keeps
  the same traces. The kept call span says so in OpenTelemetry's probability-sampling form,
  ``ot=th:<hex>`` in its trace state, and in ``llm.sampling.adjusted_count`` (``1 / rate``).
* **A call under the application's sampled span** is kept: its trace is never cut. Under a span
  the application's sampler dropped, only a rule keeps it (exported under its parent's ids).
* **Slow** is judged per model and server against what recent calls took (:class:`Typical`,
  bounded memory), and against fixed thresholds when the options give them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from otel_llm import semconv as sc
from otel_llm._types import AttributeMap, Attributes

__all__ = ["Decision", "Sampler", "Typical", "adjusted_count", "mark_kept", "randomness", "threshold",
           "with_threshold"]

RANDOM_BITS = 56
_RANDOM_MASK = (1 << RANDOM_BITS) - 1
_SCALE = float(1 << RANDOM_BITS)
_TH_DIGITS = 14  # 56 bits, 4 per hex digit

# how slow is slow: this many times the typical (median) value, or above the slowest 1 %
SLOW_FACTOR = 5.0
SLOW_QUANTILE = 0.99
MIN_TYPICAL = 20  # calls seen before the median is trusted
MIN_QUANTILE = 100  # calls seen before the slowest 1 % is trusted
MAX_SERIES = 256  # (server, model) pairs followed; the oldest is forgotten past this
MAX_WAITING = 65536  # server spans waiting for their children's decision (requests in flight)


@dataclass(frozen=True, slots=True)
class Decision:
    """Keep the call's spans or not, why, and the rejection threshold it was kept under."""

    keep: bool
    reasons: tuple[str, ...] = ()
    # over the 56 random bits; 0: kept with probability 1; None: unknown (the application's
    # sampler kept the parent and said nothing of its probability)
    threshold: int | None = 0


DROP = Decision(False)


def threshold(rate: float) -> int:
    """The rejection threshold for keeping ``rate`` of the calls (OpenTelemetry's ``th``)."""
    return (1 << RANDOM_BITS) - round(rate * _SCALE)


def adjusted_count(th: int) -> float:
    """How many calls one kept under threshold ``th`` stands for (``inf`` for a rate of 0)."""
    kept = (1 << RANDOM_BITS) - th
    return _SCALE / kept if kept > 0 else math.inf


def randomness(context: SpanContext) -> int:
    """The 56 random bits a keep decision reads: the trace state's explicit ``rv``, else the
    trace id's rightmost bits."""
    ot = context.trace_state.get(sc.TRACESTATE_OT) if context.trace_state else None
    if ot:
        for member in ot.split(";"):
            if member.startswith("rv:") and len(member) == 3 + _TH_DIGITS:
                try:
                    return int(member[3:], 16)
                except ValueError:
                    break
    return context.trace_id & _RANDOM_MASK


def _parent_threshold(state: TraceState | None) -> int | None:
    """The ``th`` the parent's trace state carries, if any (its adjusted count is the trace's)."""
    ot = state.get(sc.TRACESTATE_OT) if state else None
    if not ot:
        return None
    for member in ot.split(";"):
        if member.startswith("th:") and 3 < len(member) <= 3 + _TH_DIGITS:
            try:
                return int(member[3:], 16) << (4 * (_TH_DIGITS - (len(member) - 3)))
            except ValueError:
                return None
    return None


def with_threshold(context: SpanContext, th: int) -> SpanContext:
    """``context`` whose trace state's ``ot`` entry says ``th:<hex>`` (other members kept)."""
    state = context.trace_state
    if not state:  # the usual case: one trace state per threshold, built once (TraceState validates)
        alone = _ALONE.get(th)
        if alone is None:
            alone = _ALONE[th] = _threshold_state(TraceState(), th)
        return SpanContext(context.trace_id, context.span_id, context.is_remote, context.trace_flags, alone)
    return SpanContext(context.trace_id, context.span_id, context.is_remote, context.trace_flags,
                       _threshold_state(state, th))


_ALONE: dict[int, TraceState] = {}


def _threshold_state(state: TraceState, th: int) -> TraceState:
    ot = state.get(sc.TRACESTATE_OT) or ""
    members = [m for m in ot.split(";") if m and not m.startswith("th:")]
    digits = f"{th:0{_TH_DIGITS}x}".rstrip("0") or "0"
    value = ";".join([f"th:{digits}", *members])
    return state.update(sc.TRACESTATE_OT, value) if sc.TRACESTATE_OT in state else state.add(sc.TRACESTATE_OT, value)


def mark_kept(decision: Decision, attributes: Attributes, context: SpanContext) -> SpanContext:
    """Write why a kept span was kept (and what it stands for) into its ``attributes``; returns
    its context with the threshold in the trace state (unchanged when the count is unknown)."""
    attributes[sc.LLM_SAMPLING_REASON] = decision.reasons
    if decision.threshold is None:
        return context
    attributes[sc.LLM_SAMPLING_ADJUSTED_COUNT] = 1.0 if decision.threshold == 0 else adjusted_count(decision.threshold)
    return with_threshold(context, decision.threshold)


class Typical:
    """What recent values of one measure were, in bounded memory: counts in log-spaced buckets
    (about 9 % wide), halved whenever they reach ``window`` so that old calls fade out."""

    __slots__ = ("counts", "total", "window", "_rejudge_at", "_median", "_slowest")

    _PER_OCTAVE = 8

    def __init__(self, window: int = 2000) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.window = window
        # the median and slowest 1 % are read again once the counts grew by a 32nd since they
        # were last read (the walk over the buckets is the cost), or after a halving
        self._rejudge_at = 0
        self._median: float | None = None
        self._slowest: float | None = None

    def observe(self, value: float) -> bool:
        """:meth:`is_slow`, then :meth:`add`: what each call does, in one step (it is on every
        call's path, hence spelled out)."""
        total = self.total
        slow = False
        if total >= MIN_TYPICAL:
            if total >= self._rejudge_at:
                self._judge(total)
            median, slowest = self._median, self._slowest
            slow = (median is not None and value >= SLOW_FACTOR * median) or (slowest is not None and value > slowest)
        index = math.floor(math.log2(value) * self._PER_OCTAVE) if value > 1e-9 else -240
        counts = self.counts
        counts[index] = counts.get(index, 0) + 1
        self.total = total = total + 1
        if total >= self.window:
            self._halve()
        return slow

    def add(self, value: float) -> None:
        index = math.floor(math.log2(value) * self._PER_OCTAVE) if value > 1e-9 else -240
        self.counts[index] = self.counts.get(index, 0) + 1
        self.total += 1
        if self.total >= self.window:
            self._halve()

    def is_slow(self, value: float) -> bool:
        """Whether ``value`` is slow next to the values seen so far (before adding it)."""
        total = self.total
        if total < MIN_TYPICAL:
            return False
        if total >= self._rejudge_at:
            self._judge(total)
        median, slowest = self._median, self._slowest
        return (median is not None and value >= SLOW_FACTOR * median) or (slowest is not None and value > slowest)

    def quantile(self, q: float) -> float | None:
        """The value below which ``q`` of the recent calls fell (a bucket's upper edge)."""
        if not self.total:
            return None
        rank = q * self.total
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return float(2.0 ** ((index + 1) / self._PER_OCTAVE))
        return None

    def _judge(self, total: int) -> None:
        self._rejudge_at = total + max(1, total >> 5)
        self._median = self.quantile(0.5)
        self._slowest = self.quantile(SLOW_QUANTILE) if total >= MIN_QUANTILE else None

    def _halve(self) -> None:
        self.counts = {k: v // 2 for k, v in self.counts.items() if v > 1}
        self.total = sum(self.counts.values())
        self._rejudge_at = 0


class Sampler:
    """The keep decision for each finished call (see the module docstring); thread-safe."""

    def __init__(self, rate: float, keep: Iterable[str], slow_ttft: float | None = None,
                 slow_duration: float | None = None) -> None:
        self.rate = rate
        self.keep = frozenset(keep)
        self.threshold = threshold(rate)
        self.slow_ttft = slow_ttft
        self.slow_duration = slow_duration
        self._series: dict[tuple[object, ...], tuple[Typical, Typical]] = {}
        self._lock = threading.Lock()
        self._by_rate = Decision(True, ("rate",), self.threshold)  # the common decisions, made once
        self._by_parent = Decision(True, ("parent",), None)
        # span id -> [the first kept child's decision] (empty while none), see open_parent
        self._waiting: dict[int, list[Decision]] = {}

    def decide(self, context: SpanContext, parent: SpanContext | None, attributes: AttributeMap,
               error: str | None, duration: float, restarted: bool = False) -> Decision:
        """Keep the call whose call span has ``context`` (under ``parent``) and ``attributes``?"""
        return self._given(context, parent, self.reasons(attributes, error, duration, restarted))

    def _given(self, context: SpanContext, parent: SpanContext | None, reasons: tuple[str, ...]) -> Decision:
        """The decision once the rules gave ``reasons``: the waiting parent, the application's, the rate."""
        waiting = self._waiting.get(parent.span_id) if parent is not None and self._waiting else None
        if waiting is not None:  # a parent of this process that decides after its children
            decision = self._unparented(context, reasons)
            if decision.keep and not waiting:
                waiting.append(decision)
            return decision
        if parent is not None and parent.trace_flags & TraceFlags.SAMPLED:
            if reasons:
                return Decision(True, reasons, 0)
            inherited = _parent_threshold(parent.trace_state) if parent.trace_state else None
            return self._by_parent if inherited is None else Decision(True, ("parent",), inherited)
        if parent is None:
            return self._unparented(context, reasons)
        return Decision(True, reasons, 0) if reasons else DROP

    def _unparented(self, context: SpanContext, reasons: tuple[str, ...]) -> Decision:
        if reasons:
            return Decision(True, reasons, 0)
        if self.threshold < (1 << RANDOM_BITS) and randomness(context) >= self.threshold:
            return self._by_rate
        return DROP

    # -- a server span that decides after the model call it relays (the gateway's, the proxy's) ---
    def open_parent(self, context: SpanContext) -> None:
        """``context`` is a span of this process whose decision waits for its children's: a model
        call under it decides as if it had no parent (the rules, else the rate)."""
        if len(self._waiting) < MAX_WAITING:
            self._waiting[context.span_id] = []

    def forget_parent(self, context: SpanContext) -> None:
        """Stop waiting for the span ``open_parent`` registered (it records nothing)."""
        self._waiting.pop(context.span_id, None)

    def close_parent(self, context: SpanContext, error: str | None, parent: SpanContext | None) -> Decision:
        """The decision for the span ``open_parent`` registered: kept as its kept child was (the
        same reasons and count), else for its own error, or by its own parent or the rate as a call
        is. Its duration is not judged: it would keep a tree without its model call for a slow
        upload or queue, or for the noise of the requests whose call was dropped."""
        kept = self._waiting.pop(context.span_id, None)
        if kept:
            return kept[0]
        return self._given(context, parent, ("failed",) if error is not None and "failed" in self.keep else ())

    def pending(self, parent: SpanContext | None) -> bool:
        """Whether a call under ``parent`` goes out with its decision still to be made: the sampled
        flag it sends then says "record while I decide", not that its trace was kept."""
        return parent is None or not parent.trace_flags & TraceFlags.SAMPLED or parent.span_id in self._waiting

    def reasons(self, attributes: AttributeMap, error: str | None, duration: float,
                restarted: bool = False) -> tuple[str, ...]:
        """The ``sample_keep`` rules the call matches, in the option's order."""
        keep = self.keep
        found: list[str] = []
        if "failed" in keep and error is not None:
            found.append("failed")
        if self._slow(attributes, duration) and "slow" in keep:
            found.append("slow")
        if "cold" in keep and attributes.get(sc.LLM_DIAGNOSIS_COLD_START) is True:
            found.append("cold")
        if "buffered" in keep and attributes.get(sc.LLM_DIAGNOSIS_STREAM_BUFFERED) is True:
            found.append("buffered")
        if "queued" in keep and attributes.get(sc.LLM_DIAGNOSIS_BOTTLENECK) == "queue":
            found.append("queued")
        if "restart" in keep and restarted:
            found.append("restart")
        if "retry" in keep and attributes.get(sc.LLM_DIAGNOSIS_RETRY) is True:
            found.append("retry")
        return tuple(found)

    def _slow(self, attributes: AttributeMap, duration: float) -> bool:
        """Judge the call against its series, then add it to the series (every call is learned)."""
        ttft = _seconds(attributes.get(sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN))
        whole = _seconds(duration)
        slow = (whole is not None and self.slow_duration is not None and whole >= self.slow_duration) or \
            (ttft is not None and self.slow_ttft is not None and ttft >= self.slow_ttft)
        key: tuple[object, ...] = (attributes.get(sc.SERVER_ADDRESS), attributes.get(sc.SERVER_PORT),
                                   attributes.get(sc.GEN_AI_REQUEST_MODEL), ttft is not None)
        with self._lock:
            try:
                series = self._series.get(key)
            except TypeError:  # an unhashable value: its text names the series
                key = tuple(map(str, key))
                series = self._series.get(key)
            if series is None:
                if len(self._series) >= MAX_SERIES:
                    del self._series[next(iter(self._series))]
                series = self._series[key] = (Typical(), Typical())
            if ttft is not None:
                slow = series[0].observe(ttft) or slow
            if whole is not None:
                slow = series[1].observe(whole) or slow
        return slow


def _seconds(value: object) -> float | None:
    """A finite, non-negative number of seconds, else None (judged by nothing)."""
    if value.__class__ is float:  # the usual case, checked first
        return value if 0.0 <= value < math.inf else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < math.inf:
        return float(value)
    return None
