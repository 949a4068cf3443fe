"""Serving: the per-connection loop, an async context manager, and ``SimServer`` (background thread)."""

from __future__ import annotations

import asyncio
import logging
import selectors
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from .scenario import SimConfig
from .control import SimControl
from .engine import SimState
from .httpio import BadRequest, ClientGone, Responder, read_request, set_nodelay
from .routes import dispatch

__all__ = ["SimApp", "SimServer", "run_precise", "running"]

log = logging.getLogger("otel_llm.sim")
_T = TypeVar("_T")


def run_precise(main: Coroutine[Any, Any, _T]) -> _T:
    """Like asyncio.run, on a select()-based loop.

    epoll/poll take millisecond timeouts, so every asyncio.sleep there wakes up to 1 ms late;
    select() takes microseconds. Its 1024-descriptor limit is no concern for a test server.
    """
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class SimApp:
    """The simulator on one event loop: shared state plus the open connections."""

    def __init__(self, config: SimConfig) -> None:
        self.state = SimState(config)
        self.port = 0
        self._connections: set[asyncio.Task[Any]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        set_nodelay(writer)
        try:
            await self._serve(reader, writer)
        except ClientGone:
            self.state.stats.disconnects += 1
            log.debug("client disconnected mid-response")
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.debug("connection dropped: %r", exc)
        except asyncio.CancelledError:
            # Only close_connections() cancels us; ending quietly keeps asyncio from logging it.
            log.debug("connection closed at shutdown")
        finally:
            writer.close()
            self._connections.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await read_request(reader, writer)
            except BadRequest as exc:
                await Responder(writer, keep_alive=False).send_json(400, {"error": {"message": str(exc)}})
                return
            if request is None:
                return
            responder = Responder(writer, request.keep_alive, head_only=request.method == "HEAD")
            try:
                await dispatch(self.state, request, responder)
            except (ClientGone, ConnectionError):
                raise
            except Exception:
                log.exception("sim failed on %s %s", request.method, request.path)
                if responder.started:
                    return
                await responder.send_json(500, {"error": {"message": "internal simulator error"}})
            if not responder.keep_alive or writer.transport.is_closing():
                return

    async def close_connections(self) -> None:
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)


@asynccontextmanager
async def running(config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[SimApp]:
    """Serve on the current loop for the duration of the block."""
    app = SimApp(config)
    server = await asyncio.start_server(app.handle, host, port, reuse_address=True)
    app.port = server.sockets[0].getsockname()[1]
    try:
        yield app
    finally:
        server.close()
        await app.close_connections()
        await server.wait_closed()


class SimServer(SimControl):
    """The simulator in a background thread with its own event loop; use as a context manager."""

    def __init__(
        self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0, **overrides: Any
    ) -> None:
        self.config = (config or SimConfig()).merged(overrides)
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> SimServer:
        self._thread = threading.Thread(target=self._run, name="otel-llm-sim", daemon=True)
        self._thread.start()
        self._ready.wait(10.0)
        if self._error is not None or not self._ready.is_set():
            raise RuntimeError(f"simulator failed to start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10.0)
        self._thread = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            run_precise(self._main())
        except BaseException as exc:  # surfaced to start()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running(self.config, self.host, self.port) as app:
            self.port = app.port
            self._ready.set()
            await self._stop.wait()
