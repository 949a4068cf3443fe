"""Start-up cost of otel_llm: ``instrument()``, the first traced call, LiteLLM's first call.

    python benchmarks/startup.py [--runs N] [--quick] [--json FILE] [--source DIR] [--no-litellm]

Every figure comes from fresh child processes of this virtualenv's python (median over
``--runs``), in an environment without OTel settings or proxies, with the embedded default (no
endpoint configured: JSON-lines file in a temporary directory, summary line, observers on):

(a) ``instrument``: the CPU of ``import otel_llm; otel_llm.instrument()`` (the whole process, and
    the main thread alone), against a child that only imports what the embedded default needs of
    the OpenTelemetry SDK (trace, metrics, their export modules, resources). Measured inside the
    child, after the interpreter's own start; also the process CPU one second later (the
    observers' first samples).
(b) ``first call``: CPU of the first streamed httpx call against the simulator and of later ones
    (median of calls 2..6), instrumented and plain, in the same child: otel_llm's first-call
    extra is (instrumented first - later) - (plain first - later). Also instrumented without the
    runtime-state poller, whose identification of a new local server (/proc, once per server)
    runs during that server's first call.
(c) ``litellm``: wall time from ``litellm.acompletion(..., stream=True)`` to the first content
    chunk against the simulator's OpenAI route, in fresh processes: plain, a control that first
    imports what the embedded default uses of the OpenTelemetry SDK (no otel_llm), and
    instrumented (``instrument()`` before
    ``import litellm``); with the full (generation 2) garbage collections that ran before the
    first token, and the CPU of the application's thread and of the others.

The simulator is ``otel-llm sim`` (the console command), started once, answering at once.
``--source DIR`` measures another checkout of otel_llm (PYTHONPATH=DIR in the children).
``--quick``: one run each, for a smoke test (figures too noisy to judge).

Targets: (a) at most 150 ms of CPU beyond importing the SDK; (b) the first call at most 5 ms more
than a later one; (c) LiteLLM's first token within 20 ms of plain.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from otel_llm_testing.net import free_port

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

TARGET_INSTRUMENT_MS = 150.0
TARGET_FIRST_CALL_MS = 5.0
TARGET_LITELLM_MS = 20.0

# What the embedded default uses of the SDK: the baseline child imports exactly this.
SDK_IMPORTS = ("opentelemetry.sdk.trace", "opentelemetry.sdk.trace.export", "opentelemetry.sdk.metrics",
               "opentelemetry.sdk.metrics.export", "opentelemetry.sdk.resources")

# The children's code. Only ``time`` and ``sys`` (already loaded by the interpreter) come before
# the measured part, so nothing the measured code needs is imported early.
_MEASURE = """
import sys, time
c0, t0 = time.process_time(), time.thread_time()
{work}
c1, t1 = time.process_time(), time.thread_time()
time.sleep({settle})
c2 = time.process_time()
import json
print("RESULT " + json.dumps({{"process": c1 - c0, "main": t1 - t0, "settled": c2 - c0, "file": {file}}}))
"""
_SDK_WORK = "\n".join(f"import {name}" for name in SDK_IMPORTS)
_OTEL_WORK = "import otel_llm\notel_llm.instrument()"

_CALLS = """
import sys, time
instrumented, url, calls = sys.argv[1] == "1", sys.argv[2], int(sys.argv[3])
if instrumented:
    import otel_llm
    otel_llm.instrument()
import httpx
client = httpx.Client(timeout=30)
body = {"model": "startup-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
results = []
for _ in range(calls):
    c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
    with client.stream("POST", url, json=body) as response:
        for _line in response.iter_lines():
            pass
    results.append((time.process_time() - c0, time.thread_time() - t0, time.perf_counter() - w0))
client.close()
import json
print("RESULT " + json.dumps(results))
"""

_LITELLM = """
import asyncio, gc, sys, threading, time
variant, base = sys.argv[1], sys.argv[2]
if variant == "otel":
    import otel_llm
    otel_llm.instrument()
elif variant == "sdk":  # the control: what the embedded default imports of the SDK, no otel_llm
    import {sdk_imports}
import litellm

full_gcs = []  # seconds of each full (generation 2) collection since the call started
started = {}

def on_gc(phase, info):
    if info["generation"] == 2:
        now = time.perf_counter()
        if phase == "start":
            started[threading.get_ident()] = now
        else:
            full_gcs.append(now - started.pop(threading.get_ident(), now))

async def call():
    full_gcs.clear()
    c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
    first = None
    gc_before_first = 0.0
    response = await litellm.acompletion(model="openai/startup-model", api_base=base + "/v1", api_key="sk-startup",
                                         messages=[{"role": "user", "content": "hi"}], stream=True)
    async for chunk in response:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - w0
            gc_before_first = sum(full_gcs)
    return {"first_token": first, "total": time.perf_counter() - w0, "process": time.process_time() - c0,
            "main": time.thread_time() - t0, "full_gc_before_first": gc_before_first}

async def main():
    gc.callbacks.append(on_gc)
    return [await call(), await call()]

results = asyncio.run(main())
import json
print("RESULT " + json.dumps(results))
"""

# the runtime-state poller identifies a new local server from /proc during its first call
FIRST_CALL_VARIANTS = (("plain", "0"), ("otel", "1"), ("otel_no_poller", "1"))
_LITELLM = _LITELLM.replace("{sdk_imports}", ", ".join(SDK_IMPORTS))
LITELLM_VARIANTS = (("plain", "plain"), ("sdk", "plain + SDK imported"), ("otel", "instrumented"))


def child_env(source: Path | None, workdir: Path) -> dict[str, str]:
    """This environment without OTel/otel_llm settings, proxies or PYTHON* variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("OTEL_", "PYTHON"))
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["OTEL_LLM_TRACES_FILE"] = str(workdir / "otel-llm-traces.jsonl")
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no download of the price list at import
    if source is not None:
        env["PYTHONPATH"] = str(source)
    return env


def run_child(code: str, env: dict[str, str], cwd: Path, *args: str, timeout: float = 180) -> Any:
    """Run ``code`` in a fresh interpreter; its ``RESULT`` line, parsed."""
    result = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=timeout)
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"child failed (exit {result.returncode}): {result.stderr[-3000:]}")



class Simulator:
    """``otel-llm sim`` as a subprocess, answering at once (no first-token delay)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = [str(VENV_BIN / "otel-llm"), "sim", "--port", str(self.port), "--first-token-delay", "0",
                "--token-interval", "0", "--tokens", "16"]
        self.process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def __enter__(self) -> Simulator:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"otel-llm sim exited: {stderr[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.1)
        self.process.kill()
        raise RuntimeError("otel-llm sim did not start within 60 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def ms(seconds: float) -> float:
    return seconds * 1000.0


def measure_instrument(runs: int, env: dict[str, str], cwd: Path, settle: float) -> dict[str, Any]:
    """(a): SDK-only and otel_llm children in turn, so drifting machine load hits both."""
    sdk: list[dict[str, float]] = []
    otel: list[dict[str, float]] = []
    files: set[str] = set()
    for _ in range(runs):
        sdk.append(run_child(_MEASURE.format(work=_SDK_WORK, settle=settle, file="None"), env, cwd))
        found = run_child(_MEASURE.format(work=_OTEL_WORK, settle=settle, file="otel_llm.__file__"), env, cwd)
        files.add(str(found.pop("file")))
        otel.append(found)
    out: dict[str, Any] = {"runs": runs, "otel_llm_file": sorted(files)}
    for key in ("process", "main", "settled"):
        out[f"sdk_{key}_ms"] = ms(statistics.median(r[key] for r in sdk))
        out[f"otel_{key}_ms"] = ms(statistics.median(r[key] for r in otel))
    out["beyond_sdk_ms"] = out["otel_process_ms"] - out["sdk_process_ms"]
    out["beyond_sdk_main_ms"] = out["otel_main_ms"] - out["sdk_main_ms"]
    return out


def measure_first_call(runs: int, env: dict[str, str], cwd: Path, url: str, calls: int) -> dict[str, Any]:
    """(b): per child, the first call's CPU minus the median of the later calls'."""
    out: dict[str, Any] = {"runs": runs, "calls": calls}
    for name, flag in FIRST_CALL_VARIANTS:
        firsts, laters, extras, extras_main = [], [], [], []
        variant_env = {**env, "OTEL_LLM_RUNTIME_METRICS": "false"} if name == "otel_no_poller" else env
        for _ in range(runs):
            results = run_child(_CALLS, variant_env, cwd, flag, url, str(calls))
            later = statistics.median(r[0] for r in results[1:])
            later_main = statistics.median(r[1] for r in results[1:])
            firsts.append(results[0][0])
            laters.append(later)
            extras.append(results[0][0] - later)
            extras_main.append(results[0][1] - later_main)
        out[f"{name}_first_ms"] = ms(statistics.median(firsts))
        out[f"{name}_later_ms"] = ms(statistics.median(laters))
        out[f"{name}_extra_ms"] = ms(statistics.median(extras))
        out[f"{name}_extra_main_ms"] = ms(statistics.median(extras_main))
    out["otel_llm_first_call_extra_ms"] = out["otel_extra_ms"] - out["plain_extra_ms"]
    return out


def measure_litellm(runs: int, env: dict[str, str], cwd: Path, base_url: str) -> dict[str, Any]:
    """(c): plain, control and instrumented children in turn; the first and the second call of each."""
    found: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _ in LITELLM_VARIANTS}
    for _ in range(runs):
        for name, _label in LITELLM_VARIANTS:
            found[name].append(run_child(_LITELLM, env, cwd, name, base_url, timeout=300))
    out: dict[str, Any] = {"runs": runs}
    for name, results in found.items():
        firsts = [r[0] for r in results]
        out[f"{name}_first_token_ms"] = ms(statistics.median(r["first_token"] for r in firsts))
        out[f"{name}_first_token_runs_ms"] = [round(ms(r["first_token"]), 1) for r in firsts]
        out[f"{name}_full_gc_runs_ms"] = [round(ms(r["full_gc_before_first"]), 1) for r in firsts]
        out[f"{name}_first_token_without_full_gc_ms"] = ms(statistics.median(
            r["first_token"] - r["full_gc_before_first"] for r in firsts))
        out[f"{name}_second_first_token_ms"] = ms(statistics.median(r[1]["first_token"] for r in results))
        out[f"{name}_main_cpu_ms"] = ms(statistics.median(r["main"] for r in firsts))
        out[f"{name}_other_threads_cpu_ms"] = ms(statistics.median(r["process"] - r["main"] for r in firsts))
    out["otel_minus_plain_ms"] = out["otel_first_token_ms"] - out["plain_first_token_ms"]
    out["otel_minus_plain_without_full_gc_ms"] = (out["otel_first_token_without_full_gc_ms"]
                                                  - out["plain_first_token_without_full_gc_ms"])
    return out


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "FAIL"


def report(figures: dict[str, Any]) -> None:
    a = figures["instrument"]
    print(f"(a) import otel_llm; otel_llm.instrument(), embedded default (median of {a['runs']} fresh processes)")
    print(f"    SDK imports only:       process CPU {a['sdk_process_ms']:7.1f} ms   main thread "
          f"{a['sdk_main_ms']:7.1f} ms")
    print(f"    otel_llm + instrument:  process CPU {a['otel_process_ms']:7.1f} ms   main thread "
          f"{a['otel_main_ms']:7.1f} ms"
          f"   (1 s later: {a['otel_settled_ms']:.1f} ms, SDK child {a['sdk_settled_ms']:.1f} ms)")
    print(f"    beyond the SDK:         process CPU {a['beyond_sdk_ms']:7.1f} ms   main thread "
          f"{a['beyond_sdk_main_ms']:7.1f} ms   target <= {TARGET_INSTRUMENT_MS:.0f} ms: "
          f"{verdict(a['beyond_sdk_ms'], TARGET_INSTRUMENT_MS)}")
    b = figures["first_call"]
    print(f"(b) streamed httpx call against the simulator, CPU (median of {b['runs']} processes, later = median of "
          f"calls 2..{b['calls']})")
    for name, label in (("plain", "plain"), ("otel", "instrumented"), ("otel_no_poller", "  no poller")):
        print(f"    {label:<13} first {b[f'{name}_first_ms']:6.2f} ms   later {b[f'{name}_later_ms']:6.2f} ms   "
              f"first - later {b[f'{name}_extra_ms']:6.2f} ms (main thread {b[f'{name}_extra_main_ms']:6.2f} ms)")
    print(f"    otel_llm's first-call extra: {b['otel_llm_first_call_extra_ms']:.2f} ms; instrumented first - later "
          f"{b['otel_extra_ms']:.2f} ms   target <= {TARGET_FIRST_CALL_MS:.0f} ms: "
          f"{verdict(b['otel_extra_ms'], TARGET_FIRST_CALL_MS)}")
    print(f"    without the runtime-state poller (OTEL_LLM_RUNTIME_METRICS=false): first - later "
          f"{b['otel_no_poller_extra_ms']:.2f} ms   target <= {TARGET_FIRST_CALL_MS:.0f} ms: "
          f"{verdict(b['otel_no_poller_extra_ms'], TARGET_FIRST_CALL_MS)}")
    c = figures.get("litellm")
    if c is None:
        print("(c) LiteLLM: skipped")
        return
    print(f"(c) litellm.acompletion(stream=True), request to first token, wall clock (median of {c['runs']} "
          "fresh processes)")
    for name, label in LITELLM_VARIANTS:
        print(f"    {label:<21} first call {c[f'{name}_first_token_ms']:6.1f} ms {c[f'{name}_first_token_runs_ms']}   "
              f"second call {c[f'{name}_second_first_token_ms']:5.1f} ms")
        print(f"    {'':<21} full GC pauses before the first token {c[f'{name}_full_gc_runs_ms']} ms, without them "
              f"{c[f'{name}_first_token_without_full_gc_ms']:.1f} ms; CPU: main thread "
              f"{c[f'{name}_main_cpu_ms']:.1f} ms,"
              f" other threads {c[f'{name}_other_threads_cpu_ms']:.1f} ms")
    print(f"    instrumented - plain: {c['otel_minus_plain_ms']:+.1f} ms   target <= {TARGET_LITELLM_MS:.0f} ms: "
          f"{verdict(c['otel_minus_plain_ms'], TARGET_LITELLM_MS)}")
    print(f"    the same without full GC pauses: {c['otel_minus_plain_without_full_gc_ms']:+.1f} ms   target <= "
          f"{TARGET_LITELLM_MS:.0f} ms: {verdict(c['otel_minus_plain_without_full_gc_ms'], TARGET_LITELLM_MS)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per figure (default 7)")
    parser.add_argument("--quick", action="store_true", help="one run each: a smoke test")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--source", type=Path, help="import otel_llm from this checkout in the children")
    parser.add_argument("--no-litellm", action="store_true", help="skip (c)")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else max(1, args.runs)
    settle = 0.2 if args.quick else 1.0
    with tempfile.TemporaryDirectory(prefix="otel-llm-startup-") as tmp:
        workdir = Path(tmp)
        env = child_env(args.source.resolve() if args.source else None, workdir)
        figures: dict[str, Any] = {"source": str(args.source or ROOT), "python": sys.executable}
        figures["instrument"] = measure_instrument(runs, env, workdir, settle)
        with Simulator(child_env(None, workdir)) as sim:
            url = f"{sim.base_url}/v1/chat/completions"
            figures["first_call"] = measure_first_call(runs, env, workdir, url, calls=3 if args.quick else 6)
            if not args.no_litellm:
                figures["litellm"] = measure_litellm(runs, env, workdir, sim.base_url)
    print(f"otel_llm from {', '.join(figures['instrument']['otel_llm_file'])}")
    report(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
