"""Incremental, bounded scanning of a streamed response.

The capture layer only appends ``(timestamp, chunk)`` pairs on the hot path. Every ~64 KiB (and
at the end) the pairs are folded here: the batch is joined once and scanned by the format's token
regex in C, which yields the first and last generated-token arrival times and the number of
token events without parsing JSON, and the time between consecutive output events (the metric
``time_per_output_chunk`` records one value each). Only the head (first events), the tail (last
events) and at most ``MAX_GAPS`` gaps are kept, so memory stays bounded on an endless stream.
:meth:`StreamScanner.stats` gives what was found as one frozen :class:`StreamStats` when the stream ends.
"""

from __future__ import annotations

import re

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from otel_llm.parse.formats import StreamFormat

__all__ = ["BODY_LIMIT", "GROUP_NS", "HEAD_BYTES", "MAX_GAPS", "StreamScanner", "StreamStats", "TAIL_BYTES"]

HEAD_BYTES = 16 * 1024
TAIL_BYTES = 32 * 1024
BODY_LIMIT = 8 * 1024 * 1024  # non-streamed bodies larger than this are not parsed
_OVERLAP = 128  # longer than any token marker, so a marker split across batches is still seen
_MAX_TAIL_EVENTS = 6
GROUP_NS = 1_000_000  # chunks closer than this arrived together (one burst)
MAX_GAPS = 16_384  # gaps between output events kept per stream (8 bytes each); later ones are not


class StreamStats(NamedTuple):
    """A finished stream, as scanned (times in perf-counter nanoseconds; 0: no token seen)."""

    format: StreamFormat
    chunks: int  # network chunks the application read
    size: int  # bytes
    token_events: int  # events that carried generated output
    first_token_ns: int
    last_token_ns: int
    max_gap_ns: int  # the longest silence from the first token on
    arrival_groups: int  # bursts of chunks (less than GROUP_NS apart) from the first token on
    events: tuple[bytes, ...]  # the first event, then the last few (metadata, usage, counters)
    # nanoseconds from each output event's arrival to the next one's (token_events - 1 of them,
    # up to MAX_GAPS); events that arrived in one network chunk are 0 apart
    gaps: Sequence[int] = ()


class StreamScanner:
    """Folds batches of timed chunks into first/last token times, counts and head/tail bytes."""

    __slots__ = (
        "fmt", "first_token_ns", "last_token_ns", "token_events", "chunks", "bytes",
        "max_gap_ns", "arrival_groups", "gaps", "_prev_ns", "_head", "_tail", "_overlap",
    )

    def __init__(self, fmt: StreamFormat) -> None:
        self.fmt = fmt
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.token_events = 0
        self.chunks = 0
        self.bytes = 0
        self.max_gap_ns = 0
        self.arrival_groups = 0  # bursts of chunks from the first token on
        self.gaps = array("q")
        self._prev_ns = 0
        self._head = b""
        self._tail = b""
        self._overlap = b""

    def fold(self, times: list[int], chunks: list[bytes]) -> None:
        """Account for one batch of chunks and the perf-counter times they arrived at."""
        if not chunks:
            return
        data = b"".join(chunks)
        self.chunks += len(chunks)
        self.bytes += len(data)
        if len(self._head) < HEAD_BYTES:
            self._head += data[: HEAD_BYTES - len(self._head)]
        self._tail = (self._tail + data)[-TAIL_BYTES:]
        self._scan_tokens(times, chunks, data)
        self._overlap = data[-_OVERLAP:] if len(data) >= _OVERLAP else (self._overlap + data)[-_OVERLAP:]

    def _scan_tokens(self, times: list[int], chunks: list[bytes], data: bytes) -> None:
        overlap = self._overlap
        skip = len(overlap)
        # the match objects are made in C; a Python loop over them would cost more than the scan
        matches = list(self.fmt.token.finditer(overlap + data))
        seen = 0
        while seen < len(matches) and matches[seen].end() <= skip:
            seen += 1  # seen whole in the previous batch
        count = len(matches) - seen
        if not count:
            self._note_gaps(times, 0 if self.first_token_ns else len(times))
            return
        first, last = matches[seen], matches[-1]
        ends = list(accumulate(map(len, chunks)))
        first_index = bisect_right(ends, first.end() - 1 - skip)
        last_index = bisect_right(ends, last.end() - 1 - skip)
        if count > 1 or self.first_token_ns:
            self._note_event_gaps(times, ends, matches, seen, skip)
        if not self.first_token_ns:
            self.first_token_ns = times[first_index]
            self._note_gaps(times, first_index)
        else:
            self._note_gaps(times, 0)
        self.last_token_ns = times[last_index]
        self.token_events += count

    def _note_event_gaps(self, times: list[int], ends: list[int], matches: list[re.Match[bytes]], seen: int,
                         skip: int) -> None:
        """The gap before each output event of this batch, from the previous output event (a walk
        along the chunks: cheaper than a search per event, or than C-level maps, measured)."""
        gaps = self.gaps
        room = MAX_GAPS - len(gaps)
        if room <= 0:
            return
        prev = self.last_token_ns  # 0 before the stream's first output event: it has no gap
        index = 0
        last = len(ends) - 1
        for match in matches[seen:seen + room + (0 if prev else 1)]:
            end = match.end() - 1 - skip
            while index < last and ends[index] <= end:  # the events come in order
                index += 1
            t = times[index]
            if prev:
                gaps.append(t - prev)
            prev = t

    def _note_gaps(self, times: list[int], start: int) -> None:
        """Track the longest silence and the arrival bursts, from the first generated token on."""
        if start >= len(times):
            return
        if start == 0 and self._prev_ns:
            prev = self._prev_ns
        else:
            prev = times[start]
            self.arrival_groups += 1  # the burst that carried the first token
        gap, groups = self.max_gap_ns, self.arrival_groups
        for t in times[start:]:
            delta = t - prev
            if delta > gap:
                gap = delta
            if delta > GROUP_NS:
                groups += 1
            prev = t
        self.max_gap_ns, self.arrival_groups = gap, groups
        self._prev_ns = prev

    def stats(self) -> StreamStats:
        """What the stream showed so far, as one frozen value."""
        first = self.first_event()
        events = ((first,) if first else ()) + tuple(self.last_events())
        return StreamStats(self.fmt, self.chunks, self.bytes, self.token_events, self.first_token_ns,
                           self.last_token_ns, self.max_gap_ns, self.arrival_groups, events, self.gaps)

    def first_event(self) -> bytes | None:
        """The first complete event of the stream (id, model and role live there)."""
        head = self._head.replace(b"\r\n", b"\n")
        for event in head.split(self.fmt.delimiter):
            if event.strip():
                return event
        return None

    def last_events(self) -> list[bytes]:
        """Up to the last few events (finish reason, usage and runtime counters live there)."""
        tail = self._tail.replace(b"\r\n", b"\n")
        parts = tail.split(self.fmt.delimiter)
        if len(self._tail) >= TAIL_BYTES and len(parts) > 1:
            parts = parts[1:]  # the first part was cut mid-event
        events: list[bytes] = []
        for part in reversed(parts):  # from the end: the tail holds hundreds of small events
            if part.strip():
                events.append(part)
                if len(events) == _MAX_TAIL_EVENTS:
                    break
        return events[::-1]
