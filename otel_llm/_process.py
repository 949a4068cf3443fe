"""Child processes that otel_llm starts (the simulator, llama-server, Phoenix, the gateway)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, MutableSequence
from typing import Any


def terminate(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_logged(command: list[str], log: MutableSequence[str], name: str, **popen: Any) -> subprocess.Popen[str]:
    """Start ``command`` with stdout and stderr merged; a daemon thread appends each line to
    ``log`` (a bounded deque), so a failure can quote what the child said."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, **popen)

    def drain() -> None:
        for line in proc.stdout or ():
            log.append(line.rstrip())

    threading.Thread(target=drain, name=name, daemon=True).start()
    return proc


def wait_until_ok(url: str, proc: subprocess.Popen[Any], timeout: float, interval: float,
                  fail: Callable[[str], Exception]) -> None:
    """Poll ``url`` until it answers 200; ``fail(why)`` is raised if ``proc`` exits first or
    ``timeout`` seconds pass (a server that is up but not ready answers something else)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise fail(f"exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise fail(f"not ready after {timeout:.0f} s")
