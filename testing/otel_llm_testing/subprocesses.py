"""Child processes the test helpers start and the virtualenvs they install (llama-server, Phoenix, vLLM),
and the clean environment a test's child Python runs in."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time
import sys
from collections.abc import Callable, Mapping, MutableSequence
from pathlib import Path
from typing import IO, Any

from otel_llm.tools.process import terminate

__all__ = ["MARKER", "REPO", "VENV_BIN", "clean_env", "private_venv", "run_install_step", "run_python", "start_logged",
           "terminate", "wait_until_ok"]

REPO = Path(__file__).resolve().parents[2]  # the checkout this package belongs to
VENV_BIN = Path(sys.executable).parent


_DROPPED_PREFIXES = ("OTEL_", "PYTHON")
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without OTel/otel_llm settings, proxies or PYTHON* variables, plus ``extra``.

    PYTHONPATH is this checkout (and its testing/), so a subprocess imports the otel_llm and
    otel_llm_testing under test even when the venv's editable installs point at another checkout
    (a git worktree)."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.upper().startswith(_DROPPED_PREFIXES) and k.lower() not in _PROXY_VARS
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "testing")])
    env.update(extra)
    return env


def run_python(script: str, cwd: Path, env: Mapping[str, str], *args: str,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Write ``script`` to ``cwd/app.py`` and run it with the venv's python."""
    path = cwd / "app.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path), *args], cwd=cwd, env=dict(env),
                          capture_output=True, text=True, timeout=timeout)


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


MARKER = ".otel-llm-installed"  # in a private virtualenv, written last: what was installed


def private_venv(venv: Path, executable: str, package: str, steps: Callable[[str], list[list[str]]],
                 env: dict[str, str], fail: Callable[[str], Exception], about: str, *, who: str = "otel-llm",
                 current: Callable[[str], bool] | None = None,
                 finish: Callable[[str, IO[str]], str] | None = None) -> Path:
    """``venv/bin/<executable>`` of a virtualenv of its own for ``package``, installed on first use
    (Phoenix, vLLM, the peers benchmark's instrumentations: packages that never go into the
    project's environment).

    ``steps(python)`` are the commands run after the virtualenv is created, ``python`` being its
    interpreter; ``env`` their environment, ``fail(why)`` the error raised with the log's tail,
    ``about`` what the first line printed says to expect, ``who`` the prefix of the lines printed.
    ``finish(python, log)``, when given, runs after the steps and returns the marker's text (by
    default the package's name); ``current(marker_text)`` says whether an installed virtualenv is
    still the one wanted (by default any is), else it is installed again. The marker file is written
    last, so an interrupted install is redone from scratch next time (a virtualenv cannot be moved
    into place afterwards: its scripts hold absolute paths); a lock keeps two processes from
    installing at once."""
    target = venv / "bin" / executable

    def installed() -> bool:
        try:
            text = (venv / MARKER).read_text()
        except OSError:
            return False
        return target.is_file() and (current is None or current(text))

    if installed():
        return target
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent process may be installing the same thing
        if not installed():
            _install_venv(venv, package, steps, env, fail, about, who, finish)
    return target


def _install_venv(venv: Path, package: str, steps: Callable[[str], list[list[str]]], env: dict[str, str],
                  fail: Callable[[str], Exception], about: str, who: str,
                  finish: Callable[[str, IO[str]], str] | None) -> None:
    started = time.monotonic()
    print(f"{who}: installing {package} into its own virtualenv {venv} ({about})", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    log_path = venv.with_name(venv.name + ".install.log")
    label = f"{who}: {package.split('==')[0]} install"
    python = str(venv / "bin" / "python")
    with open(log_path, "w") as log:
        for step in [[sys.executable, "-m", "venv", str(venv)], *steps(python)]:
            run_install_step(step, env, log, log_path, label, started, fail, tail_lines=40)
        marker = package + "\n" if finish is None else finish(python, log)
    (venv / MARKER).write_text(marker)
    print(f"{who}: {package} installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
