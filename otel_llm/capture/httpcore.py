"""Adapter for httpx / httpx2 on their default transports (httpcore / httpcore2 underneath).

``HTTPTransport.handle_request`` and ``AsyncHTTPTransport.handle_async_request`` are wrapped at
class level, so clients created before ``instrument()`` are covered too. Requests whose route is
not a model call pass straight through after one path check. For a model call the wrapper sets
httpcore's ``trace`` extension (chaining any callback already set), whose events map onto the
call's named methods, and swaps the response stream for one that hands each chunk to the call.
DNS and pool waits, which httpcore reports no event for, are timed in ``httpcore_dns``.

Custom transports (``MockTransport``, aiohttp-based ones) are not wrapped: a transport on
aiohttp is seen by the aiohttp adapter instead, so a call is never traced twice.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from otel_llm._log import log_once
from otel_llm.capture import httpcore_dns
from otel_llm.capture.call import CURRENT_CALL, END_CLOSED, END_EOF, END_UNTRACED, CallRequest, LlmCall
from otel_llm.capture.shared import ClassAttribute, Patch, SinkGetter, Stack, loaded, start_reaper, watch

__all__ = ["LIBRARIES", "STACKS"]

# (httpx-like module, its httpcore-like module)
LIBRARIES = (("httpx", "httpcore"), ("httpx2", "httpcore2"))

TraceInfo = dict[str, Any]


def _peer_address(stream: Any) -> tuple[str, int] | None:
    """The connected address, read now: by the end of the call the socket may be closed."""
    try:
        address = stream.get_extra_info("server_addr")
        return (str(address[0]), int(address[1]))
    except Exception:
        return None


def _tls_details(stream: Any) -> tuple[str | None, str | None, str | None]:
    try:
        ssl_object = stream.get_extra_info("ssl_object")
        if ssl_object is None:
            return None, None, None
        cipher = ssl_object.cipher()
        return ssl_object.version(), cipher[0] if cipher else None, ssl_object.selected_alpn_protocol()
    except Exception:
        log_once("reading TLS details failed")
        return None, None, None


def _connected(call: LlmCall, info: TraceInfo) -> None:
    call.connected(_peer_address(info.get("return_value")))


def _tls_done(call: LlmCall, info: TraceInfo) -> None:
    call.tls_done(*_tls_details(info.get("return_value")))


def _headers(call: LlmCall, info: TraceInfo) -> None:
    value = info.get("return_value")
    version = None
    if isinstance(value, tuple) and value and isinstance(value[0], bytes):
        version = value[0].decode("ascii", "replace")
    call.headers_received(version)


def _mark(method: Callable[[LlmCall], None]) -> Callable[[LlmCall, TraceInfo], None]:
    return lambda call, info: method(call)


# httpcore trace events -> the call's methods; every other event is ignored.
_EVENTS: dict[str, Callable[[LlmCall, TraceInfo], None]] = {
    "connection.connect_tcp.started": _mark(LlmCall.connect_started),
    "connection.connect_tcp.complete": _connected,
    "connection.connect_unix_socket.started": _mark(LlmCall.connect_started),
    "connection.connect_unix_socket.complete": _connected,
    "connection.start_tls.started": _mark(LlmCall.tls_started),
    "connection.start_tls.complete": _tls_done,
    "http11.send_request_headers.started": _mark(LlmCall.request_started),
    "http2.send_request_headers.started": _mark(LlmCall.request_started),
    "http11.send_request_body.complete": _mark(LlmCall.request_sent),
    "http2.send_request_body.complete": _mark(LlmCall.request_sent),
    "http11.receive_response_headers.complete": _headers,
    "http2.receive_response_headers.complete": _headers,
}


def _trace_sync(call: LlmCall, previous: Any) -> Callable[[str, TraceInfo], None]:
    events = _EVENTS

    def trace(name: str, info: TraceInfo) -> None:
        handler = events.get(name)
        if handler is not None:
            handler(call, info)
        if previous is not None:
            previous(name, info)

    return trace


def _trace_async(call: LlmCall, previous: Any) -> Callable[..., Any]:
    events = _EVENTS

    async def trace(name: str, info: TraceInfo) -> None:
        handler = events.get(name)
        if handler is not None:
            handler(call, info)
        if previous is not None:
            await previous(name, info)

    return trace


def _call_request(request: Any, path: str) -> CallRequest:
    url = request.url
    try:
        body = request.content
    except Exception:  # a streaming upload: nothing to parse, the call is still traced
        body = None
    return CallRequest(request.method, url.scheme, url.host, url.port, path, str(url), request.headers, body)


def _begin(get_sink: SinkGetter, args: Any, kwargs: Any, is_async: bool) -> LlmCall | None:
    """Start a call if the request is a model call, else None; never raises."""
    sink = get_sink()
    if sink is None:
        return None
    try:
        request = args[0] if args else kwargs.get("request")
        path = request.url.path
        route = sink.route(path)
        if route is None:
            return None
        call = LlmCall.open(sink, route, _call_request(request, path))
        previous = request.extensions.get("trace")
        trace = _trace_async(call, previous) if is_async else _trace_sync(call, previous)
        request.extensions = {**request.extensions, "trace": trace}
        return call
    except Exception:
        log_once("starting a model-call trace failed")
        return None


def _attach_response(call: LlmCall, response: Any, stream_class: type) -> None:
    """Hand the response's body to ``call``; if that fails, the response is left as it was and
    the call ends now (``untraced``): nothing would ever end it otherwise."""
    try:
        call.response_started(response.status_code, response.headers)
        response.stream = stream_class(response.stream, call)
    except Exception:
        log_once("wrapping a model-call response failed")
        call.finish(END_UNTRACED)


def _sync_send_wrapper(get_sink: SinkGetter, stream_class: type) -> Callable[..., Any]:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = _begin(get_sink, args, kwargs, is_async=False)
        if call is None:
            return wrapped(*args, **kwargs)
        token = CURRENT_CALL.set(call)
        try:
            response = wrapped(*args, **kwargs)
        except BaseException as exc:
            call.finish_from_exception(exc)
            raise
        finally:
            CURRENT_CALL.reset(token)
        _attach_response(call, response, stream_class)
        return response

    return wrapper


def _async_send_wrapper(get_sink: SinkGetter, stream_class: type) -> Callable[..., Any]:
    async def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = _begin(get_sink, args, kwargs, is_async=True)
        if call is None:
            return await wrapped(*args, **kwargs)
        token = CURRENT_CALL.set(call)
        try:
            response = await wrapped(*args, **kwargs)
        except BaseException as exc:
            call.finish_from_exception(exc)
            raise
        finally:
            CURRENT_CALL.reset(token)
        _attach_response(call, response, stream_class)
        return response

    return wrapper


def _closed_here(exc: BaseException) -> bool:
    """A read that failed because this side closed the connection (anyio's ClosedResourceError
    under httpcore's ReadError): the client gave up on the rest of the body, an early close, not
    a network error. openai's async client does so when draining after ``[DONE]`` takes over
    100 ms."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 4:
        if type(cause).__name__ == "ClosedResourceError":
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


def _stream_classes(httpx_module: ModuleType) -> tuple[type, type]:
    """(sync, async) response streams on ``httpx_module``'s own byte-stream bases: the same bytes
    objects, unbuffered, each handed to the call as the application pulls it. The call ends on
    the first of: end of body, ``close()``/``aclose()``, an exception (``GeneratorExit`` is an
    early stop, ``CancelledError`` a cancellation), or garbage collection of the stream."""

    class SyncLlmStream(httpx_module.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner = inner
            self._call = call
            watch(self, call)

        def __iter__(self) -> Any:
            call = self._call
            record = call.chunk
            try:
                for chunk in self._inner:
                    record(chunk)
                    yield chunk
            except BaseException as exc:
                call.finish_from_exception(exc)
                raise
            call.finish(END_EOF)

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._call.finish(END_CLOSED)

    class AsyncLlmStream(httpx_module.AsyncByteStream):  # type: ignore[name-defined,misc]
        # A plain async iterator, not an async generator: abandoned async generators are
        # finalized by the event loop's hooks, possibly after the loop is gone.

        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner = inner
            self._call = call
            self._iterator: Any = None
            watch(self, call)

        def __aiter__(self) -> AsyncLlmStream:
            self._iterator = self._inner.__aiter__()
            return self

        async def __anext__(self) -> bytes:
            call = self._call
            try:
                chunk: bytes = await self._iterator.__anext__()
            except StopAsyncIteration:
                call.finish(END_EOF)
                raise
            except BaseException as exc:
                if _closed_here(exc):
                    call.finish(END_CLOSED)
                else:
                    call.finish_from_exception(exc)
                raise
            call.chunk(chunk)
            return chunk

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._call.finish(END_CLOSED)

    return SyncLlmStream, AsyncLlmStream


def _client_stack(client_name: str) -> Stack:
    """The transport wrappers of one httpx-like library, patched when it is imported. httpx 0.28
    and httpx2 import their httpcore only when a transport is first built, so the httpcore side
    is a stack of its own (``httpcore_dns.stack``), patched when that import happens."""

    def patches(get_sink: SinkGetter) -> list[Patch | ClassAttribute]:
        client = loaded(client_name)
        if client is None:
            return []
        start_reaper()
        sync_stream, async_stream = _stream_classes(client)
        return [
            Patch(client, "HTTPTransport.handle_request", _sync_send_wrapper(get_sink, sync_stream)),
            Patch(client, "AsyncHTTPTransport.handle_async_request", _async_send_wrapper(get_sink, async_stream)),
        ]

    return Stack(client_name, (client_name,), patches)


# each httpx-like library and its httpcore, patched as each is imported
STACKS: tuple[Stack, ...] = tuple(
    stack for client_name, core_name in LIBRARIES
    for stack in (_client_stack(client_name), httpcore_dns.stack(core_name))
)
