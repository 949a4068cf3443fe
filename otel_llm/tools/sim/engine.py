"""The timing model: shared runtime state (load, slot, stats) and the generation driver."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from .scenario import SimConfig
from .formats.base import Timeline, Wire
from .httpio import BufferPolicy, ChunkedStream, Responder

__all__ = ["SimState", "Stats", "generate"]

log = logging.getLogger("otel_llm.sim")


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _sleep_until(deadline: float) -> None:
    # Absolute deadlines keep token spacing free of accumulated drift.
    delay = deadline - _now()
    if delay > 0:
        await asyncio.sleep(delay)


@dataclass
class Stats:
    requests: int = 0
    routes: Counter[str] = field(default_factory=Counter)
    generations: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    cold_starts: int = 0
    unloads: int = 0
    aborted: int = 0
    disconnects: int = 0
    errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "routes": dict(self.routes)}


class SimState:
    """Everything that outlives one request: config, model load state, the single slot, stats."""

    def __init__(self, config: SimConfig) -> None:
        self.initial = config
        self.config = config
        self.loaded = False
        self.stats = Stats()
        self.seq = 0
        self.requests_seen = 0  # generation requests since start or reset (fault_every counts them)
        self._load_lock = asyncio.Lock()
        self._slot_lock = asyncio.Lock()

    def reset(self) -> None:
        self.config = self.initial
        self.loaded = False
        self.stats = Stats()
        self.requests_seen = 0

    def unload(self) -> None:
        if self.loaded:
            self.stats.unloads += 1
        self.loaded = False

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def ensure_loaded(self, cfg: SimConfig, tl: Timeline | None = None) -> None:
        """Pay ``cold_delay`` once; concurrent arrivals wait for the same load."""
        if self.loaded:
            return
        started = _now()
        async with self._load_lock:
            if not self.loaded:
                if cfg.cold_delay > 0:
                    await asyncio.sleep(cfg.cold_delay)
                self.loaded = True
                self.stats.cold_starts += 1
        if tl is not None:
            tl.cold = True
            tl.load = _now() - started

    @asynccontextmanager
    async def slot(self, cfg: SimConfig, tl: Timeline) -> AsyncIterator[None]:
        """One generation at a time when serialized; the wait is recorded as queue time."""
        if cfg.concurrency != "serialized":
            yield
            return
        started = _now()
        async with self._slot_lock:
            tl.queue = _now() - started
            yield

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        stats = self.stats
        stats.generations += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            yield
        finally:
            stats.in_flight -= 1


async def generate(state: SimState, responder: Responder, wire: Wire) -> None:
    """Answer one generation request following the injected timings."""
    cfg, tl = wire.cfg, wire.tl
    state.requests_seen += 1
    faulty = state.requests_seen % max(1, cfg.fault_every) == 0
    if cfg.error_status and faulty:
        await _sleep_until(tl.arrival + cfg.headers_delay)
        state.stats.errors += 1
        await responder.send_json(cfg.error_status, wire.error_body(cfg.error_status))
        return
    with state.in_flight():
        await state.ensure_loaded(cfg, tl)
        async with state.slot(cfg, tl):
            tl.start = _now()
            sink = _StreamSink(responder, wire) if wire.stream else _UnarySink(responder, wire)
            if not await _drive(cfg, tl, sink, cfg.abort_after_tokens if faulty else None):
                state.stats.aborted += 1


async def _drive(cfg: SimConfig, tl: Timeline, sink: _StreamSink | _UnarySink, limit: int | None) -> bool:
    """Run the timeline; False when the response was aborted on purpose (after ``limit`` tokens)."""
    # Every deadline derives from the plan, not from when the previous step really ran,
    # so one late wake-up never shifts the events after it.
    headers_at = tl.start + cfg.headers_delay
    first_at = headers_at + cfg.first_token_delay
    await _sleep_until(headers_at)
    tl.headers = _now()
    await sink.open()
    await sink.keepalive_until(first_at)
    if limit == 0 or tl.tokens == 0:
        await _sleep_until(first_at)
        tl.first = tl.last = _now()
    if limit == 0:
        await sink.abort()
        return False
    for index in range(tl.tokens):
        await _sleep_until(first_at + index * cfg.token_interval)
        tl.mark_token(_now())
        await sink.token(index)
        if limit is not None and tl.emitted >= limit:
            await sink.abort()
            return False
    tl.end = _now()
    await sink.close()
    return True


class _StreamSink:
    """Frames go out as they happen (or in bursts when buffering is on)."""

    def __init__(self, responder: Responder, wire: Wire) -> None:
        self.responder = responder
        self.wire = wire
        self.pending: list[bytes] = []
        self.stream: ChunkedStream | None = None

    async def open(self) -> None:
        cfg = self.wire.cfg
        policy = BufferPolicy(cfg.buffer_flush_interval, cfg.buffer_flush_frames) if cfg.buffering else None
        self.stream = await self.responder.start_stream(200, self.wire.content_type, self.wire.stream_headers(), policy)
        if cfg.role_frame:
            await self.stream.send(self.wire.opening())
        elif self.wire.opening_required:
            self.pending = self.wire.opening()

    async def keepalive_until(self, deadline: float) -> None:
        interval = self.wire.cfg.keepalive_interval
        if interval <= 0:
            return
        tick = self.wire.tl.headers + interval
        while tick < deadline - 1e-6:  # no keep-alive on the first token's own instant
            await _sleep_until(tick)
            assert self.stream is not None
            await self.stream.send([self.wire.keepalive()])
            tick += interval

    async def token(self, index: int) -> None:
        await self._send(self.wire.token(index))

    async def close(self) -> None:
        await self._send(self.wire.closing())
        assert self.stream is not None
        await self.stream.finish()

    async def abort(self) -> None:
        assert self.stream is not None
        await self.stream.abort()

    async def _send(self, frames: list[bytes]) -> None:
        assert self.stream is not None
        frames, self.pending = self.pending + frames, []
        await self.stream.send(frames)


class _UnarySink:
    """Nothing is written until generation is done; then headers and body leave together."""

    def __init__(self, responder: Responder, wire: Wire) -> None:
        self.responder = responder
        self.wire = wire

    async def open(self) -> None:
        return None

    async def keepalive_until(self, deadline: float) -> None:
        return None

    async def token(self, index: int) -> None:
        return None

    async def close(self) -> None:
        headers, body = self.wire.unary()
        await self.responder.send_json(200, body, headers)

    async def abort(self) -> None:
        self.responder.abort()
