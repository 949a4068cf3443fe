"""The polls' HTTP client: short timeout, no proxies, made at the first request, closed if its own."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry import context

from otel_llm.observers import _runtime_client
from otel_llm.observers._runtime_client import PollClient, http_suppressed


def _client(seen: list[httpx.Request]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="ok")

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_a_given_client_is_used_and_left_open() -> None:
    seen: list[httpx.Request] = []
    given = _client(seen)
    poll = PollClient(given)
    assert poll.get("http://runtime:8000/metrics", "text/plain").text == "ok"
    assert seen[0].headers["accept"] == "text/plain"
    assert seen[0].extensions["timeout"]["read"] == _runtime_client.TIMEOUT
    poll.close()
    assert not given.is_closed
    given.close()


def test_its_own_client_is_made_at_the_first_request_without_proxies_and_closed() -> None:
    poll = PollClient()
    poll.close()  # nothing made yet: nothing to close
    assert poll._client is None
    made = poll._http()
    assert made.trust_env is False and made.timeout.read == _runtime_client.TIMEOUT
    poll.close()
    assert made.is_closed


def test_no_client_is_made_once_stopped() -> None:
    poll = PollClient(stopped=lambda: True)
    with pytest.raises(RuntimeError):
        poll.get("http://runtime:8000/metrics", "text/plain")
    assert poll._client is None


def test_http_instrumentation_is_suppressed_inside_only() -> None:
    key = getattr(context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)
    if key is None:
        pytest.skip("this OpenTelemetry API keeps the key elsewhere")
    with http_suppressed():
        assert context.get_value(key) is True
    assert not context.get_value(key)
