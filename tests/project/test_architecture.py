"""The flow of one call, as docs/architecture.md draws it, held true of the code: capture never
imports telemetry, telemetry never calls into capture (it reads capture's frozen record), parse
and export stay below them, and the observers are reached only through their protocol."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "otel_llm"

# package -> the SDK packages and modules it may import at run time (imports under
# ``if TYPE_CHECKING:`` are for annotations only and are not counted)
ALLOWED = {
    "capture": {"capture", "parse", "_log", "_types", "semconv"},
    "parse": {"parse", "_log", "_types", "semconv"},
    "telemetry": {"telemetry", "parse", "capture.record", "observers.evidence", "config", "_log", "_types",
                  "semconv", "version"},
    "export": {"export", "config", "_log", "_types", "semconv", "version"},
}


def _runtime_imports(path: Path) -> set[str]:
    """The otel_llm modules ``path`` imports outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name.removeprefix("otel_llm.") for name in found if name.startswith("otel_llm.")}


def _allowed(target: str, allowed: set[str]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def _violations(package: str) -> list[str]:
    bad = []
    for path in sorted((SDK / package).rglob("*.py")):
        for target in sorted(_runtime_imports(path)):
            if not _allowed(target, ALLOWED[package]):
                bad.append(f"{path.relative_to(ROOT)} imports otel_llm.{target}")
    return bad


def test_each_layer_imports_only_what_the_flow_allows() -> None:
    bad = [line for package in ALLOWED for line in _violations(package)]
    assert bad == [], bad


def test_telemetry_reaches_the_observers_only_through_their_protocol() -> None:
    """Even for annotations: the sink knows ``observers.evidence`` and nothing else of them."""
    bad = []
    for path in sorted((SDK / "telemetry").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [module or ""]
            bad += [f"{path.name}: {n}" for n in names if n.startswith("otel_llm.observers")
                    and n != "otel_llm.observers.evidence"]
    assert bad == [], bad


def test_telemetry_holds_and_finishes_no_call() -> None:
    """Open calls are capture's: nothing in telemetry ends one (``.finish(`` on a call) or keeps them."""
    bad = [path.name for path in (SDK / "telemetry").rglob("*.py")
           if "END_EXIT" in path.read_text() or "call.finish(" in path.read_text()]
    assert bad == [], bad


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from otel_llm.capture.call import X\n"
                      "from otel_llm.telemetry.calls import Telemetry\nimport otel_llm.observers.manager\n")
    found = _runtime_imports(source)
    assert found == {"telemetry.calls.Telemetry", "observers.manager"}
    assert not _allowed("telemetry.calls.Telemetry", ALLOWED["capture"])
    assert not _allowed("observers.manager", ALLOWED["telemetry"])
    assert _allowed("observers.evidence.CallEnd", ALLOWED["telemetry"])
