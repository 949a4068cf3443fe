"""A real Prometheus (Debian's package, installed on first use) scraping what a test starts, and
what a test reads from it."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from otel_llm_testing import markers
from otel_llm_testing.net import LOOPBACK, free_port, wait_for

__all__ = ["PROMETHEUS", "Prometheus", "PrometheusMissing", "finite_values", "install_prometheus", "wait_until"]

PROMETHEUS = "/usr/bin/prometheus"


class PrometheusMissing(RuntimeError):
    """Prometheus could not be installed."""


def install_prometheus() -> str:
    """Debian's prometheus (2.42 here), installed with apt-get when missing (as root, like chromium
    for the HTML report test); its path."""
    markers.need("backend", "Prometheus")
    if not os.path.exists(PROMETHEUS):
        started = time.monotonic()
        logs = []
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "prometheus"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                  env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
            logs.append(f"$ {' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            if proc.returncode != 0:
                raise PrometheusMissing("installing prometheus failed:\n" + "\n".join(logs))
        print(f"installed prometheus in {time.monotonic() - started:.1f}s")
    if not os.path.exists(PROMETHEUS):
        raise PrometheusMissing(f"no {PROMETHEUS} after the install ({shutil.which('prometheus')} on PATH)")
    return PROMETHEUS


class Prometheus:
    """``prometheus`` on 127.0.0.1 scraping ``targets`` (job name -> host:port) every second,
    with its data in a temporary directory; a context manager."""

    def __init__(self, binary: str, targets: dict[str, str]) -> None:
        self.binary = binary
        self.targets = targets
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="otel-llm-prometheus-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = self._dir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        return {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                                   for job, target in self.targets.items()]}

    def start(self) -> Prometheus:
        """Start without waiting (see ``wait_ready``): it loads while the rest starts."""
        config = self._dir / "prometheus.yml"
        config.write_text(json.dumps(self.config(), indent=2))  # JSON is YAML
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [self.binary, f"--config.file={config}", f"--web.listen-address={LOOPBACK}:{self.port}",
                 f"--storage.tsdb.path={self._dir / 'data'}", "--storage.tsdb.retention.time=1h",
                 "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self._proc.returncode}:\n{self.log()}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(ready, timeout), f"prometheus not ready after {timeout} s:\n{self.log()}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def api(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert body.get("status") == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) that ``expr`` evaluates to now."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise AssertionError(f"{expr}: unexpected result type {data['resultType']}")

    def metric_names(self) -> set[str]:
        return set(self.api("label/__name__/values"))

    def up(self) -> dict[str, float]:
        return {s["metric"]["job"]: float(s["value"][1]) for s in self.query("up")}

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def finite_values(samples: list[dict[str, Any]]) -> list[float]:
    return [v for v in (float(s["value"][1]) for s in samples) if math.isfinite(v)]


def wait_until(check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """The first truthy ``check()`` within ``timeout`` seconds, else the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer or time.monotonic() > deadline:
            return answer
        time.sleep(interval)
