"""Per-level figures with the definitions of ``vllm bench serve``, goodput, the SLO and the knee.

* TTFT: request sent -> first content chunk; ITL: every gap between consecutive content chunks
  (percentiles over all gaps of the level); TPOT: (E2EL - TTFT) / (output tokens - 1) per
  request; E2EL: the whole request.
* Throughput over the level's duration (first send to last end): requests/s, output tokens/s,
  total (input + output) tokens/s, all of successful requests.
* Goodput: successful requests per second meeting every SLO (``ttft``, ``tpot``, ``e2el``, in
  seconds). A level meets the SLO when at least ``attainment`` of the requests it sent (failures
  count as misses) meet every SLO.
* Percentiles interpolate linearly between closest ranks (numpy's default, as vLLM's).
* Trust: a stream whose tokens reached the bench in bursts (``RequestRecord.burst``) was not timed
  as the server sent it. When such streams are not rare (``BURST_SHARE``), the level's stream
  timings are not trusted and ``bursts`` says why: the generator's own loop stalled while they
  streamed, for at least half their longest silence (``RequestRecord.stalled``), waiting for a
  CPU (``generator_cpu``) or busy with its own work (``generator_busy``; ``generator`` where
  Linux's scheduler statistics cannot tell which), or it read on time and the server or an
  intermediary released them in bursts (``upstream``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from otel_llm.tools.bench.load import LevelResult, RequestRecord

__all__ = ["BURST_SHARE", "SLO_KEYS", "bursts", "knee", "parse_slo", "percentile", "summarize"]

SLO_KEYS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)
KNEE_GAIN = 0.10  # a level that adds less than this share of throughput is past the knee
BURST_SHARE = 0.10  # a level with at least this share of its judged streams in bursts is not trusted
STALLED_SHARE = 0.5  # bursts laid on the generator when at least this share lived through its stalls
RUNQUEUE_SHARE = 0.5  # ... and on a CPU it did not get when at least this share of the stalls was run-queue wait


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile of ``values``, ``p`` from 0 to 100 (not a fraction), interpolated
    linearly between the two closest ranks: rank ``(n - 1) * p / 100`` of the sorted values, numpy's
    default method ("linear") and so ``vllm bench serve``'s. None for no values.

    The repository's one definition of a percentile: the benchmarks report theirs with it too, so
    every p90 or p99 it prints means the same thing."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": sum(values) / len(values) if values else None}
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(values, p)
    return out


def parse_slo(text: str) -> dict[str, float]:
    """``ttft=0.5,tpot=0.05`` -> {"ttft": 0.5, "tpot": 0.05} (seconds); ValueError with a message."""
    slo: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"bad SLO {part!r}: use {', '.join(k + '=SECONDS' for k in SLO_KEYS)}")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"bad SLO {part!r}: {value!r} is not a number of seconds") from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"bad SLO {part!r}: the limit must be a positive number of seconds")
        slo[key] = seconds
    if not slo:
        raise ValueError("empty SLO")
    return slo


def meets(record: RequestRecord, slo: Mapping[str, float]) -> bool:
    """A successful request within every limit (a TPOT that cannot be computed is within)."""
    if not record.ok:
        return False
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.e2el}

    def within(key: str, limit: float) -> bool:
        value = values[key]
        if value is None:
            return key == "tpot"
        return value <= limit

    return all(within(k, limit) for k, limit in slo.items())


def summarize(result: LevelResult, slo: Mapping[str, float] | None = None,
              attainment: float = 0.9) -> dict[str, Any]:
    """The level's figures (seconds, tokens, per second) as the report and the JSON show them."""
    records = result.records
    ok = [r for r in records if r.ok and r.e2el is not None]
    failed = [r for r in records if r.failure is not None]
    duration = result.duration
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.input_tokens or 0 for r in ok)
    lags = [r.lag for r in records if r.e2el is not None or r.failure is not None]
    summary: dict[str, Any] = {
        "level": result.level.label, "concurrency": result.level.concurrency, "rate": _finite(result.level.rate),
        "sent": len(records), "completed": len(ok), "failed": len(failed),
        "unfinished": len(records) - len(ok) - len(failed),
        "failures": dict(Counter(r.failure for r in failed)),
        "retries": sum(r.retries for r in records),
        "duration": duration,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "total_token_throughput": (out_tokens + in_tokens) / duration if duration > 0 else None,
        "output_tokens": out_tokens, "input_tokens": in_tokens,
        "ttft": _dist([r.ttft for r in ok if r.ttft is not None]),
        "tpot": _dist([t for r in ok if (t := r.tpot) is not None]),
        "itl": _dist([gap for r in ok for gap in r.itl]),
        "e2el": _dist([r.e2el for r in ok if r.e2el is not None]),
        "lag": _dist(lags), "generator_cpu_share": result.cpu_share, "stopped": result.stopped,
        "generator_loop": result.loop.to_dict() if result.loop is not None else None,
        "bursts": bursts(result),
    }
    summary["stream_timing_trusted"] = summary["bursts"]["cause"] is None
    if result.memory is not None:
        summary["runtime_memory"] = result.memory
    native = _native(ok)
    if native:
        summary["native"] = native
    if slo:
        good = [r for r in ok if meets(r, slo)]
        summary["goodput"] = len(good) / duration if duration > 0 else None
        summary["slo_attainment"] = len(good) / len(records) if records else None
        summary["meets_slo"] = bool(records) and len(good) >= attainment * len(records)
    return summary


def bursts(result: LevelResult) -> dict[str, Any]:
    """The level's streams that reached the bench in bursts, and the likely cause when they are not
    rare (None when they are, or none could be judged); see the module docstring."""
    judged = [r for r in result.records if r.ok and r.burst is not None]
    burst = [r for r in judged if r.burst]
    stalled = [r for r in burst if r.stalled]
    out: dict[str, Any] = {"judged": len(judged), "burst": len(burst), "burst_during_stalls": len(stalled),
                           "share": len(burst) / len(judged) if judged else None, "cause": None}
    if not burst or len(burst) < BURST_SHARE * len(judged):
        return out
    loop = result.loop
    if loop is None or len(stalled) < STALLED_SHARE * len(burst):
        out["cause"] = "upstream"
    else:
        runqueue = loop.stall_runqueue_share
        out["cause"] = ("generator" if runqueue is None  # no scheduler statistics here: either
                        else "generator_cpu" if runqueue >= RUNQUEUE_SHARE else "generator_busy")
    return out


# the runtime's own figures a level summarizes (its records keep every llm.runtime.* they got)
NATIVE_SUMMARY = {
    "queue_duration": "llm.runtime.queue_duration", "load_duration": "llm.runtime.load_duration",
    "prompt_eval_duration": "llm.runtime.prompt_eval_duration", "prompt_eval_rate": "llm.runtime.prompt_eval_rate",
    "generation_rate": "llm.runtime.generation_rate", "total_duration": "llm.runtime.total_duration",
    "draft_acceptance_rate": "llm.runtime.draft_acceptance_rate",
}


def _native(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Per figure the runtime reported: mean and percentiles over the requests that have it."""
    out: dict[str, Any] = {}
    names = {r.native.get("llm.runtime.name") for r in records} - {None}
    if names:
        out["runtime"] = sorted(str(n) for n in names)
    for name, key in NATIVE_SUMMARY.items():
        values = [float(v) for r in records if isinstance(v := r.native.get(key), (int, float))
                  and not isinstance(v, bool) and math.isfinite(v)]
        if values:
            out[name] = _dist(values)
    return out


def knee(summaries: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the last level before output throughput stops growing (gain < KNEE_GAIN), None
    when it grows to the end (or fewer than two levels)."""
    rates = [s.get("output_throughput") for s in summaries]
    for i in range(1, len(rates)):
        before, now = rates[i - 1], rates[i]
        if before and now is not None and now < before * (1 + KNEE_GAIN):
            return i - 1
    return None


def _finite(value: float | None) -> float | str | None:
    return "inf" if value == math.inf else value
