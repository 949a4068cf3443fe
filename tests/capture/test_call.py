"""LlmCall, the recording of one model call: what each timeline method writes, how chunks are
folded into the scanner or the bounded body, and that ``finish`` hands the sink one frozen
record, exactly once."""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading

import pytest

from otel_llm._log import reset_log_once
from otel_llm.capture import call as call_module
from otel_llm.capture.call import (
    END_CANCELLED, END_CLOSED, END_EOF, END_ERROR, END_GC, FOLD_BYTES, CallRecord, LlmCall, Timeline, TlsInfo,
)
from otel_llm.capture.record import MARKS
from otel_llm.parse import routes
from otel_llm.parse.formats import NDJSON, SSE
from otel_llm_testing.fake_sink import CHAT_ROUTE, SeamSink, call_request, open_call

OLLAMA = routes.Route(routes.API_OLLAMA_CHAT, routes.OP_CHAT, "ollama")


def test_call_request_fields_and_order() -> None:
    request = call_request(body=None)
    assert request._fields == ("method", "scheme", "host", "port", "path", "url", "headers", "body")
    assert request.port == 8080 and request.path == "/v1/chat/completions" and request.body is None
    assert request.url.endswith("?x=1")


def test_open_tells_the_sink_which_call_started() -> None:
    headers: dict[str, str] = {}
    sink = SeamSink()
    call = LlmCall.open(sink, CHAT_ROUTE, call_request(headers))
    assert sink.started == [call] and call.key == id(call)
    assert headers == {"traceparent": "00-x"}  # the sink writes trace context into the request's carrier
    assert call.timeline() == Timeline(call.t0, call.epoch0, 0) and not call.finished and not call.streaming
    assert call.route is CHAT_ROUTE and call.status == 0 and call.end_reason == ""


def test_each_timeline_method_stamps_its_own_mark_in_order() -> None:
    call, _ = open_call()
    steps = [(call.dns_started, "dns_start"), (call.dns_done, "dns_end"), (call.connect_started, "connect_start"),
             (lambda: call.connected(("10.0.0.1", 443)), "connect_end"), (call.tls_started, "tls_start"),
             (lambda: call.tls_done("TLSv1.3", "TLS_AES_128_GCM_SHA256", "h2"), "tls_end"),
             (call.request_started, "upload_start"), (call.request_sent, "body_sent"),
             (lambda: call.headers_received("2"), "headers")]
    stamped = []
    for step, name in steps:
        before = call_module.perf_ns()
        step()
        mark = getattr(call.timeline(), name)
        assert before <= mark <= call_module.perf_ns(), name
        stamped.append(mark)
    assert stamped == sorted(stamped)
    timeline = call.timeline()
    assert timeline.pool_start == timeline.pool_end == 0  # no pool wait happened
    assert sorted(MARKS) == sorted([name for _, name in steps] + ["pool_end", "pool_start"])
    assert call.peer == ("10.0.0.1", 443)
    assert call.tls == TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", "h2")
    assert call.http_version == "2"


def test_pool_wait_keeps_the_first_start_and_the_last_end() -> None:
    call, _ = open_call()
    call.pool_wait(100, 200)
    call.pool_wait(300, 450)
    assert (call.timeline().pool_start, call.timeline().pool_end) == (100, 450)


def test_peer_and_tls_details_are_not_lost() -> None:
    call, _ = open_call()
    call.connected(("127.0.0.1", 1))
    call.set_peer(None)  # a stack that cannot tell keeps what the socket said
    assert call.peer == ("127.0.0.1", 1)
    call.set_peer(("127.0.0.2", 2))
    assert call.peer == ("127.0.0.2", 2)
    call.tls_info("TLSv1.2", "c1", None)
    call.tls_info("TLSv1.3", "c2", "h2")  # only the first report of a connect-with-handshake counts
    assert call.tls == TlsInfo("TLSv1.2", "c1", None)
    call.tls_done("TLSv1.3", "c3", "http/1.1")  # a real TLS phase always wins
    assert call.tls == TlsInfo("TLSv1.3", "c3", "http/1.1")


def test_headers_received_without_a_version_keeps_the_known_one() -> None:
    call, _ = open_call()
    call.headers_received("1.1")
    call.headers_received(None)
    call.headers_received("")
    assert call.http_version == "1.1"


def test_response_started_keeps_an_earlier_headers_mark() -> None:
    call, _ = open_call()
    call.headers_received()
    first = call.timeline().headers
    call.response_started(200, {"Content-Type": "application/json"})
    assert call.timeline().headers == first
    other, _ = open_call()
    other.response_started(200, {})
    assert other.timeline().headers > 0


def test_response_started_lowercases_headers_and_picks_whole_body_parsing() -> None:
    call, _ = open_call()
    call.response_started(201, {"Content-Type": "Application/JSON", "X-Request-Id": "r1"})
    assert call.status == 201
    assert call.response_headers == {"content-type": "Application/JSON", "x-request-id": "r1"}
    assert call.content_type == "application/json"
    assert call.scanner is None and not call.streaming and call.decoder is None and call.captured is None


@pytest.mark.parametrize(("route", "content_type", "framing"), [
    (CHAT_ROUTE, "text/event-stream; charset=utf-8", SSE),
    (CHAT_ROUTE, "application/x-ndjson", NDJSON),
    (OLLAMA, "application/x-ndjson", NDJSON),
    (OLLAMA, "application/jsonl", NDJSON),
])
def test_a_stream_content_type_starts_the_scanner(route: routes.Route, content_type: str, framing: str) -> None:
    call, _ = open_call(route=route)
    call.response_started(200, {"Content-Type": content_type})
    assert call.streaming and call.scanner is not None
    assert call.scanner.fmt.framing == framing
    assert call.captured is None  # content capture is off in this sink


def test_captured_bytes_only_when_the_sink_captures_content() -> None:
    call, _ = open_call(SeamSink(capture_content=True))
    call.response_started(200, {"content-type": "text/event-stream"})
    assert call.captured == bytearray()
    whole, _ = open_call(SeamSink(capture_content=True))
    whole.response_started(200, {"content-type": "application/json"})
    assert whole.captured is None  # a whole body is parsed from call.body instead


def test_content_encoding_gets_a_decoder_unless_the_stack_already_decoded() -> None:
    call, _ = open_call()
    call.response_started(200, {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert call.decoder is not None
    decoded, _ = open_call()
    decoded.response_started(200, {"Content-Encoding": "gzip"}, decoded=True)
    assert decoded.decoder is None


def test_chunks_wait_for_the_fold_until_more_than_fold_bytes() -> None:
    call, _ = open_call()
    call.response_started(200, {"content-type": "application/json"})
    call.chunk(b"a" * (FOLD_BYTES - 1))
    call.chunk(b"b")
    assert call.pending == FOLD_BYTES and len(call.chunks) == 2 and call.body == []
    assert len(call.times) == 2 and call.times[0] <= call.times[1]
    call.chunk(b"c")  # one byte over: folded into the body
    assert call.pending == 0 and call.chunks == [] and call.times == []
    assert b"".join(call.body) == b"a" * (FOLD_BYTES - 1) + b"bc"


def test_fold_feeds_the_scanner_with_each_chunks_time() -> None:
    call, _ = open_call()
    call.response_started(200, {"content-type": "text/event-stream"})
    call.times[:] = [1_000, 2_000, 3_000]
    call.chunks[:] = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
                      b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n',
                      b'data: {"choices":[{"delta":{"content":"!"}}]}\n\ndata: [DONE]\n\n']
    call.fold()
    assert call.scanner is not None
    assert (call.scanner.token_events, call.scanner.first_token_ns, call.scanner.last_token_ns) == (2, 2_000, 3_000)
    assert call.body == [] and call.chunks == [] and call.times == []


def test_fold_decodes_a_compressed_body() -> None:
    call, _ = open_call()
    call.response_started(200, {"content-type": "application/json", "content-encoding": "gzip"})
    wire = gzip.compress(b'{"id":"x","choices":[]}')
    call.chunk(wire[:7])
    call.chunk(wire[7:])
    call.fold()
    assert b"".join(call.body) == b'{"id":"x","choices":[]}'


def test_captured_stream_bytes_stop_at_the_capture_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_module, "CAPTURE_BYTES", 10)
    call, _ = open_call(SeamSink(capture_content=True))
    call.response_started(200, {"content-type": "text/event-stream"})
    call.chunk(b"0123456")
    call.fold()
    call.chunk(b"789abcdef")
    call.fold()
    call.chunk(b"ghij")
    call.fold()
    assert call.captured == bytearray(b"0123456789")
    assert call.scanner is not None and call.scanner.bytes == 20  # the scanner still sees everything


def test_a_body_over_the_limit_is_dropped_and_stays_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_module, "BODY_LIMIT", 10)
    call, _ = open_call()
    call.response_started(200, {"content-type": "application/json"})
    call.chunk(b"0123456789")
    call.fold()
    assert b"".join(call.body) == b"0123456789" and not call.body_overflow  # exactly the limit is kept
    call.chunk(b"x")
    call.fold()
    assert call.body == [] and call.body_overflow
    call.chunk(b"y")
    call.fold()
    assert call.body == [] and call.chunks == [] and call.pending == 0


class _BrokenScanner:
    def fold(self, times: list[int], chunks: list[bytes]) -> None:
        raise ValueError("scanner bug")


def test_a_failing_scanner_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    reset_log_once()
    call, _ = open_call()
    call.scanner = _BrokenScanner()  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        for _ in range(2):
            call.chunk(b"data")
            call.fold()
    assert call.chunks == [] and call.times == [] and call.pending == 0
    assert [r.getMessage() for r in caplog.records].count(
        "otel_llm: scanning a response stream failed (further occurrences are not logged)") == 1


def test_the_anchor_pairs_the_call_start_with_the_wall_clock() -> None:
    before = call_module.perf_ns()
    call, _ = open_call()
    assert before <= call.t0 <= call_module.perf_ns()
    assert call.epoch0 > 1_600_000_000 * 10**9  # an epoch time in nanoseconds, not a perf counter


def test_finish_folds_what_is_left_then_hands_over_once() -> None:
    call, sink = open_call()
    call.response_started(200, {"content-type": "application/json"})
    call.chunk(b'{"a":')
    call.chunk(b"1}")
    call.finish(END_EOF, at_ns=123)
    call.finish(END_ERROR, ValueError("late"))
    call.finish_from_exception(GeneratorExit())
    assert sink.finished == [{"reason": END_EOF, "exception": None, "t_end": 123, "body": b'{"a":1}'}]
    assert call.finished and call.end_reason == END_EOF and call.t_end == 123 and call.chunks == []


def test_finish_without_a_time_stamps_now() -> None:
    call, _ = open_call()
    before = call_module.perf_ns()
    call.finish(END_CLOSED)
    assert before <= call.t_end <= call_module.perf_ns()


def test_the_sink_sees_the_exception_but_the_record_drops_it() -> None:
    call, sink = open_call()
    error = ConnectionResetError("peer reset")
    call.finish(END_ERROR, error)
    assert sink.finished[0]["exception"] is error
    assert call.exception is None  # a traceback kept here would keep the call alive forever


def test_a_failing_sink_is_logged_and_the_call_stays_finished(caplog: pytest.LogCaptureFixture) -> None:
    reset_log_once()
    call, sink = open_call(SeamSink(fail=True))
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        call.finish(END_EOF)
    assert call.finished and len(sink.finished) == 1
    assert any("finishing a model call failed" in r.getMessage() for r in caplog.records)
    call.finish(END_GC)
    assert len(sink.finished) == 1


def test_finish_from_inside_the_sink_does_not_deadlock_or_repeat() -> None:
    class Reentrant(SeamSink):
        def call_finished(self, record: CallRecord, state: object = None) -> None:
            super().call_finished(record)
            self.started[-1].finish(END_GC)  # e.g. the response collected while the sink runs

    call, sink = open_call(Reentrant())
    call.finish(END_EOF)
    assert [f["reason"] for f in sink.finished] == [END_EOF]


def test_racing_finishes_reach_the_sink_once() -> None:
    call, sink = open_call()
    barrier = threading.Barrier(8)
    reasons = [END_EOF, END_CLOSED, END_ERROR, END_GC] * 2

    def end(reason: str) -> None:
        barrier.wait()
        call.finish(reason)

    threads = [threading.Thread(target=end, args=(reason,)) for reason in reasons]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(sink.finished) == 1 and call.end_reason == sink.finished[0]["reason"]


@pytest.mark.parametrize(("exc", "reason", "kept"), [
    (GeneratorExit(), END_CLOSED, False),
    (asyncio.CancelledError(), END_CANCELLED, True),
    (OSError("boom"), END_ERROR, True),
    (KeyboardInterrupt(), END_ERROR, True),
])
def test_finish_from_exception_maps_the_way_the_call_ended(exc: BaseException, reason: str, kept: bool) -> None:
    call, sink = open_call()
    call.finish_from_exception(exc)
    assert sink.finished[0]["reason"] == reason
    assert sink.finished[0]["exception"] is (exc if kept else None)


def test_a_replaced_response_leaves_nothing_of_the_earlier_one() -> None:
    """``response_replaced`` resets every response-side field (one added to LlmCall later must be
    reset there too, or this fails)."""
    (fresh, _), (call, _) = open_call(), open_call()
    call.response_started(503, {"content-type": "text/event-stream", "content-encoding": "gzip"})
    call.chunk(b"x" * 100)
    call.fold()
    call.chunk(b"y")
    call.request_sent()
    sent = call.timeline().body_sent
    call.response_replaced()
    kept = {"sink", "route", "request", "t0", "epoch0", "t_end", "_marks", "peer", "tls", "http_version",
            "end_reason", "exception", "_lock", "_done", "__weakref__"}
    for name in LlmCall.__slots__:
        if name not in kept:
            assert getattr(call, name) == getattr(fresh, name), name
    assert call.timeline().body_sent == sent  # the timeline stays
