"""The Collector's ``tail_sampling`` decision, read from a configuration, for spans collected here.

No collector runs in the tests, so the policies of collector-config/ are applied by this reading
of them. It knows only ``ottl_condition`` policies whose conditions are conjunctions of the
forms the configs use, and raises ``ValueError`` on anything else, so that a policy it cannot read
fails the test instead of being read wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_llm_testing.collectors import Received, attributes_of

__all__ = ["SpanFacts", "from_otlp", "from_sdk", "kept_traces", "matches"]


@dataclass(frozen=True)
class SpanFacts:
    """What a policy can look at: the span's trace, parent, scope, attributes and resource."""

    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    scope: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    resource: Mapping[str, Any] = field(default_factory=dict)


def from_otlp(received: Received) -> list[SpanFacts]:
    """Every span an OTLP receiver decoded."""
    out = []
    for request in received.traces:
        for resource_spans in request.resource_spans:
            resource = attributes_of(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                out.extend(SpanFacts(span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                                     scope_spans.scope.name, attributes_of(span.attributes), resource)
                           for span in scope_spans.spans)
    return out


def from_sdk(spans: Iterable[ReadableSpan]) -> list[SpanFacts]:
    """Spans an SDK exporter received (the in-memory exporter's)."""
    out = []
    for span in spans:
        assert span.context is not None
        parent = format(span.parent.span_id, "016x") if span.parent is not None else ""
        scope = span.instrumentation_scope.name if span.instrumentation_scope is not None else ""
        out.append(SpanFacts(format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"), parent,
                             scope, dict(span.attributes or {}), dict(span.resource.attributes)))
    return out


def kept_traces(config: Mapping[str, Any], spans: Iterable[SpanFacts]) -> set[str]:
    """The trace ids the config's ``tail_sampling`` processor keeps (any policy matching any span)."""
    policies = config["processors"]["tail_sampling"]["policies"]
    by_trace: dict[str, list[SpanFacts]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    return {trace for trace, members in by_trace.items()
            if any(_policy_matches(policy, span) for policy in policies for span in members)}


def _policy_matches(policy: Mapping[str, Any], span: SpanFacts) -> bool:
    if policy["type"] != "ottl_condition":
        raise ValueError(f"policy {policy['name']}: type {policy['type']} is not read here")
    block = policy["ottl_condition"]
    if set(block) - {"error_mode", "span"}:
        raise ValueError(f"policy {policy['name']}: only span conditions are read here")
    return any(matches(condition, span) for condition in block["span"])


_SCOPE = re.compile(r'instrumentation_scope\.name (==|!=) "([^"]*)"')
_ATTRIBUTE = re.compile(r'(resource\.)?attributes\["([^"]+)"\] (==|!=|>|<) (nil|true|false|"[^"]*"|-?[0-9.]+)')


def matches(condition: str, span: SpanFacts) -> bool:
    """One OTTL span condition: terms joined by `` and ``."""
    return all(_term(term.strip(), span) for term in condition.split(" and "))


def _term(term: str, span: SpanFacts) -> bool:
    if term == "IsRootSpan()":
        return span.parent_span_id.strip("0") == ""
    if scope := _SCOPE.fullmatch(term):
        return (span.scope == scope[2]) == (scope[1] == "==")
    if attribute := _ATTRIBUTE.fullmatch(term):
        where, key, op, literal = attribute.groups()
        value = (span.resource if where else span.attributes).get(key)
        return _compare(value, op, _literal(literal))
    raise ValueError(f"OTTL condition not read here: {term!r}")


def _literal(text: str) -> Any:
    if text == "nil":
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"'):
        return text[1:-1]
    return float(text)


def _compare(value: Any, op: str, literal: Any) -> bool:
    if op in ("==", "!="):
        if isinstance(value, (list, tuple)):
            value = list(value)
        return (value == literal) == (op == "==")
    # OTTL: an ordering between a missing value or a non-number and a number is false
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return value > literal if op == ">" else value < literal
