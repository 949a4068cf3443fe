"""One run of the GPU check: NVML read, the model server started, this process instrumented and
streaming calls to it, ``otel-llm bench`` run against it, each step judged, everything stopped
within the time limit whatever happens."""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_llm_testing.gpu_check.judges import (
    Check, _mib, _num, _points, checks_value, judge_bench, judge_calls, judge_hw_fields, judge_hw_metrics,
    judge_memory, judge_nvml_device, judge_process_memory, judge_spans, judge_torch, summary_line,
)
from otel_llm_testing.gpu_check.nvml import nvml_processes, nvml_shutdown, probe_nvml, read_nvml_fields
from otel_llm_testing.gpu_check.server import MODEL_NAME, WORDS

__all__ = ["ROOT", "SCRIPT", "run"]

ROOT = Path(__file__).resolve().parents[3]  # the repository: its otel_llm is the one checked
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"  # what the model server runs as, with --serve


class _Timeout(BaseException):
    """The run's time is up (raised from SIGALRM; a BaseException, so no handler swallows it)."""


class _Server:
    """The model server child: started, its JSON lines read, stopped with its whole group."""

    def __init__(self, env: dict[str, str], workdir: Path, size: str, ballast_gib: float, allow_cpu: bool) -> None:
        command = [sys.executable, str(SCRIPT), "--serve", "--size", size, "--ballast-gib", str(ballast_gib)]
        if allow_cpu:
            command.append("--allow-cpu")
        self.log_path = workdir / "server.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                     text=True, env=env, cwd=workdir, start_new_session=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, name="gpu-check-server-stdout", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.events.put(event)
        self.events.put({"event": "exited"})

    def wait_for(self, name: str, seconds: float) -> dict[str, Any]:
        """The next event ``name``; {"event": "exited"...} if the server ended first."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"event": "timeout", "waited": seconds}
            try:
                event = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if event.get("event") in (name, "exited"):
                if event["event"] == "exited":
                    try:
                        event["returncode"] = self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        event["returncode"] = None
                return event

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._log.close()
        return self.proc.poll()


def _child_env(deps: Path | None) -> dict[str, str]:
    paths = [str(p) for p in (deps, ROOT) if p is not None]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for name in [k for k in env if k.startswith("OTEL_")]:  # the children's telemetry stays local
        del env[name]
    return env


def _get_json(url: str, timeout: float = 10.0) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback only
        return json.loads(response.read())


def _metrics_of(data: Any) -> dict[str, list[dict[str, Any]]]:
    """The hw.* and process.gpu.* points of one collection, as plain dicts."""
    found: dict[str, list[dict[str, Any]]] = {}
    for resource in getattr(data, "resource_metrics", None) or []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name.startswith(("hw.", "process.gpu.")):
                    found.setdefault(metric.name, []).extend(
                        {"attributes": dict(p.attributes or {}), "value": p.value} for p in metric.data.data_points)
    return found


class _Collector:
    """Collects the metric reader every ``interval`` seconds in a thread, tagged with the phase."""

    def __init__(self, reader: Any, started: float, interval: float = 0.5) -> None:
        self.reader, self.started, self.interval = reader, started, interval
        self.samples: list[dict[str, Any]] = []
        self.phase = "idle"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def collect(self) -> dict[str, Any]:
        try:
            metrics = _metrics_of(self.reader.get_metrics_data())
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            metrics = {}
        sample = {"t": time.monotonic() - self.started, "phase": self.phase, "metrics": metrics}
        self.samples.append(sample)
        return sample

    def start(self) -> None:
        def run() -> None:
            while not self._stop.wait(self.interval):
                self.collect()

        self._thread = threading.Thread(target=run, name="gpu-check-collector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _stream_call(client: Any, url: str, index: int, tokens: int) -> dict[str, Any]:
    prompt = f"[call {index}] " + " ".join(WORDS * 4)
    payload = {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}], "stream": True,
               "stream_options": {"include_usage": True}, "max_tokens": tokens}
    started = time.monotonic()
    record: dict[str, Any] = {"index": index, "status": None, "chunks": 0, "error": None}
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=payload) as response:
            record["status"] = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content": "' in line and '"content": ""' not in line:
                    record["chunks"] += 1
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


def _span_dict(span: Any) -> dict[str, Any]:
    attributes = dict(span.attributes or {})
    keep = {k: (list(v) if isinstance(v, tuple) else v) for k, v in attributes.items()
            if k.startswith(("llm.host.", "gen_ai.usage.", "gen_ai.operation", "server.", "llm.client.time_to"))}
    duration = (span.end_time - span.start_time) / 1e9 if span.end_time and span.start_time else None
    return {"name": span.name, "duration": duration, "attributes": keep}


def _run_bench(env: dict[str, str], workdir: Path, url: str, seconds: float) -> tuple[int | None, Any, str]:
    """(return code, the --json document or None, the output's tail) of ``otel-llm bench``."""
    out = workdir / "bench.json"
    command = [sys.executable, "-m", "otel_llm.tools.main", "bench", url, "--model", MODEL_NAME,
               "--concurrency", "1,2", "--requests", "4", "--prompt-tokens", "64", "--output-tokens", "128",
               "--warmup", "1", "--seconds", "60", "--timeout", "60", "--json", str(out)]
    bench_env = dict(env, OTEL_LLM_TRACES_FILE=str(workdir / "bench-traces.jsonl"))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, env=bench_env, cwd=workdir, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=max(5.0, seconds))
    except subprocess.TimeoutExpired:
        output = f"(otel-llm bench cut after {seconds:.0f} s)"
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)
    try:
        doc = json.loads(out.read_text())
    except (OSError, ValueError):
        doc = None
    return proc.returncode, doc, output[-4000:]


class _LogList:
    """The otel_llm logger's records, kept for the JSON (why a field is missing, and so on)."""

    def __init__(self) -> None:
        import logging

        self.lines: list[str] = []

        class Keep(logging.Handler):
            def emit(inner, record: logging.LogRecord) -> None:  # noqa: N805
                self.lines.append(f"{record.levelname} {record.getMessage()}")

        self.handler = Keep(level=logging.INFO)
        self.logger = logging.getLogger("otel_llm")
        self.previous = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.previous)


def _pick_device(devices: list[dict[str, Any]], torch_info: Mapping[str, Any]) -> dict[str, Any]:
    uuid = torch_info.get("device_uuid")
    return next((d for d in devices if uuid and d["uuid"] == uuid), devices[0])


def run(args: argparse.Namespace, deps: Path | None) -> int:
    started = time.monotonic()
    deadline = started + args.timeout
    result: dict[str, Any] = {"tool": "benchmarks/gpu_check.py", "started": time.time(), "gpu": None,
                              "python": sys.version.split()[0], "platform": platform.platform(),
                              "deps": str(deps) if deps else None,
                              "options": {k: v for k, v in vars(args).items() if k not in ("serve", "port")}}

    def say(text: str) -> None:
        print(text, flush=True)

    nvml, devices, why = probe_nvml()
    if nvml is None or devices is None:
        say(f"gpu_check: no GPU ({why}); nothing checked")
        result.update(gpu=False, reason=why, passed=True, checks=[])
        _write(args.out, result)
        return 0

    run_state = _Run(args, deps, nvml, devices, result, say, deadline)
    previous_alarm = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, args.timeout - 10.0))  # 10 s left to clean up
    # and should Python itself be stuck (in a driver call, say): the server ended, this process too
    last_resort = threading.Timer(args.timeout + 5.0, run_state.abandon)
    last_resort.daemon = True
    last_resort.start()
    try:
        run_state.steps()
    except _NoCuda as exc:
        say(f"gpu_check: no GPU ({exc}); nothing checked")
        result.update(gpu=False, reason=str(exc), passed=True)
    except _Stop:
        pass
    except _Timeout:
        run_state.checks.append(Check("timeout", {"stage": run_state.stage, "seconds": args.timeout},
                                      [f"the run reached its limit (--timeout {args.timeout:g}, less 10 s to clean up) "
                                       f"while {run_state.stage}"]))
    except Exception as exc:
        import traceback

        run_state.checks.append(Check("run", {"stage": run_state.stage, "traceback": traceback.format_exc()[-3000:]},
                                      [f"{type(exc).__name__} while {run_state.stage}: {exc}"]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_alarm)
        run_state.close()
        last_resort.cancel()
        result["seconds"] = round(time.monotonic() - started, 1)
    if result.get("gpu") is False:
        result["checks"] = []
        _write(args.out, result)
        return 0
    return _finish(result, run_state.checks, say, args.out)


class _NoCuda(Exception):
    """NVML sees a device but torch cannot use it: no GPU to check."""


class _Stop(Exception):
    """A check failed in a way that leaves nothing more to check."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


class _Run:
    """One run's steps and what they hold (server, instrumentation), closed whatever happens."""

    def __init__(self, args: argparse.Namespace, deps: Path | None, nvml: Any, devices: list[dict[str, Any]],
                 result: dict[str, Any], say: Any, deadline: float) -> None:
        self.args, self.deps, self.nvml, self.devices, self.result, self.say = args, deps, nvml, devices, result, say
        self.deadline = deadline
        self.started = time.monotonic()
        self.checks: list[Check] = []
        self.stage = "reading NVML"
        self.server: _Server | None = None
        self.collector: _Collector | None = None
        self.logs: _LogList | None = None
        self.providers: list[Any] = []
        self.instrumented = False
        self.workdir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.readings: dict[str, Any] = {"nvml_fields": {}}
        result["readings"] = self.readings

    def left(self, reserve: float = 15.0) -> float:
        return max(1.0, self.deadline - time.monotonic() - reserve)

    def steps(self) -> None:
        nvml, devices, readings, say = self.nvml, self.devices, self.readings, self.say
        readings["nvml_devices"] = [{k: v for k, v in d.items() if k != "handle"} for d in devices]
        readings["nvml_fields"]["before_server"] = {d["uuid"]: read_nvml_fields(nvml, d["handle"]) for d in devices}
        processes_before = {d["uuid"]: nvml_processes(nvml, d["handle"]) for d in devices}
        readings["nvml_processes_before_server"] = processes_before
        say(f"NVML: {len(devices)} device(s): " + ", ".join(
            f"{d['name']} {_mib(d['memory_total'])} ({_mib(d['memory_used'])} used)" for d in devices)
            + f"; driver {devices[0]['driver_version']}")

        self.stage = "starting the model server"
        env = _child_env(self.deps)
        self.server = server = _Server(env, self.workdir, self.args.size, self.args.ballast_gib, self.args.allow_cpu)
        torch_event = server.wait_for("torch", min(150.0, self.left()))
        readings["torch_report"] = torch_event
        if torch_event.get("event") == "torch" and torch_event.get("importable") and not torch_event.get("cuda") \
                and not self.args.allow_cpu:
            raise _NoCuda(f"NVML sees {devices[0]['name']}, but {torch_event.get('reason')}")
        self.result["gpu"] = True
        if torch_event.get("event") != "torch":
            how = "did not report in time" if torch_event.get("event") == "timeout" else "ended before reporting"
            torch_event = {"importable": False, "reason": f"the server {how} ({torch_event}): {server.log_tail(1500)}"}
        device = _pick_device(devices, torch_event)
        self.checks.append(judge_nvml_device({k: v for k, v in device.items() if k != "handle"}))
        self.checks.append(judge_torch(torch_event, device["name"]))
        if not torch_event.get("importable"):
            raise _Stop()
        ready = server.wait_for("ready", min(240.0, self.left()))
        if ready.get("event") != "ready":
            self.checks.append(Check("server_start", {"event": ready, "log": server.log_tail()},
                                     ["the model server did not start"]))
            raise _Stop()
        readings["server"] = ready
        server_pid, url = int(ready["pid"]), f"http://127.0.0.1:{ready['port']}"
        say(f"server: pid {server_pid} at {url}, {ready.get('model')} ({ready.get('parameters', 0) / 1e6:.0f} M "
            f"parameters) on {torch_event.get('device_name') or 'the CPU'}, ready in "
            f"{ready.get('build_seconds', 0):.1f} s; torch reserved {_mib(ready.get('memory_reserved'))}")

        self.stage = "instrumenting"
        import otel_llm
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.result["otel_llm"] = {"version": otel_llm.__version__, "path": str(Path(otel_llm.__file__).parent)}
        self.logs = _LogList()
        exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        meter_provider = MeterProvider(metric_readers=[reader])
        self.providers = [tracer_provider, meter_provider]
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, console_summary=False,
                            host_metrics=True, gpu_metrics=True, runtime_metrics=False)
        self.instrumented = True
        import httpx

        self.collector = collector = _Collector(reader, self.started)
        collector.collect()
        # the host sampler's first samples (a call in its first second has no evidence to carry yet)
        time.sleep(2.0)
        collector.collect()

        self.stage = "streaming calls"
        calls: list[dict[str, Any]] = []
        collector.phase = "calls"
        collector.start()
        with httpx.Client(timeout=httpx.Timeout(60.0), trust_env=False) as client:
            for index in range(self.args.calls):
                calls.append(_stream_call(client, url, index, self.args.tokens))
                collector.collect()  # NVML's utilization still covers the call just ended
                if index == self.args.calls // 2:
                    readings["nvml_fields"]["during_calls"] = {
                        device["uuid"]: read_nvml_fields(nvml, device["handle"])}
        collector.stop()
        collector.phase = "after"
        say(f"calls: {len(calls)} streamed, {sum(c['chunks'] for c in calls)} chunks in "
            f"{sum(c['seconds'] for c in calls):.1f} s")

        self.stage = "reading memory"
        time.sleep(0.5)  # the last step's kernels done, the server idle
        first = _get_json(url + "/gpu-check/torch")
        sample = collector.collect()
        direct = nvml.nvmlDeviceGetMemoryInfo(device["handle"])
        processes = nvml_processes(nvml, device["handle"])
        second = _get_json(url + "/gpu-check/torch")
        readings["torch_stats"] = [first, second]
        readings["nvml_fields"]["after_calls"] = {device["uuid"]: read_nvml_fields(nvml, device["handle"])}
        readings["nvml_processes_after_calls"] = processes
        used = _points(sample, "hw.gpu.memory.usage", device["uuid"])
        metric_used = used[0]["value"] if used else None
        readings["memory"] = {"metric_used": metric_used, "direct_used": int(direct.used),
                              "direct_total": int(direct.total)}
        server_pids = {server_pid}
        server_bytes = [int(p["used_bytes"]) for p in processes if p["pid"] in server_pids and _num(p["used_bytes"])]

        def others(found: list[dict[str, Any]]) -> int:
            return sum(int(p["used_bytes"]) for p in found if p["pid"] not in server_pids and _num(p["used_bytes"]))

        self.checks.append(judge_hw_metrics(collector.samples, device))
        self.checks.append(judge_hw_fields(collector.samples, device["uuid"],
                                           readings["nvml_fields"]["after_calls"][device["uuid"]]))
        self.checks.append(judge_memory(
            [first, second], metric_used if metric_used is not None else int(direct.used), int(direct.total),
            device["memory_used"], sum(server_bytes) if server_bytes else None, others(processes),
            others(processes_before.get(device["uuid"], []))))
        process_points = [{"pid": (p.get("attributes") or {}).get("process.pid"), "value": p.get("value")}
                          for s in collector.samples for p in _points(s, "process.gpu.memory.usage")]
        self.checks.append(judge_process_memory(process_points, server_pids, processes))
        spans = [_span_dict(s) for s in exporter.get_finished_spans()
                 if (s.attributes or {}).get("gen_ai.operation.name") is not None]
        self.checks.append(judge_calls(calls, spans, self.args.calls))
        self.checks.append(judge_spans(spans))

        self.stage = "running otel-llm bench"
        otel_llm.uninstrument()
        self.instrumented = False
        say("otel-llm bench: running")
        returncode, doc, output = _run_bench(env, self.workdir, url, min(240.0, self.left()))
        readings["bench_output_tail"] = output
        self.checks.append(judge_bench(doc, server_pid, returncode,
                                       checks_value(self.checks, "gpu_memory_consistent", "torch_reserved"), output))
        self.stage = "done"

    def close(self) -> None:
        """Stop everything this run started (each step on its own: one failing stops no other)."""
        result = self.result
        if self.collector is not None:
            self.collector.stop()
            result["metric_samples"] = self.collector.samples
            result["collector_errors"] = self.collector.errors
        if self.instrumented:
            try:
                import otel_llm

                otel_llm.uninstrument()
            except Exception as exc:
                result["uninstrument_error"] = repr(exc)
        for provider in self.providers:
            try:
                provider.shutdown()
            except Exception:
                pass
        if self.logs is not None:
            self.logs.close()
            result["otel_llm_log"] = self.logs.lines
        if self.server is not None:
            result["server_returncode"] = self.server.stop()
            result["server_log_tail"] = self.server.log_tail()
        nvml_shutdown(self.nvml)
        shutil.rmtree(self.workdir, ignore_errors=True)  # what the JSON needs of it is in the JSON

    def abandon(self) -> None:
        """The last resort past the hard limit: end the server's group and this process."""
        print(f"gpu_check: FAILED: timeout (stuck while {self.stage}; ended after {self.args.timeout + 5:g} s)",
              file=sys.stderr, flush=True)
        if self.server is not None:
            try:
                os.killpg(self.server.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os._exit(1)


def _finish(result: dict[str, Any], checks: list[Check], say: Any, out: str | None) -> int:
    result["checks"] = [c.to_dict() for c in checks]
    result["passed"] = bool(checks) and all(c.passed for c in checks)
    result["failed"] = [c.name for c in checks if not c.passed]
    _write(out, result)  # first: the file is there whatever happens to the output
    for check in checks:
        say(f"{'PASS' if check.passed else 'FAIL'} {check.name}" + ("" if check.passed else
                                                                     ": " + "; ".join(check.problems)))
    say(summary_line(checks) if checks else "gpu_check: FAILED: nothing was checked")
    return 0 if result["passed"] else 1


def _write(out: str | None, result: Mapping[str, Any]) -> None:
    if not out:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"gpu_check: wrote {path}", flush=True)
