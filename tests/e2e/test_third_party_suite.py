"""Nothing the application did not ask for: a client library's own test suite gives the same
results with and without ``otel_llm.instrument()``.

The suite is the official ollama-python client's, from its sdist on PyPI (the version installed
here): a real HTTP server on loopback (pytest-httpserver) with ordered request expectations, so
any request otel_llm sent of its own (a runtime-state poll of ``/api/ps``) would fail tests. It
runs twice in subprocesses, plainly and instrumented as a new user would (the embedded default,
every observer on), and the per-test outcomes must be identical. The sdist is cached under
``~/.cache/otel-llm/third-party``: the first download takes about a minute (pip prepares the
sdist's metadata), each run of the suite about 10 s.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm.export.jsonl import read_jsonl
from otel_llm_testing.subprocesses import clean_env
from otel_llm_testing import markers

CACHE = Path.home() / ".cache" / "otel-llm" / "third-party"
# the package under test, as this process imports it (a worktree's, not the venv's editable one)
OTEL_LLM_ROOT = Path(otel_llm.__file__).resolve().parents[1]
PLUGIN = "import otel_llm\notel_llm.instrument()\n"  # what a new user adds, before the tests run

pytestmark = [pytest.mark.timeout(600), pytest.mark.backend]


def _sdist(package: str, version: str) -> Path:
    """The package's sdist from PyPI, downloaded once into the cache."""
    markers.need("backend", "a download from PyPI")
    target = CACHE / f"{package}-{version}"
    found = sorted(target.glob("*.tar.gz"))
    if found:
        return found[0]
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", str(partial), f"{package}=={version}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    archives = sorted(partial.glob("*.tar.gz"))
    if result.returncode != 0 or not archives:
        pytest.fail(f"could not download the {package}=={version} sdist from PyPI (this test needs it; "
                    f"never skipped): {' '.join(command)}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    partial.rename(target)
    return target / archives[0].name


def _extract_tests(archive: Path, into: Path) -> Path:
    """The sdist's ``tests/`` directory, alone, so the suite imports the installed package."""
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["tests"]]
        assert members, f"{archive.name} has no tests/ directory"
        tar.extractall(into, members=members, filter="data")
    suite = into / "suite"
    (into / members[0].name.split("/")[0]).rename(suite)
    (suite / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: no configuration of ours
    return suite


def _outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | error | skipped, from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(min(kinds, default=""), "passed")
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return outcomes


def _run_suite(suite: Path, tmp: Path, label: str, instrumented: bool) -> tuple[dict[str, str], str]:
    plugins = tmp / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "otel_llm_instrumented.py").write_text(PLUGIN)
    env = clean_env(OTEL_LLM_TRACES_FILE=str(tmp / f"traces-{label}.jsonl"),
                    PYTHONPATH=os.pathsep.join([str(plugins), str(OTEL_LLM_ROOT)]))
    junit = tmp / f"{label}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:rerunfailures",
               f"--junitxml={junit}", *(["-p", "otel_llm_instrumented"] if instrumented else []), "tests"]
    result = subprocess.run(command, cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert junit.exists(), f"the {label} run wrote no report:\n{output}"
    return _outcomes(junit), output


def test_ollama_client_suite_identical_with_instrumentation(tmp_path: Path) -> None:
    version = importlib.metadata.version("ollama")
    suite = _extract_tests(_sdist("ollama", version), tmp_path)

    plain, plain_output = _run_suite(suite, tmp_path, "plain", instrumented=False)
    not_passed = {test: outcome for test, outcome in plain.items() if outcome in ("failed", "error")}
    assert len(plain) >= 50 and not not_passed, (
        f"ollama {version}'s own suite does not pass without otel_llm (its test requirements, "
        f"pytest-httpserver, are in otel_llm's test extra): {not_passed}\n{plain_output}")
    assert not (tmp_path / "traces-plain.jsonl").exists()

    instrumented, output = _run_suite(suite, tmp_path, "instrumented", instrumented=True)
    changed = {test: (plain.get(test), instrumented.get(test)) for test in plain.keys() | instrumented.keys()
               if plain.get(test) != instrumented.get(test)}
    assert not changed, f"outcomes (plain, instrumented) that differ: {changed}\n{output}"

    # it really was instrumented: the suite's model calls are in the traces file
    calls = [s for s in read_jsonl(tmp_path / "traces-instrumented.jsonl") if s["kind"] == 3]
    assert len(calls) >= 20, len(calls)
    assert {c["attributes"].get(sc.SERVER_ADDRESS) for c in calls} <= {"localhost", "127.0.0.1", "::1"}
    assert any(c["attributes"].get(sc.GEN_AI_OPERATION_NAME) == "chat" for c in calls)
