"""Self-contained HTML report of a diagnose run, rendered from its JSON record.

``render_html(record)`` takes the dict that ``--json FILE`` writes (see
:func:`otel_llm.tools.diagnose.report.json_record`) and returns one HTML document: inline CSS,
inline SVG charts drawn here, no scripts, fonts or external resources.
Every text taken from the record is escaped. Nothing from the environment is added: the record is already masked.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from otel_llm.tools.html_report import document, nice_max as _nice_max, svg_open as _svg_open, ticks as _ticks
from otel_llm.tools.html_report import escape_attr as _e

__all__ = ["PHASE_COLORS", "render_html", "write_html"]

# Fill colour of each phase bar of the waterfall (span names as the record holds them, plus derived client phases).
PHASE_COLORS = {
    "http.connect": "#8e6cc7",
    "http.upload": "#c77cb5",
    "llm.server_wait": "#e0823d",
    "llm.first_token": "#d9b13b",
    "llm.decode": "#2b7bb9",
    "wait (ttfb)": "#e0823d",
    "first token": "#d9b13b",
    "decode": "#2b7bb9",
}
OTHER_COLOR = "#6b8e5a"
TOTAL_COLOR = "#9aa3ad"
COLD_COLOR = "#c8553d"
WARM_COLOR = "#2b7bb9"
RATE_COLOR = "#3f9a6b"
EVAL_COLOR = "#e0823d"

# ---------------------------------------------------------------- formatting

def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fmt_s(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if abs(v) < 1 else f"{v:.2f}s"


def _fmt_rate(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else f"{v:.1f}"


def _fmt_any(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt_any(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_fmt_any(v)}" for k, v in value.items())
    return str(value)


def _median(values: Iterable[Any]) -> float | None:
    present = [v for v in (_num(x) for x in values) if v is not None]
    return statistics.median(present) if present else None


# ---------------------------------------------------------------- trials

def _ok(trial: Any) -> bool:
    return isinstance(trial, Mapping) and trial.get("error") is None


def _trial_label(trial: Mapping[str, Any]) -> str:
    kind = str(trial.get("kind", "?"))
    if kind == "cold":
        return "cold"
    index = trial.get("index")
    number = index + 1 if isinstance(index, int) else "?"
    if kind == "concurrent":
        return f"c={trial.get('concurrency')} #{number}"
    return f"{kind} #{number}"


def median_warm_trial(target: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The successful warm trial whose ttft is the (lower) median, or None."""
    warm: list[Mapping[str, Any]] = [t for t in target.get("warm") or [] if _ok(t) and _num(t.get("ttft")) is not None]
    if not warm:
        warm = [t for t in target.get("warm") or [] if _ok(t)]
        return warm[len(warm) // 2] if warm else None
    warm.sort(key=lambda t: t["ttft"])
    return warm[(len(warm) - 1) // 2]


def waterfall_segments(trial: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """(name, start, duration) of each phase, laid end to end in the order the record holds them.

    The trial's ``phases`` (child span durations) when present, otherwise phases derived from ttfb/ttft/decode.
    """
    segments: list[tuple[str, float, float]] = []
    phases = trial.get("phases") or {}
    at = 0.0
    if isinstance(phases, Mapping) and phases:
        for name, seconds in phases.items():
            d = _num(seconds)
            if d is None or d < 0:
                continue
            segments.append((str(name), at, d))
            at += d
        return segments
    ttfb, ttft, decode = (_num(trial.get(k)) for k in ("ttfb", "ttft", "decode"))
    if ttfb is not None:
        segments.append(("wait (ttfb)", 0.0, ttfb))
        at = ttfb
    if ttft is not None and ttft >= at:
        segments.append(("first token", at, ttft - at))
        at = ttft
    if decode is not None:
        segments.append(("decode", at, decode))
    return segments


# ---------------------------------------------------------------- charts

def waterfall_svg(trial: Mapping[str, Any], title: str) -> str:
    segments = waterfall_segments(trial)
    total = _num(trial.get("total"))
    span_end = max([s + d for _n, s, d in segments] + [total or 0.0])
    top = _nice_max(span_end)
    left, right, row_h, head = 150, 30, 22, 30
    width = 540
    rows = (1 if total is not None else 0) + len(segments)
    height = head + max(rows, 1) * row_h + 40
    plot_w = width - left - right

    def x(v: float) -> float:
        return left + plot_w * (v / top)

    out = _svg_open("waterfall", width, height, title, f"waterfall of {title}")
    base = head + max(rows, 1) * row_h
    for tick in _ticks(top):
        out.append(f'<line class="grid" x1="{x(tick):.1f}" y1="{head}" x2="{x(tick):.1f}" y2="{base}"/>')
        out.append(f'<text x="{x(tick):.1f}" y="{base + 14}" text-anchor="middle">{_e(_fmt_s(tick))}</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{base}" x2="{width - right}" y2="{base}"/>')
    y = head
    if total is not None:
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">total {_e(_fmt_s(total))}</text>')
        out.append(f'<rect class="bar total" data-phase="total" x="{left}" y="{y + 4}" '
                   f'width="{max(x(total) - left, 1):.1f}" height="{row_h - 8}" fill="{TOTAL_COLOR}">'
                   f'<title>total {_e(_fmt_s(total))}</title></rect>')
        y += row_h
    for name, start, duration in segments:
        color = PHASE_COLORS.get(name, OTHER_COLOR)
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{_e(name)}</text>')
        out.append(f'<rect class="bar phase" data-phase="{_e(name)}" x="{x(start):.1f}" y="{y + 3}" '
                   f'width="{max(x(start + duration) - x(start), 1.5):.1f}" height="{row_h - 6}" fill="{color}">'
                   f'<title>{_e(name)}: {_e(_fmt_s(duration))} (from +{_e(_fmt_s(start))})</title></rect>')
        out.append(f'<text x="{min(x(start + duration) + 4, width - right - 40):.1f}" y="{y + 15}" '
                   f'fill="#5d6874">{_e(_fmt_s(duration))}</text>')
        y += row_h
    for key, color in (("ttfb", "#5d6874"), ("ttft", "#c8553d")):
        v = _num(trial.get(key))
        if v is not None:
            out.append(f'<line x1="{x(v):.1f}" y1="{head - 4}" x2="{x(v):.1f}" y2="{base}" stroke="{color}" '
                       f'stroke-dasharray="4 3" stroke-width="1.5"/>')
            out.append(f'<text x="{x(v) + 3:.1f}" y="{base + 28}" fill="{color}">{key}</text>')
    if not segments and total is None:
        out.append(f'<text x="{left}" y="{head + 15}">no timings recorded</text>')
    out.append("</svg>")
    return "\n".join(out)


def _vbar_chart(kind: str, title: str, bars: Sequence[tuple[str, float | None, str]], unit_fmt: Callable[[float], str],
                width: int = 540, height: int = 260) -> list[str]:
    """Vertical bars: (label, value, colour); returns SVG lines without the closing tag."""
    left, right, head, foot = 60, 20, 34, 50
    plot_h = height - head - foot
    top = _nice_max(max([v for _l, v, _c in bars if v is not None] + [0.0]))

    def y(v: float) -> float:
        return head + plot_h * (1 - v / top)

    out = _svg_open(kind, width, height, title, title)
    for tick in _ticks(top):
        out.append(f'<line class="grid" x1="{left}" y1="{y(tick):.1f}" x2="{width - right}" y2="{y(tick):.1f}"/>')
        out.append(f'<text x="{left - 4}" y="{y(tick) + 4:.1f}" text-anchor="end">{_e(unit_fmt(tick))}</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{head + plot_h}" x2="{width - right}" y2="{head + plot_h}"/>')
    slot = (width - left - right) / max(len(bars), 1)
    bar_w = min(48.0, slot * 0.7)
    for i, (label, value, color) in enumerate(bars):
        cx = left + slot * (i + 0.5)
        if value is None:
            out.append(f'<text x="{cx:.1f}" y="{head + plot_h - 4}" text-anchor="middle" fill="#c8553d">failed</text>')
        else:
            out.append(f'<rect class="bar" x="{cx - bar_w / 2:.1f}" y="{y(value):.1f}" width="{bar_w:.1f}" '
                       f'height="{max(head + plot_h - y(value), 1):.1f}" fill="{color}">'
                       f'<title>{_e(label)}: {_e(unit_fmt(value))}</title></rect>')
            out.append(f'<text x="{cx:.1f}" y="{y(value) - 3:.1f}" text-anchor="middle">{_e(unit_fmt(value))}</text>')
        out.append(f'<text x="{cx:.1f}" y="{head + plot_h + 14}" text-anchor="middle">{_e(label)}</text>')
    return out


def ttft_svg(target: Mapping[str, Any]) -> str:
    bars: list[tuple[str, float | None, str]] = []
    cold = target.get("cold") or target.get("reachability")
    if isinstance(cold, Mapping):
        bars.append(("cold", _num(cold.get("ttft")) if _ok(cold) else None, COLD_COLOR))
    for trial in target.get("warm") or []:
        if isinstance(trial, Mapping):
            bars.append((_trial_label(trial), _num(trial.get("ttft")) if _ok(trial) else None, WARM_COLOR))
    out = _vbar_chart("ttft", "time to first token per trial", bars, _fmt_s)
    width, height = 540, 260
    out.append(f'<rect x="{width - 170}" y="8" width="10" height="10" fill="{COLD_COLOR}"/>'
               f'<text x="{width - 156}" y="17">cold</text>'
               f'<rect x="{width - 110}" y="8" width="10" height="10" fill="{WARM_COLOR}"/>'
               f'<text x="{width - 96}" y="17">warm</text>')
    out.append(f'<text x="10" y="{height - 8}" class="muted">failed trials are marked, not drawn</text>')
    out.append("</svg>")
    return "\n".join(out)


def concurrency_svg(target: Mapping[str, Any]) -> str:
    """Left: ttft of each trial (points) and median (bar) per level; right: median client rate per level."""
    levels = []
    for key, trials in (target.get("concurrency") or {}).items():
        try:
            level = int(key)
        except (TypeError, ValueError):
            continue
        levels.append((level, [t for t in trials or [] if isinstance(t, Mapping)]))
    levels.sort()
    width, height = 1060, 280
    left, head, foot, panel_w, gap = 60, 54, 50, 440, 90
    plot_h = height - head - foot
    out = _svg_open("concurrency", width, height, "concurrency sweep: time to first token and generation rate",
                    "concurrency sweep")
    ttfts = [_num(t.get("ttft")) for _l, ts in levels for t in ts if _ok(t)]
    rates = [_median(t.get("client_rate") for t in ts if _ok(t)) for _l, ts in levels]
    panels = [("ttft per request (points) and median (bar)", _nice_max(max([v for v in ttfts if v] + [0.0])),
               _fmt_s, left),
              ("median client rate [tok/s]", _nice_max(max([v for v in rates if v] + [0.0])), _fmt_rate,
               left + panel_w + gap)]
    slot = panel_w / max(len(levels), 1)
    bar_w = min(60.0, slot * 0.6)
    for p, (ptitle, top, fmt, x0) in enumerate(panels):
        def y(v: float, top: float = top) -> float:
            return head + plot_h * (1 - v / top)

        out.append(f'<text x="{x0}" y="{head - 12}" class="muted">{_e(ptitle)}</text>')
        for tick in _ticks(top):
            out.append(f'<line class="grid" x1="{x0}" y1="{y(tick):.1f}" x2="{x0 + panel_w}" y2="{y(tick):.1f}"/>')
            out.append(f'<text x="{x0 - 4}" y="{y(tick) + 4:.1f}" text-anchor="end">{_e(fmt(tick))}</text>')
        out.append(f'<line class="axis" x1="{x0}" y1="{head + plot_h}" x2="{x0 + panel_w}" y2="{head + plot_h}"/>')
        line_pts = []
        for i, (level, trials) in enumerate(levels):
            cx = x0 + slot * (i + 0.5)
            out.append(f'<text x="{cx:.1f}" y="{head + plot_h + 14}" text-anchor="middle">c={level}</text>')
            failed = sum(1 for t in trials if not _ok(t))
            if failed:
                out.append(f'<text x="{cx:.1f}" y="{head + plot_h + 28}" text-anchor="middle" fill="#c8553d">'
                           f'{failed} failed</text>')
            if p == 0:
                med = _median(t.get("ttft") for t in trials if _ok(t))
                if med is not None:
                    out.append(f'<rect class="bar" x="{cx - bar_w / 2:.1f}" y="{y(med):.1f}" width="{bar_w:.1f}" '
                               f'height="{max(head + plot_h - y(med), 1):.1f}" fill="{WARM_COLOR}" '
                               f'fill-opacity="0.55"><title>c={level} median ttft {_e(_fmt_s(med))}</title></rect>')
                for j, t in enumerate(t for t in trials if _ok(t) and _num(t.get("ttft")) is not None):
                    px = cx + (j - (len(trials) - 1) / 2) * min(10, bar_w / max(len(trials), 1))
                    out.append(f'<circle class="point" cx="{px:.1f}" cy="{y(t["ttft"]):.1f}" r="4" '
                               f'fill="{COLD_COLOR}"><title>{_e(_trial_label(t))}: ttft '
                               f'{_e(_fmt_s(t["ttft"]))}</title></circle>')
            else:
                rate = rates[i]
                if rate is not None:
                    out.append(f'<rect class="bar" x="{cx - bar_w / 2:.1f}" y="{y(rate):.1f}" width="{bar_w:.1f}" '
                               f'height="{max(head + plot_h - y(rate), 1):.1f}" fill="{RATE_COLOR}">'
                               f'<title>c={level} median rate {_e(_fmt_rate(rate))} tok/s</title></rect>')
                    out.append(f'<text x="{cx:.1f}" y="{y(rate) - 3:.1f}" text-anchor="middle">'
                               f'{_e(_fmt_rate(rate))}</text>')
                    line_pts.append((cx, y(rate)))
        if len(line_pts) > 1:
            d = " ".join(f"{'M' if k == 0 else 'L'}{px:.1f},{py:.1f}" for k, (px, py) in enumerate(line_pts))
            out.append(f'<path class="line" d="{d}" fill="none" stroke="#1d5f3e" stroke-width="1.5"/>')
    if not levels:
        out.append(f'<text x="{left}" y="{head + 20}">no concurrency sweep recorded</text>')
    out.append("</svg>")
    return "\n".join(out)


def prompt_sweep_svg(sweep: Sequence[Mapping[str, Any]]) -> str:
    points = sorted((p for p in sweep if isinstance(p, Mapping) and _num(p.get("prompt_tokens")) is not None),
                    key=lambda p: p["prompt_tokens"])
    width, height = 560, 280
    left, right, head, foot = 60, 20, 34, 56
    plot_w, plot_h = width - left - right, height - head - foot
    values = [_num(p.get(k)) for p in points for k in ("ttft_s", "native_prompt_eval_s")]
    top_y = _nice_max(max([v for v in values if v is not None] + [0.0]))
    top_x = _nice_max(max([float(p["prompt_tokens"]) for p in points] + [0.0]))

    def x(v: float) -> float:
        return left + plot_w * (v / top_x)

    def y(v: float) -> float:
        return head + plot_h * (1 - v / top_y)

    out = _svg_open("prompt-sweep", width, height, "time to first token vs prompt tokens", "prompt size sweep")
    for tick in _ticks(top_y):
        out.append(f'<line class="grid" x1="{left}" y1="{y(tick):.1f}" x2="{width - right}" y2="{y(tick):.1f}"/>')
        out.append(f'<text x="{left - 4}" y="{y(tick) + 4:.1f}" text-anchor="end">{_e(_fmt_s(tick))}</text>')
    for tick in _ticks(top_x):
        out.append(f'<text x="{x(tick):.1f}" y="{head + plot_h + 14}" text-anchor="middle">{tick:.0f}</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{head + plot_h}" x2="{width - right}" y2="{head + plot_h}"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{head + plot_h + 30}" text-anchor="middle">prompt tokens</text>')
    for key, color, name in (("ttft_s", WARM_COLOR, "ttft (client)"),
                             ("native_prompt_eval_s", EVAL_COLOR, "prompt eval (native)")):
        measured = [(float(p["prompt_tokens"]), _num(p.get(key))) for p in points]
        pts = [(px, py) for px, py in measured if py is not None]
        if len(pts) > 1:
            d = " ".join(f"{'M' if k == 0 else 'L'}{x(px):.1f},{y(py):.1f}" for k, (px, py) in enumerate(pts))
            out.append(f'<path class="line" d="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for px, py in pts:
            out.append(f'<circle class="point" cx="{x(px):.1f}" cy="{y(py):.1f}" r="4" fill="{color}">'
                       f'<title>{px:.0f} tokens: {_e(name)} {_e(_fmt_s(py))}</title></circle>')
    out.append(f'<rect x="{width - 255}" y="8" width="10" height="10" fill="{WARM_COLOR}"/>'
               f'<text x="{width - 241}" y="17">ttft (client)</text>'
               f'<rect x="{width - 160}" y="8" width="10" height="10" fill="{EVAL_COLOR}"/>'
               f'<text x="{width - 146}" y="17">prompt eval (native)</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------- sections

def _config_table(config: Mapping[str, Any]) -> str:
    rows = []
    for key, value in config.items():
        if key == "runtimes" and isinstance(value, list):
            value = "; ".join(f"{r.get('url')}: {r.get('name') or '?'} {r.get('version') or ''}".strip()
                              for r in value if isinstance(r, Mapping))
        rows.append(f"<tr><th>{_e(key)}</th><td>{_e(_fmt_any(value))}</td></tr>")
    return '<table class="config">' + "".join(rows) + "</table>"


def _verdicts_html(verdicts: Sequence[Any]) -> str:
    if not verdicts:
        return '<p class="muted">no verdict: nothing stood out.</p>'
    parts = []
    for i, v in enumerate(verdicts):
        if not isinstance(v, Mapping):
            continue
        evidence = v.get("evidence") or {}
        ev = ", ".join(f"{k}={_fmt_any(val)}" for k, val in evidence.items() if val is not None) \
            if isinstance(evidence, Mapping) else _fmt_any(evidence)
        parts.append(
            f'<div class="verdict{"" if i == 0 else " info"}" data-code="{_e(v.get("code", ""))}">'
            f'<span class="badge{"" if i == 0 else " secondary"}">{"PRIMARY " if i == 0 else ""}'
            f'{_e(v.get("code", ""))}</span>{_e(v.get("summary", ""))}'
            + (f'<div class="muted">evidence: <code>{_e(ev)}</code></div>' if ev else "")
            + (f'<div>remedy: {_e(v.get("remedy"))}</div>' if v.get("remedy") else "")
            + "</div>")
    return "\n".join(parts)


def _trial_table(target: Mapping[str, Any]) -> str:
    trials: list[Mapping[str, Any]] = []
    first = target.get("reachability")
    if isinstance(first, Mapping):
        trials.append(first)
    trials += [t for t in target.get("warm") or [] if isinstance(t, Mapping)]
    for _level, ts in (target.get("concurrency") or {}).items():
        trials += [t for t in ts or [] if isinstance(t, Mapping)]
    head = ("<tr><th>trial</th><th>status</th><th>ttfb</th><th>ttft</th><th>decode</th><th>total</th>"
            "<th>rate tok/s</th><th>native tok/s</th><th>tokens</th><th>bottleneck</th><th>note</th></tr>")
    rows = []
    for t in trials:
        note = "" if _ok(t) else f"{t.get('error')} {t.get('detail') or ''}".strip()
        rows.append(
            f"<tr><td>{_e(_trial_label(t))}</td><td>{_e(t.get('status') or '-')}</td>"
            + "".join(f'<td class="num">{_e(_fmt_s(t.get(k)))}</td>' for k in ("ttfb", "ttft", "decode", "total"))
            + f'<td class="num">{_e(_fmt_rate(t.get("client_rate")))}</td>'
            f'<td class="num">{_e(_fmt_rate(t.get("native_rate")))}</td>'
            f'<td class="num">{_e(t.get("output_tokens") if t.get("output_tokens") is not None else "-")}</td>'
            f"<td>{_e(t.get('bottleneck') or '-')}</td><td>{_e(note)}</td></tr>")
    return '<table class="trials">' + head + "".join(rows) + "</table>"


_STATS = (("ttfb", _fmt_s), ("ttft", _fmt_s), ("decode", _fmt_s), ("total", _fmt_s),
          ("rate client", _fmt_rate), ("rate native", _fmt_rate), ("prompt eval native", _fmt_s))


def _runtime(target: Mapping[str, Any]) -> str:
    runtime = target.get("runtime") or {}
    return " ".join(str(x) for x in (runtime.get("name"), runtime.get("version")) if x)


def _comparison_table(targets: Sequence[Mapping[str, Any]]) -> str:
    head = "<tr><th>warm median</th>" + "".join(f"<th>{_e(t.get('url', '?'))}</th>" for t in targets) + "</tr>"
    rows = []
    for label, fmt in _STATS:
        cells = []
        for t in targets:
            item = (t.get("warm_stats") or {}).get(label) or {}
            cells.append(f'<td class="num">{_e(fmt(item.get("median")))}</td>')
        rows.append(f"<tr><th>{_e(label)}</th>{''.join(cells)}</tr>")
    rows.append("<tr><th>cold ttft</th>" + "".join(
        f'<td class="num">{_e(_fmt_s((t.get("cold") or {}).get("ttft")))}</td>' for t in targets) + "</tr>")
    rows.append("<tr><th>runtime</th>" + "".join(f"<td>{_e(_runtime(t) or '-')}</td>" for t in targets) + "</tr>")
    rows.append("<tr><th>primary verdict</th>" + "".join(
        f'<td><span class="badge">{_e(t.get("primary"))}</span></td>' if t.get("primary") else "<td>-</td>"
        for t in targets) + "</tr>")
    return '<table class="comparison">' + head + "".join(rows) + "</table>"


def _target_html(target: Mapping[str, Any], number: int) -> str:
    rt = _runtime(target) or "unknown runtime"
    parts = [f'<section class="target" id="target-{number}">',
             f"<h2>{number}. {_e(target.get('url', '?'))}</h2>",
             f'<p class="muted">api {_e(target.get("api", "?"))}, {_e(rt)}</p>',
             "<h3>verdicts</h3>", _verdicts_html(target.get("verdicts") or [])]
    cold = target.get("cold")
    warm = median_warm_trial(target)
    charts = []
    if isinstance(cold, Mapping):
        charts.append(waterfall_svg(cold, "cold trial"))
    if warm is not None:
        charts.append(waterfall_svg(warm, f"median warm trial ({_trial_label(warm)})"))
    if charts:
        parts += ["<h3>waterfall of representative trials</h3>", '<div class="charts">', *charts, "</div>"]
    parts += ["<h3>time to first token</h3>", '<div class="charts">', ttft_svg(target), "</div>"]
    if target.get("concurrency"):
        parts += ["<h3>concurrency</h3>", '<div class="charts">', concurrency_svg(target), "</div>"]
    sweep = target.get("prompt_sweep")
    if isinstance(sweep, list) and sweep:
        parts += ["<h3>prompt size sweep</h3>", '<div class="charts">', prompt_sweep_svg(sweep), "</div>"]
        fitted = target.get("prefill_fit") or {}
        notes = []
        for label in ("native", "client"):
            item = fitted.get(label) if isinstance(fitted, Mapping) else None
            if isinstance(item, Mapping) and _num(item.get("tokens_per_second")) is not None:
                notes.append(f"{label}: {item['tokens_per_second']:.0f} tokens/s, "
                             f"{_fmt_s(item.get('fixed_s'))} fixed")
        if notes:
            parts.append(f'<p class="muted prefill-fit">fitted prefill rate: {_e("; ".join(notes))}</p>')
    streaming = target.get("streaming") or {}
    if streaming:
        parts.append(f'<p class="muted">streaming: {_e(streaming.get("buffered_trials", "-"))}/'
                     f'{_e(streaming.get("judged_trials", "-"))} warm streams arrived in bursts; median longest '
                     f'chunk gap {_e(_fmt_s(streaming.get("median_max_chunk_gap")))}</p>')
    parts += ["<h3>trials</h3>", _trial_table(target), "</section>"]
    return "\n".join(parts)


def render_html(record: Mapping[str, Any]) -> str:
    """The whole report as one self-contained HTML document."""
    config = record.get("config") or {}
    targets = [t for t in record.get("targets") or [] if isinstance(t, Mapping)]
    model = config.get("model", "?")
    title = f"otel-llm diagnose: {model}"
    body = [f"<h1>{_e(title)}</h1>",
            f'<p class="muted">{len(targets)} target(s); started {_e(config.get("started_at", "?"))}</p>',
            "<h2>run configuration</h2>", _config_table(config)]
    if len(targets) > 1:
        body += ["<h2>target comparison</h2>", _comparison_table(targets)]
    body += [_target_html(t, i + 1) for i, t in enumerate(targets)]
    return document(title, body)


def write_html(record: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write :func:`render_html` of ``record`` to ``path`` (UTF-8)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(record))
