"""The layout: the architecture page's Layout section matches the tree, the SDK never imports a tool, and the
packages import each other without a cycle or a reach into another package's private module."""

from __future__ import annotations

import ast
import re
import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _packages() -> list[str]:
    """Every package directory of the repository's Python code, as a path relative to the root."""
    found = []
    for init in [*ROOT.glob("otel_llm/**/__init__.py"), *ROOT.glob("testing/**/__init__.py")]:
        found.append(init.parent.relative_to(ROOT).as_posix() + "/")
    return sorted(found)


def _tracked_top_level() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = [line for line in files.splitlines() if "/" in line]
    test_folders = {"/".join(line.split("/")[:2]) + "/" for line in lines
                    if line.startswith("tests/") and line.count("/") > 1}
    return {line.split("/")[0] + "/" for line in lines} | test_folders


def test_the_layout_section_names_every_folder_and_package() -> None:
    section = _layout_section()
    named = set(re.findall(r"`([\w.-]+(?:/[\w.-]+)*/)`", section))
    missing = sorted((_tracked_top_level() | set(_packages())) - named - {
        p for p in _packages() if p.startswith("otel_llm/tools/") and p.count("/") > 3})
    assert not missing, f"not in the Layout section of docs/architecture.md: {missing}"


def test_every_path_the_layout_section_names_exists() -> None:
    section = _layout_section()
    paths = set(re.findall(r"`((?:\.ci|otel_llm|testing|tests|tools|benchmarks|examples|dashboards|deploy|"
                           r"collector-config)/[\w./-]*)`", section))
    assert len(paths) > 15
    assert not sorted(p for p in paths if not (ROOT / p).exists())


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT / "testing" if path.is_relative_to(ROOT / "testing") else ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    paths = [*ROOT.glob("otel_llm/**/*.py"), *ROOT.glob("testing/otel_llm_testing/**/*.py")]
    return {_module_name(path): path for path in paths}


def _imports() -> dict[str, set[str]]:
    """module -> the otel_llm modules it imports (``from a import b``: ``a.b`` where that is a
    module, else ``a``), relative imports resolved."""
    sources = _sources()
    found: dict[str, set[str]] = {}
    for module, path in sources.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names)
        found[module] = {n for n in names if n.startswith("otel_llm") and n in sources}
    return found


def _package_of(module: str) -> str:
    """The folder a module belongs to: otel_llm.capture, otel_llm.tools.bench, otel_llm (top level)..."""
    parts = module.split(".")
    if parts[0] == "otel_llm_testing":
        return "otel_llm_testing"
    depth = 3 if parts[:2] == ["otel_llm", "tools"] else 2
    return ".".join(parts[:depth])  # a top-level module (otel_llm.config) is a node of its own


def test_the_sdk_never_imports_a_tool_or_a_test_helper() -> None:
    bad = {module: sorted(n for n in names if n.startswith(("otel_llm.tools", "otel_llm_testing")))
           for module, names in _imports().items()
           if not module.startswith(("otel_llm.tools", "otel_llm_testing")) and module != "otel_llm.gateway"}
    assert not any(bad.values()), {k: v for k, v in bad.items() if v}


def test_no_module_imports_another_package_s_private_module() -> None:
    bad = []
    for module, names in _imports().items():
        for target in names:
            if not target.rpartition(".")[2].startswith("_") or target.endswith("__main__"):
                continue
            owner = target.rpartition(".")[0]
            if not (module == owner or module.startswith(owner + ".")):
                bad.append(f"{module} -> {target}")
    assert not bad, sorted(set(bad))


def test_the_tools_use_only_the_sdk_s_public_names() -> None:
    """The commands and servers are clients of the SDK: no SDK module or name with a leading
    underscore (their own private modules are theirs)."""
    bad = []
    for path in sorted((ROOT / "otel_llm" / "tools").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            bad += [f"{path.relative_to(ROOT)}: {name}" for name in names
                    if name.startswith("otel_llm.") and not name.startswith("otel_llm.tools.")
                    and any(part.startswith("_") and part != "__version__" for part in name.split(".")[1:])]
    assert bad == [], bad


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, names in _imports().items():
        if module.endswith(".__main__"):
            continue  # an entry point (python -m): nothing imports it, so it closes no cycle
        for name in names:
            if _package_of(name) != _package_of(module):
                graph[_package_of(module)].add(_package_of(name))
    assert "otel_llm.tools.diagnose" in graph  # the graph is really built

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = [c for p in graph if (c := cycle_from(p))]
    assert not cycles, cycles


# SDK modules with no logic of their own to test: names, types, a version, a re-export.
_NOTHING_TO_TEST = {"otel_llm/version.py", "otel_llm/package.py", "otel_llm/gateway.py", "otel_llm/_types.py",
                    "otel_llm/semconv.py"}


def _test_names() -> set[str]:
    return {path.stem for path in (ROOT / "tests").rglob("test_*.py")}


def test_every_sdk_module_has_a_test_module_named_after_it() -> None:
    """``otel_llm/<package>/<name>.py`` is tested in ``tests/**/test_<name>.py`` (or
    ``test_<package>_<name>.py``), so a newcomer finds its tests by its name."""
    names = _test_names()
    missing = []
    for path in sorted((ROOT / "otel_llm").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("otel_llm/tools/") or path.name == "__init__.py" or relative in _NOTHING_TO_TEST:
            continue
        stem = path.stem.lstrip("_")
        package = path.parent.name
        if not {f"test_{stem}", f"test_{package}_{stem}"} & names:
            missing.append(relative)
    assert missing == [], missing


# parse/ reads what capture recorded and nothing else: whatever sends a request or reads a process
# (the runtime-state poller, diagnose's probes, the process observers) lives outside it
_IO_MODULES = ("socket", "http.client", "urllib.request", "httpx", "subprocess", "aiohttp", "urllib3", "requests",
               "psutil")
# the otel_llm modules parse/ may import besides its own: names and types, no behaviour
_PURE_SHARED = {"otel_llm.semconv", "otel_llm._types", "otel_llm._log"}


def _imported_names(tree: ast.AST) -> set[str]:
    """Every module a source names in an import statement or in ``importlib.import_module("...")``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def _impurities(module: str, source: str, imports: set[str]) -> list[str]:
    tree = ast.parse(source)
    found = [f"{module} imports {name}" for name in sorted(_imported_names(tree))
             if any(name == io or name.startswith(io + ".") for io in _IO_MODULES)]
    found += [f"{module} reads {node.value!r}" for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc")]
    found += [f"{module} imports {name}" for name in sorted(imports)
              if not name.startswith("otel_llm.parse") and name not in _PURE_SHARED]
    # a function that takes GET access to a server (diagnose's ``Routes``) sends requests through it
    found += [f"{module} asks a server through Routes" for node in ast.walk(tree)
              if isinstance(node, ast.Name) and node.id == "Routes"
              or isinstance(node, ast.ClassDef) and node.name == "Routes"]
    return found


def test_parse_does_no_io() -> None:
    """No module under otel_llm/parse/ imports a network or process module, reads /proc, imports
    the otel_llm packages that do (observers, runtimes, tools...), or asks a server for a route."""
    sources, imports = _sources(), _imports()
    parse = {module: path for module, path in sources.items() if module.startswith("otel_llm.parse")}
    assert "otel_llm.parse.runtimes.llamacpp" in parse  # the modules are really found
    bad = sorted({problem for module, path in parse.items()
                  for problem in _impurities(module, path.read_text(), imports[module])})
    assert not bad, bad


def test_the_parse_purity_check_sees_what_it_forbids() -> None:
    """The check above finds each kind of impurity in a source that has it."""
    source = ("import socket\nfrom urllib.request import urlopen\nimport importlib\nimportlib.import_module('httpx')\n"
              "PATH = '/proc/self/stat'\ndef probe(routes: Routes) -> None: ...\n")
    found = _impurities("example", source, {"otel_llm.observers.sockets", "otel_llm.semconv"})
    assert found == ["example imports httpx", "example imports socket", "example imports urllib.request",
                     "example imports urllib.request.urlopen", "example reads '/proc/self/stat'",
                     "example imports otel_llm.observers.sockets", "example asks a server through Routes"], found
