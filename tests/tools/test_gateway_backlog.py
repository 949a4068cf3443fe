"""The gateway's backlog: records built after the answers in flight, in order, bounded."""

from __future__ import annotations

import asyncio
import threading

from otel_llm.tools.gateway.backlog import Backlog, DeferredSink


def test_work_runs_in_order_one_piece_per_loop_turn() -> None:
    """Submitted work waits for the next turn and runs one piece per turn, so a callback that
    became ready in between (a socket, here a call_soon) runs before the rest of the backlog."""
    done: list[str] = []

    async def run() -> None:
        backlog = Backlog()
        backlog.start(asyncio.get_running_loop())
        for name in ("a", "b", "c"):
            backlog.submit(done.append, name)
        assert done == [] and len(backlog) == 3  # nothing ran where it was submitted
        asyncio.get_running_loop().call_soon(done.append, "ready")
        for _ in range(6):
            await asyncio.sleep(0)
        assert done == ["a", "ready", "b", "c"]
        assert len(backlog) == 0

    asyncio.run(run())


def test_full_backlog_off_loop_thread_and_after_flush_run_at_once() -> None:
    done: list[int] = []

    async def run() -> None:
        backlog = Backlog(limit=2)
        backlog.start(asyncio.get_running_loop())
        for n in range(4):
            backlog.submit(done.append, n)
        assert done == [2, 3] and backlog.ran_at_once == 2  # the two past the limit: at once
        thread = threading.Thread(target=backlog.submit, args=(done.append, 9))  # a call ended by the GC
        thread.start()
        thread.join()
        assert done == [2, 3, 9]
        backlog.flush()  # shutdown: what waited runs now, later work at once
        assert done == [2, 3, 9, 0, 1]
        backlog.submit(done.append, 10)
        assert done[-1] == 10

    asyncio.run(run())


def test_failing_work_is_logged_and_the_rest_still_runs() -> None:
    done: list[str] = []

    def boom() -> None:
        raise RuntimeError("a bug in a record")

    async def run() -> None:
        backlog = Backlog()
        backlog.start(asyncio.get_running_loop())
        backlog.submit(boom)
        backlog.submit(done.append, "after")
        for _ in range(4):
            await asyncio.sleep(0)

    asyncio.run(run())
    assert done == ["after"]


class _Sink:
    capture_content = True

    def __init__(self) -> None:
        self.finished: list[tuple[object, object]] = []

    def route(self, path: str) -> object:
        return path if path.startswith("/v1/") else None

    def call_started(self, call: object) -> object:
        return ("state", call)

    def call_finished(self, record: object, state: object) -> None:
        self.finished.append((record, state))


def test_deferred_sink_defers_only_the_finish() -> None:
    async def run() -> None:
        backlog = Backlog()
        backlog.start(asyncio.get_running_loop())
        sink = _Sink()
        deferred = DeferredSink(sink, backlog)  # type: ignore[arg-type]
        assert deferred.capture_content is True and deferred.wrapped is sink
        assert deferred.route("/v1/chat/completions") == "/v1/chat/completions" and deferred.route("/x") is None
        assert deferred.call_started("c") == ("state", "c")  # type: ignore[arg-type]
        deferred.call_finished("record", "state")  # type: ignore[arg-type]
        assert sink.finished == []
        await asyncio.sleep(0)
        assert sink.finished == [("record", "state")]

    asyncio.run(run())
