"""A real trace backend with a UI, Arize Phoenix, for tests and for looking at traces by hand.

``arize-phoenix`` (PyPI) pulls in about 140 packages, several of them pinned, so it never goes
into the project's environment: it is installed once into its own virtualenv under the cache
directory (``~/.cache/otel-llm/phoenix-<version>``; under a minute with a warm pip cache, a few
minutes otherwise), and ``phoenix serve`` runs from there on free loopback ports with a fresh
working directory (its SQLite database) and its telemetry off.

    with PhoenixServer() as phoenix:
        otel_llm.instrument(endpoint=phoenix.otlp_http_endpoint)            # or:
        otel_llm.instrument(endpoint=phoenix.otlp_grpc_endpoint, protocol="grpc")
        ...
        spans = phoenix.wait_for_spans(lambda spans: len(spans) >= 5)
        print(phoenix.url)                                                   # the web UI

    python -m otel_llm_testing.phoenix [--port 6006]    # install if needed, serve until Ctrl-C

Spans come back through Phoenix's REST API (``GET /v1/projects/<project>/spans``) as dicts with
``name``, ``context.trace_id``/``context.span_id``, ``parent_id``, ``start_time``/``end_time``
(ISO 8601), ``status_code`` and flat ``attributes``. Phoenix stores spans under the project
named by the resource attribute ``openinference.project.name``, else ``default``; it keeps its
own OpenInference ``span_kind`` (``LLM`` for a span with ``gen_ai.*`` model attributes, else
``UNKNOWN``) instead of the OpenTelemetry kind, and adds ``llm.*`` OpenInference attributes
derived from the ``gen_ai.*`` ones. It accepts traces only: OTLP metrics exports are refused
(HTTP 405, gRPC UNIMPLEMENTED), which OTLP exporters log and go on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from otel_llm_testing.subprocesses import private_venv, start_logged, terminate, wait_until_ok
from otel_llm_testing.llama_server import DEFAULT_CACHE
from otel_llm_testing.net import free_port
from otel_llm_testing.markers import need

__all__ = ["PHOENIX_VERSION", "PhoenixError", "PhoenixServer", "phoenix_executable"]

PHOENIX_VERSION = "20.26.1"
PHOENIX_PACKAGE = f"arize-phoenix=={PHOENIX_VERSION}"
# settings of the caller's environment that must not reach Phoenix or its installer
_DROPPED_PREFIXES = ("OTEL_", "PHOENIX_", "PYTHON", "VIRTUAL_ENV")


class PhoenixError(RuntimeError):
    """Phoenix could not be installed or started, or did not show the spans asked for."""


def venv_path(cache_dir: Path = DEFAULT_CACHE) -> Path:
    return Path(cache_dir) / f"phoenix-{PHOENIX_VERSION}"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_DROPPED_PREFIXES)}
    env.update(extra)
    return env


def phoenix_executable(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The ``phoenix`` command of the private virtualenv, installed on first use."""
    return private_venv(venv_path(cache_dir), "phoenix", PHOENIX_PACKAGE, _install_steps,
                        _clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
                        lambda why: PhoenixError(f"installing {PHOENIX_PACKAGE} {why}"),
                        "about 140 packages: from under a minute to several minutes, once")


def _install_steps(python: str) -> list[list[str]]:
    return [
        [python, "-m", "pip", "install", "--progress-bar", "off", "--upgrade", "pip"],
        [python, "-m", "pip", "install", "--progress-bar", "off", PHOENIX_PACKAGE],
        [python, "-c", "import phoenix.server.main"],
    ]


class PhoenixServer:
    """``phoenix serve`` on 127.0.0.1 (web UI and OTLP/HTTP on one port, OTLP/gRPC on another);
    a context manager."""

    def __init__(self, *, port: int = 0, grpc_port: int = 0, startup_timeout: float = 180.0,
                 cache_dir: Path = DEFAULT_CACHE) -> None:
        self.port = port
        self.grpc_port = grpc_port
        self.startup_timeout = startup_timeout
        self.cache_dir = cache_dir
        self.working_dir: Path | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._log: deque[str] = deque(maxlen=400)

    # --- addresses -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The web UI and REST API."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_http_endpoint(self) -> str:
        """Base OTLP/HTTP endpoint (``/v1/traces`` is appended by exporters, as for any collector)."""
        return self.url

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    # --- life cycle ------------------------------------------------------------------------------

    def command(self) -> list[str]:
        return [str(phoenix_executable(self.cache_dir)), "serve"]

    def start(self) -> PhoenixServer:
        need("backend", "Arize Phoenix")
        command = self.command()  # installs first if needed: before any port is picked
        chosen = (self.port, self.grpc_port)
        for attempt in range(3):
            self.port, self.grpc_port = chosen[0] or free_port(), chosen[1] or free_port()
            try:
                return self._start(command)
            except PhoenixError as exc:
                # a free port picked here can be taken by someone else before Phoenix binds it
                if any(chosen) or "address already in use" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start(self, command: list[str]) -> PhoenixServer:
        self._log.clear()
        self.working_dir = Path(tempfile.mkdtemp(prefix="otel-llm-phoenix-"))
        env = _clean_env(PHOENIX_WORKING_DIR=str(self.working_dir), PHOENIX_HOST="127.0.0.1",
                         PHOENIX_PORT=str(self.port), PHOENIX_GRPC_PORT=str(self.grpc_port),
                         PHOENIX_TELEMETRY_ENABLED="false", PYTHONUNBUFFERED="1")
        self._proc = start_logged(command, self._log, "phoenix-log", env=env, cwd=self.working_dir)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        """``/healthz`` answers once the app (and with it the gRPC receiver) has started."""
        assert self._proc is not None
        wait_until_ok(f"{self.url}/healthz", self._proc, self.startup_timeout, 0.25,
                      lambda why: PhoenixError(f"phoenix serve {why}:\n{self.log_tail()}"))

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._log)[-lines:])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, 15)
        if self.working_dir is not None:
            shutil.rmtree(self.working_dir, ignore_errors=True)
            self.working_dir = None

    def __enter__(self) -> PhoenixServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- reading spans back ----------------------------------------------------------------------

    def spans(self, limit: int = 1000, project: str = "default") -> list[dict[str, Any]]:
        """Up to ``limit`` spans of ``project``, newest first, through the REST API."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while len(found) < limit:
                params: dict[str, Any] = {"limit": min(limit - len(found), 1000)}
                if cursor:
                    params["cursor"] = cursor
                response = client.get(f"/v1/projects/{project}/spans", params=params)
                if response.status_code == 404:  # the project exists once its first span arrived
                    return found
                response.raise_for_status()
                page = response.json()
                found.extend(page.get("data") or [])
                cursor = page.get("next_cursor")
                if not cursor or not page.get("data"):
                    break
        return found[:limit]

    def wait_for_spans(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0,
                       limit: int = 1000, project: str = "default") -> list[dict[str, Any]]:
        """Poll until ``predicate(spans)`` holds (Phoenix ingests asynchronously); the spans."""
        deadline = time.monotonic() + timeout
        spans: list[dict[str, Any]] = []
        while True:
            spans = self.spans(limit, project)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted(str(s.get("name")) for s in spans)
                raise PhoenixError(f"Phoenix did not show the expected spans within {timeout:.0f} s; it has "
                                   f"{len(spans)}: {names[:50]}\nlog:\n{self.log_tail(15)}")
            time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    """``python -m otel_llm_testing.phoenix``: install if needed, then serve until interrupted."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=6006, help="web UI, REST API and OTLP/HTTP (default 6006)")
    parser.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC (default 4317)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the server is stopped and its working directory removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with PhoenixServer(port=args.port, grpc_port=args.grpc_port) as phoenix:
        print(f"Phoenix {PHOENIX_VERSION}: UI {phoenix.url}\n"
              f"  OTEL_LLM_ENDPOINT={phoenix.otlp_http_endpoint}  (http/protobuf)\n"
              f"  OTEL_LLM_ENDPOINT={phoenix.otlp_grpc_endpoint} OTEL_LLM_PROTOCOL=grpc\n"
              "Ctrl-C stops it (its data lives in a temporary directory and goes with it).", flush=True)
        try:
            while phoenix._proc is not None and phoenix._proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
