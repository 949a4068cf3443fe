"""Adapter for aiohttp's client (``ClientSession``), and every httpx transport built on it.

Hooks, all class level, so sessions created before ``instrument()`` are covered too:

* ``ClientSession._request`` (every ``get``/``post``/``request`` goes through it): one path check;
  for a model call, the body for parsing and the pending call, for the hooks below.
* aiohttp's public tracing signals (``TraceConfig``): request start (the call opens there and
  ``traceparent`` goes into the request's own header copy), DNS, pool queueing, connection
  create or reuse, request headers and body chunks sent. The session's ``_trace_configs`` gains
  otel_llm's config only while a model call is being set up, so other requests send no signal
  to otel_llm and the application's own configs are untouched.
* ``ClientResponse.start`` (the head arrived: status, headers, peer, TLS details),
  ``release``/``close`` (the application is done: early close) and the response's
  ``StreamReader``, whose class becomes a subclass that hands each piece the application reads
  to the call (same bytes objects) and ends it at the end of the body.

aiohttp resolves, connects and negotiates TLS inside one "connection create" step: the connect
phase includes TLS (its details are on ``http.connect``), and there is no separate TLS phase.
Upload ends when the last body chunk is handed to the writer. httpx transports on aiohttp
(httpx-aiohttp, openai's ``DefaultAioHttpClient``, LiteLLM's ``LiteLLMAiohttpTransport``) are
not httpcore transports: only this adapter sees their calls, once each.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from types import SimpleNamespace
from typing import Any, Callable
from urllib.parse import urlsplit

from otel_llm._log import log_once
from otel_llm.capture.call import END_CLOSED, END_EOF, END_UNTRACED, CallRequest, LlmCall, perf_ns
from otel_llm.capture.shared import ClassAttribute, Patch, SinkGetter, Stack, body_bytes, loaded, start_reaper, watch

__all__ = ["STACKS", "patches"]


class _Pending:
    """A model call being set up inside ``ClientSession._request``."""

    __slots__ = ("sink", "route", "body", "decoded", "call")

    def __init__(self, sink: Any, route: Any, body: bytes | None, decoded: bool) -> None:
        self.sink, self.route, self.body, self.decoded = sink, route, body, decoded
        self.call: LlmCall | None = None


# the model call the current task is inside ``ClientSession._request`` for
_PENDING: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("otel_llm_aiohttp", default=None)
_READERS: dict[int, LlmCall] = {}  # id(StreamReader) -> its call, while the call is open
_RESPONSES: weakref.WeakKeyDictionary[Any, LlmCall] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=256)
def _path_of(url: str) -> str:
    return urlsplit(url).path


def _url_path(url: Any) -> str | None:
    if isinstance(url, str):
        return _path_of(url)
    path = getattr(url, "path", None)  # yarl.URL
    return path if isinstance(path, str) else None


def _body(session: Any, kwargs: dict[str, Any]) -> bytes | None:
    """The request body for parsing: aiohttp serializes ``json=`` itself, later, so the same
    serializer is run here once more; streams and forms are not read (None)."""
    data = kwargs.get("data")
    payload = kwargs.get("json")
    if data is None and payload is not None:
        data = session.json_serialize(payload)
    return body_bytes(data)


def _pending(sink: Any, session: Any, args: Any, kwargs: dict[str, Any]) -> _Pending | None:
    url = args[1] if len(args) > 1 else kwargs.get("str_or_url", kwargs.get("url"))
    path = _url_path(url)
    if path is None:
        return None
    route = sink.route(path)
    if route is None:
        return None
    auto = kwargs.get("auto_decompress")
    decoded = bool(session.auto_decompress if auto is None else auto)
    return _Pending(sink, route, _body(session, kwargs), decoded)


def _request_wrapper(get_sink: SinkGetter, reader_class: type, stream_reader: type) -> Callable[..., Any]:
    async def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        sink = get_sink()
        pending = None
        if sink is not None:
            try:
                pending = _pending(sink, instance, args, kwargs)
            except Exception:
                log_once("starting a model-call trace failed")
        if pending is None:
            return await wrapped(*args, **kwargs)
        token = _PENDING.set(pending)
        try:
            response = await wrapped(*args, **kwargs)
        except BaseException as exc:
            if pending.call is not None:
                pending.call.finish_from_exception(exc)
            raise
        finally:
            _PENDING.reset(token)
        call = pending.call
        if call is not None:  # the answer the application gets (after any redirects)
            try:
                _response_started(call, response, pending.decoded, reader_class, stream_reader)
            except Exception:
                log_once("wrapping a model-call response failed")
                _untraced(call, response)
        return response

    return wrapper


# -- tracing signals ---------------------------------------------------------------------------
def _call_of(ctx: Any) -> LlmCall | None:
    pending = getattr(ctx, "otel_llm", None)
    return pending.call if pending is not None else None


async def _on_request_start(session: Any, ctx: Any, params: Any) -> None:
    pending: _Pending | None = getattr(ctx, "otel_llm", None)
    if pending is None or pending.call is not None:
        return
    try:
        url = params.url
        port = url.explicit_port if hasattr(url, "explicit_port") else url.port
        request = CallRequest(params.method, url.scheme, url.host or "", port, url.path, str(url), params.headers,
                              pending.body)
        pending.call = LlmCall.open(pending.sink, pending.route, request)
    except Exception:
        log_once("starting a model-call trace failed")


def _signal(action: Callable[[LlmCall, Any, Any], None]) -> Callable[..., Any]:
    async def handler(session: Any, ctx: Any, params: Any) -> None:
        call = _call_of(ctx)
        if call is not None:
            action(call, ctx, params)

    return handler


def _queued_start(call: LlmCall, ctx: Any, params: Any) -> None:
    ctx.otel_llm_queued = perf_ns()


def _queued_end(call: LlmCall, ctx: Any, params: Any) -> None:
    start = getattr(ctx, "otel_llm_queued", 0)
    if start:
        call.pool_wait(start, perf_ns())


def _headers_sent(call: LlmCall, ctx: Any, params: Any) -> None:
    call.request_started()
    if not call.request.body and call.request.body is not None:  # no body: nothing more to send
        call.request_sent()


def _trace_config(aiohttp: Any) -> Any:
    config = aiohttp.TraceConfig(trace_config_ctx_factory=_Context)
    config.on_request_start.append(_on_request_start)
    config.on_connection_queued_start.append(_signal(_queued_start))
    config.on_connection_queued_end.append(_signal(_queued_end))
    config.on_connection_create_start.append(_signal(lambda call, ctx, params: call.connect_started()))
    config.on_connection_create_end.append(_signal(lambda call, ctx, params: call.connected(None)))
    config.on_dns_resolvehost_start.append(_signal(lambda call, ctx, params: call.dns_started()))
    config.on_dns_resolvehost_end.append(_signal(lambda call, ctx, params: call.dns_done()))
    config.on_request_headers_sent.append(_signal(_headers_sent))
    config.on_request_chunk_sent.append(_signal(lambda call, ctx, params: call.request_sent()))
    config.freeze()
    return config


class _Context(SimpleNamespace):
    """Per-request trace context: carries the pending call from ``_request`` to the signals
    (DNS signals come from another task, so a context variable would not reach them)."""

    def __init__(self, trace_request_ctx: Any = None) -> None:
        super().__init__(trace_request_ctx=trace_request_ctx, otel_llm=_PENDING.get())


def _trace_configs_attribute(config: Any) -> property:
    """``ClientSession._trace_configs`` with otel_llm's config added while a model call is set up
    (aiohttp reads it once per request, in ``_request``)."""

    def get(session: Any) -> Any:
        configs = session.__dict__.get("_trace_configs", [])
        if _PENDING.get() is None:
            return configs
        return [*configs, config]

    def set_(session: Any, value: Any) -> None:
        session.__dict__["_trace_configs"] = value

    return property(get, set_)


# -- the response ------------------------------------------------------------------------------
async def _start_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``ClientResponse.start``: a response head arrived (each redirect hop's; the last wins)."""
    pending = _PENDING.get()
    call = pending.call if pending is not None else None
    if call is None:
        return await wrapped(*args, **kwargs)
    connection = args[0] if args else kwargs.get("connection")
    transport = getattr(connection, "transport", None)  # read now: released at the end of the body
    response = await wrapped(*args, **kwargs)
    try:
        _head_arrived(call, response, transport)
    except Exception:
        log_once("reading a model-call response head failed")
    return response


def _head_arrived(call: LlmCall, response: Any, transport: Any) -> None:
    version = response.version
    call.headers_received(f"{version.major}.{version.minor}" if version is not None else None)
    if transport is None:
        return
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        call.set_peer((str(peer[0]), int(peer[1])))
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is not None:
        cipher = ssl_object.cipher()
        call.tls_info(ssl_object.version(), cipher[0] if cipher else None, ssl_object.selected_alpn_protocol())


def _response_started(call: LlmCall, response: Any, decoded: bool, reader_class: Any, stream_reader: Any) -> None:
    call.response_started(response.status, response.headers, decoded=decoded)
    _RESPONSES[response] = call
    watch(response, call)
    content: Any = response.content
    if content.__class__ is stream_reader:  # not the shared empty reader of bodiless answers
        content.__class__ = reader_class
        _READERS[id(content)] = call
        weakref.finalize(response, _READERS.pop, id(content), None)
        if content.at_eof():
            call.finish(END_EOF)


def _untraced(call: LlmCall, response: Any) -> None:
    """``_response_started`` failed part way: forget what it registered (reads and the release
    record nothing), and end the call now, which nothing would do otherwise. Never raises."""
    try:
        if _RESPONSES.get(response) is call:
            del _RESPONSES[response]
        key = id(response.content)
        if _READERS.get(key) is call:
            del _READERS[key]
    except Exception:  # an odd response object: the call is still ended below
        pass
    call.finish(END_UNTRACED)


def _done_wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``ClientResponse.release``/``close``: the application is done with the answer."""
    call = _RESPONSES.get(instance)
    if call is not None:
        _READERS.pop(id(instance.content), None)  # reading on after this records nothing
        call.finish(END_CLOSED)  # nothing if the body was read to its end
    return wrapped(*args, **kwargs)


def _reader_class(stream_reader: type) -> type:
    """A ``StreamReader`` that hands each piece it returns to its call. Only the methods that
    return data to a caller other than another read method record: ``read(-1)`` reads through
    ``readany``, ``readline`` through ``readuntil``, ``readexactly`` and ``iter_*`` through these."""

    def _got(reader: Any, data: bytes) -> None:
        call = _READERS.get(id(reader))
        if call is None:
            return
        if data:
            call.chunk(data)
        if reader.at_eof():
            _READERS.pop(id(reader), None)
            call.finish(END_EOF)

    def _failed(reader: Any, exc: BaseException) -> None:
        call = _READERS.pop(id(reader), None)
        if call is not None:
            call.finish_from_exception(exc)

    class LlmStreamReader(stream_reader):  # type: ignore[misc]
        __slots__ = ()  # same layout: assigned as __class__ of an existing reader

        async def read(self, n: int = -1) -> bytes:
            if n < 0:
                return await super().read(n)  # type: ignore[no-any-return]
            try:
                data = await super().read(n)
            except BaseException as exc:
                _failed(self, exc)
                raise
            _got(self, data)
            return data  # type: ignore[no-any-return]

        async def readany(self) -> bytes:
            try:
                data = await super().readany()
            except BaseException as exc:
                _failed(self, exc)
                raise
            _got(self, data)
            return data  # type: ignore[no-any-return]

        async def readuntil(self, separator: bytes = b"\n", *, max_size: int | None = None) -> bytes:
            try:
                data = await super().readuntil(separator, max_size=max_size)
            except BaseException as exc:
                _failed(self, exc)
                raise
            _got(self, data)
            return data  # type: ignore[no-any-return]

        async def readchunk(self) -> tuple[bytes, bool]:
            try:
                result = await super().readchunk()
            except BaseException as exc:
                _failed(self, exc)
                raise
            _got(self, result[0])
            return result  # type: ignore[no-any-return]

        def read_nowait(self, n: int = -1) -> bytes:
            data = super().read_nowait(n)
            _got(self, data)
            return data  # type: ignore[no-any-return]

    return LlmStreamReader


def patches(get_sink: SinkGetter) -> list[Patch | ClassAttribute]:
    """The hooks, once aiohttp and the submodules they patch are imported."""
    aiohttp = loaded("aiohttp")
    reqrep = loaded("aiohttp.client_reqrep")
    stream_reader = getattr(loaded("aiohttp.streams"), "StreamReader", None)
    if aiohttp is None or stream_reader is None or reqrep is None:
        return []
    start_reaper()
    reader_class = _reader_class(stream_reader)
    return [
        Patch(aiohttp, "ClientSession._request", _request_wrapper(get_sink, reader_class, stream_reader)),
        ClassAttribute(aiohttp, "ClientSession._trace_configs", _trace_configs_attribute(_trace_config(aiohttp))),
        Patch(reqrep, "ClientResponse.start", _start_wrapper),
        Patch(reqrep, "ClientResponse.release", _done_wrapper),
        Patch(reqrep, "ClientResponse.close", _done_wrapper),
    ]


# aiohttp imports both submodules itself; naming them makes the patching wait for them if a
# release ever imports them lazily
STACKS: tuple[Stack, ...] = (Stack("aiohttp", ("aiohttp", "aiohttp.client_reqrep", "aiohttp.streams"), patches),)
