"""Class-level hooks on httpx / httpx2 transports.

``HTTPTransport.handle_request`` and ``AsyncHTTPTransport.handle_async_request`` are wrapped at
class level, so clients created before ``instrument()`` are covered too. Requests whose route is
not a model call pass straight through after one path check. For a model call the wrapper adds
httpcore's ``trace`` extension (chaining any callback already set), injects ``traceparent``,
and swaps the response stream for a timing wrapper.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from otel_llm._log import log_once
from otel_llm.capture.call import LlmCall
from otel_llm.capture.dns import CURRENT_CALL
from otel_llm.capture.streams import make_stream_classes

if TYPE_CHECKING:
    from otel_llm.build.telemetry import Telemetry

TelemetryGetter = Callable[[], "Telemetry | None"]


def _chain_sync(call: LlmCall, previous: Any) -> Callable[[str, dict[str, Any]], None]:
    record = call.on_trace_event
    if previous is None:
        return record

    def trace(name: str, info: dict[str, Any]) -> None:
        record(name, info)
        previous(name, info)

    return trace


def _chain_async(call: LlmCall, previous: Any) -> Callable[..., Any]:
    record = call.on_trace_event

    async def trace(name: str, info: dict[str, Any]) -> None:
        record(name, info)
        if previous is not None:
            await previous(name, info)

    return trace


def _begin(get_telemetry: TelemetryGetter, args: Any, kwargs: Any, is_async: bool) -> LlmCall | None:
    """Start a call if the request is a model call, else None; never raises."""
    telemetry = get_telemetry()
    if telemetry is None:
        return None
    try:
        request = args[0] if args else kwargs.get("request")
        call = telemetry.start_call(request)
        if call is None:
            return None
        previous = request.extensions.get("trace")
        chain = _chain_async if is_async else _chain_sync
        request.extensions = {**request.extensions, "trace": chain(call, previous)}
        return call
    except Exception:
        log_once("starting a model-call trace failed")
        return None


def _attach_response(call: LlmCall, response: Any, stream_class: type) -> None:
    try:
        call.on_response(response.status_code, response.headers)
        response.stream = stream_class(response.stream, call)
    except Exception:
        log_once("wrapping a model-call response failed")


def sync_send_wrapper(get_telemetry: TelemetryGetter, httpx_module: ModuleType) -> Callable[..., Any]:
    """wrapt wrapper for ``HTTPTransport.handle_request``."""
    stream_class, _ = make_stream_classes(httpx_module)

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = _begin(get_telemetry, args, kwargs, is_async=False)
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


def async_send_wrapper(get_telemetry: TelemetryGetter, httpx_module: ModuleType) -> Callable[..., Any]:
    """wrapt wrapper for ``AsyncHTTPTransport.handle_async_request``."""
    _, stream_class = make_stream_classes(httpx_module)

    async def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        call = _begin(get_telemetry, args, kwargs, is_async=True)
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
