"""Coverage-guided fuzzing of otel_llm's parsers with atheris (libFuzzer); not collected by pytest.

    .venv/bin/pip install atheris
    .venv/bin/python tests/parse/fuzz_atheris.py -atheris_runs=200000            # a bounded run
    .venv/bin/python tests/parse/fuzz_atheris.py -max_total_time=600 corpus/     # keep a growing corpus

Without a corpus directory argument, one seeded from the fixtures is made in the temp directory;
crash inputs are written there too (-artifact_prefix).

The corpus is seeded with every stream and body fixture under tests/fixtures. One input drives, per
the first bytes: the API, NDJSON or SSE, chunk and batch split points, optional TGI response headers,
and the bytes themselves. Each input goes through what a finished call goes through: StreamScanner
(batched, checked against one unbatched fold), parse_events on the first/last events, parse_body,
parse_request, runtime_counters and the attribute builders. Any exception, a non-finite or
mistyped value, or a scanner answer that depends on batching is reported as a crash.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["otel_llm"]):
    from otel_llm.telemetry.attributes import response_attributes
    from otel_llm.telemetry.runtime import runtime_attributes
    from otel_llm.parse.formats import stream_format
    from otel_llm.parse.framing import StreamScanner
    from otel_llm.parse.request import parse_request
    from otel_llm.parse.response import parse_body, parse_events
    from otel_llm.parse.runtimes import runtime_counters

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from otel_llm_testing.parse_fixtures import ALL_APIS  # noqa: E402
from tests.parse.test_fuzz import (  # noqa: E402
    BODY_FILES, STREAM_FILES, check_attributes, check_counters, check_request, check_response_info,
    check_scanner,
)

_HEADER_NAMES = ["x-compute-type", "x-compute-time", "x-total-time", "x-validation-time", "x-queue-time",
                 "x-inference-time", "x-time-per-token", "x-prompt-tokens", "x-generated-tokens"]


def _answer(scanner: StreamScanner) -> tuple:
    return (scanner.token_events, scanner.first_token_ns, scanner.last_token_ns, scanner.max_gap_ns,
            scanner.arrival_groups, scanner.bytes, scanner.first_event(), tuple(scanner.last_events()))


def test_one_input(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    api = ALL_APIS[fdp.ConsumeIntInRange(0, len(ALL_APIS) - 1)]
    ndjson = fdp.ConsumeBool()
    cuts = sorted({fdp.ConsumeIntInRange(0, 1 << 16) for _ in range(fdp.ConsumeIntInRange(0, 12))})
    batch = fdp.ConsumeIntInRange(1, 6)
    headers = None
    if fdp.ConsumeBool():
        headers = {name: fdp.ConsumeUnicodeNoSurrogates(12) for name in _HEADER_NAMES if fdp.ConsumeBool()}
    data = fdp.ConsumeBytes(fdp.remaining_bytes())

    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(points, points[1:]) if b > a] or [b""]
    times, now = [], 0
    for i in range(len(chunks)):  # arrival times with uneven gaps, as the capture layer records them
        now += 1000 + (i * 7919) % 3_000_000
        times.append(now)
    fmt = stream_format(api, "application/x-ndjson" if ndjson else "text/event-stream")
    whole = StreamScanner(fmt)
    whole.fold(times, chunks)
    check_scanner(whole, data, times)
    batched = StreamScanner(fmt)
    for start in range(0, len(chunks), batch):
        batched.fold(times[start:start + batch], chunks[start:start + batch])
    if _answer(batched) != _answer(whole):
        raise AssertionError(f"batching changed the answer: {_answer(batched)} != {_answer(whole)}")

    first = whole.first_event()
    for info in (parse_events(api, ([first] if first else []) + whole.last_events(), headers),
                 parse_body(api, data, headers, want_text=True)):
        check_response_info(info)
        info.runtime = info.runtime or "vllm"
        counters = runtime_counters(info, headers)
        check_counters(counters)
        attrs: dict = {}
        runtime_attributes(counters, attrs)
        response_attributes(info, attrs, capture_content=True)
        check_attributes(attrs)
    check_request(parse_request(api, data))


def _seed_corpus(args: list[str]) -> list[str]:
    """Add a corpus directory seeded with the fixtures when none is given."""
    scratch = Path(tempfile.gettempdir())
    if not any(a.startswith("-artifact_prefix=") for a in args):
        args = [*args, f"-artifact_prefix={scratch}/otel_llm_atheris_"]  # crash files: not in the repo
    if any(not a.startswith("-") for a in args[1:]):
        return args
    corpus = scratch / "otel_llm_atheris_corpus"
    corpus.mkdir(exist_ok=True)
    for path in STREAM_FILES + BODY_FILES:
        # prefix: API index 0, SSE/NDJSON by suffix, no cuts, batch 1, no headers
        prefix = bytes([0, path.suffix == ".ndjson", 0, 0, 0, 0])
        (corpus / f"{path.parent.name}_{path.name}").write_bytes(prefix + path.read_bytes())
    return [*args, str(corpus)]


def main() -> None:
    atheris.Setup(_seed_corpus(sys.argv), test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
