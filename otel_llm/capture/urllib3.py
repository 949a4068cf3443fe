"""Adapter for urllib3 2.x, and so for ``requests`` (and every library built on either).

urllib3 has no tracing hooks; these class-level wrappers give the phases (all sync, on one
thread, so the hooks deeper in the stack find the call in ``CURRENT_CALL``):

* ``HTTPConnectionPool.urlopen``: one path check; for a model call, a copy of the headers with
  the trace context (the application's own headers object is not touched), then the call is the
  current one until ``urlopen`` returns: the retries and redirects it follows belong to it, and
  it records the answer ``urlopen`` returns. A body that ends inside ``urlopen`` (preloaded, or
  drained before a retry or a redirect) ends the call only once that answer is returned, and a
  later answer's head replaces what an earlier one left.
* ``HTTPConnectionPool._get_conn`` (a real wait for a connection of a full, blocking pool),
  ``HTTPConnection._new_conn`` (TCP connect; DNS is timed apart in ``create_connection``, which
  resolves first and then connects to each address in order, as urllib3 does),
  ``_ssl_wrap_socket_and_match_hostname`` (the TLS handshake), ``HTTPConnection.request``
  (headers and body written; plain HTTP connects lazily inside it) and http.client's
  ``getresponse`` (the head arrived, before urllib3 may preload the body). A failure recording
  any of them is logged once and the call goes on; the wrapped method runs as without otel_llm.
* ``HTTPResponse.__init__``: a model call's response gets a subclass (``_TracedResponse``) whose
  body reads hand the call the bytes as they came off the wire (decoded for parsing only), as
  the application pulls them (``iter_content``, ``iter_lines``, ``raw.read``, ``stream``,
  ``.content``), and whose ``release_conn``/``close`` end it.
"""

from __future__ import annotations

import socket
from typing import Any, Callable

from otel_llm._log import log_once
from otel_llm.capture.call import CURRENT_CALL, END_CLOSED, END_EOF, END_UNTRACED, CallRequest, LlmCall, perf_ns
from otel_llm.capture.shared import ClassAttribute, Patch, SinkGetter, Stack, body_bytes, loaded, timed_wait
from otel_llm.capture.httpcore_dns import is_ip

__all__ = ["STACKS", "patches"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# On a model call's HTTPResponse (its own __dict__): the call, whether one of the wrapped reads is
# running (urllib3 releases and closes the response inside them), and how its body ended when that
# happened inside the call's own ``urlopen`` (see ``_end``).
_CALL, _READING, _ENDED = "_otel_llm_call", "_otel_llm_reading", "_otel_llm_ended"
_URLOPEN_ARGS = ("method", "url", "body", "headers", "retries", "redirect", "assert_same_host", "timeout",
                 "pool_timeout", "release_conn", "chunked", "body_pos", "preload_content", "decode_content")


def _open(sink: Any, pool: Any, path_and_query: str, args: Any, kwargs: dict[str, Any],
          header_dict: type) -> LlmCall | None:
    """A new call with its own copy of the headers (in ``kwargs``), or None: not a model call."""
    path = path_and_query.split("?", 1)[0]
    route = sink.route(path)
    if route is None:
        return None
    named = dict(zip(_URLOPEN_ARGS, args))
    named.update(kwargs)
    headers = header_dict(named.get("headers") or pool.headers)
    port = pool.port if pool.port != _DEFAULT_PORTS.get(pool.scheme) else None
    host = pool.host
    netloc = f"[{host}]" if ":" in host else host
    url = f"{pool.scheme}://{netloc}{f':{port}' if port else ''}{path_and_query}"
    request = CallRequest(str(named.get("method", "GET")).upper(), pool.scheme, host, port, path, url, headers,
                          body_bytes(named.get("body")))
    call = LlmCall.open(sink, route, request)
    kwargs.update({k: v for k, v in named.items() if k not in kwargs})
    kwargs["headers"] = headers
    return call


def _urlopen_wrapper(get_sink: SinkGetter, header_dict: type) -> Callable[..., Any]:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        sink = get_sink()
        if sink is None or CURRENT_CALL.get() is not None:  # a retry inside the call's own urlopen
            return wrapped(*args, **kwargs)
        call = None
        try:
            target = args[1] if len(args) > 1 else kwargs.get("url")
            if isinstance(target, str):
                call = _open(sink, instance, target, args, kwargs, header_dict)
        except Exception:
            log_once("starting a model-call trace failed")
        if call is None:
            return wrapped(*args, **kwargs)
        token = CURRENT_CALL.set(call)
        try:
            response = wrapped(**kwargs)
        except BaseException as exc:
            call.finish_from_exception(exc)
            raise
        finally:
            CURRENT_CALL.reset(token)
        try:
            _settle(call, response)
        except Exception:
            log_once("ending a model call failed")
        return response

    return wrapper


def _settle(call: LlmCall, response: Any) -> None:
    """``urlopen`` returned the answer the application gets (after any retry or redirect it
    followed): end the call if that answer's body already ended inside ``urlopen`` (preloaded),
    or if its body is not traced (nothing else would end the call)."""
    state = getattr(response, "__dict__", None) or {}
    ended = state.pop(_ENDED, None)
    if ended is not None:
        reason, exc, at_ns = ended
        if exc is None:
            call.finish(reason, at_ns=at_ns)
        else:
            call.finish_from_exception(exc)
    elif state.get(_CALL) is not call:  # tracing its body failed (logged): nothing else ends the call
        call.finish(END_UNTRACED)


def _timed(before: Callable[[LlmCall], None] | None, after: Callable[[LlmCall, Any], None],
           failed: str) -> Callable[..., Any]:
    """A wrapper that reports to the current call around the wrapped method, and does nothing
    outside model calls. A failure reporting is logged once (``failed``), never raised: the
    wrapped method runs and its result reaches urllib3 as without otel_llm, and the call goes on
    (its body still ends it)."""

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = CURRENT_CALL.get()
        if call is None:
            return wrapped(*args, **kwargs)
        if before is not None:
            try:
                before(call)
            except Exception:
                log_once(failed)
        result = wrapped(*args, **kwargs)
        try:
            after(call, result)
        except Exception:
            log_once(failed)
        return result

    return wrapper


def _peer(sock: Any) -> tuple[str, int] | None:
    try:
        address = sock.getpeername()
        return (str(address[0]), int(address[1]))
    except Exception:
        return None


def _tls_done(call: LlmCall, wrapped: Any) -> None:
    try:
        ssl_socket = wrapped.socket
        cipher = ssl_socket.cipher()
        call.tls_done(ssl_socket.version(), cipher[0] if cipher else None, ssl_socket.selected_alpn_protocol())
    except Exception:
        call.tls_done(None, None, None)


def _head(call: LlmCall, response: Any) -> None:
    """http.client parsed the head (urllib3 builds its response, and may read the body, next)."""
    if call.status:  # urlopen retried or followed a redirect: this answer replaces the earlier one
        call.response_replaced()
    version = getattr(response, "version", None)
    call.headers_received({10: "1.0", 11: "1.1"}.get(version) if isinstance(version, int) else None)
    call.response_started(response.status, response.msg)


def _pool_wait(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``_get_conn``: timed only when it will block (a full pool in blocking mode)."""
    call = CURRENT_CALL.get()
    pool = instance.pool
    if call is None or not instance.block or pool is None or pool.qsize():
        return wrapped(*args, **kwargs)
    return timed_wait(call, wrapped, args, kwargs)


def _create_connection(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Resolve on its own (timed as DNS), then connect to each address in order."""
    call = CURRENT_CALL.get()
    address = args[0] if args else kwargs.get("address")
    if call is None or not isinstance(address, tuple):
        return wrapped(*args, **kwargs)
    host, port = address
    if host.startswith("["):
        host = host.strip("[]")
    if is_ip(host):
        return wrapped(*args, **kwargs)
    util = loaded("urllib3.util.connection")
    family = util.allowed_gai_family() if util is not None else socket.AF_UNSPEC
    try:
        call.dns_started()
    except Exception:
        log_once("recording a model-call DNS lookup failed")
        return wrapped(*args, **kwargs)
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)  # a failure ends the call in DNS
    except UnicodeError:
        # a name with an empty or over-long label (the idna codec's check, before any lookup):
        # urllib3 checks it before resolving and raises its own error (LocationParseError)
        return wrapped(*args, **kwargs)
    try:
        call.dns_done()
    except Exception:
        log_once("recording a model-call DNS lookup failed")
    rest = args[1:]
    error: OSError | None = None
    for ip in dict.fromkeys(info[4][0] for info in infos):
        try:
            return wrapped((ip, port), *rest, **{k: v for k, v in kwargs.items() if k != "address"})
        except OSError as exc:
            error = exc
    raise error or OSError("getaddrinfo returns an empty list")  # urllib3's own words


class _TracedResponse:
    """Mixed into a model call's response class (assigned as its ``__class__`` before
    ``__init__``, so a preloaded body is seen too): every body read ends in ``_raw_read`` or, for
    a chunked body, ``_update_chunk_length`` and ``_handle_chunk``, with the bytes as they came
    off the wire; the application is done at ``release_conn`` or ``close``. Other responses keep
    their class and pay nothing."""

    __slots__ = ()

    def _handle_chunk(self, amt: int | None) -> bytes:
        call = self.__dict__.get(_CALL)
        try:
            data: bytes = super()._handle_chunk(amt)  # type: ignore[misc]
        except BaseException as exc:
            if call is not None:
                _end(self, call, "", exc)
            raise
        if call is not None and data:
            call.chunk(data)
        return data

    def _update_chunk_length(self) -> None:
        # the last chunk (length 0) ends the body; a body cut short fails here, after urllib3
        # closed the response under it
        state = self.__dict__
        call = state.get(_CALL)
        state[_READING] = True
        try:
            super()._update_chunk_length()  # type: ignore[misc]
        except BaseException as exc:
            if call is not None:
                _end(self, call, "", exc)
            raise
        finally:
            state[_READING] = False
        if call is not None and self.chunk_left == 0:  # type: ignore[attr-defined]
            _end(self, call, END_EOF)

    def _raw_read(self, *args: Any, **kwargs: Any) -> bytes:
        state = self.__dict__
        call = state.get(_CALL)
        state[_READING] = True
        try:
            data: bytes = super()._raw_read(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            if call is not None:
                _end(self, call, "", exc)
            raise
        finally:
            state[_READING] = False
        if call is not None:
            if data:
                call.chunk(data)
            remaining = self.length_remaining  # type: ignore[attr-defined]
            # a read that returned with the body closed under it reached the end (http.client
            # closes a close-delimited body at EOF, urllib3 a fully read Content-Length one)
            if (remaining is not None and remaining <= 0) or self.isclosed():  # type: ignore[attr-defined]
                _end(self, call, END_EOF)
        return data

    def release_conn(self) -> None:
        # urllib3 calls it at the end of the body; the application may call it early
        _ended(self)
        super().release_conn()  # type: ignore[misc]

    def close(self) -> None:
        # an early close, or the response's collection (urllib3 responses close in __del__)
        _ended(self)
        super().close()  # type: ignore[misc]


_TRACED: dict[type, type] = {}


def _traced_class(cls: type) -> type:
    traced = _TRACED.get(cls)
    if traced is None:
        traced = _TRACED[cls] = type(cls.__name__, (_TracedResponse, cls), {"__slots__": ()})
    return traced


def _response_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``HTTPResponse.__init__``: inside a model call's ``urlopen``, the response belongs to the
    call from the start."""
    call = CURRENT_CALL.get()
    if call is not None:
        try:
            instance.__class__ = _traced_class(type(instance))
            instance.__dict__[_CALL] = call
        except Exception:  # a response class whose layout cannot take the mix-in: untraced body
            log_once("tracing a urllib3 response body failed")
    return wrapped(*args, **kwargs)


def _end(response: Any, call: LlmCall, reason: str, exc: BaseException | None = None) -> None:
    state = response.__dict__
    state.pop(_CALL, None)  # later reads record nothing
    if CURRENT_CALL.get() is call:
        # inside the call's own urlopen: a preloaded body, or one drained before a retry or a
        # redirect; urlopen may still replace this answer, its wrapper ends the call (``_settle``)
        state[_ENDED] = (reason, exc, perf_ns())
        return
    if exc is None:
        call.finish(reason)
    else:
        call.finish_from_exception(exc)


def _at_end(response: Any) -> bool:
    """The whole body came in (the last chunk, or all of a Content-Length)."""
    if getattr(response, "chunked", False):
        return getattr(response, "chunk_left", None) == 0
    remaining = getattr(response, "length_remaining", None)
    return remaining is not None and remaining <= 0


def _ended(response: Any) -> None:
    state = response.__dict__
    call = state.get(_CALL)
    if call is not None and not state.get(_READING):  # else the read running ends the call itself
        _end(response, call, END_EOF if _at_end(response) else END_CLOSED)


def patches(get_sink: SinkGetter) -> list[Patch | ClassAttribute]:
    """The hooks, once urllib3 2.x is imported (1.x lacks the body hooks: not covered)."""
    urllib3 = loaded("urllib3")
    if urllib3 is None or not str(getattr(urllib3, "__version__", "1")).startswith("2"):
        return []
    pool = loaded("urllib3.connectionpool")
    connection = loaded("urllib3.connection")
    header_dict = urllib3.HTTPHeaderDict
    return [
        Patch(pool, "HTTPConnectionPool.urlopen", _urlopen_wrapper(get_sink, header_dict)),
        Patch(pool, "HTTPConnectionPool._get_conn", _pool_wait),
        Patch(connection, "HTTPConnection._new_conn",
              _timed(LlmCall.connect_started, lambda call, sock: call.connected(_peer(sock)),
                     "recording a model-call connection failed")),
        Patch(loaded("urllib3.util.connection"), "create_connection", _create_connection),
        Patch(connection, "_ssl_wrap_socket_and_match_hostname",
              _timed(LlmCall.tls_started, _tls_done, "recording a model-call TLS handshake failed")),
        Patch(connection, "HTTPConnection.request",
              _timed(LlmCall.request_started, lambda call, result: call.request_sent(),
                     "recording a model-call request upload failed")),
        # urllib3.connection imports http.client (the standard library: no hook of its own)
        Patch(loaded("http.client"), "HTTPConnection.getresponse",
              _timed(None, _head, "reading a model-call response head failed")),
        Patch(loaded("urllib3.response"), "HTTPResponse.__init__", _response_init),
    ]


# urllib3 imports all of these itself; naming them makes the patching wait for them if a release
# ever imports one lazily
STACKS: tuple[Stack, ...] = (
    Stack("urllib3", ("urllib3", "urllib3.connectionpool", "urllib3.connection", "urllib3.response",
                      "urllib3.util.connection"), patches),
)
