"""Clients in other languages, as the tests run them through ``otel-llm proxy``: Debian's curl,
the official ``openai`` npm package on Node.js, and Go's standard ``net/http``.

The clients page's table "Tested clients in other languages" (docs/clients.md) is built from
``table_rows()`` and checked against it (``tests/project/test_doc_tables.py``);
``tests/e2e/test_proxy_clients.py`` drives the Node.js and Go clients against the simulator and
the real llama.cpp server, ``tests/tools/test_proxy.py`` and ``tests/e2e/test_proxy_llamacpp.py``
curl. What is missing is installed on first use, behind the ``backend`` marker: Debian's
``nodejs``/``npm`` or ``golang-go`` with apt-get, the ``openai`` package with npm into the cache
directory (``~/.cache/otel-llm/node-openai-<version>``). The Go program is built once per source
into the cache directory too, so no call's timing includes a compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from otel_llm_testing import markers
from otel_llm_testing.llama_server import DEFAULT_CACHE
from otel_llm_testing.subprocesses import REPO

__all__ = ["CLIENTS_DIR", "GO_SOURCE", "GO_USER_AGENT", "NODE_SCRIPT", "OPENAI_JS_USER_AGENT", "OPENAI_JS_VERSION",
           "TABLE_HEADER", "ClientError", "curl_version", "go_client", "go_version", "node_openai", "node_version",
           "run_go", "run_node", "table_rows"]

CLIENTS_DIR = REPO / "tests" / "fixtures" / "clients"
NODE_SCRIPT = CLIENTS_DIR / "openai_chat.cjs"
GO_SOURCE = CLIENTS_DIR / "stream_chat.go"
OPENAI_JS_VERSION = "6.49.0"  # the newest openai release that still runs on Node.js 20 (7.x needs 22)
OPENAI_JS_USER_AGENT = f"OpenAI/JS {OPENAI_JS_VERSION}"
GO_USER_AGENT = "Go-http-client/1.1"
TABLE_HEADER = "| client | version tested | through |"


class ClientError(RuntimeError):
    """A client could not be installed, built or run; the message quotes its output."""


# -- versions --------------------------------------------------------------------------------------
def _output(command: list[str]) -> str | None:
    """The command's stdout, or None when the program is not installed."""
    if shutil.which(command[0]) is None:
        return None
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout


def curl_version() -> str | None:
    out = _output(["curl", "--version"])  # curl 7.88.1 (x86_64-pc-linux-gnu) libcurl/7.88.1 ...
    return None if out is None else out.split()[1]


def node_version() -> str | None:
    out = _output(["node", "--version"])  # v20.20.2
    return None if out is None else out.strip().removeprefix("v")


def go_version() -> str | None:
    out = _output(["go", "version"])  # go version go1.19.8 linux/amd64
    if out is None:
        return None
    match = re.search(r"\bgo(\d+\.\d+(?:\.\d+)?)\b", out)
    assert match, out
    return match[1]


def table_rows() -> list[str | None]:
    """The table's rows from the versions installed here; None for a client whose toolchain is
    not installed (its version cannot be told until a test installs it)."""
    curl, node, go = curl_version(), node_version(), go_version()
    return [
        None if curl is None else f"| curl | curl {curl} | `otel-llm proxy`: streamed calls |",
        None if node is None else (f"| Node.js `openai` | openai {OPENAI_JS_VERSION} (npm), Node.js {node} | "
                                   "`otel-llm proxy`: streamed and whole calls, on Node's `fetch` |"),
        None if go is None else f"| Go `net/http` | Go {go} | `otel-llm proxy`: streamed calls |",
    ]


# -- installing ------------------------------------------------------------------------------------
def _apt_install(*packages: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, check=False)
        if done.returncode != 0:
            raise ClientError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _installed_openai(package_dir: Path) -> str | None:
    manifest = package_dir / "node_modules" / "openai" / "package.json"
    return json.loads(manifest.read_text())["version"] if manifest.exists() else None


def node_openai(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The directory holding ``node_modules/openai`` at the pinned version, with ``node`` on the
    PATH: Debian's nodejs and npm installed if Node.js is missing, the package installed once."""
    package_dir = Path(cache_dir) / f"node-openai-{OPENAI_JS_VERSION}"
    if shutil.which("node") is None or shutil.which("npm") is None:
        markers.need("backend", "Node.js (Debian's nodejs and npm, with apt-get)")
        _apt_install("nodejs", "npm")
    if _installed_openai(package_dir) == OPENAI_JS_VERSION:
        return package_dir
    markers.need("backend", f"npm install openai@{OPENAI_JS_VERSION}")
    started = time.monotonic()
    staging = package_dir.with_name(package_dir.name + ".installing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "package.json").write_text('{"private": true}\n')
    done = subprocess.run(["npm", "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--save-exact",
                           f"openai@{OPENAI_JS_VERSION}"], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or _installed_openai(staging) != OPENAI_JS_VERSION:
        raise ClientError(f"npm install openai@{OPENAI_JS_VERSION} failed:\n{done.stdout[-2000:]}\n"
                          f"{done.stderr[-2000:]}")
    shutil.rmtree(package_dir, ignore_errors=True)
    staging.rename(package_dir)
    print(f"installed openai@{OPENAI_JS_VERSION} (npm) in {time.monotonic() - started:.1f}s")
    return package_dir


def _go_env(cache_dir: Path) -> dict[str, str]:
    go = Path(cache_dir) / "go"
    # no modules, no downloads: the program needs the standard library only
    return dict(os.environ, GO111MODULE="off", GOPROXY="off", GOFLAGS="", CGO_ENABLED="0",
                GOCACHE=str(go / "cache"), GOPATH=str(go / "path"))


def go_client(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The Go program, built once per source and Go version (Debian's golang-go installed if
    ``go`` is missing)."""
    if shutil.which("go") is None:
        markers.need("backend", "Go (Debian's golang-go, with apt-get)")
        _apt_install("golang-go")
    source = GO_SOURCE.read_bytes()
    tag = hashlib.sha256(source + (go_version() or "").encode()).hexdigest()[:12]
    binary = Path(cache_dir) / "go" / "bin" / f"stream_chat-{tag}"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    building = binary.with_name(binary.name + ".building")
    done = subprocess.run(["go", "build", "-o", str(building), str(GO_SOURCE)], capture_output=True, text=True,
                          timeout=600, env=_go_env(cache_dir), cwd=CLIENTS_DIR, check=False)
    if done.returncode != 0:
        raise ClientError(f"go build {GO_SOURCE.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    building.rename(binary)
    return binary


# -- running ---------------------------------------------------------------------------------------
def run_node(package_dir: Path, base_url: str, body: dict[str, Any], raw: Path) -> str:
    """One call by the openai package (``base_url``: ``.../v1``): the text the application got;
    ``raw`` receives the response body the client read."""
    done = subprocess.run(["node", str(NODE_SCRIPT), str(package_dir), base_url, json.dumps(body), str(raw)],
                          capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise ClientError(f"node {NODE_SCRIPT.name} exited with {done.returncode}:\n{done.stderr.decode()[-3000:]}")
    return done.stdout.decode()


def run_go(binary: Path, url: str, body: dict[str, Any], raw: Path) -> str:
    """One streamed call by the Go program (``url``: the chat endpoint): the text it printed;
    ``raw`` receives the response body it read."""
    done = subprocess.run([str(binary), "-raw", str(raw), url, json.dumps(body)], capture_output=True, timeout=120,
                          check=False)
    if done.returncode != 0:
        raise ClientError(f"{binary.name} exited with {done.returncode}:\n{done.stderr.decode()[-3000:]}")
    return done.stdout.decode()
