"""log_once (otel_llm._log): each distinct problem is logged once, with its level and traceback, until
reset_log_once forgets what was logged."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from otel_llm._log import log_once, logger, reset_log_once


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """otel_llm's records at every level, with nothing logged yet."""
    reset_log_once()
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        yield caplog
    reset_log_once()


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_llm"]


def test_each_message_is_logged_once(logs: pytest.LogCaptureFixture) -> None:
    for _ in range(3):
        log_once("parsing failed")
        log_once("exporting failed")
    assert _messages(logs) == ["otel_llm: parsing failed (further occurrences are not logged)",
                                 "otel_llm: exporting failed (further occurrences are not logged)"]


def test_reset_forgets_what_was_logged(logs: pytest.LogCaptureFixture) -> None:
    log_once("parsing failed")
    log_once("parsing failed")
    reset_log_once()
    log_once("parsing failed")
    assert len(_messages(logs)) == 2


def test_level_and_the_current_exception(logs: pytest.LogCaptureFixture) -> None:
    try:
        raise ValueError("bad frame")
    except ValueError:
        log_once("scanning failed")
        log_once("noted quietly", level=logging.DEBUG, exc_info=False)
    warning, debug = [r for r in logs.records if r.name == "otel_llm"]
    assert warning.levelno == logging.WARNING and warning.exc_info is not None
    assert warning.exc_info[0] is ValueError and "bad frame" in logs.text
    assert debug.levelno == logging.DEBUG and not debug.exc_info


def test_a_message_suppressed_at_a_disabled_level_is_still_counted_as_logged(
        logs: pytest.LogCaptureFixture) -> None:
    """Once means once per message, whatever became of the record."""
    logs.set_level(logging.ERROR, logger=logger.name)
    log_once("quiet problem")
    logs.set_level(logging.DEBUG, logger=logger.name)
    log_once("quiet problem")
    assert _messages(logs) == []


def test_concurrent_callers_log_a_message_once(logs: pytest.LogCaptureFixture) -> None:
    barrier = threading.Barrier(8)

    def report() -> None:
        barrier.wait()
        for _ in range(50):
            log_once("raced problem", exc_info=False)

    threads = [threading.Thread(target=report) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(_messages(logs)) == 1
