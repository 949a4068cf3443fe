"""Stopping the child processes the tools start (the simulator, the gateway)."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["terminate"]


def terminate(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
