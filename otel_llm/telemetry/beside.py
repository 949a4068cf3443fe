"""Beside another GenAI instrumentation: one call span per model call, each metric counted once.

The official OpenTelemetry GenAI instrumentations, openlit and OpenLLMetry open their own
CLIENT span around a model call (``chat gpt-4o``) and record the ``gen_ai.client.*`` metrics.
When otel_llm captures a call under such a span (``beside_genai``, on by default), it does not
add a second call span: its span becomes that span's child, the call's transport view, named
after the HTTP request (``POST /v1/chat/completions``), with otel_llm's own attributes (``http.*``,
``server.*``, ``url.*``, ``llm.*``) and no ``gen_ai.*`` one, so that no backend counts the call,
its tokens or its cost twice; the phases and the runtime's spans hang under it as usual. The
other instrumentation is named in ``llm.beside.instrumentation``. Where that instrumentation is
one known to record ``gen_ai.*`` metrics, otel_llm leaves the ones it records to it (openlit and
OpenLLMetry record ``gen_ai.server.time_to_first_token`` from the client's timings, for instance)
and records the others and its own ``llm.*`` metrics for the call.

Only a span whose kind, scope and attributes can be read (the OpenTelemetry SDK's) is recognised.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind

from otel_llm import semconv as sc
from otel_llm._types import Attributes
from otel_llm.parse.routes import OP_CHAT, OP_GENERATE_CONTENT, OP_TEXT_COMPLETION

__all__ = ["genai_parent", "metrics_left_to", "transport_attributes", "transport_name"]

_MODEL_CALLS = frozenset((OP_CHAT, OP_TEXT_COMPLETION, OP_GENERATE_CONTENT))
# OpenInference's instrumentations mark a model call's span this way (and record no metrics)
_OPENINFERENCE_KIND = "openinference.span.kind"
# The gen_ai metrics each GenAI instrumentation records itself, by instrumentation scope (the
# first prefix that matches), under the default names (otel_llm leaves the same quantity under
# the semantic-conventions-genai names too), read from their sources and runs
_CLIENT = frozenset((sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_TO_FIRST_CHUNK,
                     sc.METRIC_TIME_PER_OUTPUT_CHUNK))
_SERVER_TTFT = sc.METRIC_SERVER_TIME_TO_FIRST_TOKEN
_RECORDED_BY = (
    ("opentelemetry.instrumentation.genai.", _CLIENT),  # opentelemetry-python-genai's (util-genai)
    ("opentelemetry.instrumentation.openai_v2", frozenset((sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE))),
    ("openlit.", _CLIENT | {_SERVER_TTFT, sc.METRIC_SERVER_TIME_PER_OUTPUT_TOKEN}),  # timed on the client
    # OpenLLMetry's (opentelemetry.instrumentation.openai.v1, .anthropic, ...; traceloop's semconv_ai)
    ("opentelemetry.instrumentation.", frozenset((sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE,
                                                  _SERVER_TTFT))),
)
_NONE: frozenset[str] = frozenset()


def genai_parent(span: Any, model: str | None, host: str | None) -> str | None:
    """The instrumentation scope of ``span`` when it is another instrumentation's span for the
    model call about to start (``model`` at ``host``, when known), else None. Never raises."""
    try:
        if not span.is_recording():
            return None
        scope = getattr(getattr(span, "instrumentation_scope", None), "name", None)
        if not isinstance(scope, str) or scope == sc.INSTRUMENTATION_NAME:
            return None
        attributes = getattr(span, "attributes", None) or {}
        if not _is_model_call(span, attributes):
            return None
        requested = attributes.get(sc.GEN_AI_REQUEST_MODEL)
        address = attributes.get(sc.SERVER_ADDRESS)
        if (model and isinstance(requested, str) and requested != model) or (
                host and isinstance(address, str) and address != host):
            return None  # another call's span: the application's own, around this request
        return scope
    except Exception:
        return None


def _is_model_call(span: Any, attributes: Any) -> bool:
    """A model call's span by the GenAI conventions (CLIENT, ``gen_ai.operation.name`` or, before
    the instrumentation sets it, a ``{operation} {model}`` name), or by OpenInference's."""
    if attributes.get(_OPENINFERENCE_KIND) == "LLM":
        return True
    if getattr(span, "kind", None) is not SpanKind.CLIENT:
        return False
    operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
    if operation is None:
        name = getattr(span, "name", None)
        operation = name.partition(" ")[0] if isinstance(name, str) else None
    return operation in _MODEL_CALLS


def metrics_left_to(scope: str | None) -> frozenset[str]:
    """The gen_ai metrics (default names) the instrumentation of ``scope`` records itself, which
    otel_llm then leaves to it."""
    if scope is not None:
        for prefix, families in _RECORDED_BY:
            if scope.startswith(prefix):
                return families
    return _NONE


def transport_name(method: str, path: str) -> str:
    """The transport view's span name: the HTTP request, without its query string."""
    return f"{method} {path.partition('?')[0]}"


def transport_attributes(attributes: Attributes) -> Attributes:
    """The call span's attributes less the ``gen_ai.*`` ones, which the other span carries."""
    return {key: value for key, value in attributes.items() if not key.startswith("gen_ai.")}
