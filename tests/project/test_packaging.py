"""The wheel: it requires exactly what the SDK imports, ships nothing for tests, and traces a
streamed call installed alone into a fresh virtualenv."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from otel_llm_testing import markers

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "otel_llm"
# Imported by the SDK only where the library that needs them is installed (httpcore's async
# backend brings anyio), so never a requirement of its own.
OPTIONAL = {"anyio"}
OPENAI = "openai==3.57.0"  # the application's own client, at the version the clients page names

pytestmark = [pytest.mark.timeout(900), pytest.mark.backend, pytest.mark.slow]


def _sdk_files() -> list[Path]:
    """Every module of the SDK: the package minus the tools and the gateway's short path."""
    return [path for path in SDK.rglob("*.py")
            if "tools" not in path.relative_to(SDK).parts and path != SDK / "gateway.py"]


def _sdk_imports() -> set[str]:
    """Absolute module names the SDK imports, anywhere in a module (lazy imports included)."""
    names: set[str] = set()
    for path in _sdk_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] not in sys.stdlib_module_names
            and not name.startswith("otel_llm")}


def _modules_of(distribution: str) -> set[str]:
    """The dotted names of the modules an installed distribution provides."""
    found = set()
    for file in metadata.distribution(distribution).files or ():
        parts = Path(str(file)).with_suffix("").parts
        if str(file).endswith(".py") and not parts[0].endswith((".dist-info", ".data")):
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    markers.need("backend", "pip (the build backend and the wheel's requirements come from PyPI)")
    out = tmp_path_factory.mktemp("wheel")
    # from a copy of what git sees: setuptools' build/ folder in a checkout keeps modules that
    # were since renamed or removed, and would put them in the wheel
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
                   check=True, timeout=600)
    (built,) = out.glob("otel_llm-*.whl")
    return built


def _metadata(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def test_every_requirement_is_imported_by_the_sdk(wheel: Path) -> None:
    imports = _sdk_imports()
    required = [Requirement(line) for line in _metadata(wheel).get_all("Requires-Dist")]
    plain = [r for r in required if r.marker is None or "extra" not in str(r.marker)]
    assert plain, "the wheel requires nothing"
    unused = [r.name for r in plain if not imports & _modules_of(r.name)]
    assert not unused, f"required, but no SDK module imports them: {unused}"


def test_every_library_the_sdk_imports_is_required(wheel: Path) -> None:
    required = [Requirement(line) for line in _metadata(wheel).get_all("Requires-Dist")]
    provided = set().union(*(_modules_of(r.name) for r in required
                             if r.marker is None or "extra" not in str(r.marker)))
    # a name is provided as a module, a name in a provided module, or a namespace package above one
    missing = sorted(name for name in _sdk_imports() - provided
                     if name.split(".")[0] not in OPTIONAL and name.rpartition(".")[0] not in provided
                     and not any(p.startswith(name + ".") for p in provided))
    assert not missing, f"imported by the SDK, but no requirement provides them: {missing}"


def test_the_tools_come_with_extras_and_the_test_helpers_stay_out(wheel: Path) -> None:
    extras = set(_metadata(wheel).get_all("Provides-Extra"))
    assert {"gateway", "bench", "all"} <= extras
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "otel_llm/py.typed" in names
    assert "otel_llm/tools/main.py" in names and "otel_llm/tools/gateway/app.py" in names
    assert not [n for n in names if "otel_llm_testing" in n or n.startswith(("tests/", "benchmarks/"))]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_the_wheel_alone_traces_a_streamed_call(wheel: Path, sim: Any, tmp_path: Path) -> None:
    """A fresh virtualenv with the wheel (no extra) and the application's openai client."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel), OPENAI],
                   check=True, timeout=600)
    traces = tmp_path / "traces.jsonl"
    script = f"""
import importlib.util, openai, otel_llm
otel_llm.instrument(traces_file={str(traces)!r}, console_summary=False, service_name="wheel-check")
client = openai.OpenAI(base_url={sim.base_url + "/v1"!r}, api_key="unused")
stream = client.chat.completions.create(model="sim-model", messages=[{{"role": "user", "content": "hi"}}],
                                        stream=True, max_tokens=5)
print("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
otel_llm.uninstrument()
print([m for m in ("otel_llm_testing", "uvicorn", "aiohttp") if importlib.util.find_spec(m)])
"""
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text, absent = done.stdout.splitlines()
    assert text == "tok0 tok1 tok2 tok3 tok4"
    assert absent == "[]"  # neither the test helpers nor any extra came with the wheel
    spans = [span for line in traces.read_text().splitlines()
             for resource in json.loads(line)["resourceSpans"]
             for scope in resource["scopeSpans"] for span in scope["spans"]]
    names = {span["name"] for span in spans}
    assert "chat sim-model" in names and {"llm.first_token", "llm.decode"} <= names
