"""``SimProcess``: the simulator in a child process, so client and server do not share a GIL."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

from otel_llm.tools.process import terminate

from .scenario import SimConfig
from .control import SimControl

__all__ = ["SimProcess"]

_LISTENING = re.compile(r"listening on http://(?P<host>[^\s:]+):(?P<port>\d+)")
# The directory that holds the otel_llm package, so the child imports this very tree.
_ROOT = Path(__file__).resolve().parents[2]


class SimProcess(SimControl):
    """Runs ``python -m otel_llm.tools.sim``; use as a context manager."""

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = 20.0,
        **overrides: Any,
    ) -> None:
        self.config = (config or SimConfig()).merged(overrides)
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        flags = ["--host", self.host, "--port", str(self.port), *self.config.to_cli_args()]
        return [sys.executable, "-m", "otel_llm.tools.sim", *flags]

    def start(self) -> SimProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, text=True
        )
        line = self._first_line()
        match = _LISTENING.search(line)
        if match is None:
            self.stop()
            raise RuntimeError(f"simulator did not start: {line!r}")
        self.port = int(match["port"])
        return self

    def _first_line(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], self.startup_timeout)
        if not ready:
            self.stop()
            raise RuntimeError(f"simulator printed nothing within {self.startup_timeout} s")
        return self._proc.stdout.readline()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        terminate(proc, 5.0)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
