"""Terminal report and JSON record of a diagnose run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from .sweep import fit
from .trials import TargetResult, Trial
from .verdicts import Verdict, median

__all__ = ["PHASES", "json_record", "phase_stats", "summary_table", "trial_line", "verdict_lines"]

# (label, Trial attribute, unit)
PHASES = (
    ("ttfb", "ttfb", "s"),
    ("ttft", "ttft", "s"),
    ("decode", "decode", "s"),
    ("total", "total", "s"),
    ("rate client", "client_rate", "tok/s"),
    ("rate native", "native_rate", "tok/s"),
    ("prompt eval native", "prompt_eval", "s"),
)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if unit == "tok/s" else f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def phase_stats(trials: Sequence[Trial]) -> dict[str, dict[str, float | None]]:
    """Median, min and max of each phase over ``trials`` (absent values skipped)."""
    stats: dict[str, dict[str, float | None]] = {}
    for label, attr, _unit in PHASES:
        values = [getattr(t, attr) for t in trials if getattr(t, attr) is not None]
        stats[label] = {"median": median(values), "min": min(values) if values else None,
                        "max": max(values) if values else None, "n": len(values)}
    return stats


def trial_line(trial: Trial) -> str:
    if not trial.ok:
        status = f" HTTP {trial.status}" if trial.status else ""
        label = trial.kind if trial.kind == "cold" else f"{trial.kind} #{trial.index + 1}"
        return f"{label}: {trial.error}{status} {trial.detail or ''}".rstrip()
    parts = [f"ttfb {_fmt(trial.ttfb, 's')}", f"ttft {_fmt(trial.ttft, 's')}", f"decode {_fmt(trial.decode, 's')}",
             f"total {_fmt(trial.total, 's')}", f"{_fmt(trial.client_rate, 'tok/s')} tok/s"]
    if trial.native_rate is not None:
        parts.append(f"native {_fmt(trial.native_rate, 'tok/s')} tok/s")
    if trial.draft_acceptance is not None:
        parts.append(f"draft accepted {trial.draft_acceptance:.0%}")
    if trial.load:
        parts.append(f"load {_fmt(trial.load, 's')}")
    label = f"{trial.kind}" if trial.kind == "cold" else f"{trial.kind} #{trial.index + 1}"
    if trial.kind == "concurrent":
        label = f"c={trial.concurrency} #{trial.index + 1} (start +{trial.start * 1000:.0f}ms)"
    return f"{label}: " + ", ".join(parts)


def summary_table(results: Sequence[TargetResult]) -> list[str]:
    """Rows = phases (warm median [min-max]), one column per target, plus the cold trial."""
    headers = ["phase (warm)"] + [r.url for r in results]
    rows: list[list[str]] = []
    stats = [phase_stats(r.ok_warm()) for r in results]
    for label, _attr, unit in PHASES:
        row = [f"{label} [{unit}]"]
        for s in stats:
            item = s[label]
            if item["median"] is None:
                row.append("-")
            else:
                row.append(f"{_fmt(item['median'], unit)} [{_fmt(item['min'], unit)}-{_fmt(item['max'], unit)}]")
        rows.append(row)
    rows.append(["cold ttft"] + [_fmt(r.cold.ttft if r.cold else None, "s") for r in results])
    for level in sorted({lv for r in results for lv in r.concurrency}):
        rows.append([f"c={level} ttft max"] + [
            _fmt(max((t.ttft for t in r.concurrency.get(level, []) if t.ttft is not None), default=None), "s")
            for r in results])
        rows.append([f"c={level} rate"] + [
            _fmt(median(t.client_rate for t in r.concurrency.get(level, [])), "tok/s") for r in results])
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def verdict_lines(found: Sequence[Verdict]) -> list[str]:
    lines = []
    for i, verdict in enumerate(found):
        tag = "PRIMARY " if i == 0 else ""
        lines.append(f"  [{tag}{verdict.code}] {verdict.summary}")
        evidence = ", ".join(f"{k}={v}" for k, v in verdict.evidence.items() if v is not None)
        if evidence:
            lines.append(f"      evidence: {evidence}")
        lines.append(f"      remedy: {verdict.remedy}")
    return lines


def json_record(config: dict[str, Any], results: Sequence[TargetResult],
                found: Sequence[Sequence[Verdict]], redact: Callable[[str], str]) -> str:
    targets = []
    for result, verdicts_ in zip(results, found):
        targets.append({
            "url": result.url,
            "api": result.api,
            "runtime": {"name": result.runtime_name, "version": result.runtime_version},
            "model": dataclasses.asdict(result.model_info) if result.model_info is not None else None,
            "reachability": result.reachable.to_dict() if result.reachable else None,
            "cold": result.cold.to_dict() if result.cold else None,
            "warm": [t.to_dict() for t in result.warm],
            "warm_stats": phase_stats(result.ok_warm()),
            "concurrency": {str(level): [t.to_dict() for t in trials] for level, trials in
                            sorted(result.concurrency.items())},
            "cold_trials": [t.to_dict() for t in result.cold_trials],
            "prompt_sweep": fit(result.prompt_sweep)["points"],
            "prefill_fit": {k: v for k, v in fit(result.prompt_sweep).items() if k != "points"},
            "streaming": {
                "buffered_trials": sum(1 for t in result.warm if t.stream_buffered),
                "judged_trials": sum(1 for t in result.warm if t.stream_buffered is not None),
                "median_max_chunk_gap": median(t.max_chunk_gap for t in result.warm),
            },
            "host": [r.to_dict() for r in result.host_readings],
            "memory": result.memory,
            "verdicts": [v.to_dict() for v in verdicts_],
            "primary": verdicts_[0].code if verdicts_ else None,
        })
    return redact(json.dumps({"config": config, "targets": targets}, indent=2, default=str))


def progress_bar(done: int, total: int, label: str, width: int = 24) -> str:
    """``label [#########---------------] 3/8``: for the long steps, on a terminal."""
    total = max(1, total)
    filled = round(width * min(done, total) / total)
    return f"{label} [{'#' * filled}{'-' * (width - filled)}] {done}/{total}"
