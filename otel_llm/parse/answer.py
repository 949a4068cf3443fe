"""What a finished call's response said, read once into one value: :class:`Answer`.

The events or the body (ids, finish reasons, usage, error), the runtime's own counters and the
``Server-Timing`` header. Pure: the sink passes what capture recorded, gets an ``Answer`` back and
builds the call's telemetry from it (``otel_llm.telemetry.build``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from otel_llm.parse.content import stream_text
from otel_llm.parse.formats import NDJSON
from otel_llm.parse.framing import StreamStats
from otel_llm.parse.response import ResponseInfo, parse_body, parse_events
from otel_llm.parse.runtimes import RuntimeCounters, runtime_counters
from otel_llm.parse.server_timing import parse_server_timing

__all__ = ["Answer", "NO_ANSWER", "read_answer"]


class Answer(NamedTuple):
    """The response of one call, parsed."""

    response: ResponseInfo | None  # None: nothing to parse (no body, cancelled, too large)
    counters: RuntimeCounters | None  # the runtime's own account, when it gave one
    server_timing: Mapping[str, float] | None  # the Server-Timing header's durations, seconds


NO_ANSWER = Answer(None, None, None)


def read_answer(api: str, headers: Mapping[str, str], stream: StreamStats | None, body: bytes | None,
                captured: bytes | None, cancelled: bool, want_text: bool,
                runtime: Callable[[], str | None]) -> Answer:
    """Parse a finished call's response. ``stream``: the scanner's account of a streamed one,
    ``body``: a whole one's bytes, ``captured``: a stream's leading bytes (content capture on),
    ``cancelled``: the call was cancelled before its body was read. ``runtime`` names the
    runtime when the response does not say (vLLM's never do); it is asked only then."""
    response = None
    if stream is not None:
        response = parse_events(api, stream.events, headers)
        if captured is not None:
            response.output_text = stream_text(api, captured, stream.format.framing == NDJSON)
    elif body and not cancelled:
        response = parse_body(api, body, headers, want_text=want_text)
    counters = None
    if response is not None:
        response.runtime = response.runtime or runtime()
        if response.runtime or response.native:  # TGI's headers are in native too
            counters = runtime_counters(response, headers)
    timing = headers.get("server-timing")
    if response is None and timing is None:
        return NO_ANSWER
    return Answer(response, counters, parse_server_timing(timing) if timing else None)
