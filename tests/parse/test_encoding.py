"""Content decoding for parsing: header values, the codecs, data split anywhere, and input that is
truncated, corrupt or a bomb, which stops decoding (bounded) and never raises.

tests/capture/test_compression.py covers the decoder through real clients and the common cases
(two gzip members, raw deflate, stacked encodings, an unknown one, a one-chunk bomb)."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from otel_llm.parse.encoding import MAX_DECODED, Decoder, decoder_for, supported_encodings

MiB = 1024 * 1024
DATA = os.urandom(1500).hex().encode() + b"data: {}\n\n" * 50


def _decoder(encoding: str) -> Decoder:
    decoder = decoder_for(encoding)
    assert decoder is not None
    return decoder


def _decode_split(encoding: str, wire: bytes, cuts: list[int]) -> tuple[bytes, Decoder]:
    points = [0, *cuts, len(wire)]
    pieces = [wire[a:b] for a, b in zip(points, points[1:])]
    decoder = _decoder(encoding)
    _, chunks = decoder.decode(list(range(len(pieces))), pieces)
    return b"".join(chunks), decoder


def _sync_pieces(sizes: list[int]) -> list[bytes]:
    """One gzip stream, flushed after each piece so that piece i decodes to ``sizes[i]`` zero bytes."""
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    return [compressor.compress(b"\0" * size) + compressor.flush(zlib.Z_SYNC_FLUSH) for size in sizes]


@pytest.mark.parametrize("value", [None, "", "identity", "Identity", " identity , identity ", ",", " , "])
def test_nothing_to_undo(value: str | None) -> None:
    assert decoder_for(value) is None


@pytest.mark.parametrize("value", ["gzip", "x-gzip", "GZIP", " gzip ", "gzip,identity", "identity, Gzip"])
def test_gzip_spellings(value: str) -> None:
    decoder = _decoder(value)
    assert b"".join(decoder.decode([1], [gzip.compress(DATA)])[1]) == DATA and not decoder.broken


def test_one_unknown_encoding_in_a_list_makes_the_whole_body_undecodable() -> None:
    decoder = _decoder("gzip, x-custom")
    assert decoder.decode([1], [gzip.compress(DATA)]) == ([], []) and decoder.broken


def test_supported_encodings_start_with_the_zlib_ones() -> None:
    found = supported_encodings()
    assert found[:2] == ["gzip", "deflate"]
    assert set(found) <= {"gzip", "deflate", "br", "zstd"}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
@pytest.mark.parametrize("cuts", [[1], [2], [1, 2, 3], [10, 11], list(range(1, 40, 3))])
def test_any_split_decodes_to_the_same_bytes(encoding: str, cuts: list[int]) -> None:
    if encoding == "gzip":
        wire = gzip.compress(DATA)
    elif encoding == "deflate":
        wire = zlib.compress(DATA)  # zlib-wrapped: the header may arrive one byte at a time
    else:
        raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        wire, encoding = raw.compress(DATA) + raw.flush(), "deflate"
    out, decoder = _decode_split(encoding, wire, cuts)
    assert out == DATA and not decoder.broken


def test_two_gzip_members_meeting_at_a_chunk_boundary() -> None:
    first, second = gzip.compress(DATA[:700]), gzip.compress(DATA[700:])
    out, decoder = _decode_split("gzip", first + second, [len(first)])
    assert out == DATA and not decoder.broken


def test_empty_chunks_and_chunks_without_output_are_dropped_with_their_times() -> None:
    pieces = _sync_pieces([3, 0, 5])
    header_only = pieces[0][:10]  # the gzip header: no output yet
    decoder = _decoder("gzip")
    times, chunks = decoder.decode([1, 2, 3, 4, 5], [header_only, pieces[0][10:], b"", pieces[1], pieces[2]])
    assert times == [2, 5] and chunks == [b"\0" * 3, b"\0" * 5]


def test_a_fold_decodes_on_from_where_the_last_one_stopped() -> None:
    wire = gzip.compress(DATA)
    decoder = _decoder("gzip")
    first = decoder.decode([1], [wire[:300]])[1]
    second = decoder.decode([2], [wire[300:]])[1]
    assert b"".join(first + second) == DATA


def test_a_truncated_body_gives_what_arrived_and_never_raises() -> None:
    wire = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    body = wire.compress(DATA[:1000]) + wire.flush(zlib.Z_SYNC_FLUSH) + wire.compress(DATA[1000:]) + wire.flush()
    cut = len(body) - 40  # the connection dropped before the end
    out, decoder = _decode_split("gzip", body[:cut], [])
    assert DATA.startswith(out) and len(out) >= 1000
    assert not decoder.broken


@pytest.mark.parametrize("garbage", [b"\x00" * 20, b"not compressed at all", b"\x1f\x8b\x08" + b"\xff" * 30,
                                     os.urandom(64)])
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "gzip, deflate"])
def test_garbage_stops_decoding_without_an_error(garbage: bytes, encoding: str) -> None:
    decoder = _decoder(encoding)
    times, chunks = decoder.decode([1, 2], [garbage, garbage])
    assert decoder.broken and sum(map(len, chunks)) <= MAX_DECODED
    assert decoder.decode([3], [gzip.compress(DATA)]) == ([], [])  # gave up for good


def test_good_chunks_before_a_corrupt_one_are_kept() -> None:
    wire = gzip.compress(DATA)
    decoder = _decoder("gzip")
    times, chunks = decoder.decode([1, 2, 3], [wire, b"trailing garbage, not a gzip member", wire])
    assert decoder.broken and times == [1] and chunks == [DATA]


def test_output_is_bounded_across_the_chunks_of_one_fold() -> None:
    decoder = _decoder("gzip")
    times, chunks = decoder.decode(list(range(6)), _sync_pieces([MiB + 1] * 6))
    assert decoder.broken
    assert times == [0, 1, 2] and sum(map(len, chunks)) == 3 * (MiB + 1) <= MAX_DECODED


def test_the_bound_is_per_fold() -> None:
    pieces = _sync_pieces([3 * MiB, 3 * MiB])
    decoder = _decoder("gzip")
    assert sum(map(len, decoder.decode([1], pieces[:1])[1])) == 3 * MiB
    assert sum(map(len, decoder.decode([2], pieces[1:])[1])) == 3 * MiB
    assert not decoder.broken


def test_output_is_bounded_when_the_budget_runs_out_exactly() -> None:
    decoder = _decoder("gzip")
    _, chunks = decoder.decode(list(range(5)), _sync_pieces([MiB, MiB, MiB, MiB, 8 * MiB]))
    assert sum(map(len, chunks)) <= MAX_DECODED


def test_br_split_truncated_corrupt_and_bomb() -> None:
    brotli = pytest.importorskip("brotli")
    wire = brotli.compress(DATA)
    assert _decode_split("br", wire, [1, 5, 50])[0] == DATA
    out, decoder = _decode_split("br", wire[: len(wire) // 2], [])
    assert DATA.startswith(out) and not decoder.broken
    corrupt = _decoder("br")
    assert corrupt.decode([1], [b"\xff" * 40]) == ([], []) and corrupt.broken
    bomb = _decoder("br")
    assert bomb.decode([1], [brotli.compress(b"\0" * (MAX_DECODED + 1))]) == ([], []) and bomb.broken


def test_zstd_split_truncated_corrupt_and_bomb() -> None:
    zstandard = pytest.importorskip("zstandard")
    compressor = zstandard.ZstdCompressor()
    wire = compressor.compress(DATA)
    assert _decode_split("zstd", wire, [1, 4, 30])[0] == DATA
    out, decoder = _decode_split("zstd", wire[:-20], [])
    assert DATA.startswith(out) and not decoder.broken
    corrupt = _decoder("zstd")
    assert corrupt.decode([1], [b"\x00" * 40]) == ([], []) and corrupt.broken
    bomb = _decoder("zstd")
    assert bomb.decode([1], [compressor.compress(b"\0" * (MAX_DECODED + 1))]) == ([], []) and bomb.broken
