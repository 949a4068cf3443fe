"""Reading the Grafana dashboards (``dashboards/*.json``) as the tests check them: panels, queries,
template variables, Grafana's interpolation and the metric names a PromQL expression reads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_llm_testing.subprocesses import REPO

__all__ = ["BUILTINS", "DASHBOARDS", "FILES", "Query", "all_panels", "label_values_query", "load", "metric_names",
           "queries", "referenced_variables", "substitute", "variables"]

DASHBOARDS = REPO / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))
# Grafana's own variables, as the tests substitute them (a 1 s scrape interval)
BUILTINS = {"__rate_interval": "10s", "__range": "5m", "__interval": "5s", "__from": "0", "__to": "0"}


def load(path: Path) -> dict[str, Any]:
    """A dashboard's JSON."""
    return json.loads(path.read_text(encoding="utf-8"))


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


@dataclass(frozen=True)
class Query:
    """One panel query: the file, the panel's title, its refId and PromQL."""

    file: str
    panel: str
    ref: str
    expr: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.panel, self.ref)


def queries() -> list[Query]:
    """Every query of every dashboard."""
    found = []
    for path in FILES:
        for panel in all_panels(load(path)):
            for t in panel.get("targets", []):
                found.append(Query(path.name, panel["title"], t["refId"], t["expr"]))
    return found


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The dashboard's template variables by name."""
    return {v["name"]: v for v in dashboard["templating"]["list"]}


_VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)")


def referenced_variables(text: str) -> set[str]:
    """The variables ``text`` refers to (``$name`` or ``${name}``)."""
    return {a or b for a, b in _VARIABLE.findall(text)}


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Grafana's interpolation as the tests do it: built-ins as ``BUILTINS``, every other variable ``.*``."""
    values = {**BUILTINS, **(values or {})}
    return _VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(2), ".*"), expr)


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors; no ``__name__`` matchers here)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text))
    return {n for n in names if n.lower() not in _KEYWORDS and not re.fullmatch(r"\d.*", n)}


def label_values_query(definition: str) -> tuple[str, str]:
    """``label_values(selector, label)`` -> (selector, label)."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", definition.strip())
    assert match, definition
    return match.group(1).strip(), match.group(2)
