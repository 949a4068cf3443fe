"""httpcore adapter, continued: time what httpcore emits no trace event for: DNS apart from TCP connect, and pool waits.

A request that finds every pooled connection busy blocks in ``PoolRequest.wait_for_connection``;
that wait is timed only when it really blocks (no connection assigned yet).

httpcore resolves inside ``connect_tcp`` (``socket.create_connection`` / anyio's happy eyeballs),
so there is no DNS event. During a model call, the backend's ``connect_tcp`` is given the
resolved addresses instead of the name: ``getaddrinfo`` is timed on its own, then each address is
tried in order, as ``create_connection`` does. TLS still uses the original host name for SNI and
certificate checks (httpcore passes it to ``start_tls`` separately). Outside model calls the
original method runs untouched.
"""

from __future__ import annotations

import ipaddress
import socket
from types import ModuleType
from typing import Any, Callable

from otel_llm.capture.call import CURRENT_CALL, perf_ns
from otel_llm.capture.hooks import ClassAttribute, Patch, SinkGetter, Stack, loaded, timed_wait

__all__ = ["is_ip", "patches", "stack"]


def _sync_pool_wait_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """wrapt wrapper for ``PoolRequest.wait_for_connection``: times a real wait for a connection."""
    call = CURRENT_CALL.get()
    if call is None or instance.connection is not None:
        return wrapped(*args, **kwargs)
    return timed_wait(call, wrapped, args, kwargs)


async def _async_pool_wait_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """wrapt wrapper for ``AsyncPoolRequest.wait_for_connection``."""
    call = CURRENT_CALL.get()
    if call is None or instance.connection is not None:
        return await wrapped(*args, **kwargs)
    start = perf_ns()
    try:
        return await wrapped(*args, **kwargs)
    finally:
        call.pool_wait(start, perf_ns())


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    rest = dict(kwargs)
    host = args[0] if len(args) > 0 else rest.pop("host")
    port = args[1] if len(args) > 1 else rest.pop("port")
    names = ("timeout", "local_address", "socket_options")
    for name, value in zip(names, args[2:]):
        rest[name] = value
    return host, port, rest


def _addresses(infos: list[Any]) -> list[str]:
    seen: list[str] = []
    for info in infos:
        address = info[4][0]
        if address not in seen:
            seen.append(address)
    return seen


def _sync_connect_wrapper(core: ModuleType) -> Callable[..., Any]:
    """wrapt wrapper for ``<core>.SyncBackend.connect_tcp``."""

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = CURRENT_CALL.get()
        if call is None:
            return wrapped(*args, **kwargs)
        host, port, rest = _split(args, kwargs)
        if is_ip(host):
            return wrapped(host, port, **rest)
        call.dns_started()
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:  # no end mark: the call ends inside the DNS phase
            raise core.ConnectError(str(exc)) from exc
        call.dns_done()
        return _connect_each(wrapped, _addresses(infos), port, rest, core)

    return wrapper


def _connect_each(wrapped: Any, addresses: list[str], port: int, rest: dict[str, Any], core: Any) -> Any:
    error: BaseException | None = None
    for address in addresses:
        try:
            return wrapped(address, port, **rest)
        except core.ConnectError as exc:
            error = exc
    raise error if error is not None else core.ConnectError("no address to connect to")


def _async_connect_wrapper(core: ModuleType) -> Callable[..., Any]:
    """wrapt wrapper for ``<core>.AnyIOBackend.connect_tcp``."""

    async def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = CURRENT_CALL.get()
        if call is None:
            return await wrapped(*args, **kwargs)
        host, port, rest = _split(args, kwargs)
        if is_ip(host):
            return await wrapped(host, port, **rest)
        import anyio

        call.dns_started()
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:  # no end mark: the call ends inside the DNS phase
            raise core.ConnectError(str(exc)) from exc
        call.dns_done()
        error: BaseException | None = None
        for address in _addresses(infos):
            try:
                return await wrapped(address, port, **rest)
            except core.ConnectError as exc:
                error = exc
        raise error if error is not None else core.ConnectError("no address to connect to")

    return wrapper


def patches(core: ModuleType, core_name: str) -> list[Patch]:
    """DNS and pool-wait timing for one httpcore-like module (already imported)."""
    return [
        Patch(core, "SyncBackend.connect_tcp", _sync_connect_wrapper(core)),
        Patch(core, "AnyIOBackend.connect_tcp", _async_connect_wrapper(core)),
        # private modules, imported by the package itself: pool waits are simply not timed where
        # they differ or are not imported
        Patch(loaded(f"{core_name}._sync.connection_pool"), "PoolRequest.wait_for_connection",
              _sync_pool_wait_wrapper),
        Patch(loaded(f"{core_name}._async.connection_pool"), "AsyncPoolRequest.wait_for_connection",
              _async_pool_wait_wrapper),
    ]


def stack(core_name: str) -> Stack:
    """The httpcore-like library ``core_name``, patched when it is imported."""

    def core_patches(get_sink: SinkGetter) -> list[Patch | ClassAttribute]:
        core = loaded(core_name)
        return list(patches(core, core_name)) if core is not None else []

    return Stack(core_name, (core_name,), core_patches)
