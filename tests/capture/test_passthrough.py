"""Property: whatever bytes a server streams, in whatever chunks, the application reads exactly
those bytes, no exception from otel_llm reaches it, and exactly one call span ends."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_llm_testing.otel import Otel
from otel_llm_testing.model_server import Plan, PlanServer

ROUTES = ["/v1/chat/completions", "/api/chat", "/completion", "/generate_stream", "/api/v1/chat", "/v1/messages"]
CONTENT_TYPES = ["text/event-stream", "application/x-ndjson", "application/json"]
_TOKENISH = st.sampled_from([b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', b"\n\n", b"\n", b"data:",
                             b'"content":"', b'{"done":true}\n', b"data: [DONE]\n\n", b"event: message.delta\n",
                             b'"text":"y"'])


@pytest.fixture(scope="module")
def server() -> Iterator[PlanServer]:
    srv = PlanServer()
    yield srv
    srv.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.one_of(st.binary(max_size=300), _TOKENISH), max_size=25),
       route=st.sampled_from(ROUTES), content_type=st.sampled_from(CONTENT_TYPES), stream=st.booleans())
@pytest.mark.slow
def test_bytes_pass_through_unchanged(server: PlanServer, otel: Otel, chunks: list[bytes], route: str,
                                      content_type: str, stream: bool) -> None:
    otel.clear()
    server.plans.append(Plan(200, [("content-type", content_type)], chunks))
    with httpx.Client() as client:
        if stream:
            with client.stream("POST", f"http://127.0.0.1:{server.port}{route}",
                               json={"model": "m", "stream": True}) as r:
                received = b"".join(r.iter_raw())
        else:
            received = client.post(f"http://127.0.0.1:{server.port}{route}", json={"model": "m"}).content
    assert received == b"".join(chunks)
    assert len(otel.calls()) == 1
