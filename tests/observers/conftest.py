"""The observers' fixtures: a fake model runtime on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otel_llm_testing.fake_runtime import FakeRuntime, fake_runtime


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    """A fake runtime answering canned bodies per path on 127.0.0.1, for this test."""
    with fake_runtime() as state:
        yield state
