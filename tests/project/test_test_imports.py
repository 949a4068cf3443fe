"""The test suite's helpers live in the ``otel_llm_testing`` package: a test never imports a conftest
(pytest loads each conftest itself, and importing one as a module runs it twice under two names) or
another test module (whose tests would then run twice), and a conftest holds only fixtures and hooks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.append((node.lineno, base))
            # ``from . import conftest`` and ``from tests import conftest`` name the module as an alias
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def _python_files() -> list[Path]:
    return sorted(p for folder in ("tests", "benchmarks", "testing", "examples") for p in (ROOT / folder).rglob("*.py"))


def test_no_module_imports_a_conftest() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in _python_files()
           for line, name in _imported_modules(ast.parse(path.read_text()))
           if name.rpartition(".")[2] == "conftest"]
    assert not bad, f"import these from otel_llm_testing instead: {bad}"


def test_no_test_module_imports_another() -> None:
    """Scripts beside the tests (``tests/parse/fuzz_atheris.py``) may reuse a test module's pieces."""
    modules = [*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "tests").rglob("conftest.py")]
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in sorted(modules)
           for line, name in _imported_modules(ast.parse(path.read_text()))
           if name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")]
    assert not bad, f"move what they share into otel_llm_testing: {bad}"


def test_a_conftest_holds_only_fixtures_and_hooks() -> None:
    bad = []
    for path in sorted((ROOT / "tests").rglob("conftest.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                bad.append(f"{path.relative_to(ROOT)}: class {node.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fixture = any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)
                if not (fixture or node.name.startswith("pytest_")):
                    bad.append(f"{path.relative_to(ROOT)}: def {node.name}")
    assert not bad, f"helpers belong in otel_llm_testing, not a conftest: {bad}"


def test_the_check_sees_an_import_of_a_conftest() -> None:
    sources = ["from tests.conftest import make_otel", "import conftest", "from tests import conftest",
               "from .conftest import x", "from . import conftest", "def f():\n    from tests.conftest import x"]
    for source in sources:
        assert any(name.rpartition(".")[2] == "conftest" for _, name in _imported_modules(ast.parse(source))), source
    assert not any(name.rpartition(".")[2] == "conftest"
                   for _, name in _imported_modules(ast.parse("from otel_llm_testing.otel import make_otel")))
