"""The httpcore DNS and pool-wait hooks (``otel_llm.capture.httpcore_dns``): resolution timed apart
from the TCP connect during model calls only, connection attempts exactly as without otel_llm (the
sync backend's addresses in order, each with the whole timeout; anyio's happy eyeballs under one
timeout), and pool waits timed only when a request really queues."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import httpcore
import httpcore2
import httpx
import pytest

from otel_llm.capture import httpcore_dns
from otel_llm.capture import install
from otel_llm.capture.install import _is_ours, _layers
from otel_llm.capture.call import CURRENT_CALL, END_ERROR, CallRequest, LlmCall
from otel_llm.capture.shared import Patch
from otel_llm.parse import routes
from otel_llm_testing.fake_sink import CHAT, CHAT_PATH, NAME, addrinfo
from otel_llm_testing.fake_sink import FakeSink as _Sink
from otel_llm_testing.model_server import ModelServer



def _call() -> tuple[LlmCall, _Sink]:
    sink = _Sink()
    request = CallRequest("POST", "http", NAME, 80, CHAT_PATH, f"http://{NAME}{CHAT_PATH}", {}, b"{}")
    return LlmCall.open(sink, routes.match_route(CHAT_PATH), request), sink  # type: ignore[arg-type]


@contextlib.contextmanager
def _current(call: LlmCall | None) -> Iterator[None]:
    token = CURRENT_CALL.set(call)
    try:
        yield
    finally:
        CURRENT_CALL.reset(token)


class _Backend:
    """Stands for the original ``connect_tcp``: records each attempt, fails the listed hosts."""

    def __init__(self, fail: dict[str, BaseException] | None = None) -> None:
        self.fail = fail or {}
        self.attempts: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def _attempt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        self.attempts.append((args, kwargs))
        error = self.fail.get(args[0])
        if error is not None:
            raise error
        return f"stream to {args[0]}"

    def sync(self, *args: Any, **kwargs: Any) -> str:
        return self._attempt(args, kwargs)

    async def async_(self, *args: Any, **kwargs: Any) -> str:
        await asyncio.sleep(0)
        return self._attempt(args, kwargs)


def _connect(is_async: bool, backend: _Backend, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the adapter's ``connect_tcp`` wrapper for httpcore over ``backend``."""
    if is_async:
        return asyncio.run(httpcore_dns._async_connect_wrapper(backend.async_, None, args, kwargs))
    return httpcore_dns._sync_connect_wrapper(httpcore)(backend.sync, None, args, kwargs)


BOTH = pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])


# -- helpers -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", True), ("::1", True), ("fe80::1%eth0", True), ("2001:db8::8a2e:370:7334", True),
    ("localhost", False), ("[::1]", False), ("", False), ("1.2.3", False), ("256.1.1.1", False), (NAME, False),
])
def test_is_ip(host: str, expected: bool) -> None:
    assert httpcore_dns.is_ip(host) is expected


def test_split_names_the_positional_arguments_and_keeps_the_callers_kwargs() -> None:
    kwargs = {"socket_options": [(1, 2, 3)]}
    assert httpcore_dns._split((NAME, 443, 5.0, "10.0.0.2"), kwargs) == (
        NAME, 443, {"timeout": 5.0, "local_address": "10.0.0.2", "socket_options": [(1, 2, 3)]})
    assert kwargs == {"socket_options": [(1, 2, 3)]}  # a copy was changed, not the caller's dict
    named = {"host": NAME, "port": 80, "timeout": None}
    assert httpcore_dns._split((), named) == (NAME, 80, {"timeout": None})
    assert named == {"host": NAME, "port": 80, "timeout": None}
    infos = [(socket.AF_INET6, 1, 6, "", ("::1", 80, 0, 0)), (socket.AF_INET, 1, 6, "", ("127.0.0.1", 80)),
             (socket.AF_INET6, 2, 17, "", ("::1", 80, 0, 0)), (socket.AF_INET, 2, 17, "", ("127.0.0.1", 80))]
    assert httpcore_dns._addresses(infos) == ["::1", "127.0.0.1"]  # the resolver's order, once each


# -- the connect wrappers, called directly -------------------------------------------------------
@BOTH
def test_outside_a_model_call_the_backend_gets_its_arguments_untouched(resolver: dict[str, list[str]],
                                                                       is_async: bool) -> None:
    backend = _Backend()
    with _current(None):
        assert _connect(is_async, backend, (NAME, 80), {"timeout": 3.0}) == f"stream to {NAME}"
    assert backend.attempts == [((NAME, 80), {"timeout": 3.0})]
    assert resolver["asked"] == []  # resolution left to the backend itself


def test_an_ip_literal_is_connected_to_without_resolving(resolver: dict[str, list[str]]) -> None:
    call, _ = _call()
    backend = _Backend()
    with _current(call):
        _connect(False, backend, ("::1",), {"port": 8080, "timeout": 1.0, "local_address": None})
    assert backend.attempts == [(("::1", 8080), {"timeout": 1.0, "local_address": None})]
    assert resolver["asked"] == []
    assert call.timeline().dns_start == call.timeline().dns_end == 0


def test_a_sync_model_call_resolves_apart_then_tries_each_address_in_order(resolver: dict[str, list[str]]) -> None:
    resolver[NAME] = ["10.0.0.7", "10.0.0.7", "10.0.0.8", "10.0.0.9"]
    call, _ = _call()
    backend = _Backend(fail={"10.0.0.7": httpcore.ConnectError("refused")})
    with _current(call):
        result = _connect(False, backend, (NAME, 8443, 2.5), {"socket_options": []})
    assert result == "stream to 10.0.0.8"  # the first address that connects; the rest are not tried
    assert backend.attempts == [(("10.0.0.7", 8443), {"timeout": 2.5, "socket_options": []}),
                                (("10.0.0.8", 8443), {"timeout": 2.5, "socket_options": []})]
    assert resolver["asked"] == [NAME]
    t = call.timeline()
    assert 0 < t.dns_start <= t.dns_end


def test_a_connect_timeout_on_one_address_moves_on_to_the_next(resolver: dict[str, list[str]]) -> None:
    """httpcore maps a socket timeout to ConnectTimeout, which is not a ConnectError: it moves on
    all the same, as ``socket.create_connection`` (httpcore without otel_llm) does."""
    resolver[NAME] = ["2001:db8::1", "127.0.0.1"]  # e.g. an IPv6 address whose packets are dropped
    backend = _Backend(fail={"2001:db8::1": httpcore.ConnectTimeout("timed out")})
    call, _ = _call()
    with _current(call):
        assert _connect(False, backend, (NAME, 80), {"timeout": 1.0}) == "stream to 127.0.0.1"
    assert [args for args, _ in backend.attempts] == [("2001:db8::1", 80), ("127.0.0.1", 80)]
    assert [kwargs for _, kwargs in backend.attempts] == [{"timeout": 1.0}] * 2  # each the whole timeout


@pytest.mark.parametrize("last", [httpcore.ConnectError("second refused"), httpcore.ConnectTimeout("timed out")],
                         ids=["refused", "timed-out"])
def test_when_no_address_connects_the_last_failure_is_raised(resolver: dict[str, list[str]],
                                                             last: Exception) -> None:
    resolver[NAME] = ["10.0.0.7", "10.0.0.8"]
    backend = _Backend(fail={"10.0.0.7": httpcore.ConnectTimeout("first timed out"), "10.0.0.8": last})
    call, _ = _call()
    with _current(call), pytest.raises(type(last)) as raised:
        _connect(False, backend, (NAME, 80), {})
    assert raised.value is last and len(backend.attempts) == 2
    with pytest.raises(httpcore.ConnectError, match="no address"):  # a resolver that answered nothing
        httpcore_dns._connect_each(_Backend().sync, [], 80, {}, httpcore)


def _infos(*ips: str) -> list[tuple[Any, ...]]:
    return [addrinfo(ip, 8443) for ip in ips]


def test_the_async_backend_keeps_its_arguments_and_only_its_own_lookup_is_timed() -> None:
    """In a model call, ``AnyIOBackend.connect_tcp`` still gets the name (anyio resolves and
    connects as without otel_llm); the anyio lookup of that host and port inside it is timed, once:
    not the local address's, not a second one, not one outside the connect."""
    call, _ = _call()
    marks: list[tuple[str, int, int]] = []

    async def getaddrinfo(host: Any, port: Any, **kwargs: Any) -> Any:  # stands for anyio's
        await asyncio.sleep(0)
        return _infos("10.0.0.7")

    lookup = functools.partial(httpcore_dns._anyio_getaddrinfo_wrapper, getaddrinfo, None)

    async def backend(*args: Any, **kwargs: Any) -> Any:  # stands for AnyIOBackend.connect_tcp
        for host, port in (("10.0.0.2", None), (NAME, 8443), (NAME, 8443)):  # local address, host, again
            await lookup((host, port), {"type": socket.SOCK_STREAM})
            t = call.timeline()
            marks.append((host, t.dns_start, t.dns_end))
        return args, kwargs

    async def run() -> Any:
        with _current(call):
            result = await httpcore_dns._async_connect_wrapper(backend, None, (NAME, 8443, 2.5), {"socket_options": []})
            assert httpcore_dns._RESOLVING.get() is None
        assert await lookup((NAME, 8443), {}) == _infos("10.0.0.7")  # outside the connect: untouched
        return result

    assert asyncio.run(run()) == ((NAME, 8443, 2.5), {"socket_options": []})
    (_, local_start, _), (_, start, end), (_, again_start, again_end) = marks
    assert local_start == 0 and 0 < start <= end and (again_start, again_end) == (start, end)
    assert call.timeline().dns_start == start


def test_a_failed_async_lookup_leaves_the_call_inside_dns() -> None:
    call, _ = _call()
    error = socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    async def getaddrinfo(host: Any, port: Any, **kwargs: Any) -> Any:
        raise error

    async def backend(host: str, port: int, **kwargs: Any) -> Any:
        return await httpcore_dns._anyio_getaddrinfo_wrapper(getaddrinfo, None, (host, port), {})

    with _current(call), pytest.raises(socket.gaierror) as raised:
        asyncio.run(httpcore_dns._async_connect_wrapper(backend, None, (NAME, 80), {}))
    assert raised.value is error  # anyio's own error: httpcore maps it as without otel_llm
    t = call.timeline()
    assert t.dns_start > 0 and t.dns_end == 0


# -- the real backends: the same outcome with or without otel_llm ------------------------------
HANG = ("192.0.2.1", "192.0.2.2")  # TEST-NET addresses, made to time out below
REFUSED = "192.0.2.9"  # made to refuse below
SCENARIOS = pytest.mark.parametrize("addresses", [
    pytest.param((HANG[0], "127.0.0.1"), id="timeout-then-listening"),
    pytest.param((REFUSED, HANG[0], "127.0.0.1"), id="refused-timeout-listening"),
    pytest.param(HANG, id="all-time-out"),
    pytest.param((REFUSED, HANG[1]), id="refused-then-timeout"),
    pytest.param((HANG[0], REFUSED), id="timeout-then-refused"),
])


@pytest.fixture
def listener() -> Iterator[int]:
    """A port listening on 127.0.0.1 only (connections wait in the backlog)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield int(server.getsockname()[1])


def _outcome(connect: Any) -> str:
    try:
        stream = connect()
    except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
        return type(exc).__name__
    peer = stream.get_extra_info("server_addr")
    stream.close()
    return f"connected to {peer[0]}"


@SCENARIOS
def test_the_sync_backend_connects_as_without_otel_llm(sink: _Sink, resolver: dict[str, list[str]],
                                                       listener: int, monkeypatch: pytest.MonkeyPatch,
                                                       addresses: tuple[str, ...]) -> None:
    """``socket.create_connection`` tries each address in turn, each with the whole timeout, and
    moves on after any failure: the instrumented backend does the same, DNS timed apart."""
    resolver[NAME] = list(addresses)
    attempts: list[str] = []
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        attempts.append(address[0])
        if address[0] in HANG:
            raise TimeoutError("timed out")  # what a connect with a timeout raises when it expires
        if address[0] == REFUSED:
            raise ConnectionRefusedError(111, "Connection refused")
        real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    backend = httpcore.SyncBackend()
    results = []
    for call in (None, _call()[0]):
        attempts.clear()
        with _current(call):
            outcome = _outcome(lambda: backend.connect_tcp(NAME, listener, timeout=1.0))
        results.append((outcome, list(attempts)))
    assert results[0] == results[1], results
    assert results[0] == ("connected to 127.0.0.1" if "127.0.0.1" in addresses
                          else "ConnectTimeout" if addresses[-1] in HANG else "ConnectError", list(addresses))
    t = call.timeline()  # type: ignore[union-attr]
    assert 0 < t.dns_start <= t.dns_end


@SCENARIOS
def test_the_async_backend_connects_as_without_otel_llm(sink: _Sink, resolver: dict[str, list[str]],
                                                        listener: int, monkeypatch: pytest.MonkeyPatch,
                                                        addresses: tuple[str, ...]) -> None:
    """anyio's ``connect_tcp``: one lookup, happy eyeballs (the next address 250 ms after the last
    attempt began, or as soon as it failed) and httpcore's single timeout around all of it: the
    instrumented backend connects the same way within the same time, its lookup timed apart."""
    from anyio._backends._asyncio import AsyncIOBackend

    resolver[NAME] = list(addresses)
    attempts: list[str] = []
    real_connect = AsyncIOBackend.connect_tcp

    async def connect_tcp(cls: Any, host: str, port: int, local_address: Any = None) -> Any:
        attempts.append(host)
        if host in HANG:
            await anyio.sleep_forever()
        if host == REFUSED:
            raise ConnectionRefusedError(111, "Connection refused")
        return await real_connect(host, port, local_address)

    monkeypatch.setattr(AsyncIOBackend, "connect_tcp", classmethod(connect_tcp))
    timeout = 0.6
    results, elapsed = [], []
    for call in (None, _call()[0]):
        attempts.clear()
        resolver["asked"].clear()

        async def run() -> str:
            with _current(call):
                stream: Any = None

                async def connect() -> Any:
                    nonlocal stream
                    stream = await httpcore.AnyIOBackend().connect_tcp(NAME, listener, timeout=timeout)

                try:
                    await connect()
                except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                    return type(exc).__name__
                peer = stream.get_extra_info("server_addr")
                await stream.aclose()
                return f"connected to {peer[0]}"

        started = time.monotonic()
        results.append((asyncio.run(run()), list(attempts), list(resolver["asked"])))
        elapsed.append(time.monotonic() - started)
    assert results[0] == results[1], results
    outcome, tried, asked = results[1]
    assert asked == [NAME]  # resolved once, by anyio itself
    assert outcome == ("connected to 127.0.0.1" if "127.0.0.1" in addresses
                       else "ConnectTimeout" if set(addresses) & set(HANG) else "ConnectError")
    assert elapsed[1] < 2 * timeout, elapsed  # one timeout for all the addresses, not one each
    t = call.timeline()  # type: ignore[union-attr]
    assert 0 < t.dns_start <= t.dns_end


# -- through httpx ---------------------------------------------------------------------------------
@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer(tokens=2, first_token_delay=0.0, token_interval=0.0) as server:
        yield server


def _post(is_async: bool, url: str, method: str = "POST") -> httpx.Response:
    if not is_async:
        with httpx.Client() as client:
            return client.request(method, url, json=CHAT if method == "POST" else None)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.request(method, url, json=CHAT if method == "POST" else None)

    return asyncio.run(run())


@BOTH
def test_a_model_call_by_host_name_times_dns_inside_connect(sink: _Sink, model_server: ModelServer,
                                                            resolver: dict[str, list[str]],
                                                            is_async: bool) -> None:
    """The name resolves to an address the server does not listen on first (IPv6 loopback: refused, or
    unreachable without IPv6), then to the server's."""
    resolver[NAME] = ["::1", "127.0.0.1"]
    response = _post(is_async, model_server.url(CHAT_PATH, host=NAME))
    assert response.status_code == 200 and response.json()["choices"]
    record = sink.one()
    assert record.request.host == NAME and model_server.requests[-1].headers["host"].startswith(NAME)
    assert record.peer == ("127.0.0.1", model_server.port)  # the second address
    t = record.timeline
    assert 0 < t.connect_start <= t.dns_start <= t.dns_end <= t.connect_end <= t.upload_start
    assert resolver["asked"][0] == NAME


def test_the_sync_backend_is_handed_addresses_in_model_calls_only(sink: _Sink, model_server: ModelServer,
                                                                 resolver: dict[str, list[str]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    resolver[NAME] = ["::1", "127.0.0.1"]
    targets: list[tuple[Any, ...]] = []
    real = socket.create_connection

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        targets.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)  # what httpcore's SyncBackend calls
    _post(False, model_server.url(CHAT_PATH, host=NAME))
    port = model_server.port
    assert targets == [("::1", port), ("127.0.0.1", port)]
    targets.clear()
    assert _post(False, model_server.url("/v1/models", host=NAME), method="GET").status_code == 200
    assert targets == [(NAME, port)]  # not a model call: the backend resolves, as without otel_llm
    assert len(sink.records) == 1


@BOTH
def test_a_name_that_does_not_resolve_ends_the_call_inside_dns(sink: _Sink, resolver: dict[str, list[str]],
                                                               is_async: bool) -> None:
    resolver[NAME] = []
    with pytest.raises(httpx.ConnectError) as raised:  # what httpx raises for it without otel_llm too
        _post(is_async, f"http://{NAME}:9{CHAT_PATH}")
    assert isinstance(raised.value.__cause__, httpcore.ConnectError)  # the adapter's, as the backend's would be
    assert "not known" in str(raised.value)  # the resolver's own message
    record = sink.one()
    assert record.end_reason == END_ERROR and record.exception is raised.value
    t = record.timeline
    assert 0 < t.connect_start <= t.dns_start and t.dns_end == t.connect_end == t.upload_start == 0


# -- pool waits, and what is patched --------------------------------------------------------------
def test_pool_waits_are_timed_only_when_no_connection_is_assigned() -> None:
    waited: list[str] = []

    def wait(timeout: float | None = None) -> str:
        waited.append("sync")
        return "connection"

    async def await_(timeout: float | None = None) -> str:
        waited.append("async")
        return "connection"

    assigned, queued = SimpleNamespace(connection=object()), SimpleNamespace(connection=None)
    for is_async in (False, True):
        for instance, timed in ((assigned, False), (queued, True)):
            call, _ = _call()
            with _current(call):
                if is_async:
                    result = asyncio.run(httpcore_dns._async_pool_wait_wrapper(await_, instance, (), {"timeout": 1}))
                else:
                    result = httpcore_dns._sync_pool_wait_wrapper(wait, instance, (), {"timeout": 1})
            t = call.timeline()
            assert result == "connection"
            assert (0 < t.pool_start <= t.pool_end) is timed and (t.pool_start == 0) is (not timed)
    with _current(None):  # outside a model call: nothing to time
        assert httpcore_dns._sync_pool_wait_wrapper(wait, queued, (), {}) == "connection"
    assert waited == ["sync", "sync", "async", "async", "sync"]


@pytest.mark.parametrize("core", [httpcore, httpcore2], ids=["httpcore", "httpcore2"])
def test_every_hook_names_a_method_of_the_installed_library(core: Any) -> None:
    """A renamed private class or function would silently stop DNS or pool-wait timing: each
    target must exist."""
    hooks = httpcore_dns.patches(core, core.__name__)
    assert [p.target for p in hooks] == ["SyncBackend.connect_tcp", "AnyIOBackend.connect_tcp",
                                         "PoolRequest.wait_for_connection", "AsyncPoolRequest.wait_for_connection",
                                         "getaddrinfo"]
    for patch in hooks:
        assert isinstance(patch, Patch) and patch.module is not None, patch.target
        owner, _, method = patch.target.rpartition(".")
        assert callable(getattr(getattr(patch.module, owner) if owner else patch.module, method)), patch.target
    assert hooks[-1].module.__name__ == "anyio._core._sockets"
    stack = httpcore_dns.stack(core.__name__)
    assert stack.modules == (core.__name__,) and len(stack.patches(lambda: None)) == 5


def test_anyio_is_hooked_once_for_both_httpcores(sink: _Sink) -> None:
    """httpcore and httpcore2 both ask for the anyio lookup hook: it is installed once, and removed."""
    from anyio._core import _sockets

    assert install.patched_stacks() >= {"httpcore", "httpcore2"}
    assert [_is_ours(layer) for layer in _layers(_sockets, "getaddrinfo")] == [True]
    assert httpcore_dns._anyio_patches() == []  # already there: not asked for again
    install.deactivate()
    assert list(_layers(_sockets, "getaddrinfo")) == []
    install.activate(lambda: sink)
    assert [_is_ours(layer) for layer in _layers(_sockets, "getaddrinfo")] == [True]
