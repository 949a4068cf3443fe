"""The GPU check (otel_llm_testing.gpu_check, run as benchmarks/gpu_check.py): here, without a GPU, it says so
and exits 0; its judging functions, fed with readings shaped like an H200's (passing ones, and failing ones
that name their check)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from otel_llm_testing import markers
from otel_llm_testing.gpu_check import judges, nvml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
MIB = 1 << 20
GIB = 1 << 30


H200 = {"count": 1, "name": "NVIDIA H200", "uuid": "GPU-5f3c9a1e-0b7d-4c2e-9a41-3d2b8e6f7a10",
        "driver_version": "580.159.04", "memory_total": 143771 * MIB, "memory_used": 581 * MIB}
SERVER_PID = 4242


def _has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_"))}


# -- the script, run here ---------------------------------------------------------------------------
@pytest.mark.skipif(_has_nvml(), reason="this machine has a GPU: the script would run its whole check")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                            timeout=60, env=_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no GPU" in result.stdout
    assert result.stdout.count("no GPU") == 1 and not result.stderr
    doc = json.loads(out.read_text())
    assert doc["gpu"] is False and doc["reason"] and doc["checks"] == []


def test_without_nvidia_ml_py_it_says_so_and_exits_0(tmp_path: Path) -> None:
    """No site-packages (python -S): no pynvml, no OpenTelemetry, and still a clean answer."""
    result = subprocess.run([sys.executable, "-S", str(SCRIPT), "--deps", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, env=_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no GPU (nvidia-ml-py (pynvml) is not installed)" in result.stdout


def test_the_observers_page_gives_both_commands() -> None:
    page = (ROOT / "docs" / "observers.md").read_text()
    assert "make gpu-deps" in page
    assert "python benchmarks/gpu_check.py --out gpu-check.json" in page
    assert "\ngpu-deps:" in (ROOT / "Makefile").read_text()


@pytest.mark.backend  # the wheels come from PyPI
@pytest.mark.slow
def test_make_gpu_deps_fetches_the_sdk_for_python_3_12(tmp_path: Path) -> None:
    """``make gpu-deps``, into a folder of the test's: the OpenTelemetry API and SDK, importable from it."""
    markers.need("backend", "pip (the wheels come from PyPI)")
    target = tmp_path / "deps"
    done = subprocess.run(["make", "gpu-deps", f"GPU_DEPS_DIR={target}", f"PYTHON={sys.executable}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "opentelemetry" / "sdk" / "trace" / "__init__.py").is_file()
    assert (target / "opentelemetry" / "semconv").is_dir()


# -- NVML's answers as JSON -------------------------------------------------------------------------
def test_nvml_answers_become_plain_json() -> None:
    import pynvml

    memory = pynvml.c_nvmlMemory_t()
    memory.total, memory.free, memory.used = 80 * GIB, 70 * GIB, 10 * GIB
    process = pynvml.nvmlFriendlyObject({"pid": SERVER_PID, "usedGpuMemory": 5 * GIB, "gpuInstanceId": 0xFFFFFFFF})
    assert nvml.plain(memory) == {"total": 80 * GIB, "free": 70 * GIB, "used": 10 * GIB}
    assert nvml.plain([process]) == [{"pid": SERVER_PID, "usedGpuMemory": 5 * GIB, "gpuInstanceId": 0xFFFFFFFF}]
    assert nvml.plain(b"NVIDIA H200") == "NVIDIA H200"
    assert nvml.plain(ctypes.c_uint(7).value) == 7


def test_nvml_calls_never_raise_and_keep_the_error_code() -> None:
    import pynvml

    class Nvml:
        NVMLError = pynvml.NVMLError

        @staticmethod
        def nvmlDeviceGetPowerUsage(handle: Any) -> int:  # noqa: N802 - NVML's name
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[Any]:  # noqa: N802
            return [pynvml.nvmlFriendlyObject({"pid": SERVER_PID, "usedGpuMemory": None})]

    fields = nvml.read_nvml_fields(Nvml(), object())
    assert fields["power"]["error"] == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert fields["temperature"] == {"error": None, "message": "this nvidia-ml-py has no nvmlDeviceGetTemperature"}
    assert nvml.nvml_processes(Nvml(), object()) == [{"pid": SERVER_PID, "used_bytes": None}]


# -- the judging functions --------------------------------------------------------------------------
def _failing(check: Any, name: str, *phrases: str) -> None:
    assert check.name == name and not check.passed
    text = "; ".join(check.problems)
    for phrase in phrases:
        assert phrase in text, text
    assert judges.summary_line([check]) == f"gpu_check: FAILED: {name}"


def test_nvml_device() -> None:
    check = judges.judge_nvml_device(H200)
    assert check.passed and check.values["name"] == "NVIDIA H200"
    _failing(judges.judge_nvml_device({**H200, "uuid": "", "memory_total": 0}), "nvml_device", "UUID", "memory total")
    _failing(judges.judge_nvml_device(None), "nvml_device", "no device")


def test_torch_cuda() -> None:
    report = {"importable": True, "cuda": True, "torch": "2.11.0+cu130", "device_name": "NVIDIA H200"}
    assert judges.judge_torch(report, "NVIDIA H200").passed
    _failing(judges.judge_torch({**report, "cuda": False, "reason": "torch.cuda.is_available() is False"}),
             "torch_cuda", "sees no CUDA device")
    _failing(judges.judge_torch({"importable": False, "reason": "No module named 'torch'"}), "torch_cuda",
             "could not be imported")


def _sample(t: float, phase: str, utilization: float, used: int, limit: int = H200["memory_total"],
            model: str = "NVIDIA H200", pids: dict[int, int] | None = None, **extra: float) -> dict[str, Any]:
    device = {"hw.id": H200["uuid"], "hw.name": "gpu0", "hw.vendor": "NVIDIA", "hw.model": model}
    metrics: dict[str, list[dict[str, Any]]] = {
        "hw.gpu.utilization": [{"attributes": {**device, "hw.gpu.task": "general"}, "value": utilization}],
        "hw.gpu.memory.usage": [{"attributes": device, "value": used}],
        "hw.gpu.memory.limit": [{"attributes": device, "value": limit}],
    }
    for name, value in extra.items():
        metrics[name.replace("_", ".")] = [{"attributes": device, "value": value}]
    if pids:
        metrics["process.gpu.memory.usage"] = [{"attributes": {**device, "process.pid": pid}, "value": v}
                                               for pid, v in pids.items()]
    return {"t": t, "phase": phase, "metrics": metrics}


def test_hw_metrics() -> None:
    samples = [_sample(0.1, "idle", 0.0, 581 * MIB), _sample(2.6, "calls", 0.0, 6 * GIB),
               _sample(3.1, "calls", 0.43, 6 * GIB), _sample(3.6, "calls", 0.61, 6 * GIB)]
    check = judges.judge_hw_metrics(samples, H200)
    assert check.passed, check.problems
    assert check.values["utilization_max"] == 0.61 and check.values["memory_limit"] == [H200["memory_total"]]
    idle_only = [_sample(0.1, "idle", 0.5, GIB), _sample(2.6, "calls", 0.0, GIB), _sample(3.1, "calls", 0.0, GIB)]
    _failing(judges.judge_hw_metrics(idle_only, H200), "hw_gpu_metrics", "stayed at 0 during the calls (2 samples)")
    wrong = [_sample(2.6, "calls", 0.5, GIB, limit=80 * GIB, model="Tesla T4")]
    _failing(judges.judge_hw_metrics(wrong, H200), "hw_gpu_metrics", "differs from NVML's total", "is not NVML's name")
    percent = [_sample(2.6, "calls", 43.0, GIB)]  # a percentage where a fraction belongs
    _failing(judges.judge_hw_metrics(percent, H200), "hw_gpu_metrics", "left 0..1")
    other_device = [{**s, "metrics": {k: [{**p, "attributes": {**p["attributes"], "hw.id": "GPU-other"}}
                                          for p in v] for k, v in s["metrics"].items()}} for s in samples]
    _failing(judges.judge_hw_metrics(other_device, H200), "hw_gpu_metrics", "no hw.gpu.utilization point")


def test_hw_fields_missing_only_where_nvml_says_unsupported() -> None:
    every = {"hw_gpu_memory_utilization": 0.04, "hw_energy": 1.2e6, "hw_temperature": 41,
             "hw_gpu_io": 0, "hw_gpu_clock_frequency": 1.98e9, "hw_gpu_throttle": 0}
    samples = [_sample(3.0, "calls", 0.5, GIB, **every)]
    power_unsupported = {"power": {"error": judges.NVML_NOT_SUPPORTED, "message": "Not Supported"},
                         "clocks_event_reasons": {"value": 0}}
    check = judges.judge_hw_fields(samples, H200["uuid"], power_unsupported)
    assert check.passed and check.values["unsupported"] == {"hw.power": [judges.NVML_NOT_SUPPORTED]}
    without_temperature = {k: v for k, v in every.items() if k != "hw_temperature"}
    samples = [_sample(3.0, "calls", 0.5, GIB, hw_power=310.5, **without_temperature)]
    _failing(judges.judge_hw_fields(samples, H200["uuid"], {"temperature": {"value": 41}}), "hw_gpu_fields",
             "no hw.temperature point, though NVML answers its reading (temperature: {\"value\": 41})")


# an H200 after the calls: 581 MiB used before the server, torch reserved 5.2 GiB (model,
# ballast, KV caches), its process 5.7 GiB to NVML (the CUDA context beside), 6.3 GiB used
RESERVED, PROCESS, USED = int(5.2 * GIB), int(5.7 * GIB), int(5.7 * GIB) + 581 * MIB


def _torch(reserved: int = RESERVED) -> dict[str, Any]:
    return {"pid": SERVER_PID, "cuda": True, "memory_reserved": reserved, "memory_allocated": reserved - 64 * MIB}


def test_memory_consistent() -> None:
    check = judges.judge_memory([_torch(), _torch()], USED, H200["memory_total"], H200["memory_used"], PROCESS)
    assert check.passed, check.problems
    assert check.values["context"] == PROCESS - RESERVED and check.values["beside_torch"] == USED - RESERVED
    # the process unknown to NVML (another PID namespace): judged on the growth of used memory
    assert judges.judge_memory([_torch()], USED, H200["memory_total"], H200["memory_used"], None).passed
    # another process arriving meanwhile is not the server's
    assert judges.judge_memory([_torch()], USED + 2 * GIB, H200["memory_total"], H200["memory_used"], PROCESS,
                           other_processes=2 * GIB).passed


def test_memory_inconsistent() -> None:
    total, before = H200["memory_total"], H200["memory_used"]
    _failing(judges.judge_memory([_torch()], RESERVED - GIB, total, before, PROCESS), "gpu_memory_consistent",
             "is below torch's reserved")
    _failing(judges.judge_memory([_torch()], total - GIB, total, before, None), "gpu_memory_consistent",
             "beside torch's reserved memory")  # free memory read as used, say
    _failing(judges.judge_memory([_torch()], USED // 1024, total // 1024, before // 1024, PROCESS // 1024),
             "gpu_memory_consistent", "below torch's reserved")  # KiB where bytes belong
    _failing(judges.judge_memory([_torch()], USED + 8 * GIB, total, before, PROCESS + 8 * GIB),
             "gpu_memory_consistent", "exceeds torch's reserved by")
    _failing(judges.judge_memory([_torch()], USED, total, before, PROCESS + 2 * GIB), "gpu_memory_consistent",
             "grew by")
    _failing(judges.judge_memory([_torch(0)], USED, total, before, PROCESS), "gpu_memory_consistent",
             "no reserved memory")
    _failing(judges.judge_memory([_torch(RESERVED), _torch(RESERVED + 3 * GIB)], USED + 3 * GIB, total, before,
                             PROCESS + 3 * GIB), "gpu_memory_consistent", "moved during the reading")


def test_process_memory() -> None:
    points = [{"pid": SERVER_PID, "value": PROCESS - MIB}, {"pid": SERVER_PID, "value": PROCESS}]
    check = judges.judge_process_memory(points, {SERVER_PID}, [{"pid": SERVER_PID, "used_bytes": PROCESS}])
    assert check.passed and check.values["server_bytes"] == PROCESS
    _failing(judges.judge_process_memory([], {SERVER_PID}, [{"pid": 981234, "used_bytes": PROCESS}]),
             "process_gpu_memory", "NVML lists {981234: ", "another PID namespace")
    _failing(judges.judge_process_memory([], {SERVER_PID}, [{"pid": SERVER_PID, "used_bytes": PROCESS}]),
             "process_gpu_memory", "the observer did not watch it")
    _failing(judges.judge_process_memory([], {SERVER_PID}, [{"pid": SERVER_PID, "used_bytes": None}]),
             "process_gpu_memory", "usedGpuMemory is not available")
    _failing(judges.judge_process_memory([{"pid": SERVER_PID, "value": 0}], {SERVER_PID}), "process_gpu_memory",
             "is 0")


def _span(utilization: float | None = 0.52, memory: float | None = float(USED)) -> dict[str, Any]:
    attributes = {"gen_ai.operation.name": "chat", "llm.host.cpu.utilization": 0.2}
    if utilization is not None:
        attributes[judges.SPAN_GPU_UTILIZATION] = utilization
    if memory is not None:
        attributes[judges.SPAN_GPU_MEMORY] = memory
    return {"name": "chat gpu-check-llama", "duration": 1.9, "attributes": attributes}


def test_calls_and_span_evidence() -> None:
    calls = [{"index": i, "status": 200, "chunks": 384, "error": None} for i in range(3)]
    spans = [_span(0.0), _span(0.52), _span(0.61)]
    assert judges.judge_calls(calls, spans, 3).passed
    assert judges.judge_spans(spans).passed
    _failing(judges.judge_calls([*calls[:2], {"index": 2, "status": None, "chunks": 0, "error": "ReadTimeout"}],
                            spans[:2], 3), "calls", "failed or streamed nothing", "2 call spans for 3 calls")
    _failing(judges.judge_spans([_span(), _span(None, None)]), "span_gpu_evidence",
             "1 of 2 call spans carry no llm.host.gpu.utilization", "carry no llm.host.gpu.memory.usage")
    _failing(judges.judge_spans([_span(0.0), _span(0.0)]), "span_gpu_evidence", "is 0 on every call span")
    _failing(judges.judge_spans([_span(0.5, 0.0)]), "span_gpu_evidence", "llm.host.gpu.memory.usage is 0")
    _failing(judges.judge_spans([]), "span_gpu_evidence", "no call span")


def _bench(peak: int | None = PROCESS, pids: list[int] | None = None, failed: int = 0) -> dict[str, Any]:
    memory = {"peak_rss_bytes": 3 * GIB, "peak_gpu_memory_bytes": peak, "pids": [SERVER_PID] if pids is None else pids,
              "samples": 40, "interval": 0.1, "not_seen": None}
    return {"configuration": {"runtime_processes": f"peak resident memory of python3 {SERVER_PID}"},
            "levels": [{"level": f"concurrency {c}", "completed": 4 - failed, "failed": failed,
                        "runtime_memory": memory} for c in (1, 2)]}


def test_bench_peak_vram() -> None:
    check = judges.judge_bench(_bench(), SERVER_PID, 0, RESERVED)
    assert check.passed and check.values["peak_gpu_memory_bytes"] == PROCESS
    _failing(judges.judge_bench(_bench(None), SERVER_PID, 0, RESERVED), "bench_peak_vram",
             f"no level reported a peak GPU memory for the server's process {SERVER_PID}")
    _failing(judges.judge_bench(_bench(pids=[]), SERVER_PID, 0), "bench_peak_vram", "pids watched none")
    _failing(judges.judge_bench(_bench(RESERVED // 2), SERVER_PID, 0, RESERVED), "bench_peak_vram",
             "is below torch's reserved")
    _failing(judges.judge_bench(_bench(failed=4), SERVER_PID, 0, RESERVED), "bench_peak_vram", "requests failed")
    _failing(judges.judge_bench(None, SERVER_PID, 2, RESERVED, "otel-llm bench: error: the following arguments"),
             "bench_peak_vram", "exited 2", "wrote no JSON")


def test_the_summary_names_every_failed_check() -> None:
    passed = judges.Check("nvml_device", {"name": "NVIDIA H200"})
    failed = [judges.Check("process_gpu_memory", problems=["x"]), judges.Check("bench_peak_vram", problems=["y"])]
    assert judges.summary_line([passed]) == "gpu_check: all 1 checks passed"
    assert judges.summary_line([passed, *failed]) == "gpu_check: FAILED: process_gpu_memory, bench_peak_vram"
    assert failed[0].to_dict() == {"name": "process_gpu_memory", "passed": False, "values": {}, "problems": ["x"]}


# -- the model server, on a stand-in engine ------------------------------------------------------------
class _Engine:
    """The server's engine without torch: a word per token."""

    requests = 0

    def tokens_of(self, prompt: str) -> list[int]:
        return [1] * len(prompt.split())

    def generate(self, ids: list[int], count: int) -> Any:
        self.requests += 1
        return (f"w{i} " for i in range(count))

    def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid()}


def _shape(value: Any) -> Any:
    """A response's structure: what differs between two servers by nature (ids, times, the model's
    name, the text, token counts) blanked."""
    if isinstance(value, dict):
        return {k: (k if k in ("id", "created", "model", "system_fingerprint") else
                    "text" if k == "content" and v else
                    "count" if k.endswith("_tokens") else _shape(v))
                for k, v in value.items() if k != "prompt_tokens_details"}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return value


def test_the_model_server_writes_the_simulator_s_openai_chat_format() -> None:
    """Streamed and not: the frames the simulator writes for an OpenAI-compatible runtime (SGLang's
    flavour: no fingerprint, no quirk), in the same order and shape."""
    import threading
    from http.server import ThreadingHTTPServer

    import httpx

    from otel_llm.tools.sim.formats.openai import ChatWire
    from otel_llm.tools.sim.scenario import SimConfig
    from otel_llm_testing.gpu_check import server

    body = {"model": server.MODEL_NAME, "messages": [{"role": "user", "content": "say three words"}],
            "max_tokens": 3}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), server._handler(_Engine()))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions"
        frames = [line.removeprefix("data: ") for line in httpx.post(url, json=streamed, timeout=10).text.split("\n\n")
                  if line]
        unary = httpx.post(url, json=body, timeout=10).json()
    finally:
        httpd.shutdown()
        httpd.server_close()

    sim = ChatWire(streamed, SimConfig(runtime="sglang"), 0.0, 1)
    sim_frames = [frame.decode().removeprefix("data: ").rstrip("\n")
                  for frame in [*sim.opening(), *(f for i in range(3) for f in sim.token(i)), *sim.closing()]]
    assert frames[-1] == sim_frames[-1] == "[DONE]"
    assert [_shape(json.loads(f)) for f in frames[:-1]] == [_shape(json.loads(f)) for f in sim_frames[:-1]]
    _, sim_unary = ChatWire(body, SimConfig(runtime="sglang"), 0.0, 1).unary()
    assert _shape(unary) == _shape(sim_unary)
