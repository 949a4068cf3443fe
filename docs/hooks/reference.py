"""MkDocs hook: the reference page, generated from ``otel_llm/semconv.py`` at every build.

``reference.md`` exists only in the built site: ``on_files`` adds it from :func:`render`, which
reads every name from ``otel_llm.semconv`` and what it is from ``otel_llm.semconv_reference``. A
constant without its entry (or an entry without its constant) raises, so ``mkdocs build`` fails
instead of publishing a reference that has drifted from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # this checkout's otel_llm, whatever the virtualenv has installed
    sys.path.insert(0, str(ROOT))

PAGE = "reference.md"
_COLUMNS = {
    "span": ("Span name", "Span kind", "When it is recorded"),
    "event": ("Event name", "Type", "When it is recorded"),
    "attribute": ("Attribute", "Type", "Where and when it is set"),
    "metric": ("Metric", "Instrument", "When it is recorded"),
    "scope": ("Scope name", "Used by", "Where"),
}
_INTRO = """\
---
hide:
  - navigation
---

# Reference: every name otel_llm emits

This page is generated from `otel_llm/semconv.py` each time the site is built (see
[About this page](#about-this-page)), so it lists exactly the span names, span events, attributes
and metrics that otel_llm writes. The call span itself (kind CLIENT) is named
`{{gen_ai.operation.name}} {{gen_ai.request.model}}` (the operation alone when the request names
no model); the gateway's span (kind SERVER) is named `{{http.request.method}} {{url.path}}` for a
model route, else the method alone.

**Status** is the name's status in the OpenTelemetry semantic conventions
(v{version}); the `gen_ai.*` names and their definitions follow
[{genai_repository}](https://github.com/{genai_repository}) at commit `{genai_commit}`:

{statuses}
"""
_FOOTER = """\
## About this page

Each name comes from its constant in `otel_llm/semconv.py`; what it is (kind, type or
instrument, unit, when it is set, status) comes from its entry in
`otel_llm/semconv_reference.py`. The docs build (`make docs`) and the tests
(`tests/project/test_docs.py`, `tests/project/test_semconv_reference.py`) fail when a constant has
no entry or an entry names no constant, and the tests check each metric's instrument and unit
against the instruments the code creates.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(kind: str, rows: list[tuple[str, Any]]) -> list[str]:
    name, type_, when = _COLUMNS[kind]
    units = kind in ("attribute", "metric")
    head = [name, type_, *(["Unit"] if units else []), when, "Status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for value, entry in sorted(rows, key=lambda row: row[0]):
        constants = ", ".join(f"semconv.{c}" for c in entry.constants)
        cells = [f"`{_cell(value)}`<br><small>{constants}</small>", _cell(entry.type)]
        if units:
            cells.append(f"`{entry.unit}`" if entry.unit else "")
        cells += [_cell(entry.when), f"`{entry.status}`"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(module: ModuleType | None = None, table: Any = None) -> str:
    """The reference page's Markdown for ``module`` (default: ``otel_llm.semconv``) and ``table``
    (default: its entries); ValueError when the two disagree."""
    from otel_llm import semconv
    from otel_llm import semconv_reference as ref

    found = ref.entries(module or semconv, ref.ENTRIES if table is None else table)
    statuses = "\n".join(f"- `{status}`: {meaning}" for status, meaning in ref.STATUSES.items())
    out = [_INTRO.format(version=ref.SEMCONV_VERSION, statuses=statuses, genai_repository=ref.GENAI_REPOSITORY,
                         genai_commit=ref.GENAI_COMMIT)]
    for kind, title in ref.KINDS.items():
        rows = [(value, entry) for value, entry in found if entry.kind == kind and entry.emitted]
        if rows:
            out += [f"## {title}", "", *_table(kind, rows), ""]
    unused = [(value, entry) for value, entry in found if not entry.emitted]
    if unused:
        out += ["## Read or defined, not emitted", "",
                "Names `otel_llm/semconv.py` holds that otel_llm does not write: read from a runtime's own "
                "span, or defined without being emitted (each row says which).", ""]
        for kind in ref.KINDS:
            rows = [(value, entry) for value, entry in unused if entry.kind == kind]
            if rows:
                out += [*_table(kind, rows), ""]
    out.append(_FOOTER)
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
