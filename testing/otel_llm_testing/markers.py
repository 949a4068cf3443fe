"""The test suite's markers, enforced: a test starts a real runtime or backend only if it says so.

The suite's conftest calls :func:`allow` before each test with that test's markers. Starting a real
runtime (``runtime``) or backend (``backend``) without the marker then fails at once with what to
add, so ``make check``, which deselects those markers, never starts one by accident and a missing
marker is found by the first run of ``make check``. The markers also travel to child processes
(``make demo``, an example) in ``OTEL_LLM_TEST_MARKERS``. Outside the test suite nothing is checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["ENV", "MarkerMissing", "allow", "need"]

ENV = "OTEL_LLM_TEST_MARKERS"
_inherited = os.environ.get(ENV)
# None: not under the test suite, anything may start
_allowed: frozenset[str] | None = None if _inherited is None else frozenset(_inherited.split(","))


class MarkerMissing(RuntimeError):
    """A test started something real without the marker that says it does."""


def allow(markers: Iterable[str]) -> None:
    """The markers of the test about to run."""
    global _allowed
    _allowed = frozenset(markers)
    os.environ[ENV] = ",".join(sorted(_allowed))


def need(marker: str, what: str) -> None:
    """Raise unless the running test carries ``marker`` (``what``: what it is about to start)."""
    if _allowed is not None and marker not in _allowed:
        raise MarkerMissing(f"this test starts {what}: mark it with @pytest.mark.{marker} "
                            f"(pyproject.toml lists the markers)")
