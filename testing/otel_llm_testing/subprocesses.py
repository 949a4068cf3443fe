"""Child processes the test helpers start and the virtualenvs they install (llama-server, Phoenix, vLLM)."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import threading
import time
import sys
from collections.abc import Callable, MutableSequence
from pathlib import Path
from typing import IO, Any

from otel_llm.tools.process import terminate

__all__ = ["private_venv", "run_install_step", "start_logged", "terminate", "wait_until_ok"]


def start_logged(command: list[str], log: MutableSequence[str], name: str,
                 echo: Callable[[str], None] | None = None, **popen: Any) -> subprocess.Popen[str]:
    """Start ``command`` with stdout and stderr merged; a daemon thread appends each line to
    ``log`` (a bounded deque), so a failure can quote what the child said, and hands it to
    ``echo`` when given (a failing echo is dropped: the child must never block on its log)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, **popen)

    def drain() -> None:
        shown = echo
        for line in proc.stdout or ():
            log.append(line.rstrip())
            if shown is not None:
                try:
                    shown(line)
                except Exception:  # noqa: BLE001 - a closed terminal or pipe: keep draining
                    shown = None

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


def run_install_step(step: list[str], env: dict[str, str], log: IO[str], log_path: Path, label: str,
                     started: float, fail: Callable[[str], Exception], tail_lines: int = 30) -> None:
    """Run one step of a virtualenv install (``venv``, ``pip install``...): its output goes to
    ``log``, a progress line to stderr now and then (``label``: who installs what), and on
    failure ``fail(message)`` is raised with the log's last ``tail_lines`` lines."""
    log.write(f"$ {' '.join(step)}\n")
    log.flush()
    proc = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, env=env)
    assert proc.stdout is not None
    collected = 0
    for line in proc.stdout:
        log.write(line)
        if line.startswith("Collecting "):
            collected += 1
            if collected % 20 == 1:
                print(f"{label} ({time.monotonic() - started:.0f} s, {collected} packages resolved): "
                      f"{line.strip()[:90]}", file=sys.stderr, flush=True)
        elif line.startswith("Installing collected"):
            print(f"{label} ({time.monotonic() - started:.0f} s): installing "
                  f"{len(line.split(':', 1)[-1].split(','))} packages", file=sys.stderr, flush=True)
    if proc.wait() != 0:
        log.flush()
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-tail_lines:])
        raise fail(f"failed at `{' '.join(step)}` (log: {log_path}):\n{tail}")


_MARKER = ".otel-llm-installed"


def private_venv(venv: Path, executable: str, package: str, steps: Callable[[str], list[list[str]]],
                 env: dict[str, str], fail: Callable[[str], Exception], about: str) -> Path:
    """``venv/bin/<executable>`` of a virtualenv of its own for ``package``, installed on first use
    (Phoenix, vLLM: packages that never go into the project's environment).

    ``steps(python)`` are the commands run after the virtualenv is created, ``python`` being its
    interpreter; ``env`` their environment, ``fail(why)`` the error raised with the log's tail,
    ``about`` what the first line printed says to expect. A marker file is written last, so an
    interrupted install is redone from scratch next time (a virtualenv cannot be moved into place
    afterwards: its scripts hold absolute paths); a lock keeps two processes from installing at once."""
    target = venv / "bin" / executable
    if (venv / _MARKER).is_file() and target.is_file():
        return target
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent process may be installing the same thing
        if not ((venv / _MARKER).is_file() and target.is_file()):
            _install_venv(venv, package, steps, env, fail, about)
    return target


def _install_venv(venv: Path, package: str, steps: Callable[[str], list[list[str]]], env: dict[str, str],
                  fail: Callable[[str], Exception], about: str) -> None:
    started = time.monotonic()
    print(f"otel-llm: installing {package} into its own virtualenv {venv} ({about})", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    log_path = venv.with_name(venv.name + ".install.log")
    label = f"otel-llm: {package.split('==')[0]} install"
    with open(log_path, "w") as log:
        for step in [[sys.executable, "-m", "venv", str(venv)], *steps(str(venv / "bin" / "python"))]:
            run_install_step(step, env, log, log_path, label, started, fail, tail_lines=40)
    (venv / _MARKER).write_text(package + "\n")
    print(f"otel-llm: {package} installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
