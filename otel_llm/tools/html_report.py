"""The pieces the self-contained HTML reports share (``diagnose --html``, ``bench --html``): the style
sheet, escaping, round axis scales and the opening of an inline SVG chart. No scripts, fonts or
external resources anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

__all__ = ["CSS", "document", "escape_attr", "nice_max", "svg_open", "ticks"]

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px;color:#1d232a;
background:#fff;max-width:1150px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:20px;margin:32px 0 8px;border-bottom:2px solid #dde3ea;padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #d5dbe2;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef2f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{border:1px solid #d5dbe2;border-left:6px solid #c8553d;border-radius:4px;padding:6px 10px;margin:8px 0;
background:#fbf7f5}
.verdict.info{border-left-color:#2b7bb9;background:#f4f8fb}
.badge{display:inline-block;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;font-weight:600;
color:#fff;background:#c8553d;border-radius:3px;padding:1px 6px;margin-right:6px}
.badge.secondary{background:#6d7a88}
.muted{color:#5d6874;font-size:13px}
.charts{display:flex;flex-wrap:wrap;gap:16px}
svg.chart{border:1px solid #e1e6ec;border-radius:4px;background:#fff}
svg.chart text{font-family:system-ui,Helvetica,Arial,sans-serif;font-size:11px;fill:#1d232a}
svg.chart .title{font-size:13px;font-weight:600}
svg.chart .axis{stroke:#9aa3ad;stroke-width:1}
svg.chart .grid{stroke:#eef1f4;stroke-width:1}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
svg.chart .knee{stroke:#c8553d;stroke-width:1.5;stroke-dasharray:5 4}
svg.chart .slo{stroke:#c8553d;stroke-width:1.5;stroke-dasharray:2 3}
"""


def escape_attr(value: Any) -> str:
    """``value`` as text safe in HTML content and quoted attributes."""
    return escape(str(value), quote=True)


def nice_max(value: float) -> float:
    """A round axis maximum >= value."""
    if value <= 0:
        return 1.0
    # an int for exponents >= 0, a float below (typeshed types int ** int as Any for that reason)
    exp: float = 10 ** int(f"{value:e}".split("e")[1])
    for step in (1, 2, 2.5, 5, 10):
        if step * exp >= value:
            return step * exp
    return 10 * exp


def ticks(top: float, n: int = 4) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def svg_open(kind: str, width: int, height: int, title: str, label: str) -> list[str]:
    """The first lines of a chart: ``data-chart`` names its kind (tests count them)."""
    return [f'<svg class="chart" data-chart="{escape_attr(kind)}" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape_attr(label)}">',
            f'<text class="title" x="10" y="18">{escape_attr(title)}</text>']


def document(title: str, body: Sequence[str]) -> str:
    """One HTML document: the title, the style sheet, the body's parts."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escape_attr(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
