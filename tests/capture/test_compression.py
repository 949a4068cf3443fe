"""A compressed answer is parsed from its decoded bytes (first token, tokens, native counters),
while the application still gets exactly what its client expects; bad encodings cost nothing."""

from __future__ import annotations

import gzip
import os
import zlib

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm.parse.encoding import MAX_DECODED, decoder_for
from otel_llm_testing.clients import CASES
from otel_llm_testing.otel import Otel
from otel_llm_testing.simulator import configure_sim

TOKENS = 8
# one case per transport and read style (httpx raw, aiohttp decoding itself, aiohttp under an
# httpx transport that leaves decoding to httpx, urllib3 under requests)
CLIENTS = [case for case in CASES if case.id in ("httpx", "aiohttp", "openai-aiohttp", "requests", "urllib3")]
NATIVE = (sc.LLM_RUNTIME_PROMPT_EVAL_DURATION, sc.LLM_RUNTIME_GENERATION_DURATION, sc.LLM_RUNTIME_GENERATION_TOKENS)


def _summary(otel: Otel) -> dict:
    call, kids = otel.one_call()
    attrs = call.attributes
    otel.clear()
    return {
        "phases": [k.name for k in kids if k.name not in (sc.SPAN_DNS, sc.SPAN_CONNECT)],
        "chunks": attrs.get(sc.LLM_CLIENT_CHUNKS),
        "tokens": attrs.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, attrs.get(sc.LLM_RUNTIME_GENERATION_TOKENS)),
        "runtime": attrs.get(sc.LLM_RUNTIME_NAME),
        "native": all(key in attrs for key in NATIVE),
        "ttft": attrs.get(sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN),
    }


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("case", CLIENTS, ids=[c.id for c in CLIENTS])
@pytest.mark.timing  # both TTFTs within 30 ms of each other
def test_compressed_stream_gives_the_same_telemetry(case, encoding: str, sim, otel: Otel) -> None:
    configure_sim(sim, tokens=TOKENS, first_token_delay=0.1, token_interval=0.01, runtime="llama.cpp")
    seen = {}
    for compression in ("off", encoding):
        configure_sim(sim, compression=compression)
        text = case.drive(sim.base_url, "m", True, 64)
        assert text == "".join(f"tok{i}" if i == 0 else f" tok{i}" for i in range(TOKENS))
        seen[compression] = _summary(otel)
    plain, compressed = seen["off"], seen[encoding]
    assert compressed["ttft"] == pytest.approx(plain["ttft"], abs=0.03)  # both about 0.1 s
    compressed.pop("ttft"), plain.pop("ttft")
    assert compressed == plain
    assert plain["chunks"] == TOKENS and plain["native"] and plain["runtime"] == "llama.cpp"


def test_the_transport_really_saw_compressed_bytes(sim) -> None:
    configure_sim(sim, tokens=3, compression="gzip", runtime="llama.cpp")
    with httpx.Client() as client:
        with client.stream("POST", f"{sim.base_url}/v1/chat/completions",
                           json={"model": "m", "stream": True, "messages": []}) as response:
            assert response.headers["content-encoding"] == "gzip"
            raw = b"".join(response.iter_raw())
    assert raw[:2] == b"\x1f\x8b" and b"tok0" in gzip.decompress(raw)


def test_compressed_whole_answer_is_parsed(sim, otel: Otel) -> None:
    configure_sim(sim, tokens=5, compression="gzip", runtime="ollama")
    httpx.post(f"{sim.base_url}/api/chat", json={"model": "m", "stream": False, "messages": [
        {"role": "user", "content": "hi"}]}).raise_for_status()
    call, _ = otel.one_call()
    assert call.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert call.attributes[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] > 0


# -- the decoder on its own ----------------------------------------------------------------------
def _decode(encoding: str, pieces: list[bytes]) -> bytes:
    decoder = decoder_for(encoding)
    assert decoder is not None
    times, chunks = decoder.decode(list(range(len(pieces))), pieces)
    assert times == sorted(times)
    return b"".join(chunks)


def test_decoder_keeps_each_pieces_arrival_time() -> None:
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    pieces = [compressor.compress(b"event %d\n" % i) + compressor.flush(zlib.Z_SYNC_FLUSH) for i in range(5)]
    pieces.append(compressor.flush())
    decoder = decoder_for("gzip")
    assert decoder is not None
    times, chunks = decoder.decode([10, 20, 30, 40, 50, 60], pieces)
    assert list(zip(times, chunks)) == [(10 * (i + 1), b"event %d\n" % i) for i in range(5)]


def test_decoder_handles_what_servers_send() -> None:
    data = os.urandom(3000).hex().encode()
    assert _decode("gzip", [gzip.compress(data[:100]) + gzip.compress(data[100:])]) == data  # two members
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert _decode("deflate", [raw.compress(data) + raw.flush()]) == data  # raw deflate, no zlib header
    assert _decode("deflate", [zlib.compress(data)]) == data
    assert _decode("identity, gzip", [gzip.compress(data)]) == data
    assert _decode("gzip, deflate", [zlib.compress(gzip.compress(data))]) == data  # applied in order
    assert decoder_for(None) is None and decoder_for("identity") is None and decoder_for("") is None


def test_br_and_zstd_with_their_codecs_installed() -> None:
    import brotli
    import zstandard

    from otel_llm.parse.encoding import supported_encodings

    assert supported_encodings() == ["gzip", "deflate", "br", "zstd"]
    data = os.urandom(2000).hex().encode()
    assert _decode("br", [brotli.compress(data)[:100], brotli.compress(data)[100:]]) == data
    frame = zstandard.ZstdCompressor().compress(data)
    assert _decode("zstd", [frame[:50], frame[50:]]) == data
    assert _decode("gzip, br", [brotli.compress(gzip.compress(data))]) == data


def test_bad_encodings_stop_decoding_without_an_error() -> None:
    unknown = decoder_for("x-unknown")
    assert unknown is not None and unknown.decode([1], [b"abc"]) == ([], []) and unknown.broken
    corrupt = decoder_for("gzip")
    assert corrupt is not None
    assert corrupt.decode([1, 2], [b"\x1f\x8bnot gzip", b"more"]) == ([], []) and corrupt.broken
    bomb = gzip.compress(b"\0" * (MAX_DECODED + 1024 * 1024))  # about 17 KB on the wire
    decoder = decoder_for("gzip")
    assert decoder is not None
    times, chunks = decoder.decode([1], [bomb])
    assert decoder.broken and sum(map(len, chunks)) <= MAX_DECODED


def test_a_bomb_through_a_client_keeps_the_response_and_bounded_memory(otel: Otel) -> None:
    """The application reads the raw bytes as sent; otel_llm stops decoding at its bound."""
    import tracemalloc

    from otel_llm_testing.model_server import Plan, PlanServer

    bomb = gzip.compress(b'{"model":"m","choices":[]}' + b" " * (64 * 1024 * 1024))  # 64 MiB decoded
    server = PlanServer()
    server.plans.append(Plan(200, [("content-type", "application/json"), ("content-encoding", "gzip")],
                             [bomb[i:i + 16384] for i in range(0, len(bomb), 16384)], chunked=False))
    try:
        tracemalloc.start()
        with httpx.Client() as client:
            with client.stream("POST", server.url("/v1/chat/completions"), json={"model": "m"}) as response:
                received = b"".join(response.iter_raw())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        server.close()
    assert received == bomb
    call, _ = otel.one_call()
    assert call.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert sc.GEN_AI_RESPONSE_MODEL not in call.attributes  # the body was given up on, not parsed
    assert peak < 3 * MAX_DECODED, peak  # never the 64 MiB the body decodes to
