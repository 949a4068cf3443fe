"""``run_install_step``: the install step shared by the Phoenix launcher and the peers benchmark."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from otel_llm_testing.subprocesses import run_install_step

PRINTS = "import sys\nfor i in range(45): print(f'Collecting pkg{i}')\nprint('Installing collected packages: a, b, c')"


def test_output_is_logged_and_progress_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_path = tmp_path / "install.log"
    with open(log_path, "w") as log:
        run_install_step([sys.executable, "-c", PRINTS], dict(os.environ), log, log_path, "x install", 0.0,
                         RuntimeError)
    text = log_path.read_text()
    assert text.startswith(f"$ {sys.executable} -c") and "Collecting pkg44" in text
    progress = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1] for line in progress] == ["Collecting pkg0", "Collecting pkg20",
                                                             "Collecting pkg40", "installing 3 packages"]
    assert all(line.startswith("x install (") for line in progress)


def test_failure_raises_with_the_log_tail(tmp_path: Path) -> None:
    log_path = tmp_path / "install.log"
    script = "import sys\nfor i in range(50): print(f'line {i}')\nsys.exit(3)"
    with open(log_path, "w") as log, pytest.raises(ValueError) as raised:
        run_install_step([sys.executable, "-c", script], dict(os.environ), log, log_path, "x", 0.0,
                         lambda why: ValueError(f"installing x {why}"), tail_lines=5)
    message = str(raised.value)
    assert message.startswith("installing x failed at `") and str(log_path) in message
    assert message.splitlines()[-5:] == [f"line {i}" for i in range(45, 50)]


@pytest.mark.slow
def test_private_venv_installs_once_and_redoes_an_interrupted_install(tmp_path: Path) -> None:
    """The shared installer of Phoenix's and vLLM's virtualenvs: a marker written last, the
    executable returned from the cache afterwards, a failed step raised with the log's tail."""
    import os

    from otel_llm_testing.subprocesses import private_venv

    class Failed(RuntimeError):
        pass

    ran: list[str] = []

    def steps(python: str) -> list[list[str]]:
        ran.append(python)
        return [[python, "-c", "print('step ran')"]]

    venv = tmp_path / "venv"
    env = dict(os.environ)
    python = private_venv(venv, "python", "thing==1", steps, env, lambda why: Failed(why), "seconds")
    assert python == venv / "bin" / "python" and python.is_file()
    assert (venv / ".otel-llm-installed").read_text() == "thing==1\n" and len(ran) == 1
    assert "step ran" in (tmp_path / "venv.install.log").read_text()
    assert private_venv(venv, "python", "thing==1", steps, env, lambda why: Failed(why), "seconds") == python
    assert len(ran) == 1  # cached: nothing run again

    broken = tmp_path / "broken"
    with pytest.raises(Failed, match="raise SystemExit"):
        private_venv(broken, "python", "thing==1", lambda py: [[py, "-c", "raise SystemExit('no good')"]],
                     env, lambda why: Failed(why), "seconds")
    assert not (broken / ".otel-llm-installed").exists()  # redone next time
