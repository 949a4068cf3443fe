"""The frozen record a finished call hands the sink: its timeline by name, the stream's
statistics or the whole body, and how the call ended."""

from __future__ import annotations

import pytest

from otel_llm.capture import call as call_module
from otel_llm.capture.call import END_EOF
from otel_llm.capture.record import MARKS, CallRecord, Timeline
from otel_llm.parse.formats import SSE
from otel_llm_testing.fake_sink import CHAT_ROUTE, SeamSink, open_call


def test_the_timeline_names_every_mark_once_after_start_epoch_and_end() -> None:
    assert Timeline._fields[:3] == ("start", "epoch", "end")
    assert MARKS == Timeline._fields[3:] and len(set(MARKS)) == len(MARKS) == 11
    assert Timeline(1, 2, 3) == (1, 2, 3) + (0,) * 11  # marks that did not happen are 0


def test_to_epoch_shifts_by_the_anchor() -> None:
    timeline = Timeline(5_000, 1_700_000_000_000_000_000, 0)
    assert timeline.to_epoch(5_000) == 1_700_000_000_000_000_000
    assert timeline.to_epoch(7_500) == 1_700_000_000_000_002_500
    assert timeline.to_epoch(4_000) == 1_699_999_999_999_999_000


def test_the_record_lists_what_telemetry_reads() -> None:
    assert CallRecord._fields == ("key", "route", "request", "timeline", "peer", "tls", "http_version", "status",
                                  "response_headers", "stream", "body", "captured", "end_reason", "exception")


def test_the_record_of_a_stream_carries_its_statistics_and_events() -> None:
    call, sink = open_call(SeamSink(capture_content=True))
    call.request_started()
    call.request_sent()
    call.response_started(200, {"Content-Type": "text/event-stream", "X-Request-Id": "r1"})
    frames = [b'data: {"id":"c1","choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
              b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n',
              b'data: {"choices":[{"delta":{"content":"!"}}]}\n\ndata: [DONE]\n\n']
    for frame in frames:
        call.chunk(frame)
    call.finish(END_EOF)
    record, = sink.records
    assert record.key == call.key and record.route is CHAT_ROUTE and record.status == 200
    assert record.response_headers == {"content-type": "text/event-stream", "x-request-id": "r1"}
    assert record.body is None and record.captured == b"".join(frames)
    stream = record.stream
    assert stream is not None and stream.format.framing == SSE
    assert (stream.chunks, stream.size, stream.token_events) == (3, len(b"".join(frames)), 2)
    assert 0 < stream.first_token_ns <= stream.last_token_ns <= record.timeline.end
    assert stream.events[0].startswith(b'data: {"id":"c1"') and stream.events[-1] == b"data: [DONE]"
    timeline = record.timeline
    assert timeline.start < timeline.upload_start <= timeline.body_sent <= timeline.headers <= timeline.end
    assert timeline.connect_start == 0  # a reused connection


def test_the_record_is_frozen() -> None:
    call, sink = open_call()
    call.finish(END_EOF)
    record = sink.records[0]
    with pytest.raises(AttributeError):
        record.status = 500  # type: ignore[misc]
    with pytest.raises(AttributeError):
        record.timeline.headers = 1  # type: ignore[misc]
    assert record.stream is None and record.body == b"" and record.captured is None


def test_the_record_of_an_overflowed_body_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_module, "BODY_LIMIT", 4)
    call, sink = open_call()
    call.response_started(200, {"content-type": "application/json"})
    call.chunk(b"0123456789")
    call.finish(END_EOF)
    assert sink.records[0].body is None  # too large to parse: nothing, rather than a truncated body
