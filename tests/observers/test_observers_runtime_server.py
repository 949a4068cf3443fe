"""One server's polled state and the attributes its series carry."""

from __future__ import annotations

from otel_llm.observers._runtime_server import ServerState, server_attrs
from otel_llm.observers.registry import Server


def test_attributes_name_the_runtime_when_known() -> None:
    assert server_attrs(Server("h", 8000, None), None) == {"server.address": "h", "server.port": 8000}
    assert server_attrs(Server("h", 8000, None), "vllm")["llm.runtime.name"] == "vllm"


def test_each_state_has_its_own_back_off() -> None:
    first, second = ServerState(), ServerState()
    first.backoff.failed("/metrics", 0.0, 1.0)
    assert second.backoff.failures == {} and first.series is not second.series
