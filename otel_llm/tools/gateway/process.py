"""``GatewayProcess`` and ``ProxyProcess``: ``otel-llm gateway`` and ``otel-llm proxy`` in a child process
(tests, examples, benchmarks)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from otel_llm.tools.process import terminate
from otel_llm.tools.gateway.keys import format_hash, generate_key

__all__ = ["GatewayProcess", "ProxyProcess"]

_LISTENING = re.compile(r"listening on (?P<url>http://\S+)")
_ROOT = Path(__file__).resolve().parents[2]


class _ChildServer:
    """The gateway's server in a child process: started, its address read from its first line,
    stopped gracefully; a context manager. Subclasses give the command."""

    role = "gateway"

    def __init__(self, env: dict[str, str] | None, startup_timeout: float, log_path: Path | None) -> None:
        self.extra_env = env or {}
        self.startup_timeout = startup_timeout
        self._dir = Path(tempfile.mkdtemp(prefix=f"otel-llm-{self.role}-"))
        self.log_path = log_path or self._dir / f"{self.role}.log"
        self.url = ""
        self.exit_code: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Any:
        env = {**os.environ, **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log())
            if match:
                self.url = match["url"]
                return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        log_text = self.log()
        self.stop()
        raise RuntimeError(f"{self.role} did not start:\n{log_text}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM (graceful: the exporters flush), then SIGKILL; the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return self.exit_code
        terminate(proc, 15.0)
        self.exit_code = proc.returncode
        return proc.returncode

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GatewayProcess(_ChildServer):
    """Runs the gateway in front of ``upstream`` with the given keys; a context manager.

    ``keys`` maps key id -> policy fields (``routes``, ``models``, ``rate``, ...); a fresh secret
    is generated for each and available in ``secrets[key_id]``. ``settings`` are gateway
    settings (``max_concurrency=2``...); ``env`` is added to the child's environment (e.g.
    ``OTEL_EXPORTER_OTLP_ENDPOINT``). The access log goes to ``access_log_path``, everything
    else the process writes to ``log_path``.
    """

    def __init__(self, upstream: str, keys: dict[str, dict[str, Any]] | None = None, *,
                 env: dict[str, str] | None = None, startup_timeout: float = 30.0, **settings: Any) -> None:
        super().__init__(env, startup_timeout, None)
        self.upstream = upstream
        self.settings = settings
        self.secrets = {key_id: generate_key() for key_id in (keys if keys is not None else {"default": {}})}
        self._keys = keys if keys is not None else {"default": {}}
        self.keys_path = self._dir / "keys.toml"
        self.access_log_path = self._dir / "access.jsonl"

    def _write_keys(self) -> None:
        lines = []
        for key_id, policy in self._keys.items():
            lines.append(f"[keys.{key_id}]")
            lines.append(f'hash = "{format_hash(self.secrets[key_id])}"')
            lines += [f"{name} = {json.dumps(value)}" for name, value in policy.items()]
        self.keys_path.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        flags = ["--upstream", self.upstream, "--listen", "127.0.0.1:0", "--keys", str(self.keys_path),
                 "--access-log", str(self.access_log_path)]
        for name, value in self.settings.items():
            flags += [f"--{name.replace('_', '-')}", str(value)]
        return [sys.executable, "-m", "otel_llm.tools.main", "gateway", *flags]

    def start(self) -> GatewayProcess:
        self._write_keys()
        started: GatewayProcess = super().start()
        return started

    def access_records(self) -> list[dict[str, Any]]:
        if not self.access_log_path.exists():
            return []
        return [json.loads(line) for line in self.access_log_path.read_text().splitlines() if line.strip()]

    def headers(self, key_id: str = "default") -> dict[str, str]:
        return {"authorization": f"Bearer {self.secrets[key_id]}"}

    def client(self, key_id: str = "default", **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(key_id), **kwargs)

    def __enter__(self) -> GatewayProcess:
        return self.start()


class ProxyProcess(_ChildServer):
    """Runs ``otel-llm proxy --upstream UPSTREAM --listen 127.0.0.1:0 ARGS...``; a context manager.

    ``args`` are more flags (``--keys FILE``, ``--stream-usage on``...); ``env`` is added to the
    child's environment (``OTEL_LLM_TRACES_FILE``...). What it prints (its address, a summary line
    per call) goes to ``log_path``."""

    role = "proxy"

    def __init__(self, upstream: str, *args: str, env: dict[str, str] | None = None,
                 startup_timeout: float = 30.0, log_path: Path | None = None) -> None:
        super().__init__(env, startup_timeout, log_path)
        self.upstream = upstream
        self.args = args

    def command(self) -> list[str]:
        return [sys.executable, "-m", "otel_llm.tools.main", "proxy", "--upstream", self.upstream,
                "--listen", "127.0.0.1:0", *self.args]

    def start(self) -> ProxyProcess:
        started: ProxyProcess = super().start()
        return started

    def __enter__(self) -> ProxyProcess:
        return self.start()
