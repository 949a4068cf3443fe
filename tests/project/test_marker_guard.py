"""The markers guard: a test starts a real runtime or backend only if it carries the marker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_llm_testing import markers
from otel_llm_testing.llama_server import LlamaServer


def test_an_unmarked_test_cannot_start_a_real_server() -> None:
    with pytest.raises(markers.MarkerMissing, match=r"mark it with @pytest.mark.runtime"):
        LlamaServer().start()  # refused before anything is built, started or bound


@pytest.fixture
def as_if_marked_backend() -> Iterator[None]:
    """What the suite's conftest does before a test marked ``backend`` (this one is not)."""
    markers.allow(["backend"])
    yield
    markers.allow([])


def test_the_running_test_s_markers_are_what_is_allowed(as_if_marked_backend: None) -> None:
    markers.need("backend", "something")  # carries it: no error
    with pytest.raises(markers.MarkerMissing, match="starts a real vLLM"):
        markers.need("runtime", "a real vLLM")


def test_a_child_process_inherits_the_markers(as_if_marked_backend: None) -> None:
    code = ("from otel_llm_testing import markers\n"
            "markers.need('backend', 'x')\n"
            "try:\n    markers.need('runtime', 'y')\nexcept markers.MarkerMissing:\n    print('refused')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


# --- reruns: only for timing tests ------------------------------------------------------------------
TESTS = Path(__file__).resolve().parents[1]
_RERUN_MARK = "mark." + "flaky"  # spelt apart so this file does not name it


def test_no_test_asks_for_reruns_but_through_the_timing_marker() -> None:
    """A rerun hides a real regression in a pure logic test: only ``timing`` reruns (conftest)."""
    offenders = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py") if _RERUN_MARK in p.read_text())
    assert offenders == [], f"use @pytest.mark.timing (the only marker that reruns) in: {offenders}"


def test_a_pure_test_is_never_rerun(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("flaky") is None


@pytest.mark.timing
def test_a_timing_test_is_rerun_twice(request: pytest.FixtureRequest) -> None:
    rerun = request.node.get_closest_marker("flaky")
    assert rerun is not None and rerun.kwargs == {"reruns": 2}


@pytest.mark.timing(reruns=1)
def test_a_timing_test_may_ask_for_fewer_reruns(request: pytest.FixtureRequest) -> None:
    rerun = request.node.get_closest_marker("flaky")
    assert rerun is not None and rerun.kwargs == {"reruns": 1}
