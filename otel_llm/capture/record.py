"""What capture hands the sink when a model call ends: one frozen record, made once.

:class:`CallRecord` holds the request, the :class:`Timeline` (each transport step by name, in
perf-counter nanoseconds), the response's head, the stream's statistics
(:class:`~otel_llm.parse.framing.StreamStats`) or the whole body, and how the call ended. They
are tuples: the sink reads them and cannot write back into capture's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Protocol

if TYPE_CHECKING:
    from otel_llm.parse.framing import StreamStats
    from otel_llm.parse.routes import Route

__all__ = [
    "CallRecord", "CallRequest", "HeaderCarrier", "Timeline", "TlsInfo",
    "END_CANCELLED", "END_CLOSED", "END_EOF", "END_ERROR", "END_EXIT", "END_GC", "END_UNTRACED",
]

# How a call ended (llm.client.end_reason).
END_EOF = "eof"
END_CLOSED = "closed"
END_CANCELLED = "cancelled"
END_ERROR = "error"
END_GC = "garbage_collected"
END_EXIT = "process_exit"
# otel_llm could not follow the response (a failure inside otel_llm, logged once): the call ends
# when its head arrived, and the application reads the body untraced
END_UNTRACED = "untraced"


class HeaderCarrier(Protocol):
    """Request headers as the seam uses them: read one, and set one (trace context)."""

    def get(self, name: str, default: Any = None) -> Any: ...

    def __setitem__(self, name: str, value: str) -> None: ...


class CallRequest(NamedTuple):
    """What an adapter hands over when a model call starts."""

    method: str
    scheme: str
    host: str
    port: int | None  # None: the scheme's default
    path: str  # decoded, without the query
    url: str  # the whole URL as sent
    headers: HeaderCarrier  # trace context is written here, before the request is sent
    body: bytes | None  # None: a streamed upload (not read); b"" when there is none


class TlsInfo(NamedTuple):
    version: str | None
    cipher: str | None
    alpn: str | None


class Timeline(NamedTuple):
    """When each step of a call happened, in perf-counter nanoseconds (0: it did not happen).

    ``pool_start``/``pool_end`` are set only when the request really queued for a pooled
    connection; ``connect_start`` is 0 on a reused connection."""

    start: int
    epoch: int  # wall-clock nanoseconds at ``start``
    end: int
    connect_start: int = 0
    dns_start: int = 0
    dns_end: int = 0
    connect_end: int = 0
    tls_start: int = 0
    tls_end: int = 0
    upload_start: int = 0  # the request head is about to be written
    body_sent: int = 0  # the whole request was handed to the network
    headers: int = 0  # the response head arrived
    pool_start: int = 0
    pool_end: int = 0

    def to_epoch(self, t_ns: int) -> int:
        """Wall-clock nanoseconds of a perf-counter time of this call."""
        return self.epoch + (t_ns - self.start)


# The order of Timeline's marks after (start, epoch, end), as capture records them.
MARKS = Timeline._fields[3:]


class CallRecord(NamedTuple):
    """One finished model call, as the sink receives it."""

    key: int  # tells this call from the others in progress (what the sink saw at call_started)
    route: Route
    request: CallRequest
    timeline: Timeline
    peer: tuple[str, int] | None
    tls: TlsInfo | None
    http_version: str | None
    status: int  # 0: no response head
    response_headers: Mapping[str, str]  # names in lower case
    stream: StreamStats | None  # None: not a streamed response
    body: bytes | None  # a non-streamed response's body; None when streamed or too large to parse
    captured: bytes | None  # the stream's leading bytes, kept only when content capture is on
    end_reason: str  # one of the END_* values
    exception: BaseException | None
