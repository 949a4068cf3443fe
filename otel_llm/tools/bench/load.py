"""The load core: streamed requests at a fixed concurrency (closed loop) or arrival rate (open loop,
Poisson), each one timed as ``vllm bench serve`` times it and traced as any call of the process.

One asyncio loop sends every request through one HTTP client (aiohttp where installed, else
httpx: ``transport``), which otel_llm instruments like any application's: each request is a
model call in the traces, under an ``otel_llm.bench.request`` span whose trace id the record
keeps. The generator watches itself: each request's lag (actual send time minus scheduled), the
process's CPU share and its event loop's punctuality (``selfwatch``) are recorded, and each stream
is judged for arriving in bursts (the rule of the SDK's ``llm.diagnosis.stream_buffered``), so a
report can say when the load generator, not the server, was the limit, and when a level's stream
timings cannot be trusted.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from opentelemetry import trace

from otel_llm.parse.content import event_text
from otel_llm.parse.formats import stream_format
from otel_llm.parse.framing import GROUP_NS, StreamStats
from otel_llm.parse.response import parse_events, parse_sse_event
from otel_llm.parse.routes import API_OPENAI_CHAT, API_OPENAI_COMPLETIONS
from otel_llm.telemetry import diagnosis
from otel_llm.tools.bench.selfwatch import LoopReport, LoopWatch
from otel_llm.tools.bench.transport import Transport, open_transport
from otel_llm.tools.bench.workload import Workload

__all__ = ["Level", "LevelResult", "RequestRecord", "RequestSpan", "run_level"]

REQUEST_SPAN = "otel_llm.bench.request"
MAX_FRAME_BYTES = 1024 * 1024  # a frame larger than this is not parsed (the stream is still read)
_LAST_EVENTS = 4  # events kept to read the usage from


class RequestSpan(NamedTuple):
    """The span each request runs under: its name, fixed attributes, and the attribute that gets
    the request's index."""

    name: str = REQUEST_SPAN
    attributes: Mapping[str, Any] = {}
    index_key: str = "llm.bench.index"


@dataclass
class RequestRecord:
    """One request's figures (seconds; None = not measured), vLLM's definitions."""

    index: int
    scheduled: float = 0.0  # after the level's start: open loop its arrival, closed loop the end of the one before
    sent: float = 0.0  # after the level's start
    ended: float | None = None  # after the level's start: the response's end (or the failure's)
    ttfb: float | None = None  # sent -> the response's head
    ttft: float | None = None  # sent -> first token chunk
    e2el: float | None = None  # sent -> last token chunk (vLLM's latency: not the usage chunk or [DONE])
    itl: list[float] = field(default_factory=list)  # every gap between consecutive token chunks
    output_tokens: int | None = None  # the runtime's count (usage), else content chunks
    input_tokens: int | None = None
    status: int | None = None
    failure: str | None = None  # None | http_<status> | timeout | broken_stream | unreachable | error
    detail: str | None = None
    trace_id: str | None = None
    retries: int = 0  # sent again after the server closed its kept-alive connection unanswered
    native: dict[str, Any] = field(default_factory=dict)  # the runtime's own llm.runtime.* figures
    burst: bool | None = None  # its tokens reached the bench in bursts (None: too short to judge)
    stalls: int = 0  # stalls of the bench's own event loop while it ran (selfwatch)
    stall_late: float = 0.0  # the longest of them: how late the loop woke (s)
    head_at: float | None = field(default=None, repr=False)  # perf-counter time of the head (set by the transport)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def lag(self) -> float:
        return max(0.0, self.sent - self.scheduled)

    @property
    def silence(self) -> float:
        """The stream's longest wait as read: between two token chunks, or from the head (else the
        send) to the first token."""
        first = (self.ttft or 0.0) - (self.ttfb or 0.0)
        return max([first, *self.itl])

    @property
    def stalled(self) -> bool:
        """Its loop stalled while it ran for at least half the stream's longest silence: the
        silence may be the bench's own, not the server's."""
        return self.stalls > 0 and self.stall_late >= 0.5 * self.silence

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1), for requests with more than one output token."""
        if self.e2el is None or self.ttft is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "tpot": self.tpot, "lag": self.lag}
        del out["head_at"]  # a clock reading of this process (ttfb is the figure)
        return out


@dataclass(frozen=True)
class Level:
    """One load level: ``concurrency`` requests in flight (closed loop), or arrivals at ``rate`` per
    second (open loop; ``math.inf``: all at once), for ``requests`` requests or ``seconds``."""

    concurrency: int | None = None
    rate: float | None = None
    requests: int = 32
    seconds: float = 60.0
    max_concurrency: int | None = None  # open loop: requests in flight at most (None: unbounded)

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        return "rate inf" if self.rate == math.inf else f"rate {self.rate:g}/s"


@dataclass
class LevelResult:
    level: Level
    records: list[RequestRecord] = field(default_factory=list)
    duration: float = 0.0  # first send to the last successful end
    cpu_share: float = 0.0  # the generator's CPU time / wall time (1.0 = one whole core)
    stopped: bool = False  # cut short (Ctrl-C, stop, or the time limit)
    interrupted: bool = False  # by Ctrl-C: no further level should run
    t0: float = 0.0
    memory: dict[str, Any] | None = None  # the server's peak memory meanwhile, where it was watched
    http_client: str | None = None  # the client the requests went through (transport.CLIENTS)
    loop: LoopReport | None = None  # how punctually the generator's event loop ran (selfwatch)


class _Stream:
    """Frames of one response as they arrive: content chunk times and the last events."""

    def __init__(self, workload: Workload) -> None:
        self.api, self.ndjson = workload.stream_api, workload.ndjson
        self.sep = b"\n" if self.ndjson else b"\n\n"
        self.buffer = b""
        self.first: bytes | None = None
        self.last: list[bytes] = []
        self.token_times: list[float] = []
        self.openai = self.api in (API_OPENAI_CHAT, API_OPENAI_COMPLETIONS)

    def feed(self, data: bytes, now: float) -> None:
        self.buffer += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        while True:
            frame, sep, rest = self.buffer.partition(self.sep)
            if not sep:
                if len(self.buffer) > MAX_FRAME_BYTES:
                    self.buffer = b""  # a frame too large to parse: dropped, the stream goes on
                return
            self.buffer = rest
            self._frame(frame, now)

    def _frame(self, frame: bytes, now: float) -> None:
        payload = frame if self.ndjson else parse_sse_event(frame)[1]
        if not payload or payload.strip() == b"[DONE]":
            return
        if self.first is None:
            self.first = frame
        self.last.append(frame)
        del self.last[:-_LAST_EVENTS]
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if isinstance(obj, dict) and self._is_token(obj):
            self.token_times.append(now)

    def _is_token(self, obj: dict[str, Any]) -> bool:
        """A chunk for a generated token. OpenAI-style: any chunk with a choice except the role
        chunk, as vLLM's bench counts (a token whose text is still a partial UTF-8 sequence, the
        finish chunk); the role chunk may come with the headers, before any token. Elsewhere: a
        chunk with generated text."""
        if not self.openai:
            return bool(event_text(self.api, obj))
        choices = obj.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return False
        delta = choices[0].get("delta")
        return not (isinstance(delta, dict) and "role" in delta and not delta.get("content"))


async def _one(client: Transport, workload: Workload, headers: Mapping[str, str], record: RequestRecord,
               t0: float, tracer: trace.Tracer, spec: RequestSpan) -> None:
    url, payload = workload.request()
    stream = _Stream(workload)
    attributes = {**spec.attributes, spec.index_key: record.index}
    clock = time.perf_counter

    def feed(data: bytes) -> None:
        stream.feed(data, clock())

    with tracer.start_as_current_span(spec.name, attributes=attributes) as span:
        context = span.get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else None
        start = clock()
        record.sent = start - t0
        await client.send(url, payload, headers, record, feed)
        record.ended = clock() - t0
    _finish(record, workload, stream, start)


def _finish(record: RequestRecord, workload: Workload, stream: _Stream, start: float) -> None:
    times = stream.token_times
    if stream.first is not None:
        info = parse_events(workload.stream_api, [stream.first] + stream.last)
        record.input_tokens = info.input_tokens
        record.output_tokens = info.output_tokens if info.output_tokens else len(times)
    if record.failure is None and not times:
        record.failure, record.detail = "broken_stream", "no token chunk"
    if record.failure is not None:
        return
    record.ttft = times[0] - start
    # vLLM's bench ends a request at its last token chunk: the usage chunk, [DONE] and closing the
    # response (where the instrumentation ends the call) come after and are not generation time
    record.e2el = times[-1] - start
    record.itl = [b - a for a, b in zip(times, times[1:])]
    if record.head_at is not None:
        record.ttfb = record.head_at - start
    record.burst = judge_burst(times, record.head_at, start, workload)


def judge_burst(times: list[float], head_at: float | None, sent: float, workload: Workload) -> bool | None:
    """Whether a stream's tokens reached the reader in bursts, by the SDK's own rule
    (``otel_llm.telemetry.diagnosis.stream_buffered``, diagnose's buffering verdict): several
    tokens per burst after silences, all at once, or held back and released with the response's
    head. ``times``: the token chunks' arrival (perf-counter s; chunks read together share one)."""
    ns = [round(t * 1e9) for t in times]
    if len(ns) < 2:
        return None
    groups, gap = 1, 0
    for before, now in zip(ns, ns[1:]):
        delta = now - before
        gap = max(gap, delta)
        groups += delta > GROUP_NS
    fmt = stream_format(workload.stream_api, "application/x-ndjson" if workload.ndjson else "text/event-stream")
    stats = StreamStats(fmt, len(ns), 0, len(ns), ns[0], ns[-1], gap, groups, ())
    head_ns = round(head_at * 1e9) if head_at is not None else 0
    held = diagnosis.held_back(stats, head_ns, round(sent * 1e9), None)
    return diagnosis.stream_buffered(stats, held)


def _arrivals(level: Level, seed: int) -> list[float]:
    """Open loop: the scheduled send times (s after the start), Poisson at ``level.rate``."""
    if level.rate is None or level.rate <= 0:
        raise ValueError("an open-loop level needs a rate > 0")
    if level.rate == math.inf:
        return [0.0] * level.requests
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(level.requests):
        out.append(t)
        t += rng.expovariate(level.rate)
    return out


async def _run(result: LevelResult, workload: Workload, headers: Mapping[str, str], seed: int,
               stop: threading.Event, progress: Callable[[int], None], tracer: trace.Tracer,
               spec: RequestSpan, http_client: str) -> None:
    level = result.level
    done = 0
    watching = _watch_ctrl_c(result, stop)
    client = open_transport(http_client, workload.timeout)
    result.http_client = client.name
    watch = LoopWatch()
    try:
        t0 = result.t0 = time.perf_counter()
        watch.start()
        deadline = t0 + level.seconds

        async def run_one(index: int, scheduled: float) -> RequestRecord:
            nonlocal done
            record = RequestRecord(index, scheduled=scheduled)
            result.records.append(record)
            await _one(client, workload, headers, record, t0, tracer, spec)
            done += 1
            progress(done)
            return record

        if level.concurrency is not None:
            await _closed(level, run_one, t0, deadline, stop)
        else:
            await _open(level, _arrivals(level, seed), run_one, t0, deadline, stop)
        result.stopped = stop.is_set() or time.perf_counter() > deadline
    finally:
        result.loop = await watch.stop()
        await client.close()
        if watching:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)


def _watch_ctrl_c(result: LevelResult, stop: threading.Event) -> bool:
    """Ctrl-C during the level marks it interrupted, sets ``stop`` and cancels the level, from the
    event loop's own signal handler: whatever the loop is running when the signal comes, the
    interruption is recorded (not left to where a KeyboardInterrupt would land). False where the
    loop cannot take signals (not the main thread, or no signal support)."""
    main = asyncio.current_task()

    def interrupted() -> None:
        result.interrupted = True
        stop.set()
        if main is not None:
            main.cancel()

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


async def _closed(level: Level, run_one: Callable[[int, float], Any], t0: float, deadline: float,
                  stop: threading.Event) -> None:
    counter = iter(range(level.requests))

    async def worker() -> None:
        due = time.perf_counter() - t0
        for index in counter:
            if stop.is_set() or time.perf_counter() >= deadline:
                return
            # due when the previous response ended: the lag is the generator's own time in between
            record = await run_one(index, due)
            due = record.ended if record.ended is not None else time.perf_counter() - t0

    await _bounded([asyncio.ensure_future(worker()) for _ in range(level.concurrency or 1)], deadline)


async def _open(level: Level, arrivals: list[float], run_one: Callable[[int, float], Any], t0: float,
                deadline: float, stop: threading.Event) -> None:
    gate = asyncio.Semaphore(level.max_concurrency) if level.max_concurrency else None
    tasks: list[asyncio.Future[None]] = []

    async def limited(index: int, at: float) -> None:
        if gate is None:
            await run_one(index, at)
            return
        async with gate:
            await run_one(index, at)

    try:
        for index, at in enumerate(arrivals):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop.is_set() or time.perf_counter() >= deadline:
                break
            tasks.append(asyncio.ensure_future(limited(index, at)))
    except asyncio.CancelledError:
        await _cancel(tasks)
        raise
    await _bounded(tasks, deadline)


async def _bounded(tasks: list[asyncio.Future[None]], deadline: float) -> None:
    """Wait for ``tasks`` until the level's time limit plus a grace for the requests in flight; the
    ones still running then (or at Ctrl-C) are cancelled and awaited, so none is left behind."""
    if not tasks:
        return
    try:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()) + 30.0)
    finally:
        await _cancel(tasks)
    for task in tasks:  # a bug of the load core itself is not silently a short level
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def _cancel(tasks: list[asyncio.Future[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _tracer() -> trace.Tracer:
    """otel_llm's own tracer while it is instrumented (the calls' providers), else the global one."""
    from otel_llm import current_session

    session = current_session()
    return session.tracer() if session is not None else trace.get_tracer("otel_llm.bench")


def run_level(level: Level, workload: Workload, headers: Mapping[str, str] | None = None, *, seed: int = 0,
              stop: threading.Event | None = None, progress: Callable[[int], None] = lambda done: None,
              tracer: trace.Tracer | None = None, span: RequestSpan = RequestSpan(),
              http_client: str = "auto") -> LevelResult:
    """Run one level on a fresh event loop until its requests are done, its time is up or ``stop``
    is set. Ctrl-C ends it early too: what was measured is returned, ``interrupted`` set.
    ``http_client``: "auto" (aiohttp where installed, else httpx), "aiohttp" or "httpx"."""
    result = LevelResult(level)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        asyncio.run(_run(result, workload, headers or {}, seed, stop or threading.Event(), progress,
                         tracer or _tracer(), span, http_client))
    except KeyboardInterrupt:
        result.stopped = result.interrupted = True
    except asyncio.CancelledError:  # the level cancelled by its own Ctrl-C handler
        if not result.interrupted:
            raise
    result.stopped = result.stopped or result.interrupted
    wall = time.perf_counter() - wall0
    result.cpu_share = (time.process_time() - cpu0) / wall if wall > 0 else 0.0
    result.records.sort(key=lambda r: r.index)
    if result.loop is not None:
        for record in result.records:
            end = record.ended if record.ended is not None else time.perf_counter() - result.t0
            record.stalls, record.stall_late = result.loop.stalls_within(result.t0 + record.sent, result.t0 + end)
    finished = [r for r in result.records if r.e2el is not None]
    if result.records:
        first = min(r.sent for r in result.records)
        result.duration = max((r.sent + (r.e2el or 0.0) for r in finished), default=first) - first
    return result
