"""The stream scanner finds generated tokens in raw bytes, however the bytes are split."""

from __future__ import annotations

import itertools
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_llm.parse import routes
from otel_llm.parse.formats import stream_format
from otel_llm.parse.framing import MAX_GAPS, TAIL_BYTES, StreamScanner


def _sse(obj: object, space: bool = True) -> bytes:
    return b"data:" + (b" " if space else b"") + json.dumps(obj).encode() + b"\n\n"


def _openai_stream(n: int) -> list[bytes]:
    frames = [_sse({"id": "c1", "choices": [{"delta": {"role": "assistant", "content": ""}}]})]
    frames.append(b": keep-alive\n\n")
    frames += [_sse({"id": "c1", "choices": [{"delta": {"content": f"tok{i} "}}]}) for i in range(n)]
    frames.append(_sse({"id": "c1", "choices": [{"delta": {}, "finish_reason": "stop"}]}))
    frames.append(_sse({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}))
    frames.append(b"data: [DONE]\n\n")
    return frames


def _scan(frames: list[bytes], api: str = routes.API_OPENAI_CHAT, batch: int = 10_000) -> StreamScanner:
    scanner = StreamScanner(stream_format(api, "text/event-stream"))
    times = [1000 * (i + 1) for i in range(len(frames))]
    for start in range(0, len(frames), batch):
        scanner.fold(times[start:start + batch], frames[start:start + batch])
    return scanner


def test_role_keepalive_and_usage_frames_are_not_tokens() -> None:
    scanner = _scan(_openai_stream(5))
    assert scanner.token_events == 5
    assert scanner.first_token_ns == 3000  # third frame: after role and keep-alive
    assert scanner.last_token_ns == 7000


def test_batches_give_the_same_answer_as_one_pass() -> None:
    frames = _openai_stream(40)
    whole = _scan(frames)
    for batch in (1, 2, 3, 7):
        part = _scan(frames, batch=batch)
        assert (part.token_events, part.first_token_ns, part.last_token_ns, list(part.gaps)) == (
            whole.token_events, whole.first_token_ns, whole.last_token_ns, list(whole.gaps))
    assert list(whole.gaps) == [1000] * 39  # one per output event after the first


def test_gaps_run_from_output_event_to_output_event() -> None:
    """Role, keep-alive, finish and usage frames carry no output: no gap of their own; output events
    that arrived in one network chunk are 0 apart (time_per_output_chunk's values)."""
    frames = _openai_stream(5)  # role, keep-alive, tok0..tok4, finish, usage, [DONE]
    network = [frames[0], frames[1] + frames[2], frames[3] + frames[4] + frames[5], frames[6],
               b"".join(frames[7:])]
    scanner = StreamScanner(stream_format(routes.API_OPENAI_CHAT, "text/event-stream"))
    scanner.fold([10, 20, 45], network[:3])
    scanner.fold([70, 80], network[3:])
    stats = scanner.stats()
    assert stats.token_events == 5 and (stats.first_token_ns, stats.last_token_ns) == (20, 70)
    assert list(stats.gaps) == [25, 0, 0, 25]
    assert sum(stats.gaps) == stats.last_token_ns - stats.first_token_ns


def test_gaps_kept_are_bounded() -> None:
    frames = _openai_stream(MAX_GAPS + 50)
    scanner = _scan(frames, batch=4000)
    assert scanner.token_events == MAX_GAPS + 50
    assert len(scanner.gaps) == MAX_GAPS and set(scanner.gaps) == {1000}


def test_a_marker_split_across_chunks_counts_once_at_its_completing_chunk() -> None:
    frame = _sse({"choices": [{"delta": {"content": "hello"}}]})
    cut = frame.index(b'"hello"') - 3
    scanner = _scan([frame[:cut], frame[cut:], frame], batch=1)
    assert scanner.token_events == 2
    assert scanner.first_token_ns == 2000
    assert list(scanner.gaps) == [1000]


def test_max_gap_counts_from_the_first_token() -> None:
    scanner = StreamScanner(stream_format(routes.API_OPENAI_CHAT, "text/event-stream"))
    frames = _openai_stream(3)
    times = [0, 500_000_000, 600_000_000, 610_000_000, 900_000_000, 901_000_000, 902_000_000, 903_000_000]
    scanner.fold(times, frames)
    assert scanner.first_token_ns == 600_000_000
    assert scanner.max_gap_ns == 290_000_000  # not the 500 ms before the first token


def test_first_and_last_events_for_final_parsing() -> None:
    scanner = _scan(_openai_stream(3))
    first = scanner.first_event()
    assert first is not None and b'"role": "assistant"' in first
    last = scanner.last_events()
    assert last[-1] == b"data: [DONE]"
    assert b'"usage"' in last[-2]


def test_tail_is_bounded_on_an_endless_stream_without_delimiters() -> None:
    scanner = StreamScanner(stream_format(routes.API_OPENAI_CHAT, "text/event-stream"))
    blob = b"x" * 65536
    for i in range(200):
        scanner.fold([i], [blob])
    assert len(scanner._tail) <= TAIL_BYTES
    assert scanner.bytes == 200 * 65536
    assert scanner.token_events == 0


def test_ollama_ndjson_tokens() -> None:
    lines = [json.dumps({"message": {"role": "assistant", "content": c}, "done": False}).encode() + b"\n"
             for c in ("Hi", " there")]
    lines.append(json.dumps({"message": {"role": "assistant", "content": ""}, "done": True,
                             "eval_count": 2}).encode() + b"\n")
    scanner = StreamScanner(stream_format(routes.API_OLLAMA_CHAT, "application/x-ndjson"))
    scanner.fold([1, 2, 3], lines)
    assert scanner.token_events == 2
    assert scanner.last_events()[-1].startswith(b'{"message"')


def test_tgi_generate_stream_without_space_after_data() -> None:
    frames = [_sse({"index": i, "token": {"id": 10 + i, "text": f"t{i}", "logprob": -0.1, "special": False},
                    "generated_text": None, "details": None}, space=False) for i in range(4)]
    scanner = _scan(frames, api=routes.API_TGI_GENERATE_STREAM)
    assert scanner.token_events == 4


def test_lmstudio_named_events() -> None:
    frames = [b"event: chat.start\ndata: {}\n\n", b"event: prompt_processing.progress\ndata: {\"progress\":0.5}\n\n",
              b"event: message.delta\ndata: {\"content\":\"Hi\"}\n\n", b"event: chat.end\ndata: {}\n\n"]
    scanner = _scan(frames, api=routes.API_LMSTUDIO_V1_CHAT)
    assert scanner.token_events == 1 and scanner.first_token_ns == 3000


def test_anthropic_deltas() -> None:
    frames = [b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n',
              b'event: ping\ndata: {"type": "ping"}\n\n',
              b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
              b'"delta":{"type":"text_delta","text":"Hi"}}\n\n',
              b'event: message_stop\ndata: {"type":"message_stop"}\n\n']
    scanner = _scan(frames, api=routes.API_ANTHROPIC_MESSAGES)
    assert scanner.token_events == 1 and scanner.first_token_ns == 3000


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4096), cuts=st.lists(st.integers(0, 4096), max_size=20))
def test_random_bytes_and_splits_never_raise(data: bytes, cuts: list[int]) -> None:
    points = sorted({c for c in cuts if c <= len(data)} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(points, points[1:]) if b > a]
    scanner = _scan(chunks or [b""], batch=3)
    scanner.first_event()
    scanner.last_events()
    assert scanner.bytes == len(data)
    assert len(scanner.gaps) == max(0, scanner.token_events - 1) and min(scanner.gaps, default=0) >= 0


def test_stream_text_joins_deltas_per_api() -> None:
    from otel_llm.parse.content import stream_text

    data = b"".join(_openai_stream(3))
    assert stream_text(routes.API_OPENAI_CHAT, data, ndjson=False) == "tok0 tok1 tok2 "
    sglang = b"".join(_sse({"text": t, "meta_info": {}}) for t in ("a", "ab", "abc")) + b"data: [DONE]\n\n"
    assert stream_text(routes.API_TGI_GENERATE, sglang, ndjson=False) == "abc"
    ollama_lines = b"".join(json.dumps({"response": t, "done": False}).encode() + b"\n" for t in ("x", "y"))
    assert stream_text(routes.API_OLLAMA_GENERATE, ollama_lines, ndjson=True) == "xy"
    assert stream_text(routes.API_OPENAI_CHAT, b"data: {broken\n\n", ndjson=False) is None


# The token regexes as plain alternations, the readable reference for the trie forms in formats.
_REFERENCE = {
    routes.API_OPENAI_CHAT: rb'"(?:content|reasoning_content|reasoning|refusal)": ?"[^"]|"tool_calls": ?\[\{',
    routes.API_OLLAMA_CHAT: rb'"(?:content|thinking)": ?"[^"]|"tool_calls": ?\[\{',
    routes.API_GENERIC: (rb'"(?:content|reasoning_content|reasoning|refusal)": ?"[^"]|"tool_calls": ?\[\{'
                         rb'|"(?:text|response)": ?"[^"]'),
}
_KEYS = ["content", "reasoning_content", "reasoning", "refusal", "tool_calls", "thinking", "text", "response",
         "re", "reasoning_", "contents", "tool_call", "role", "t"]
_VALUES = ['"x"', '""', '"', '[{', '[]', '[', 'null', '"\\"', '{"a":1}']


def _assert_trie_matches_reference(data: bytes) -> None:
    for api, reference in _REFERENCE.items():
        fast = stream_format(api, "text/event-stream").token
        expected = [m.span() for m in re.finditer(reference, data)]
        assert [m.span() for m in fast.finditer(data)] == expected, (api, data)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.one_of(
    st.tuples(st.sampled_from(_KEYS), st.sampled_from([":", ": ", ":  "]), st.sampled_from(_VALUES)).map(
        lambda kv: f'"{kv[0]}"{kv[1]}{kv[2]}'.encode()),
    st.binary(max_size=8), st.sampled_from([b'"', b",", b"{", b"}", b"\n\n"]),
), max_size=30))
def test_trie_regexes_match_exactly_what_the_plain_alternations_match(parts: list[bytes]) -> None:
    _assert_trie_matches_reference(b"".join(parts))


def test_trie_regexes_agree_on_every_key_and_value_shape() -> None:
    for key, separator, value in itertools.product(_KEYS, [":", ": ", ":  "], _VALUES):
        _assert_trie_matches_reference(f'{{"{key}"{separator}{value}}}'.encode())
