"""Render recorded model calls as terminal waterfalls (pure functions, no I/O).

Input is the flattened span dicts of :func:`otel_llm.export.jsonl.read_jsonl`. A model call is
a CLIENT span carrying ``gen_ai.operation.name``; its direct children are the phase spans. Beside
another GenAI instrumentation, otel_llm's span is the call's transport view
(``llm.beside.instrumentation``) under that instrumentation's span: the call is otel_llm's span,
named and completed (model, tokens) from the other one.

When several processes' spans meet in one file (a collector's file exporter fed by the
application, ``otel-llm gateway`` and the runtime), a model call made on behalf of another one in
the same trace (the gateway relaying it) is a hop of that call, shown under it and not counted
again, and a SERVER span the runtime exported itself (vLLM's ``llm_request``) is the runtime's own
account of the call that reached it. A call ``otel-llm proxy`` made for a client in another
language sits under the proxy's SERVER span, which says what only the proxy saw of the caller
(its user agent, when the head and the first token were written to it, how long writes waited
for it to read, whether it hung up): one line under the call's header.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_llm import semconv as sc
from otel_llm.export.summary import finite_number, kept_by

__all__ = ["ModelCall", "format_duration", "group_calls", "render_call", "render_calls", "select_calls"]

SpanDict = Mapping[str, Any]

_KIND_SERVER, _KIND_CLIENT = 2, 3  # OTLP SpanKind numbering
_STATUS_ERROR = 2
_NAME_MIN, _NAME_MAX = 15, 24  # phase-name column; 15 fits "llm.server_wait"
_MIN_BAR = 10
# Children of a well-instrumented call tile it up to clock jitter; only report a remainder
# that is a visible share of the call.
_GAP_SHARE = 0.005
UNACCOUNTED = "(unaccounted)"


@dataclass
class ModelCall:
    """One model call: its CLIENT span, its phase spans and its synthesized runtime spans."""

    span: SpanDict
    phases: list[SpanDict] = field(default_factory=list)
    runtime: list[SpanDict] = field(default_factory=list)  # llm.synthesized=true
    relayed: list[ModelCall] = field(default_factory=list)  # calls made on its behalf (a gateway's)
    served: list[SpanDict] = field(default_factory=list)  # the runtime's own SERVER spans
    caller: SpanDict | None = None  # otel-llm proxy's SERVER span: the caller's side of the call
    genai: SpanDict | None = None  # another instrumentation's span, this call's own being its transport view

    @property
    def start_ns(self) -> int:
        return int(self.span["startTimeUnixNano"])

    @property
    def end_ns(self) -> int:
        return int(self.span["endTimeUnixNano"])

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


def _is_model_call(span: SpanDict) -> bool:
    attributes = span.get("attributes") or {}
    return span.get("kind") == _KIND_CLIENT and (sc.GEN_AI_OPERATION_NAME in attributes
                                                 or sc.LLM_BESIDE_INSTRUMENTATION in attributes)


def _join(unique: Mapping[tuple[str, str], SpanDict], calls: dict[tuple[str, str], ModelCall]) -> None:
    """Each transport view takes the other instrumentation's span as its ``genai``; that span is
    no model call of its own (a call retried has one view per attempt)."""
    for call in list(calls.values()):
        if sc.LLM_BESIDE_INSTRUMENTATION in (call.span.get("attributes") or {}):
            key = (call.span["traceId"], call.span.get("parentSpanId") or "")
            call.genai = unique.get(key)
            calls.pop(key, None)


def group_calls(spans: Iterable[SpanDict]) -> list[ModelCall]:
    """Collect model calls and attach their children, oldest first.

    Works across the whole input because batch exporters may write a call and its phases
    on different lines. A span written twice (same trace and span id) counts once.
    """
    unique: dict[tuple[str, str], SpanDict] = {}
    for span in spans:
        unique[(span["traceId"], span["spanId"])] = span
    calls = {key: ModelCall(span) for key, span in unique.items() if _is_model_call(span)}
    _join(unique, calls)
    for key, span in unique.items():
        parent = calls.get((span["traceId"], span.get("parentSpanId") or ""))
        # another process's span under the call (the server it called) is not one of its phases
        if parent is not None and key not in calls and span.get("kind") != _KIND_SERVER:
            synthesized = (span.get("attributes") or {}).get(sc.LLM_SYNTHESIZED)
            (parent.runtime if synthesized else parent.phases).append(span)
    for key, span in unique.items():
        if key not in calls and _is_runtime_report(span):
            caller = _calling(unique, calls, key)
            if caller is not None:
                caller.served.append(span)
    for key, call in calls.items():
        parent_span = unique.get((key[0], call.span.get("parentSpanId") or ""))
        if parent_span is not None and _is_proxy_server(parent_span):
            call.caller = parent_span
    outer = {key: call for key, call in calls.items() if not _relay(unique, calls, key)}
    for call in calls.values():
        for spans in (call.phases, call.runtime, call.served):
            spans.sort(key=lambda s: (s["startTimeUnixNano"], s["endTimeUnixNano"]))
        call.relayed.sort(key=lambda c: (c.start_ns, c.end_ns))
    return sorted(outer.values(), key=lambda c: (c.start_ns, c.end_ns))


_MAX_DEPTH = 64  # parent chains longer than this (or cyclic ones, in a hostile file) are cut


def _is_runtime_report(span: SpanDict) -> bool:
    """A SERVER span with the runtime's own gen_ai latencies (vLLM's ``llm_request``)."""
    attrs = span.get("attributes") or {}
    return span.get("kind") == _KIND_SERVER and any(k.startswith(sc.VLLM_LATENCY_PREFIX) for k in attrs)


_PROXY_ATTRIBUTES = (sc.LLM_PROXY_TIME_TO_FIRST_BYTE, sc.LLM_PROXY_TIME_TO_FIRST_TOKEN, sc.LLM_PROXY_WRITE_WAIT)


def _is_proxy_server(span: SpanDict) -> bool:
    """``otel-llm proxy``'s SERVER span (it carries ``llm.proxy.*`` once the head was written)."""
    attrs = span.get("attributes") or {}
    return span.get("kind") == _KIND_SERVER and any(k in attrs for k in _PROXY_ATTRIBUTES)


def _calling(unique: Mapping[tuple[str, str], SpanDict], calls: Mapping[tuple[str, str], ModelCall],
             key: tuple[str, str]) -> ModelCall | None:
    """The nearest model call above the span ``key`` in its trace, if any."""
    trace_id, span = key[0], unique[key]
    for _ in range(_MAX_DEPTH):
        parent = (trace_id, span.get("parentSpanId") or "")
        if parent in calls:
            return calls[parent]
        if parent not in unique:
            return None
        span = unique[parent]
    return None


def _relay(unique: Mapping[tuple[str, str], SpanDict], calls: Mapping[tuple[str, str], ModelCall],
           key: tuple[str, str]) -> bool:
    """Whether the call ``key`` was made on behalf of another call (attached to it if so)."""
    caller = _calling(unique, calls, key)
    if caller is None:
        return False
    caller.relayed.append(calls[key])
    return True


def select_calls(calls: list[ModelCall], last: int | None = None, trace_id: str | None = None) -> list[ModelCall]:
    """Keep calls whose trace id starts with ``trace_id`` (case-insensitive), then the newest ``last``."""
    if trace_id:
        prefix = trace_id.strip().lower()
        calls = [c for c in calls if str(c.span["traceId"]).lower().startswith(prefix)]
    if last is not None:
        calls = calls[-last:] if last > 0 else []
    return calls


def format_duration(seconds: float) -> str:
    """Short human duration: milliseconds below one second, seconds above."""
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 100:
        return f"{seconds:.3f}s"
    return f"{seconds:.1f}s"


def _format_start(ns: int) -> str:
    moment = _dt.datetime.fromtimestamp(ns / 1e9)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _status(span: SpanDict) -> str | None:
    attrs = span.get("attributes") or {}
    http = attrs.get(sc.HTTP_RESPONSE_STATUS_CODE)
    status = span.get("status") or {}
    if status.get("code") == _STATUS_ERROR or sc.ERROR_TYPE in attrs:
        reason = str(attrs.get(sc.ERROR_TYPE) or status.get("message") or "")
        if http is None:
            return f"ERROR {reason}".strip()
        # error.type is often just the status code again; don't print "503 ERROR 503".
        return f"{http} ERROR" if reason in ("", str(http)) else f"{http} ERROR {reason}"
    return str(http) if http is not None else None


def _pack(parts: list[str], width: int, indent: str = "  ") -> list[str]:
    """Greedily join parts with two spaces into lines of at most ``width`` (never splitting a part)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "  " + part
        else:
            lines.append(indent + part)
    return lines


def _header(call: ModelCall, width: int) -> list[str]:
    """Identity of the call, then its key measurements (only those present), wrapped to width."""
    span = call.span
    attrs = span.get("attributes") or {}
    name = span.get("name")
    if call.genai is not None:  # the model call's name, model and tokens are on the other span
        attrs = {**(call.genai.get("attributes") or {}), **attrs}
        name = call.genai.get("name") or name
    address = attrs.get(sc.SERVER_ADDRESS)
    port = attrs.get(sc.SERVER_PORT)
    server = f"{address}:{port}" if address and port is not None else address
    first = [name or "model call", server, _status(span), _format_start(call.start_ns),
             f"total {format_duration(call.duration_ns / 1e9)}"]
    return ["  ".join(str(p) for p in first if p), *_pack(_measurements(attrs) + _diagnosis(attrs), width),
            *_pack(_request(attrs), width), *_pack(_caller(call.caller), width)]


def _caller(span: SpanDict | None) -> list[str]:
    """What the proxy saw of the caller, from the request's arrival at the proxy."""
    if span is None:
        return []
    attrs = span.get("attributes") or {}
    parts = ["via otel-llm proxy"]
    agent = attrs.get(sc.USER_AGENT_ORIGINAL)
    if isinstance(agent, str) and agent:
        parts.append(f"caller {agent[:60]}")
    for label, key in (("head written", sc.LLM_PROXY_TIME_TO_FIRST_BYTE),
                       ("first token written", sc.LLM_PROXY_TIME_TO_FIRST_TOKEN)):
        value = finite_number(attrs.get(key))
        if value is not None:
            parts.append(f"{label} {format_duration(value)}")
    wait = finite_number(attrs.get(sc.LLM_PROXY_WRITE_WAIT))
    if wait is not None and wait >= _NOTABLE_WRITE_WAIT:
        parts.append(f"caller read slowly: writes waited {format_duration(wait)}")
    if attrs.get(sc.LLM_GATEWAY_OUTCOME) == "client_closed":
        parts.append("caller hung up")
    return parts


_NOTABLE_WRITE_WAIT = 0.001  # below, writes went straight into the socket buffer


def format_bytes(value: float) -> str:
    """``812 B``, ``12.3 KiB``, ``4.0 MiB``."""
    if value < 1024:
        return f"{int(value)} B"
    if value < 1024 * 1024:
        return f"{value / 1024:.1f} KiB"
    return f"{value / (1024 * 1024):.1f} MiB"


def _request(attrs: Mapping[str, Any]) -> list[str]:
    """What the request was made of: its size, messages by role, instructions, tools, attachments."""
    parts = []
    body = finite_number(attrs.get(sc.HTTP_REQUEST_BODY_SIZE))
    if body is not None:
        parts.append(f"request {format_bytes(body)}")
    messages = attrs.get(sc.LLM_REQUEST_MESSAGES)
    if isinstance(messages, int):
        roles = [f"{attrs[key]} {role}" for role in sc.LLM_REQUEST_ROLES
                 if isinstance(attrs.get(key := sc.LLM_REQUEST_MESSAGES_PREFIX + role), int)]
        parts.append(f"{messages} messages" + (f" ({', '.join(roles)})" if roles else ""))
    for key, label in ((sc.LLM_REQUEST_SYSTEM_BYTES, "system"),
                       (sc.LLM_REQUEST_LARGEST_MESSAGE_BYTES, "largest message")):
        value = finite_number(attrs.get(key))
        if value is not None:
            parts.append(f"{label} {format_bytes(value)}")
    tools, tools_bytes = attrs.get(sc.LLM_REQUEST_TOOLS), finite_number(attrs.get(sc.LLM_REQUEST_TOOLS_BYTES))
    if isinstance(tools, int):
        parts.append(f"{tools} tools" + (f" {format_bytes(tools_bytes)}" if tools_bytes is not None else ""))
    attachments = attrs.get(sc.LLM_REQUEST_ATTACHMENTS)
    if isinstance(attachments, int) and attachments:
        parts.append(f"{attachments} attachments")
    limit = attrs.get(sc.GEN_AI_REQUEST_MAX_TOKENS)
    if isinstance(limit, int):
        parts.append(f"max_tokens {limit}")
    return parts


def _diagnosis(attrs: Mapping[str, Any]) -> list[str]:
    parts = []
    if attrs.get(sc.LLM_DIAGNOSIS_BOTTLENECK):
        parts.append(f"bottleneck {attrs[sc.LLM_DIAGNOSIS_BOTTLENECK]}")
    unaccounted = finite_number(attrs.get(sc.LLM_DIAGNOSIS_UNACCOUNTED_WAIT))
    if unaccounted is not None:
        parts.append(f"unaccounted wait {format_duration(unaccounted)}")
    for key, label in ((sc.LLM_DIAGNOSIS_COLD_START, "cold start"), (sc.LLM_DIAGNOSIS_STREAM_BUFFERED, "buffered"),
                       (sc.LLM_DIAGNOSIS_RETRY, "retry")):
        if attrs.get(key) is True:
            parts.append(label)
    pressure = finite_number(attrs.get(sc.LLM_REQUEST_CONTEXT_PRESSURE))
    if attrs.get(sc.LLM_DIAGNOSIS_CONTEXT_PRESSURE) is True and pressure is not None:
        parts.append(f"context pressure: the prompt fills {pressure:.0%} of the "
                     f"{attrs.get(sc.LLM_MODEL_CONTEXT_LENGTH)}-token context")
    if attrs.get(sc.LLM_DIAGNOSIS_PARTIAL_OFFLOAD) is True:
        total, vram = attrs.get(sc.LLM_MODEL_MEMORY_TOTAL), attrs.get(sc.LLM_MODEL_MEMORY_VRAM)
        parts.append(f"partial offload: {format_bytes(vram)} of {format_bytes(total)} in VRAM"
                     if isinstance(total, int) and isinstance(vram, int) else "partial offload")
    concurrent = attrs.get(sc.LLM_DIAGNOSIS_CONCURRENT_REQUESTS)
    if concurrent:
        parts.append(f"{concurrent} other call(s) in flight")
    kept = kept_by(attrs)
    if kept:
        parts.append(kept)
    return parts


_CLIENT_TIMES = (("ttfb", sc.LLM_CLIENT_TIME_TO_FIRST_BYTE), ("ttft", sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN),
                 ("decode", sc.LLM_CLIENT_GENERATION_DURATION))


def _measurements(attrs: Mapping[str, Any]) -> list[str]:
    parts = _durations_and_tokens(attrs, _CLIENT_TIMES, sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    rate = finite_number(attrs.get(sc.LLM_CLIENT_GENERATION_RATE))
    if rate is not None:
        parts.append(f"{rate:.1f} tok/s")
    chunks = attrs.get(sc.LLM_CLIENT_CHUNKS)
    if chunks is not None:
        parts.append(f"chunks {chunks}")
    gap = finite_number(attrs.get(sc.LLM_CLIENT_MAX_CHUNK_GAP))
    if gap is not None:
        parts.append(f"max gap {format_duration(gap)}")
    if attrs.get(sc.LLM_RUNTIME_NAME):
        parts.append(f"runtime {attrs[sc.LLM_RUNTIME_NAME]}")
    acceptance = finite_number(attrs.get(sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE))
    if acceptance is not None:
        parts.append(f"draft accepted {acceptance:.0%} ({attrs.get(sc.LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED)}/"
                     f"{attrs.get(sc.LLM_RUNTIME_DRAFT_TOKENS)})")
    reused = attrs.get(sc.LLM_CLIENT_CONNECTION_REUSED)
    if isinstance(reused, bool):
        parts.append("conn reused" if reused else "new conn")
    return parts or ["(no client timings recorded)"]


def _gaps(call: ModelCall) -> list[tuple[int, int]]:
    """Intervals of the call (ns offsets) not covered by any child span."""
    gaps, cursor = [], 0
    for child in call.phases:
        lo = max(0, int(child["startTimeUnixNano"]) - call.start_ns)
        hi = min(call.duration_ns, int(child["endTimeUnixNano"]) - call.start_ns)
        if lo > cursor:
            gaps.append((cursor, lo))
        cursor = max(cursor, hi)
    if cursor < call.duration_ns:
        gaps.append((cursor, call.duration_ns))
    return gaps


def _paint(cells: list[str], lo_ns: int, hi_ns: int, total_ns: int, char: str) -> None:
    """Fill the cells covering [lo, hi); any non-empty interval gets at least one cell."""
    width = len(cells)
    if total_ns <= 0 or hi_ns <= lo_ns:
        return
    # Rounding both ends (not start + length) lets tiled phases meet without overlap.
    start = min(width, max(0, round(lo_ns * width / total_ns)))
    end = min(width, max(0, round(hi_ns * width / total_ns)))
    if end <= start:
        start, end = min(start, width - 1), min(start, width - 1) + 1
    for i in range(start, end):
        cells[i] = char


def _row(name: str, offset_ns: int, duration_ns: int, cells: list[str], name_width: int, edge: str) -> str:
    offset = "+" + format_duration(offset_ns / 1e9)
    return f"  {name:<{name_width}} {offset:>10} {format_duration(duration_ns / 1e9):>9} {edge}{''.join(cells)}{edge}"


def render_call(call: ModelCall, width: int = 100, ascii: bool = False) -> str:  # noqa: A002 - the --ascii option
    """Render one call: header lines, one bar row per phase, and the unaccounted remainder."""
    full, gap_char, edge, reported = ("#", ".", "|", "=") if ascii else ("█", "░", "│", "▒")
    names = [str(p.get("name", "")) for p in call.phases + call.runtime + call.served] + [UNACCOUNTED]
    name_width = min(_NAME_MAX, max(_NAME_MIN, *(len(n) for n in names)))
    bar_width = max(_MIN_BAR, width - (2 + name_width + 1 + 10 + 1 + 9 + 1 + 2))
    total = call.duration_ns

    def span_row(span: SpanDict, char: str) -> str:
        lo = int(span["startTimeUnixNano"]) - call.start_ns
        hi = int(span["endTimeUnixNano"]) - call.start_ns
        cells = [" "] * bar_width
        _paint(cells, max(0, lo), min(total, hi), total, char)
        return _row(str(span.get("name", ""))[:name_width], lo, max(0, hi - lo), cells, name_width, edge)

    lines = _header(call, width) + [span_row(phase, full) for phase in call.phases]
    gaps = _gaps(call)
    missing = sum(hi - lo for lo, hi in gaps)
    if gaps and (not call.phases or missing > total * _GAP_SHARE):
        cells = [" "] * bar_width
        for lo, hi in gaps:
            _paint(cells, lo, hi, total, gap_char)
        lines.append(_row(UNACCOUNTED, gaps[0][0], missing, cells, name_width, edge))
    if call.runtime:
        lines.append(f"  as the runtime reports it ({reported}):")
        lines.extend(span_row(span, reported) for span in call.runtime)
    if call.served:
        lines.append(f"  the runtime's own span ({reported}):")
        for span in call.served:
            lines.append(span_row(span, reported))
            lines.extend(_pack(_served(span.get("attributes") or {}), width, "    "))
    for hop in call.relayed:
        lines.append("  relayed on its behalf as:")
        lines.extend("    " + line for line in render_call(hop, width - 4, ascii).splitlines())
    return "\n".join(lines)


_SERVED = (("queue", sc.VLLM_TIME_IN_QUEUE), ("prefill", sc.VLLM_TIME_IN_PREFILL),
           ("decode", sc.VLLM_TIME_IN_DECODE), ("ttft", sc.VLLM_TIME_TO_FIRST_TOKEN), ("e2e", sc.VLLM_E2E))


def _served(attrs: Mapping[str, Any]) -> list[str]:
    """The latencies and token counts a runtime's own span carries."""
    return _durations_and_tokens(attrs, _SERVED, sc.VLLM_PROMPT_TOKENS, sc.VLLM_COMPLETION_TOKENS)


def _durations_and_tokens(attrs: Mapping[str, Any], durations: tuple[tuple[str, str], ...], input_key: str,
                          output_key: str) -> list[str]:
    """``label duration`` for each present duration attribute, then ``tokens in N / out M``."""
    parts = []
    for label, key in durations:
        value = finite_number(attrs.get(key))
        if value is not None:
            parts.append(f"{label} {format_duration(value)}")
    tin, tout = attrs.get(input_key), attrs.get(output_key)
    if tin is not None or tout is not None:
        parts.append(f"tokens in {'?' if tin is None else tin} / out {'?' if tout is None else tout}")
    return parts


def render_calls(
    spans: Iterable[SpanDict],
    width: int = 100,
    ascii: bool = False,  # noqa: A002 - the --ascii option
    *,
    last: int | None = None,
    trace_id: str | None = None,
) -> str:
    """Render every model call in ``spans`` as a waterfall, newest last, blank line between calls.

    Returns "" when no call matches.
    """
    calls = select_calls(group_calls(spans), last=last, trace_id=trace_id)
    return "\n\n".join(render_call(c, width=width, ascii=ascii) for c in calls)
