"""Side-by-side comparison of targets serving the same model: is the extra wait the path or the model?

When one URL's warm time to first byte (or first token) clearly exceeds the fastest URL's while the
runtime's own account of the work (native prompt evaluation, else server-side decode rate) is the
same, the difference was spent in transport: tunnel, proxy, TLS, distance. Pure functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .trials import TargetResult, Trial
from .verdicts import Verdict, median

__all__ = ["NETPATH_MIN_S", "NETPATH_THRESHOLDS", "network_path_verdicts"]

NETPATH_MIN_S = 0.05
NETPATH_THRESHOLDS = {
    # the slower target's first byte comes at least this much later (s) ...
    "min_excess_s": NETPATH_MIN_S,
    # ... and at least this factor of the fastest target's
    "min_factor": 1.5,
    # native counters of both targets agree within this relative share ...
    "native_tolerance": 0.2,
    # ... or within this many seconds (prompt evaluation of a few ms is jittery)
    "native_abs_tolerance_s": 0.01,
}


def _profile(result: TargetResult) -> dict[str, Any]:
    warm: list[Trial] = [t for t in result.warm if t.ok]
    return {
        "ttfb": median(t.ttfb for t in warm),
        "ttft": median(t.ttft for t in warm),
        "prompt_eval": median(t.prompt_eval for t in warm),
        "native_rate": median(t.native_rate for t in warm),
        "trials": len(warm),
    }


def _close(a: float, b: float, tol: float, abs_tol: float = 0.0) -> bool:
    return abs(a - b) <= max(tol * max(abs(a), abs(b)), abs_tol)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _same_work(slow: dict[str, Any], fast: dict[str, Any], excess: float = 0.0) -> tuple[str, float, float] | None:
    """Which native counter shows both targets did the same work, or None when none can tell.
    Prompt evaluations that differ by much less than the extra wait (a quarter of it) cannot
    explain it, even when jitter on a busy machine puts them further apart than the tolerance."""
    tol = NETPATH_THRESHOLDS["native_tolerance"]
    if slow["prompt_eval"] is not None and fast["prompt_eval"] is not None:
        a, b = slow["prompt_eval"], fast["prompt_eval"]
        same = _close(a, b, tol, NETPATH_THRESHOLDS["native_abs_tolerance_s"]) or abs(a - b) <= 0.25 * excess
        return ("prompt_eval", a, b) if same else None
    if slow["native_rate"] is not None and fast["native_rate"] is not None:
        a, b = slow["native_rate"], fast["native_rate"]
        return ("native_rate", a, b) if _close(a, b, tol) else None
    return None


def _buffered(result: TargetResult) -> bool:
    judged = [t.stream_buffered for t in result.warm if t.ok and t.stream_buffered is not None]
    return bool(judged) and sum(judged) * 2 > len(judged)


def _group_key(result: TargetResult) -> str:
    return result.model or ""


def network_path_verdicts(results: Sequence[TargetResult]) -> list[Verdict]:
    """One ``network_path`` verdict per target whose first byte is late on identical native timings.

    Targets are compared within groups of the same model name; the fastest of a group is the
    reference. A metric is compared only when every target of the group reports it (ttfb first,
    else ttft). Without native counters on both sides no verdict is made: the model may differ.
    """
    groups: dict[str, list[TargetResult]] = {}
    for result in results:
        groups.setdefault(_group_key(result), []).append(result)
    found: list[Verdict] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        profiles = [(r, _profile(r)) for r in members]
        metric = next((m for m in ("ttfb", "ttft")
                       if all(p[m] is not None for _, p in profiles)), None)
        if metric is None:
            continue
        fast_result, fast = min(profiles, key=lambda rp: rp[1][metric])
        for result, prof in profiles:
            if result is fast_result or _buffered(result):
                continue  # a buffered stream's late first byte is the buffering (its own verdict)
            excess = prof[metric] - fast[metric]
            if excess < NETPATH_THRESHOLDS["min_excess_s"] or \
                    prof[metric] < NETPATH_THRESHOLDS["min_factor"] * fast[metric]:
                continue
            same = _same_work(prof, fast, excess)
            if same is None:
                continue
            counter, slow_native, fast_native = same
            what = "the first byte" if metric == "ttfb" else "the first token"
            ms = round(excess * 1000)
            evidence = {
                "url": result.url, "reference_url": fast_result.url, "metric": metric,
                f"{metric}_s": _r(prof[metric]), f"reference_{metric}_s": _r(fast[metric]),
                "excess_s": _r(excess), "factor": _r(prof[metric] / fast[metric], 2) if fast[metric] else None,
                "native_counter": counter, f"{counter}": _r(slow_native), f"reference_{counter}": _r(fast_native),
                "warm_trials": prof["trials"], "reference_warm_trials": fast["trials"],
            }
            found.append(Verdict(
                "network_path",
                f"{result.url} adds {ms} ms before {what} on identical native timings: transport, not the model",
                evidence,
                f"the path (tunnel, proxy, TLS, distance) costs the time: compare with {fast_result.url} from the "
                "same client, reuse connections (keep-alive), pick a closer relay/region, remove buffering or "
                "extra proxy hops; tuning the model or runtime will not recover these "
                f"{ms} ms",
            ))
    return found
