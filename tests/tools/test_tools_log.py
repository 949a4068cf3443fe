"""The tools' own log of failures they survive: each distinct problem once, with its traceback."""

from __future__ import annotations

import logging

import pytest

from otel_llm.tools import _log


def test_each_problem_is_logged_once_under_the_otel_llm_tree(caplog: pytest.LogCaptureFixture) -> None:
    _log._seen.clear()
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        for _ in range(3):
            try:
                raise ValueError("boom")
            except ValueError:
                _log.log_once("a test step failed")
        _log.log_once("another step failed", exc_info=False)
    records = [r for r in caplog.records if r.name == "otel_llm.tools"]
    assert [r.getMessage() for r in records] == [
        "otel-llm: a test step failed (further occurrences are not logged)",
        "otel-llm: another step failed (further occurrences are not logged)"]
    assert records[0].exc_info is not None and records[0].exc_info[0] is ValueError
    assert not records[1].exc_info
