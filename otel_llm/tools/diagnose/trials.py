"""Make traced calls against one target and turn their spans into :class:`Trial` results."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

from otel_llm import semconv as sc
from otel_llm.parse.runtimes import ModelInfo
from otel_llm.tools.bench import workload
from otel_llm.tools.bench.load import Level, RequestRecord, RequestSpan, run_level
from otel_llm.tools.diagnose.hoststate import HostReading
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

__all__ = ["APIS", "TargetResult", "Trial", "TrialRunner", "request_for", "sweep_prompt"]

APIS = workload.APIS
PROMPT = "Count from one to ten, separated by spaces."
TRIAL_SPAN = "otel_llm.diagnose.trial"


@dataclass
class Trial:
    """One traced call, as its spans describe it (seconds, tokens, tokens/s; None = not reported)."""

    kind: str = "warm"  # cold | warm | concurrent
    index: int = 0
    concurrency: int = 1
    error: str | None = None  # None, "unreachable", "http_error", "timeout", "error"
    status: int | None = None
    detail: str | None = None
    start: float = 0.0  # seconds after the first request of the group started
    total: float | None = None  # call span duration
    ttfb: float | None = None
    ttft: float | None = None
    decode: float | None = None  # client: first -> last token
    client_rate: float | None = None
    native_rate: float | None = None
    draft_acceptance: float | None = None  # speculative decoding: accepted / drafted tokens
    prompt_eval: float | None = None
    prompt_tokens: int | None = None  # evaluated by the runtime (cached ones excluded)
    input_tokens: int | None = None  # the whole prompt, as the response's usage reports it
    request_bytes: int | None = None  # the request body as sent (http.request.body.size)
    load: float | None = None
    queue: float | None = None
    output_tokens: int | None = None
    chunks: int | None = None
    max_chunk_gap: float | None = None
    stream_buffered: bool | None = None
    cold_start: bool | None = None
    bottleneck: str | None = None
    unaccounted_wait: float | None = None
    runtime: str | None = None
    trace_id: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    # response headers that say what the answer passed through (no credentials among them)
    response_headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TargetResult:
    """Everything measured for one URL; input of :func:`otel_llm.tools.diagnose.verdicts.verdicts`."""

    url: str
    api: str = "openai"
    model: str = ""
    auth_sent: bool = False
    reachable: Trial | None = None  # step 1's request, also the cold trial when it succeeded
    warm: list[Trial] = field(default_factory=list)
    concurrency: dict[int, list[Trial]] = field(default_factory=dict)
    prompt_sweep: list[Trial] = field(default_factory=list)  # same output limit, growing prompts
    cold_trials: list[Trial] = field(default_factory=list)  # deliberate ones (--cold), each from a reset
    runtime_name: str | None = None
    runtime_version: str | None = None
    model_info: ModelInfo | None = None  # from the runtime's metadata route (context length...)
    # the runtime's PID and /proc/vmstat between the steps, oldest first (a server on this host only)
    host_readings: list[HostReading] = field(default_factory=list)
    memory: dict[str, Any] | None = None  # diagnose.memory.estimate after the warm trials (MemoryEstimate)

    @property
    def cold(self) -> Trial | None:
        return self.reachable if self.reachable is not None and self.reachable.ok else None

    def ok_warm(self) -> list[Trial]:
        return [t for t in self.warm if t.ok]

    def all_trials(self) -> list[Trial]:
        """Every recorded trial, in the order of the steps."""
        first = [self.reachable] if self.reachable is not None else []
        return first + self.warm + self.cold_trials + self.prompt_sweep + [
            t for level in sorted(self.concurrency) for t in self.concurrency[level]]


def sweep_prompt(sentences: int, nonce: str) -> str:
    """A prompt of about 12 tokens per sentence; the nonce keeps it out of any prefix cache."""
    notes = " ".join(f"Note {i}: the shipment left the harbour on time." for i in range(sentences))
    return f"[{nonce}] {notes} {PROMPT}"


def request_for(api: str, base_url: str, model: str, max_tokens: int,
                prompt: str = PROMPT) -> tuple[str, dict[str, Any]]:
    """The generation URL and streaming JSON payload of ``api`` (the bench's, with this prompt)."""
    return workload.request_for(api, base_url, model, max_tokens, prompt)


def _seconds(span: ReadableSpan) -> float | None:
    if span.start_time is None or span.end_time is None:
        return None
    return (span.end_time - span.start_time) / 1e9


def _num(attrs: Mapping[str, Any], key: str) -> float | None:
    value = attrs.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(attrs: Mapping[str, Any], key: str) -> int | None:
    value = attrs.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def trial_from_spans(trial: Trial, call: ReadableSpan, children: list[ReadableSpan]) -> Trial:
    """Fill ``trial`` from the call span's attributes and its children's durations."""
    a = dict(call.attributes or {})
    trial.total = _seconds(call)
    trial.ttfb = _num(a, "llm.client.time_to_first_byte")
    trial.ttft = _num(a, "llm.client.time_to_first_token")
    trial.decode = _num(a, "llm.client.generation_duration")
    trial.client_rate = _num(a, "llm.client.generation_rate")
    trial.native_rate = _num(a, "llm.runtime.generation_rate")
    trial.draft_acceptance = _num(a, sc.LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE)
    trial.prompt_eval = _num(a, "llm.runtime.prompt_eval_duration")
    trial.prompt_tokens = _int(a, "llm.runtime.prompt_tokens")
    trial.input_tokens = _int(a, "gen_ai.usage.input_tokens")
    trial.request_bytes = _int(a, sc.HTTP_REQUEST_BODY_SIZE)
    trial.load = _num(a, "llm.runtime.load_duration")
    trial.queue = _num(a, "llm.runtime.queue_duration")
    trial.output_tokens = _int(a, "llm.runtime.generation_tokens") or _int(a, "gen_ai.usage.output_tokens")
    trial.chunks = _int(a, "llm.client.chunks")
    trial.max_chunk_gap = _num(a, "llm.client.max_chunk_gap")
    buffered = a.get("llm.diagnosis.stream_buffered")
    trial.stream_buffered = bool(buffered) if buffered is not None else None
    cold = a.get("llm.diagnosis.cold_start")
    trial.cold_start = bool(cold) if cold is not None else None
    bottleneck = a.get("llm.diagnosis.bottleneck")
    trial.bottleneck = str(bottleneck) if bottleneck is not None else None
    trial.unaccounted_wait = _num(a, "llm.diagnosis.unaccounted_wait")
    runtime = a.get("llm.runtime.name") or a.get("gen_ai.provider.name")
    trial.runtime = str(runtime) if runtime is not None else None
    status = _int(a, "http.response.status_code")
    if status is not None:
        trial.status = status
    trial.trace_id = format(call.context.trace_id, "032x")
    for child in children:
        if (child.attributes or {}).get("llm.synthesized"):
            continue  # the runtime's own account overlaps the phases; its numbers are above
        seconds = _seconds(child)
        if seconds is not None:
            trial.phases[child.name] = trial.phases.get(child.name, 0.0) + seconds
    return trial


class TrialRunner:
    """Sends traced streaming requests to one target; spans come from ``exporter``."""

    def __init__(self, tracer_provider: TracerProvider, exporter: InMemorySpanExporter, *, url: str, api: str,
                 model: str, max_tokens: int, headers: Mapping[str, str], timeout: float = 120.0,
                 redact: Callable[[str], str] = lambda s: s) -> None:
        self.tracer = tracer_provider.get_tracer("otel_llm.diagnose")
        self.exporter = exporter
        self.url, self.payload = request_for(api, url, model, max_tokens)
        self._request = (api, url, model, max_tokens)
        self.api = api
        self.headers = dict(headers)
        self.redact = redact
        self.timeout = timeout
        self.client = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0))

    def close(self) -> None:
        self.client.close()

    def one(self, kind: str, index: int = 0, concurrency: int = 1, barrier: threading.Barrier | None = None,
            t0: list[float] | None = None, prompt: str | None = None) -> Trial:
        trial = Trial(kind=kind, index=index, concurrency=concurrency)
        payload = self.payload if prompt is None else request_for(*self._request, prompt=prompt)[1]
        with self.tracer.start_as_current_span(TRIAL_SPAN, kind=SpanKind.INTERNAL, attributes={
            "llm.diagnose.kind": kind, "llm.diagnose.index": index, "llm.diagnose.concurrency": concurrency,
        }) as parent:
            if barrier is not None:
                barrier.wait()
            started = time.perf_counter()
            if t0 is not None:
                trial.start = started - t0[0] if t0 else 0.0
            for attempt in range(2):
                if not self._send(trial, payload) or attempt:
                    break
                # A server may close an idle keep-alive connection just as it is reused (cpp-httplib,
                # behind llama-server, closes after a few requests): one fresh attempt, as a browser would.
                trial.error = trial.detail = None
            parent_id = parent.get_span_context().span_id
        self._read_spans(trial, parent_id)
        return trial

    def _send(self, trial: Trial, payload: dict[str, Any]) -> bool:
        """One request; True when it failed on a reused connection before any response."""
        try:
            with self.client.stream("POST", self.url, json=payload, headers=self.headers) as response:
                trial.status = response.status_code
                trial.response_headers = path_headers(response.headers)
                if response.status_code >= 400:
                    body = response.read().decode("utf-8", "replace")
                    trial.error = "http_error"
                    trial.detail = self.redact(" ".join(body.split())[:200])
                else:
                    for _ in response.iter_bytes():
                        pass
        except httpx.ConnectError as exc:
            trial.error, trial.detail = "unreachable", self.redact(str(exc) or type(exc).__name__)
        except httpx.TimeoutException as exc:
            trial.error, trial.detail = "timeout", self.redact(str(exc) or type(exc).__name__)
        except httpx.RemoteProtocolError as exc:
            trial.error, trial.detail = "error", self.redact(f"{type(exc).__name__}: {exc}")
            return trial.status is None
        except httpx.HTTPError as exc:
            trial.error, trial.detail = "error", self.redact(f"{type(exc).__name__}: {exc}")
        return False

    def _read_spans(self, trial: Trial, parent_id: int) -> None:
        spans = list(self.exporter.get_finished_spans())
        calls = [s for s in spans if s.kind == SpanKind.CLIENT and s.parent is not None
                 and s.parent.span_id == parent_id]
        _fill_from_calls(trial, calls, spans)

    def concurrent(self, level: int) -> list[Trial]:
        """``level`` requests released together by the bench's load core, in start order."""
        api, url, model, max_tokens = self._request
        load = workload.Workload(url, api, model, output_tokens=max_tokens, exact_output=False,
                                 timeout=self.timeout, prompt=PROMPT)
        span = RequestSpan(TRIAL_SPAN, {"llm.diagnose.kind": "concurrent", "llm.diagnose.concurrency": level},
                           "llm.diagnose.index")
        result = run_level(Level(concurrency=level, requests=level, seconds=self.timeout), load, self.headers,
                           tracer=self.tracer, span=span)
        first = min((r.sent for r in result.records), default=0.0)
        spans = list(self.exporter.get_finished_spans())
        return [self._trial_of(record, level, record.sent - first, spans) for record in result.records]

    def _trial_of(self, record: RequestRecord, level: int, start: float, spans: list[ReadableSpan]) -> Trial:
        trial = Trial(kind="concurrent", index=record.index, concurrency=level, start=start, status=record.status)
        if record.failure is not None:
            trial.error = _ERRORS.get(record.failure, "http_error" if record.failure.startswith("http_") else "error")
            trial.detail = self.redact(record.detail or record.failure)
        calls = [s for s in spans if s.kind == SpanKind.CLIENT and record.trace_id is not None
                 and format(s.context.trace_id, "032x") == record.trace_id]
        _fill_from_calls(trial, calls, spans)
        return trial


PATH_HEADERS = ("content-type", "content-encoding", "server", "via", "x-accel-buffering", "cache-control")


def path_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The response headers that point at an intermediary (a proxy's Server or Via, compression
    of an event stream, X-Accel-Buffering), each clipped."""
    return {name: str(headers[name])[:120] for name in PATH_HEADERS if name in headers}


def _fill_from_calls(trial: Trial, calls: list[ReadableSpan], spans: list[ReadableSpan]) -> None:
    """Fill ``trial`` from the last of its model-call spans (the attempt that counted); the error
    and status the request itself saw are kept."""
    if not calls:
        return
    call = max(calls, key=lambda span: span.start_time or 0)
    children = [s for s in spans if s.parent is not None and s.parent.span_id == call.context.span_id]
    error, status = trial.error, trial.status
    trial_from_spans(trial, call, children)
    trial.error = error
    if status is not None:
        trial.status = status


_ERRORS = {"timeout": "timeout", "unreachable": "unreachable", "broken_stream": "error", "error": "error"}
