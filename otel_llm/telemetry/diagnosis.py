"""Diagnostic facts derived once per call from the timeline and the runtime's counters.

* ``unaccounted_wait``: the wait before the first token (before the response, when not
  streaming) that the runtime's reported queue, load and prefill (and, when not streaming,
  generation) do not explain: unreported queueing, network, proxies. Never negative; only when
  the runtime is known (recognized, configured or proven by its response): a known runtime that
  reports none of those durations (vLLM) explains nothing, so the whole wait is unaccounted,
  which for vLLM is its queue, its prefill and the transit.
* ``cold_start``: a reported model load of at least ``COLD_LOAD_SECONDS``, or the first call to
  a model after a request that unloaded it.
* ``stream_buffered``: tokens arrived in bursts after silences: on average at least
  ``BURST_TOKENS`` token events per arrival group (chunks less than 1 ms apart), and a silence of
  at least ``SILENCE_FACTOR`` times the mean token interval. A healthy stream, even a fast one,
  arrives about one token per group. Or, whatever the count of tokens (two or more), they were
  held back and released at once: the runtime reports generating them over at least
  ``HELD_MIN_SECONDS`` but they reached the client within ``HELD_SHARE`` of that time; or (the
  runtime's durations unknown) the response head itself arrived with the tokens, all in one
  burst, after a wait of at least ``HELD_MIN_SECONDS`` (a streaming server sends its head first;
  a buffering proxy holds it with the body).
* ``bottleneck``: the category with the largest share of the call: ``network``, ``queue``,
  ``load``, ``prefill``, ``decode``, ``buffering`` or ``download``. Without the runtime's
  durations the server's wait cannot be split: it counts as ``queue`` when other calls to the same server were
  in flight, else as ``prefill`` (streaming; the wait for the first token) or ``decode`` (not
  streaming; the wait for the whole answer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_llm import semconv as sc

from otel_llm.parse.framing import GROUP_NS

if TYPE_CHECKING:
    from otel_llm.telemetry.phases import Phase
    from otel_llm.parse.framing import StreamStats
    from otel_llm.parse.runtimes import RuntimeCounters

__all__ = [
    "CONTEXT_PRESSURE", "bottleneck", "cold_start", "context_pressure", "held_back", "stream_buffered",
    "unaccounted_wait",
]

COLD_LOAD_SECONDS = 0.25
BURST_TOKENS = 3.0
SILENCE_FACTOR = 3.0
MIN_TOKENS_FOR_BUFFERING = 8
HELD_MIN_SECONDS = 0.05
HELD_SHARE = 0.25
_NS = 1e-9
_NETWORK = {sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS, sc.SPAN_UPLOAD}


def _reported_wait(counters: RuntimeCounters, streaming: bool) -> float | None:
    """The sum of the durations the runtime reported before the first token (the answer), None
    when it reported none of them."""
    parts = (counters.queue_duration, counters.load_duration, counters.validation_duration,
             counters.prompt_eval_duration, None if streaming else counters.generation_duration)
    if parts.count(None) == len(parts):
        return None
    return float(sum(filter(None, parts)))  # None and 0.0 both add nothing


def explained_wait(counters: RuntimeCounters | None, streaming: bool) -> float | None:
    """What the runtime's own durations say it spent before the first token (the answer); None
    when the runtime is unknown (an OpenAI-compatible server that may report more elsewhere)."""
    if counters is None:
        return None
    reported = _reported_wait(counters, streaming)
    if reported is not None:
        return reported
    return 0.0 if counters.runtime is not None else None


def unaccounted_wait(wait: float, counters: RuntimeCounters | None, streaming: bool) -> float | None:
    explained = explained_wait(counters, streaming)
    return None if explained is None else max(0.0, wait - explained)


def cold_start(counters: RuntimeCounters | None, after_unload: bool) -> bool | None:
    if after_unload:
        return True
    if counters is None or counters.load_duration is None:
        return None
    return counters.load_duration >= COLD_LOAD_SECONDS


def stream_buffered(stream: StreamStats, held: bool | None = None) -> bool | None:
    """See the module docstring; ``held`` is :func:`held_back`'s answer for this stream."""
    tokens = stream.token_events
    if tokens < 2 or not stream.arrival_groups:
        return None
    if held:
        return True
    if tokens < MIN_TOKENS_FOR_BUFFERING:
        return False if held is False else None  # too short for bursts; not held, by the runtime's account
    span_ns = stream.last_token_ns - stream.first_token_ns
    if span_ns <= 0:
        return True  # every token arrived at once
    mean_interval = span_ns / (tokens - 1)
    return (tokens / stream.arrival_groups >= BURST_TOKENS
            and stream.max_gap_ns >= SILENCE_FACTOR * mean_interval)


def held_back(stream: StreamStats, head_ns: int, sent_ns: int, counters: RuntimeCounters | None) -> bool | None:
    """Whether the stream's tokens were held and released together (see the module docstring):
    by the runtime's own generation time when it reports one, else by the response head arriving
    with them; None when neither can tell. ``head_ns``: the response head's arrival, ``sent_ns``:
    the request's (perf-counter nanoseconds, 0 = unknown)."""
    if stream.token_events < 2 or not stream.arrival_groups:
        return None
    span_ns = stream.last_token_ns - stream.first_token_ns
    generated = counters.generation_duration if counters is not None else None
    if generated is not None and generated >= HELD_MIN_SECONDS:
        return span_ns * _NS < HELD_SHARE * generated
    if not head_ns or not sent_ns:
        return None
    head_with_tokens = stream.arrival_groups == 1 and stream.first_token_ns - head_ns < GROUP_NS
    return True if head_with_tokens and (head_ns - sent_ns) * _NS >= HELD_MIN_SECONDS else None


def bottleneck(phases: list[Phase], unaccounted: float | None, counters: RuntimeCounters | None,
               streaming: bool, buffered: bool | None, concurrent: int, held: bool | None = None) -> str | None:
    """The category with the largest share of the call (see the module docstring). Tokens held
    back (``held``) make the unexplained wait before them buffering: the generation happened in it."""
    # (category, seconds) pairs summed at the end: a closure called per share cost a frame each
    parts: list[tuple[str, float | None]] = []
    waiting = 0.0
    for name, start_ns, end_ns, _ in phases:
        seconds = (end_ns - start_ns) * _NS
        if name in _NETWORK:
            parts.append(("network", seconds))
        elif name == sc.SPAN_POOL_WAIT:
            parts.append(("queue", seconds))
        elif name == sc.SPAN_SERVER_WAIT or name == sc.SPAN_FIRST_TOKEN:
            waiting += seconds
        elif name == sc.SPAN_DECODE:
            parts.append(("buffering" if buffered else "decode", seconds))
        elif name == sc.SPAN_DOWNLOAD:
            parts.append(("download", seconds))
    if unaccounted is not None and counters is not None and _reported_wait(counters, streaming) is not None:
        parts += (("queue", counters.queue_duration), ("buffering" if held else "queue", unaccounted),
                  ("load", counters.load_duration),
                  ("prefill", (counters.prompt_eval_duration or 0.0) + (counters.validation_duration or 0.0)))
        if not streaming:
            parts.append(("decode", counters.generation_duration))
    else:
        parts.append(("buffering" if held else "queue" if concurrent else ("prefill" if streaming else "decode"),
                      waiting))
    shares: dict[str, float] = {}
    for name, share in parts:
        if share:
            shares[name] = shares.get(name, 0.0) + share
    return max(shares, key=shares.__getitem__) if shares else None


CONTEXT_PRESSURE = 0.8  # a prompt filling more of the model's context than this is flagged


def context_pressure(prompt_tokens: object, context_length: object) -> float | None:
    """Prompt tokens over the context length the runtime reports; None unless both are known."""
    if (isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and prompt_tokens >= 0
            and isinstance(context_length, int) and context_length > 0):
        return prompt_tokens / context_length
    return None
