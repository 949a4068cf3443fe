"""Deliberate cold trials: return the runtime to a defined cold state, then send ONE recorded request.

For each trial (see "Run cold trials deliberately"):

1. reset with a :class:`ColdControl`:

   * ``ColdControl.ollama()`` - Ollama's documented lifecycle control: ``POST /api/generate`` with
     ``{"model": MODEL, "keep_alive": 0}`` and no prompt unloads the model (answer
     ``done_reason: "unload"``); then ``GET /api/ps`` is polled until the model is no longer listed.
   * ``ColdControl.from_command("systemctl restart ...")`` - a user-supplied shell command run with
     ``subprocess.run(cmd, shell=True, timeout=...)``; a non-zero exit status or a timeout fails the
     reset. Then the target's probe route is polled until it answers 200 again (``/api/version``
     for ``--api ollama``, ``/health`` for llamacpp, ``/v1/models`` for openai) - none of them
     loads a model. Note: llama.cpp loads its model at process start, so after a restart its
     "cold" trial measures cold caches, not the load itself.

2. confirm that nothing warmed the model up: for ``--api ollama`` targets ``GET /api/ps`` must not
   list the model (whatever the control). Other runtimes have no documented side-effect-free route
   for this and are not checked.
3. send exactly one recorded generation request: ``runner.one("cold", i)``.

A failed reset never raises: the trial is recorded with ``error="reset_failed"`` and the reason in
``detail``, and NO generation request is sent for it (it would not be a cold trial). Reset and
probe requests are made with HTTP instrumentation suppressed, so they leave no spans.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from otel_llm.runtimes import READY_PATHS

from .trials import Trial, TrialRunner

__all__ = ["ColdControl", "ResetOutcome", "cold_trials", "cold_verdict_evidence", "model_loaded", "reset"]

PROBE_ROUTES = READY_PATHS


@dataclass(frozen=True)
class ColdControl:
    """How to return the runtime to a cold state: ``kind`` "ollama" or "command"."""

    kind: str = "ollama"
    command: str | None = None
    command_timeout: float = 300.0  # seconds the shell command may run
    ready_timeout: float = 120.0  # seconds to wait for the probe route (command) / the unload (ollama)

    @classmethod
    def ollama(cls, ready_timeout: float = 30.0) -> ColdControl:
        return cls("ollama", None, ready_timeout=ready_timeout)

    @classmethod
    def from_command(cls, command: str, command_timeout: float = 300.0, ready_timeout: float = 120.0) -> ColdControl:
        if not command.strip():
            raise ValueError("empty cold command")
        return cls("command", command, command_timeout, ready_timeout)

    @classmethod
    def parse(cls, text: str) -> ColdControl:
        """A CLI value: "ollama", or any other text = a shell command."""
        return cls.ollama() if text.strip() == "ollama" else cls.from_command(text)

    def __post_init__(self) -> None:
        if self.kind not in ("ollama", "command"):
            raise ValueError(f"unknown cold control {self.kind!r}; 'ollama' or 'command'")
        if self.kind == "command" and not self.command:
            raise ValueError("cold control 'command' needs a command")


@dataclass
class ResetOutcome:
    ok: bool
    detail: str = ""
    seconds: float = 0.0


def _root(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _suppressed() -> Any:
    from opentelemetry.instrumentation.utils import suppress_http_instrumentation

    return suppress_http_instrumentation()


def _names(model: str) -> set[str]:
    return {model, model + ":latest"} if ":" not in model else {model}


def model_loaded(client: httpx.Client, base_url: str, model: str) -> bool | None:
    """Ollama ``GET /api/ps``: is ``model`` loaded? None when the route gave no usable answer."""
    try:
        with _suppressed():
            response = client.get(_root(base_url) + "/api/ps")
        if response.status_code != 200:
            return None
        models = response.json().get("models")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(models, list):
        return None
    wanted = _names(model)
    return any(isinstance(m, dict) and (m.get("name") in wanted or m.get("model") in wanted) for m in models)


def _wait_unloaded(client: httpx.Client, base_url: str, model: str, timeout: float) -> str | None:
    """None once /api/ps no longer lists the model; else the reason."""
    deadline = time.monotonic() + timeout
    while True:
        loaded = model_loaded(client, base_url, model)
        if loaded is False:
            return None
        if time.monotonic() >= deadline:
            return "GET /api/ps gave no usable answer" if loaded is None else \
                f"model {model!r} still listed by /api/ps after {timeout:.0f} s"
        time.sleep(0.05)


def _wait_ready(client: httpx.Client, url: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            with _suppressed():
                response = client.get(url)
            if response.status_code == 200:
                return None
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        if time.monotonic() >= deadline:
            return f"{url} not ready after {timeout:.0f} s ({last})"
        time.sleep(0.1)


def reset(control: ColdControl, client: httpx.Client, base_url: str, model: str, api: str) -> ResetOutcome:
    """Bring the target to its cold state; never raises."""
    started = time.monotonic()
    base = _root(base_url)
    if control.kind == "ollama":
        try:
            with _suppressed():
                response = client.post(base + "/api/generate", json={"model": model, "keep_alive": 0},
                                       timeout=control.ready_timeout)
        except httpx.HTTPError as exc:
            return ResetOutcome(False, f"unload request failed: {type(exc).__name__}: {exc}",
                                time.monotonic() - started)
        if response.status_code != 200:
            text = " ".join(response.text.split())[:200]
            return ResetOutcome(False, f"unload request: HTTP {response.status_code} {text}",
                                time.monotonic() - started)
        try:
            reason = response.json().get("done_reason")
        except (ValueError, AttributeError):
            reason = None
        if reason is not None and reason != "unload":
            return ResetOutcome(False, f"unload request answered done_reason {reason!r}", time.monotonic() - started)
        problem = _wait_unloaded(client, base, model, control.ready_timeout)
        return ResetOutcome(problem is None, problem or "unloaded (keep_alive 0)", time.monotonic() - started)
    assert control.command is not None
    try:
        done = subprocess.run(control.command, shell=True, timeout=control.command_timeout,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ResetOutcome(False, f"cold command timed out after {control.command_timeout:.0f} s",
                            time.monotonic() - started)
    except OSError as exc:
        return ResetOutcome(False, f"cold command could not run: {exc}", time.monotonic() - started)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout or "").split())[-200:]
        return ResetOutcome(False, f"cold command exited {done.returncode}" + (f": {tail}" if tail else ""),
                            time.monotonic() - started)
    problem = _wait_ready(client, base + PROBE_ROUTES.get(api, "/v1/models"), control.ready_timeout)
    return ResetOutcome(problem is None, problem or "cold command ok", time.monotonic() - started)


def cold_trials(runner: TrialRunner, count: int, control: ColdControl, base_url: str, model: str, *,
                on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    """``count`` cold trials: reset, confirm still cold, exactly one ``runner.one("cold", i)``; repeat."""
    trials: list[Trial] = []
    with httpx.Client(headers=dict(runner.headers), trust_env=False,
                      timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        for i in range(count):
            outcome = reset(control, client, base_url, model, runner.api)
            if outcome.ok and runner.api == "ollama":
                # Confirm no automatic warm-up (a health probe, another client) loaded it again.
                if model_loaded(client, base_url, model):
                    outcome = ResetOutcome(False, f"model {model!r} loaded again before the cold request "
                                           "(/api/ps)", outcome.seconds)
            if not outcome.ok:
                trial = Trial(kind="cold", index=i, error="reset_failed", detail=runner.redact(outcome.detail))
            else:
                trial = runner.one("cold", i)
            trials.append(trial)
            if on_trial is not None:
                on_trial(trial)
    return trials


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def cold_verdict_evidence(cold: list[Trial], warm: list[Trial]) -> dict[str, Any]:
    """Evidence for the cold_start verdict from deliberate cold trials (seconds, rounded to ms).

    Keys: cold_trials / warm_trials (successful ones used), reset_failed (count),
    cold_ttft_s (median), warm_median_ttft_s, excess_s (cold - warm), native_load_duration_s
    (median of reported load durations; absent when none reported), meets_threshold (excess and
    factor of ``verdicts.THRESHOLDS``; None when not computable).
    """
    from .verdicts import THRESHOLDS

    ok_cold = [t for t in cold if t.ok]
    ok_warm = [t for t in warm if t.ok]
    cold_ttft = _median(t.ttft for t in ok_cold)
    warm_ttft = _median(t.ttft for t in ok_warm)
    excess = cold_ttft - warm_ttft if cold_ttft is not None and warm_ttft is not None else None
    evidence: dict[str, Any] = {
        "cold_trials": len(ok_cold), "warm_trials": len(ok_warm),
        "reset_failed": sum(1 for t in cold if t.error == "reset_failed"),
        "cold_ttft_s": _r(cold_ttft), "warm_median_ttft_s": _r(warm_ttft), "excess_s": _r(excess),
    }
    load = _median(t.load for t in ok_cold)
    if load is not None:
        evidence["native_load_duration_s"] = _r(load)
    evidence["meets_threshold"] = None if excess is None else bool(
        excess >= THRESHOLDS["cold_excess_s"] and cold_ttft >= THRESHOLDS["cold_factor"] * warm_ttft)  # type: ignore[operator]
    return evidence
