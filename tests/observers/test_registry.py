"""The set of model servers observers look at (otel_llm.observers.registry): configured servers,
servers seen in calls, what a later call may change, and when ``changed`` is signalled."""

from __future__ import annotations

import threading

import pytest

from otel_llm.observers.registry import Server, ServerRegistry


def by_address(registry: ServerRegistry) -> dict[tuple[str, int], Server]:
    return {(s.host, s.port): s for s in registry.servers()}


# --- Server -------------------------------------------------------------------------------------


def test_server_defaults() -> None:
    server = Server("127.0.0.1", 11434, "ollama")
    assert (server.scheme, server.configured) == ("http", False)


@pytest.mark.parametrize(("server", "url"), [
    (Server("127.0.0.1", 11434, "ollama"), "http://127.0.0.1:11434"),
    (Server("gpu-box", 443, None, "https"), "https://gpu-box:443"),
    (Server("::1", 8080, "vllm"), "http://[::1]:8080"),
    (Server("fe80::1", 8000, None, "https"), "https://[fe80::1]:8000"),
])
def test_base_url(server: Server, url: str) -> None:
    assert server.base_url == url


@pytest.mark.parametrize(("host", "local"), [
    ("localhost", True), ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("0.0.0.0", True),
    ("10.0.0.5", False), ("192.168.1.20", False), ("gpu-box", False), ("api.openai.com", False),
    ("::ffff:10.0.0.1", False), ("LOCALHOST.example.com", False),
])
def test_is_local(host: str, local: bool) -> None:
    assert Server(host, 1, None).is_local is local


# --- ServerRegistry -----------------------------------------------------------------------------


def test_an_empty_registry() -> None:
    registry = ServerRegistry()
    assert registry.servers() == []
    assert not registry.changed.is_set()


def test_a_noted_server_is_listed_with_its_runtime_and_scheme() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 11434, "ollama")
    registry.note("gpu-box", 443, "vllm", scheme="https")
    assert sorted(registry.servers()) == sorted([Server("127.0.0.1", 11434, "ollama", "http", False),
                                                 Server("gpu-box", 443, "vllm", "https", False)])
    assert registry.changed.is_set()


def test_a_server_is_listed_once_per_host_and_port() -> None:
    registry = ServerRegistry()
    for _ in range(3):
        registry.note("127.0.0.1", 8080, "llama.cpp")
    registry.note("127.0.0.1", 8081, "llama.cpp")
    registry.note("localhost", 8080, "llama.cpp")  # another name: another entry
    assert sorted((s.host, s.port) for s in registry.servers()) == [
        ("127.0.0.1", 8080), ("127.0.0.1", 8081), ("localhost", 8080)]


def test_a_server_of_unknown_runtime_is_listed_and_learns_it_later() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 8000, None)
    assert by_address(registry)[("127.0.0.1", 8000)].runtime is None
    registry.note("127.0.0.1", 8000, "vllm")
    assert by_address(registry)[("127.0.0.1", 8000)].runtime == "vllm"


def test_a_call_that_does_not_say_keeps_the_known_runtime() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 8000, "vllm")
    registry.note("127.0.0.1", 8000, None)  # e.g. a call to an OpenAI-compatible route
    assert by_address(registry)[("127.0.0.1", 8000)].runtime == "vllm"


def test_a_later_call_that_says_otherwise_replaces_a_seen_runtime() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 11434, "ollama")
    registry.note("127.0.0.1", 11434, "llama.cpp", scheme="https")
    assert by_address(registry)[("127.0.0.1", 11434)] == Server("127.0.0.1", 11434, "llama.cpp", "https", False)


def test_a_configured_server_keeps_its_runtime_and_scheme() -> None:
    registry = ServerRegistry()
    registry.configure("gpu-box", 8443, "vllm", scheme="https")
    registry.note("gpu-box", 8443, "ollama")  # what a call's route implied
    registry.note("gpu-box", 8443, None, scheme="http")
    assert registry.servers() == [Server("gpu-box", 8443, "vllm", "https", True)]


def test_configuring_overrides_what_calls_said() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 1234, "ollama")
    registry.configure("127.0.0.1", 1234, "lmstudio")
    assert registry.servers() == [Server("127.0.0.1", 1234, "lmstudio", "http", True)]


def test_changed_is_set_by_a_new_server_or_a_learned_runtime_only() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 8000, None)
    assert registry.changed.is_set()
    registry.changed.clear()
    registry.note("127.0.0.1", 8000, None)  # nothing new
    assert not registry.changed.is_set()
    registry.note("127.0.0.1", 8000, "vllm")  # its runtime learned
    assert registry.changed.is_set()
    registry.changed.clear()
    registry.note("127.0.0.1", 8000, "vllm")
    registry.note("127.0.0.1", 8000, None)
    assert not registry.changed.is_set()


def test_changed_is_set_by_configure_but_not_by_calls_to_a_configured_server() -> None:
    registry = ServerRegistry()
    registry.configure("127.0.0.1", 11434, "ollama")
    assert registry.changed.is_set()
    registry.changed.clear()
    registry.note("127.0.0.1", 11434, "llama.cpp")
    assert not registry.changed.is_set()


def test_servers_is_a_snapshot() -> None:
    registry = ServerRegistry()
    registry.note("127.0.0.1", 1, "ollama")
    snapshot = registry.servers()
    registry.note("127.0.0.1", 2, "ollama")
    assert len(snapshot) == 1 and len(registry.servers()) == 2


def test_concurrent_notes_lose_no_server() -> None:
    registry = ServerRegistry()

    def work(offset: int) -> None:
        for port in range(offset, offset + 200):
            registry.note("127.0.0.1", port, None)
            registry.note("127.0.0.1", port, "vllm")

    threads = [threading.Thread(target=work, args=(i * 100,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    servers = registry.servers()
    assert sorted(s.port for s in servers) == list(range(500))
    assert {s.runtime for s in servers} == {"vllm"}
