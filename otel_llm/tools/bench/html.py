"""``otel-llm bench --html FILE``: latency percentiles and throughput against load, the knee and the
SLO marked, rendered from the document ``--json`` writes. Self-contained: inline CSS and SVG, no
scripts; every text from the record is escaped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from otel_llm.tools.html_report import document, escape_attr as _e, nice_max, svg_open, ticks

__all__ = ["render_html", "write_html"]

COLORS = ("#2b7bb9", "#e0823d", "#c8553d", "#3f9a6b", "#8e6cc7")
_W, _H, _LEFT, _HEAD, _FOOT, _PANEL, _GAP = 1060, 300, 64, 56, 44, 440, 96


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ms(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else (f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s")


def _plain(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else f"{v:.1f}"


Series = tuple[str, list[float | None]]


def _panel(out: list[str], x0: float, title: str, labels: Sequence[str], series: Sequence[Series], fmt: Any,
           knee: int | None, limit: float | None) -> None:
    """One panel: a line per series over the levels, the knee as a dashed vertical line, the SLO
    limit as a dotted horizontal one."""
    values = [v for _, vs in series for v in vs if v is not None]
    top = nice_max(max(values + [limit or 0.0, 0.0]) * 1.05)
    plot_h = _H - _HEAD - _FOOT

    def y(v: float) -> float:
        return _HEAD + plot_h * (1 - v / top)

    slot = _PANEL / max(len(labels), 1)

    def x(i: int) -> float:
        return x0 + slot * (i + 0.5)

    out.append(f'<text x="{x0}" y="{_HEAD - 14}" class="muted">{_e(title)}</text>')
    for tick in ticks(top):
        out.append(f'<line class="grid" x1="{x0}" y1="{y(tick):.1f}" x2="{x0 + _PANEL}" y2="{y(tick):.1f}"/>')
        out.append(f'<text x="{x0 - 4}" y="{y(tick) + 4:.1f}" text-anchor="end">{_e(fmt(tick))}</text>')
    out.append(f'<line class="axis" x1="{x0}" y1="{_HEAD + plot_h}" x2="{x0 + _PANEL}" y2="{_HEAD + plot_h}"/>')
    for i, label in enumerate(labels):
        out.append(f'<text x="{x(i):.1f}" y="{_HEAD + plot_h + 14}" text-anchor="middle">{_e(label)}</text>')
    if knee is not None and 0 <= knee < len(labels):
        out.append(f'<line class="knee" x1="{x(knee):.1f}" y1="{_HEAD}" x2="{x(knee):.1f}" y2="{_HEAD + plot_h}"/>')
        out.append(f'<text x="{x(knee) + 4:.1f}" y="{_HEAD + 10}" fill="#c8553d">knee</text>')
    if limit is not None:
        out.append(f'<line class="slo" x1="{x0}" y1="{y(limit):.1f}" x2="{x0 + _PANEL}" y2="{y(limit):.1f}"/>')
        out.append(f'<text x="{x0 + _PANEL - 2}" y="{y(limit) - 4:.1f}" text-anchor="end" fill="#c8553d">'
                   f'SLO {_e(fmt(limit))}</text>')
    for n, (name, vs) in enumerate(series):
        color = COLORS[n % len(COLORS)]
        points = [(x(i), y(v), v) for i, v in enumerate(vs) if v is not None]
        if len(points) > 1:
            d = " ".join(f"{'M' if k == 0 else 'L'}{px:.1f},{py:.1f}" for k, (px, py, _) in enumerate(points))
            out.append(f'<path class="line" d="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        for px, py, v in points:
            out.append(f'<circle class="point" cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{color}">'
                       f'<title>{_e(name)}: {_e(fmt(v))}</title></circle>')
        out.append(f'<text x="{x0 + 8 + 110 * n}" y="{_H - 8}" fill="{color}">{_e(name)}</text>')


def _chart(kind: str, title: str, left: tuple[str, Sequence[Series], Any, float | None],
           right: tuple[str, Sequence[Series], Any, float | None], labels: Sequence[str], knee: int | None) -> str:
    out = svg_open(kind, _W, _H, title, title)
    for (ptitle, series, fmt, limit), x0 in ((left, _LEFT), (right, _LEFT + _PANEL + _GAP)):
        _panel(out, x0, ptitle, labels, series, fmt, knee, limit)
    out.append("</svg>")
    return "\n".join(out)


def _stat(levels: Sequence[Mapping[str, Any]], metric: str, stat: str) -> list[float | None]:
    return [_num((level.get(metric) or {}).get(stat)) for level in levels]


def _table(levels: Sequence[Mapping[str, Any]], slo: bool) -> str:
    head = ["level", "ok", "failed", "req/s", "out tok/s", "total tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
            "TPOT p99", "ITL p99", "E2EL p50", "bursts"] + (["goodput", "SLO"] if slo else [])
    rows = ["<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for level in levels:
        failures = ", ".join(f"{n} {k}" for k, n in sorted((level.get("failures") or {}).items()))
        cells = [_e(level.get("level", "?")), _e(level.get("completed", "-")),
                 _e(f"{level.get('failed', 0)}" + (f" ({failures})" if failures else "")),
                 _plain(level.get("request_throughput")), _plain(level.get("output_throughput")),
                 _plain(level.get("total_token_throughput"))]
        cells += [_ms((level.get(m) or {}).get(s)) for m, s in
                  (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"), ("itl", "p99"), ("e2el", "p50"))]
        cells.append(_bursts(level))
        if slo:
            cells += [_plain(level.get("goodput")), "meets" if level.get("meets_slo") else "misses"]
        rows.append("<tr>" + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _bursts(level: Mapping[str, Any]) -> str:
    """Streams that reached the bench in bursts, of those judged; "!" where the level is not trusted."""
    bursts = level.get("bursts")
    if not isinstance(bursts, Mapping) or not bursts.get("judged"):
        return "-"
    mark = " !" if level.get("stream_timing_trusted") is False else ""
    return _e(f"{bursts.get('burst', 0)}/{bursts['judged']}{mark}")


def _warnings(levels: Sequence[Mapping[str, Any]]) -> list[str]:
    said = [str(line) for level in levels for line in level.get("warnings") or []]
    if not said:
        return []
    return ["<h2>warnings</h2>", "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in said) + "</ul>"]


def render_html(doc: Mapping[str, Any]) -> str:
    """The whole report as one self-contained HTML document."""
    config = doc.get("configuration") or {}
    levels = [level for level in doc.get("levels") or [] if isinstance(level, Mapping)]
    labels = [str(level.get("level", "?")) for level in levels]
    knee = doc.get("knee") if isinstance(doc.get("knee"), int) else None
    slo_value = config.get("slo")
    slo: Mapping[str, Any] = slo_value if isinstance(slo_value, Mapping) else {}
    title = f"otel-llm bench: {config.get('model', '?')} at {config.get('url', '?')}"
    latency = _chart(
        "latency", "latency against load",
        ("time to first token", [(f"TTFT {s}", _stat(levels, "ttft", s)) for s in ("p50", "p90", "p99")], _ms,
         _num(slo.get("ttft"))),
        ("time per output token", [(f"TPOT {s}", _stat(levels, "tpot", s)) for s in ("p50", "p99")]
         + [("ITL p99", _stat(levels, "itl", "p99"))], _ms, _num(slo.get("tpot"))),
        labels, knee)
    throughput = _chart(
        "throughput", "throughput against load",
        ("output tokens per second", [("output tok/s", [_num(lv.get("output_throughput")) for lv in levels]),
                                      ("total tok/s", [_num(lv.get("total_token_throughput")) for lv in levels])],
         _plain, None),
        ("requests per second", [("req/s", [_num(lv.get("request_throughput")) for lv in levels])]
         + ([("goodput", [_num(lv.get("goodput")) for lv in levels])] if slo else []), _plain, None),
        labels, knee)
    meeting = [lv["level"] for lv in levels if lv.get("meets_slo")]
    summary = [f"knee: {_e(labels[knee])}" if knee is not None else "no knee: throughput grew at every level"]
    if slo:
        limits = ", ".join(f"{_e(k)} &le; {_e(_ms(v))}" for k, v in slo.items())
        summary.append(f"highest load meeting the SLO ({limits}): {_e(meeting[-1]) if meeting else 'none'}")
    workload = ", ".join(f"{_e(k)} {_e(config[k])}" for k in
                         ("api", "runtime", "prompt_tokens", "output_tokens", "mode", "requests_per_level")
                         if config.get(k) is not None)
    body = [f"<h1>{_e(title)}</h1>", f'<p class="muted">{workload}</p>',
            "<p>" + "<br>".join(summary) + "</p>", '<div class="charts">', latency, throughput, "</div>",
            "<h2>levels</h2>", _table(levels, bool(slo)), *_warnings(levels),
            f'<p class="muted">{_e(config.get("definitions", ""))}</p>']
    return document(title, body)


def write_html(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write(render_html(doc))
