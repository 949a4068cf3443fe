"""httpcore adapter, continued: time what httpcore emits no trace event for: DNS apart from TCP connect, and pool waits.

A request that finds every pooled connection busy blocks in ``PoolRequest.wait_for_connection``;
that wait is timed only when it really blocks (no connection assigned yet).

httpcore resolves inside ``connect_tcp``, so there is no DNS event. During a model call, DNS is
timed apart from the TCP connect while the connection attempts keep the library's own semantics:

* sync (``SyncBackend``: ``socket.create_connection``): the backend's ``connect_tcp`` is given the
  resolved addresses instead of the name: ``getaddrinfo`` is timed on its own, then each address
  is tried in order, each with the whole timeout, moving on after any failure (refused,
  unreachable or timed out: ``ConnectError`` or ``ConnectTimeout``) and raising the last one, as
  ``create_connection`` does.
* async (``AnyIOBackend``: ``anyio.connect_tcp``): the backend gets its arguments untouched, so
  anyio's happy eyeballs and httpcore's single ``fail_after(timeout)`` around resolution and every
  attempt stay as they are; the ``getaddrinfo`` that ``anyio.connect_tcp`` awaits for that host
  is timed instead (a hook on ``anyio._core._sockets.getaddrinfo``, a no-op outside such a
  connect). Where a later anyio resolves some other way, DNS is simply not timed apart.

TLS still uses the original host name for SNI and certificate checks (httpcore passes it to
``start_tls`` separately). Outside model calls the original methods run untouched.
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
from types import ModuleType
from typing import Any, Callable

from otel_llm.capture.call import CURRENT_CALL, LlmCall, perf_ns
from otel_llm.capture.shared import ClassAttribute, Patch, SinkGetter, Stack, loaded, timed_wait

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
    """Each address in turn, as ``socket.create_connection`` does: any failed attempt (httpcore maps
    a socket timeout to ``ConnectTimeout``, other ``OSError``s to ``ConnectError``) moves on to the
    next address, and the last failure is raised."""
    error: BaseException | None = None
    for address in addresses:
        try:
            return wrapped(address, port, **rest)
        except (core.ConnectError, core.ConnectTimeout) as exc:
            error = exc
    raise error if error is not None else core.ConnectError("no address to connect to")


# Inside an AnyIOBackend.connect_tcp of a model call, until anyio resolves its host: the call,
# the host and the port that resolution is for.
_RESOLVING: contextvars.ContextVar[tuple[LlmCall, Any, Any] | None] = contextvars.ContextVar(
    "otel_llm_resolving", default=None
)


async def _async_connect_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """wrapt wrapper for ``<core>.AnyIOBackend.connect_tcp``: the backend runs with its own
    arguments; anyio's lookup of the host is timed by ``_anyio_getaddrinfo_wrapper``."""
    call = CURRENT_CALL.get()
    if call is None:
        return await wrapped(*args, **kwargs)
    host = args[0] if args else kwargs.get("host")
    port = args[1] if len(args) > 1 else kwargs.get("port")
    token = _RESOLVING.set((call, host, port))
    try:
        return await wrapped(*args, **kwargs)
    finally:
        _RESOLVING.reset(token)


async def _anyio_getaddrinfo_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """wrapt wrapper for ``anyio._core._sockets.getaddrinfo`` (the name ``anyio.connect_tcp``
    calls): times the lookup of the host a model call's ``connect_tcp`` is connecting to, once
    (not the local address's, nor any other lookup)."""
    target = _RESOLVING.get()
    if target is None or args[:2] != target[1:]:
        return await wrapped(*args, **kwargs)
    call = target[0]
    _RESOLVING.set(None)  # once: the connect wrapper restores the variable when it returns
    call.dns_started()
    result = await wrapped(*args, **kwargs)  # a failure: no end mark, the call ends inside DNS
    call.dns_done()
    return result


def _hooked_by_us(function: Any) -> bool:
    return bool(getattr(getattr(function, "_self_wrapper", None), "_otel_llm_hook", False))


def _anyio_patches() -> list[Patch]:
    """The anyio lookup hook, once for httpcore and httpcore2 together (each stack asks for it)."""
    sockets = loaded("anyio._core._sockets")
    if sockets is None or _hooked_by_us(getattr(sockets, "getaddrinfo", None)):
        return []
    return [Patch(sockets, "getaddrinfo", _anyio_getaddrinfo_wrapper)]


def patches(core: ModuleType, core_name: str) -> list[Patch]:
    """DNS and pool-wait timing for one httpcore-like module (already imported)."""
    return [
        Patch(core, "SyncBackend.connect_tcp", _sync_connect_wrapper(core)),
        Patch(core, "AnyIOBackend.connect_tcp", _async_connect_wrapper),
        # private modules, imported by the package itself: pool waits are simply not timed where
        # they differ or are not imported
        Patch(loaded(f"{core_name}._sync.connection_pool"), "PoolRequest.wait_for_connection",
              _sync_pool_wait_wrapper),
        Patch(loaded(f"{core_name}._async.connection_pool"), "AsyncPoolRequest.wait_for_connection",
              _async_pool_wait_wrapper),
        # imported by the package itself when anyio is installed (AnyIOBackend needs it)
        *_anyio_patches(),
    ]


def stack(core_name: str) -> Stack:
    """The httpcore-like library ``core_name``, patched when it is imported."""

    def core_patches(get_sink: SinkGetter) -> list[Patch | ClassAttribute]:
        core = loaded(core_name)
        return list(patches(core, core_name)) if core is not None else []

    return Stack(core_name, (core_name,), core_patches)
