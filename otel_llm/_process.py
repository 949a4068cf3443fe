"""Child processes that otel_llm starts (the simulator, llama-server)."""

from __future__ import annotations

import subprocess
from typing import Any


def terminate(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
