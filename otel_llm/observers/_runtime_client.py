"""The HTTP client the runtime-state polls go out with."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry import context

from otel_llm._log import logger

if TYPE_CHECKING:
    import httpx

__all__ = ["TIMEOUT", "PollClient", "http_suppressed"]

TIMEOUT = 1.0


def http_suppressed() -> contextlib.AbstractContextManager[Any]:
    """OpenTelemetry's HTTP instrumentation suppressed for the polls: the key every contrib HTTP
    instrumentation checks, set without importing ``opentelemetry.instrumentation``."""
    key = getattr(context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)
    if key is None:  # an API release that moved it: the public helper
        from opentelemetry.instrumentation.utils import suppress_http_instrumentation

        return suppress_http_instrumentation()
    return _attached(context.set_value(key, True))


@contextlib.contextmanager
def _attached(ctx: context.Context) -> Iterator[None]:
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


class PollClient:
    """GET with a short timeout, ignoring proxy settings (``trust_env=False``). The httpx client is
    created, and httpx imported, at the first request: a process that never reaches a pollable
    server never imports it. A client given by the caller stays the caller's to close."""

    def __init__(self, client: httpx.Client | None = None, stopped: Callable[[], bool] = lambda: False) -> None:
        self._own = client is None
        self._client = client
        self._stopped = stopped  # true once the poller stops: a client made then would never be closed

    def get(self, url: str, accept: str) -> httpx.Response:
        """The answer; raises ``httpx.HTTPError`` when there is none, ``RuntimeError`` once stopped."""
        return self._http().get(url, headers={"Accept": accept}, timeout=TIMEOUT)

    def _http(self) -> httpx.Client:
        if self._client is None:
            if self._stopped():
                raise RuntimeError("the runtime-state observer is stopped")
            import httpx

            self._client = httpx.Client(timeout=TIMEOUT, trust_env=False)
        return self._client

    def close(self) -> None:
        if self._own and self._client is not None:
            try:
                self._client.close()
            except Exception:
                logger.debug("otel_llm: closing the runtime-state client failed", exc_info=True)
