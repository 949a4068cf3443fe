"""otel_llm's GPU observers on a real NVIDIA GPU, checked in one command (at most 8 minutes).

    make gpu-deps                                        # once, where pip reaches PyPI
    python benchmarks/gpu_check.py --out gpu-check.json  # on the machine with the GPU

What it does:

1. Reads the device through NVML (name, UUID, driver, memory, MIG mode and every field the GPU
   observer reads, as the driver returns them) before anything runs on it.
2. Starts a small model server in a child process of its own (this script with ``--serve``): a
   random-weight Llama built on the spot with transformers (a plain torch network where
   transformers cannot build it), generating on the GPU and streaming OpenAI chat completions
   over HTTP on 127.0.0.1. Nothing is downloaded.
3. Instruments this process with ``otel_llm.instrument()`` (in-memory span exporter and metric
   reader) and makes streamed calls to that server while the GPU works, collecting the metrics
   every half second.
4. Runs ``otel-llm bench`` (``python -m otel_llm.tools.main bench``) against the same server.
5. Judges what it saw and writes it all as JSON (``--out``): each check's name, whether it passed,
   its measured values and, when it failed, why. The checks:

   - ``nvml_device``: NVML found the device (name, UUID, driver version, memory).
   - ``torch_cuda``: the server's torch generates on a CUDA device.
   - ``hw_gpu_metrics``: ``hw.gpu.utilization`` above zero during the calls, ``hw.gpu.memory.usage``
     within ``hw.gpu.memory.limit``, the limit equal to NVML's total, ``hw.model`` NVML's name.
   - ``hw_gpu_fields``: every other ``hw.*`` GPU metric has a point, or NVML itself said the
     field is not supported on this device.
   - ``gpu_memory_consistent``: NVML's used memory agrees with the server's
     ``torch.cuda.memory_reserved`` plus what NVML counts beside it (the CUDA context, the
     driver's own share before the server started, other processes).
   - ``process_gpu_memory``: the server's PID has a non-zero ``process.gpu.memory.usage`` point.
   - ``calls``: every streamed call got its tokens and made one call span.
   - ``span_gpu_evidence``: each call span carries ``llm.host.gpu.utilization`` and
     ``llm.host.gpu.memory.usage``, the memory non-zero, the utilization above zero on one at least.
   - ``bench_peak_vram``: ``otel-llm bench`` reported a peak GPU memory for the server's process,
     no less than what torch had reserved.

It exits 0 when every check passed, 1 naming the checks that failed (a run cut by ``--timeout``
fails the check ``timeout``), and 0 with one line saying "no GPU" where there is none to check
(no NVML library, no device, or a torch that sees no CUDA device): then nothing heavy is started.

The whole run stays within ``--timeout`` (default 420 s), then stops what it started. The
device's Python needs torch (and transformers, for the Llama) for the server, nvidia-ml-py,
psutil, httpx and wrapt for otel_llm and, for what a GPU image lacks, the folder ``--deps`` (default
``.gpu-deps`` at the repository's root where it exists; ``make gpu-deps`` fills it with the
OpenTelemetry API and SDK). That folder and the repository go first on this process's path and
on the PYTHONPATH of its children (the server, ``otel-llm bench``). The server stops with this
script, whatever happens (its own process group, ended in a ``finally``; it also ends itself
when this process disappears).

The judging functions (``judge_*``) take plain readings and return a ``Check``, so the tests
feed them sample readings without a GPU. ``--allow-cpu`` lets the server run on the CPU: a trial
of the script's own plumbing on a machine without a GPU, with a stand-in ``pynvml`` module first
on PYTHONPATH (torch_cuda and gpu_memory_consistent then fail, as they should).
"""

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[1]
DEFAULT_DEPS = ROOT / ".gpu-deps"
MODEL_NAME = "gpu-check-llama"
MIB = 1 << 20
GIB = 1 << 30

# Beside torch's reserved memory, a process holds its CUDA context (module images, cuBLAS and
# cuDNN handles, the driver's per-process state: a few hundred MiB on Hopper) outside torch's
# allocator; more than this is not that.
CONTEXT_ALLOWANCE = 3 * GIB
# Readings taken a moment apart on a machine where nothing else allocates agree to within this.
DELTA_TOLERANCE = 1 * GIB

# NVML return codes that say a field does not exist on this device (not a bug of the observer).
NVML_NOT_SUPPORTED = 3
NVML_NO_PERMISSION = 4

REQUIRED_HW = ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit")
# the observer's other device metrics -> the NVML readings (read_nvml_fields keys) behind them
OTHER_HW = {
    "hw.gpu.memory.utilization": ("memory",),
    "hw.power": ("power",),
    "hw.energy": ("energy",),
    "hw.temperature": ("temperature",),
    "hw.gpu.io": ("pcie_tx", "pcie_rx"),
    "hw.gpu.clock.frequency": ("clock_sm", "clock_memory"),
    "hw.gpu.throttle": ("clocks_event_reasons", "clocks_throttle_reasons"),
}
SPAN_GPU_UTILIZATION = "llm.host.gpu.utilization"
SPAN_GPU_MEMORY = "llm.host.gpu.memory.usage"

# (NVML function, extra arguments) of every field the GPU observer reads, recorded as returned
NVML_FIELDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "utilization": ("nvmlDeviceGetUtilizationRates", ()),
    "memory": ("nvmlDeviceGetMemoryInfo", ()),
    "power": ("nvmlDeviceGetPowerUsage", ()),
    "energy": ("nvmlDeviceGetTotalEnergyConsumption", ()),
    "temperature": ("nvmlDeviceGetTemperature", (0,)),  # NVML_TEMPERATURE_GPU
    "pcie_tx": ("nvmlDeviceGetPcieThroughput", (0,)),  # NVML_PCIE_UTIL_TX_BYTES
    "pcie_rx": ("nvmlDeviceGetPcieThroughput", (1,)),  # NVML_PCIE_UTIL_RX_BYTES
    "clock_sm": ("nvmlDeviceGetClockInfo", (1,)),  # NVML_CLOCK_SM
    "clock_memory": ("nvmlDeviceGetClockInfo", (2,)),  # NVML_CLOCK_MEM
    "clocks_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    "clocks_throttle_reasons": ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    "compute_processes": ("nvmlDeviceGetComputeRunningProcesses", ()),
    "graphics_processes": ("nvmlDeviceGetGraphicsRunningProcesses", ()),
    "mig_mode": ("nvmlDeviceGetMigMode", ()),
}


# -- checks: pure functions of readings ------------------------------------------------------------
@dataclass
class Check:
    """One check's verdict: passed when no problem was found."""

    name: str
    values: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "values": self.values, "problems": self.problems}


def _num(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f} MiB"


def judge_nvml_device(device: Mapping[str, Any] | None) -> Check:
    """NVML found the device: ``device`` as ``probe_nvml`` describes it (count, name, uuid,
    driver_version, memory_total, memory_used)."""
    check = Check("nvml_device", dict(device or {}))
    if not device:
        check.problems.append("NVML described no device")
        return check
    if not (_num(device.get("count")) and device["count"] >= 1):
        check.problems.append(f"NVML counted {device.get('count')!r} devices")
    if not device.get("name"):
        check.problems.append("NVML gave the device no name")
    if not str(device.get("uuid") or "").startswith(("GPU-", "MIG-")):
        check.problems.append(f"NVML's UUID {device.get('uuid')!r} is not a GPU UUID")
    if not device.get("driver_version"):
        check.problems.append("NVML gave no driver version")
    total, used = device.get("memory_total"), device.get("memory_used")
    if not (_num(total) and total > 0):
        check.problems.append(f"NVML's memory total is {total!r}")
    elif not (_num(used) and 0 <= used <= total):
        check.problems.append(f"NVML's memory used ({used!r}) is not within 0..{total}")
    return check


def judge_torch(info: Mapping[str, Any] | None, nvml_name: str | None = None) -> Check:
    """The server's torch generates on a CUDA device (``info``: the server's torch report)."""
    check = Check("torch_cuda", dict(info or {}))
    if not info:
        check.problems.append("the server reported nothing about torch")
        return check
    if not info.get("importable", True):
        check.problems.append(f"torch could not be imported in the server: {info.get('reason')}")
    elif not info.get("cuda"):
        check.problems.append(f"the server's torch sees no CUDA device ({info.get('reason') or 'no reason given'})")
    elif nvml_name and info.get("device_name") and info["device_name"] != nvml_name:
        check.values["note"] = f"torch names the device {info['device_name']!r}, NVML {nvml_name!r}"
    return check


def _points(sample: Mapping[str, Any], name: str, uuid: str | None = None) -> list[dict[str, Any]]:
    points = (sample.get("metrics") or {}).get(name) or []
    return [p for p in points if uuid is None or (p.get("attributes") or {}).get("hw.id") == uuid]


def judge_hw_metrics(samples: Sequence[Mapping[str, Any]], device: Mapping[str, Any]) -> Check:
    """``samples``: metric collections ``{"t", "phase", "metrics": {name: [{"attributes",
    "value"}]}}``; the device's (``uuid``, ``name``, ``memory_total``) utilization must exceed 0 in
    the samples of phase ``calls``, its memory usage stay within a limit equal to NVML's total."""
    uuid = device.get("uuid")
    utilization = [(round(s.get("t", 0.0), 2), p["value"]) for s in samples if s.get("phase") == "calls"
                   for p in _points(s, "hw.gpu.utilization", uuid)]
    usage = [p["value"] for s in samples for p in _points(s, "hw.gpu.memory.usage", uuid)]
    limits = sorted({p["value"] for s in samples for p in _points(s, "hw.gpu.memory.limit", uuid)})
    models = sorted({str((p.get("attributes") or {}).get("hw.model"))
                     for s in samples for p in _points(s, "hw.gpu.utilization", uuid)})
    seen = sorted({name for s in samples for name in (s.get("metrics") or {}) if _points(s, name, uuid)})
    check = Check("hw_gpu_metrics", {
        "device_uuid": uuid, "metrics_seen": seen, "utilization_during_calls": utilization,
        "utilization_max": max((v for _, v in utilization), default=None),
        "memory_usage_min": min(usage, default=None), "memory_usage_max": max(usage, default=None),
        "memory_limit": limits, "hw_model": models, "samples": len(samples)})
    for name in REQUIRED_HW:
        if name not in seen:
            check.problems.append(f"no {name} point for the device {uuid}")
    if "hw.gpu.utilization" in seen:
        if not utilization:
            check.problems.append("no hw.gpu.utilization point was collected during the calls")
        elif not any(_num(v) and v > 0 for _, v in utilization):
            check.problems.append(f"hw.gpu.utilization stayed at 0 during the calls ({len(utilization)} samples)")
        elif any(not (_num(v) and 0 <= v <= 1) for _, v in utilization):
            check.problems.append("hw.gpu.utilization left 0..1")
    total = device.get("memory_total")
    if limits and _num(total) and limits != [total]:
        check.problems.append(f"hw.gpu.memory.limit {limits} differs from NVML's total {total}")
    if usage and limits and (min(usage) <= 0 or max(usage) > max(limits)):
        check.problems.append(f"hw.gpu.memory.usage ({_mib(min(usage))}..{_mib(max(usage))}) is not within "
                              f"0..{_mib(max(limits))}")
    if models and device.get("name") and models != [device["name"]]:
        check.problems.append(f"hw.model {models} is not NVML's name {device['name']!r}")
    return check


def _nvml_error_code(reading: Any) -> int | None:
    return reading.get("error") if isinstance(reading, Mapping) and _num(reading.get("error")) else None


def judge_hw_fields(samples: Sequence[Mapping[str, Any]], uuid: str | None,
                    nvml_fields: Mapping[str, Any]) -> Check:
    """Every other hw.* metric of the observer has a point for the device, unless NVML answered
    its reading with not-supported or no-permission (``nvml_fields``: ``read_nvml_fields``)."""
    seen = {name for s in samples for name in (s.get("metrics") or {}) if _points(s, name, uuid)}
    check = Check("hw_gpu_fields", {"present": sorted(n for n in OTHER_HW if n in seen), "unsupported": {}})
    for name, readings in OTHER_HW.items():
        if name in seen:
            continue
        codes = [_nvml_error_code(nvml_fields.get(key)) for key in readings]
        if name == "hw.gpu.throttle":  # either function will do: unsupported only if both are
            unsupported = all(c in (NVML_NOT_SUPPORTED, NVML_NO_PERMISSION) for c in codes)
        else:
            unsupported = any(c in (NVML_NOT_SUPPORTED, NVML_NO_PERMISSION) for c in codes)
        if unsupported:
            check.values["unsupported"][name] = codes
        else:
            check.problems.append(f"no {name} point, though NVML answers its reading "
                                  f"({', '.join(f'{k}: {_brief(nvml_fields.get(k))}' for k in readings)})")
    return check


def _brief(reading: Any) -> str:
    text = json.dumps(reading, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def judge_memory(torch_stats: Sequence[Mapping[str, Any]], nvml_used: int | None, nvml_total: int | None,
                 used_before_server: int | None, server_process: int | None, other_processes: int = 0,
                 other_processes_before: int = 0, allowance: int = CONTEXT_ALLOWANCE,
                 tolerance: int = DELTA_TOLERANCE) -> Check:
    """NVML's used memory against torch's reserved memory in the server, read a moment apart
    with the server idle (``torch_stats``: the server's reports bracketing the NVML reading).

    ``server_process``: NVML's memory of the server's process (None: NVML did not list it);
    ``other_processes`` / ``other_processes_before``: NVML's memory of every other process on
    the device, now and before the server started; ``used_before_server``: NVML's used memory
    before the server started (the driver's own share and those processes)."""
    reserved_values = [int(v) for s in torch_stats if _num(v := s.get("memory_reserved"))]
    reserved = max(reserved_values) if reserved_values else None
    check = Check("gpu_memory_consistent", {
        "torch_reserved": reserved, "torch_reserved_readings": reserved_values,
        "torch_allocated": max((s.get("memory_allocated") or 0 for s in torch_stats), default=None),
        "nvml_used": nvml_used, "nvml_total": nvml_total, "nvml_used_before_server": used_before_server,
        "nvml_server_process": server_process, "nvml_other_processes": other_processes,
        "nvml_other_processes_before": other_processes_before,
        "beside_torch": None if reserved is None or nvml_used is None else nvml_used - reserved,
        "context": None if reserved is None or server_process is None else server_process - reserved,
        "allowance": allowance, "tolerance": tolerance})
    if reserved is None or reserved <= 0:
        check.problems.append(f"the server's torch reports no reserved memory ({reserved!r})")
        return check
    if len(reserved_values) > 1 and max(reserved_values) - min(reserved_values) > tolerance:
        check.problems.append(f"torch's reserved memory moved during the reading ({reserved_values})")
    if not _num(nvml_used) or not _num(nvml_total):
        check.problems.append("NVML gave no used/total memory")
        return check
    if nvml_used > nvml_total:
        check.problems.append(f"NVML's used memory {_mib(nvml_used)} exceeds its total {_mib(nvml_total)}")
    if nvml_used < reserved:
        check.problems.append(f"NVML's used memory {_mib(nvml_used)} is below torch's reserved {_mib(reserved)}")
    baseline = used_before_server if _num(used_before_server) else other_processes_before
    others_grown = other_processes - other_processes_before  # what other processes took meanwhile
    beside = nvml_used - reserved
    if beside > baseline + max(0, others_grown) + allowance:
        check.problems.append(f"NVML counts {_mib(beside)} beside torch's reserved memory: more than the "
                              f"{_mib(baseline)} used before the server, {_mib(max(0, others_grown))} other "
                              f"processes took since and {_mib(allowance)} for the server's CUDA context")
    if server_process is not None:
        if server_process < reserved:
            check.problems.append(f"NVML's memory of the server's process {_mib(server_process)} is below torch's "
                                  f"reserved {_mib(reserved)}")
        elif server_process - reserved > allowance:
            check.problems.append(f"NVML's memory of the server's process exceeds torch's reserved by "
                                  f"{_mib(server_process - reserved)} (allowed {_mib(allowance)})")
        if _num(used_before_server):
            grown = nvml_used - used_before_server - others_grown
            if abs(grown - server_process) > tolerance:
                check.problems.append(f"NVML's used memory grew by {_mib(grown)} (other processes aside) while "
                                      f"the server's process holds {_mib(server_process)}")
    elif _num(used_before_server):
        grown = nvml_used - used_before_server - others_grown
        if grown < reserved - tolerance:
            check.problems.append(f"NVML's used memory grew by {_mib(grown)} since before the server, less than "
                                  f"torch's reserved {_mib(reserved)}")
    return check


def judge_process_memory(points: Iterable[Mapping[str, Any]], server_pids: Iterable[int],
                         nvml_processes: Sequence[Mapping[str, Any]] = ()) -> Check:
    """The server's PID (or one of its children's) has a non-zero ``process.gpu.memory.usage``
    point. ``points``: ``{"pid", "value"}`` from every collection; ``nvml_processes``: NVML's own
    list (``{"pid", "used_bytes"}``), quoted when the check fails."""
    pids = set(server_pids)
    largest: dict[int, int] = {}
    for point in points:
        pid, value = point.get("pid"), point.get("value")
        if isinstance(pid, int) and _num(value):
            largest[pid] = max(largest.get(pid, 0), int(value))
    ours = {pid: value for pid, value in largest.items() if pid in pids}
    check = Check("process_gpu_memory", {"server_pids": sorted(pids), "points_by_pid": largest,
                                         "server_bytes": max(ours.values(), default=None),
                                         "nvml_processes": list(nvml_processes)})
    if not any(v > 0 for v in ours.values()):
        listed = {p.get("pid"): p.get("used_bytes") for p in nvml_processes}
        if ours:
            check.problems.append(f"process.gpu.memory.usage of the server's process is 0 ({ours})")
        elif any(pid in listed and listed[pid] is None for pid in pids):
            check.problems.append(f"NVML lists the server's process without its memory ({listed}): "
                                  "usedGpuMemory is not available here")
        elif any(pid in listed for pid in pids):
            check.problems.append(f"NVML lists the server's process ({listed}) but process.gpu.memory.usage has no "
                                  f"point for it (points for {sorted(largest) or 'no pid'}): the observer did "
                                  "not watch it")
        else:
            check.problems.append(f"no process.gpu.memory.usage point for the server's pids {sorted(pids)}; NVML "
                                  f"lists {listed or 'no process'}"
                                  + (" (pids of another PID namespace?)" if listed else ""))
    return check


def judge_calls(calls: Sequence[Mapping[str, Any]], spans: Sequence[Mapping[str, Any]], expected: int) -> Check:
    """``calls``: what the client saw of each streamed call (``status``, ``chunks``, ``error``)."""
    check = Check("calls", {"expected": expected, "made": len(calls), "spans": len(spans),
                            "calls": list(calls)})
    bad = [c for c in calls if c.get("error") or c.get("status") != 200 or not c.get("chunks")]
    if len(calls) != expected:
        check.problems.append(f"{len(calls)} calls made of {expected}")
    if bad:
        check.problems.append(f"{len(bad)} call(s) failed or streamed nothing: {bad[:3]}")
    if len(spans) != len(calls):
        check.problems.append(f"{len(spans)} call spans for {len(calls)} calls")
    return check


def judge_spans(spans: Sequence[Mapping[str, Any]]) -> Check:
    """Each call span (``{"name", "attributes"}``) carries the GPU evidence of its window."""
    evidence: list[dict[str, Any]] = [{"name": s.get("name"), "duration": s.get("duration"),
                 SPAN_GPU_UTILIZATION: (s.get("attributes") or {}).get(SPAN_GPU_UTILIZATION),
                 SPAN_GPU_MEMORY: (s.get("attributes") or {}).get(SPAN_GPU_MEMORY)} for s in spans]
    check = Check("span_gpu_evidence", {"spans": evidence})
    if not spans:
        check.problems.append("no call span to look at")
        return check
    for key in (SPAN_GPU_UTILIZATION, SPAN_GPU_MEMORY):
        missing = sum(1 for e in evidence if not _num(e[key]))
        if missing:
            check.problems.append(f"{missing} of {len(evidence)} call spans carry no {key}")
    if any(_num(e[SPAN_GPU_MEMORY]) and e[SPAN_GPU_MEMORY] <= 0 for e in evidence):
        check.problems.append(f"{SPAN_GPU_MEMORY} is 0 on a call span")
    utilization = [e[SPAN_GPU_UTILIZATION] for e in evidence if _num(e[SPAN_GPU_UTILIZATION])]
    if utilization and not any(u > 0 for u in utilization):
        check.problems.append(f"{SPAN_GPU_UTILIZATION} is 0 on every call span")
    if any(not 0 <= u <= 1 for u in utilization):
        check.problems.append(f"{SPAN_GPU_UTILIZATION} left 0..1")
    return check


def judge_bench(doc: Mapping[str, Any] | None, server_pid: int | None, returncode: int | None,
                torch_reserved: int | None = None, output_tail: str = "") -> Check:
    """``otel-llm bench --json``'s document: a level's ``runtime_memory`` names the server's PID
    and a peak GPU memory, no less than torch's reserved memory in it."""
    levels = [level for level in (doc or {}).get("levels") or [] if isinstance(level, Mapping)]
    rows = [{"level": lv.get("level"), "completed": lv.get("completed"), "failed": lv.get("failed"),
             "peak_gpu_memory_bytes": (lv.get("runtime_memory") or {}).get("peak_gpu_memory_bytes"),
             "peak_rss_bytes": (lv.get("runtime_memory") or {}).get("peak_rss_bytes"),
             "pids": (lv.get("runtime_memory") or {}).get("pids"),
             "not_seen": (lv.get("runtime_memory") or {}).get("not_seen")} for lv in levels]
    peaks = [r["peak_gpu_memory_bytes"] for r in rows
             if _num(r["peak_gpu_memory_bytes"]) and server_pid in (r["pids"] or [])]
    check = Check("bench_peak_vram", {
        "returncode": returncode, "levels": rows, "peak_gpu_memory_bytes": max(peaks, default=None),
        "server_pid": server_pid, "torch_reserved": torch_reserved,
        "runtime_processes": ((doc or {}).get("configuration") or {}).get("runtime_processes")})
    if returncode != 0:
        check.problems.append(f"otel-llm bench exited {returncode}: {output_tail[-400:].strip()}")
    if doc is None:
        check.problems.append("otel-llm bench wrote no JSON")
        return check
    if not levels:
        check.problems.append("otel-llm bench measured no level")
    if any(r["failed"] for r in rows) or not any(r["completed"] for r in rows):
        counts = [(r["level"], r["completed"], r["failed"]) for r in rows]
        check.problems.append(f"otel-llm bench's requests failed (level, completed, failed): {counts}")
    if not peaks:
        seen = sorted({pid for r in rows for pid in (r["pids"] or [])})
        check.problems.append(f"no level reported a peak GPU memory for the server's process {server_pid} "
                              f"(pids watched {seen or 'none'}; {rows[0]['not_seen'] if rows else ''})")
    elif max(peaks) <= 0:
        check.problems.append("the peak GPU memory reported is 0")
    elif _num(torch_reserved) and max(peaks) < torch_reserved:
        check.problems.append(f"the peak GPU memory {_mib(max(peaks))} is below torch's reserved "
                              f"{_mib(torch_reserved)} in that process")
    return check


def summary_line(checks: Sequence[Check]) -> str:
    failed = [c.name for c in checks if not c.passed]
    if failed:
        return f"gpu_check: FAILED: {', '.join(failed)}"
    return f"gpu_check: all {len(checks)} checks passed"


# -- NVML, read directly ---------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """An NVML answer as JSON: structures as dicts of their fields, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    fields = getattr(value, "_fields_", None)  # a ctypes structure (utilization, memory...)
    if fields:
        return {name: _plain(getattr(value, name, None)) for name, *_ in fields}
    if hasattr(value, "__dict__"):  # nvidia-ml-py's friendly objects (processes)
        return {name: _plain(v) for name, v in vars(value).items() if not name.startswith("_")}
    return str(value)


def _nvml_call(nvml: Any, function: str, *args: Any) -> Any:
    """``{"value": ...}`` or ``{"error": code, "message": ...}``, never raising."""
    try:
        fn = getattr(nvml, function)
    except AttributeError:
        return {"error": None, "message": f"this nvidia-ml-py has no {function}"}
    try:
        return {"value": _plain(fn(*args))}
    except Exception as exc:  # NVMLError and ctypes failures
        return {"error": getattr(exc, "value", None), "message": f"{type(exc).__name__}: {exc}"}


def read_nvml_fields(nvml: Any, handle: Any) -> dict[str, Any]:
    """Every field the GPU observer reads, as NVML returns it for ``handle`` (see NVML_FIELDS)."""
    found = {key: _nvml_call(nvml, function, handle, *args) for key, (function, args) in NVML_FIELDS.items()}
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            found["memory_v2"] = {"value": _plain(nvml.nvmlDeviceGetMemoryInfo(handle, version=version))}
        except Exception as exc:
            found["memory_v2"] = {"error": getattr(exc, "value", None), "message": f"{type(exc).__name__}: {exc}"}
    return found


def probe_nvml() -> tuple[Any, list[dict[str, Any]] | None, str | None]:
    """(pynvml, the devices, None) with NVML initialized, or (None, None, why there is no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None, None, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return None, None, f"NVML did not start: {exc or type(exc).__name__}"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        driver = _plain(_nvml_call(pynvml, "nvmlSystemGetDriverVersion").get("value"))
        nvml_version = _plain(_nvml_call(pynvml, "nvmlSystemGetNVMLVersion").get("value"))
        cuda_driver = _nvml_call(pynvml, "nvmlSystemGetCudaDriverVersion_v2").get("value")
        devices = []
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append({"index": index, "handle": handle, "count": count,
                            "name": _plain(pynvml.nvmlDeviceGetName(handle)),
                            "uuid": _plain(pynvml.nvmlDeviceGetUUID(handle)),
                            "driver_version": driver, "nvml_version": nvml_version,
                            "cuda_driver_version": cuda_driver,
                            "memory_total": int(memory.total), "memory_used": int(memory.used)})
    except Exception as exc:
        _nvml_shutdown(pynvml)
        return None, None, f"NVML could not list the devices: {exc or type(exc).__name__}"
    if not devices:
        _nvml_shutdown(pynvml)
        return None, None, "NVML found no device"
    return pynvml, devices, None


def _nvml_shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def nvml_processes(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    """NVML's compute processes on the device: ``{"pid", "used_bytes"}``."""
    reading = _nvml_call(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    found = []
    for process in reading.get("value") or []:
        if isinstance(process, Mapping):
            found.append({"pid": process.get("pid"), "used_bytes": process.get("usedGpuMemory")})
    return found


# -- the model server (this script with --serve) ---------------------------------------------------
SIZES = {
    # hidden size, layers, attention heads, MLP size, vocabulary: about 480 M parameters, 1 GB in
    # bf16, a few milliseconds of GPU work per token
    "medium": {"hidden": 2048, "layers": 8, "heads": 16, "intermediate": 5632, "vocab": 32000},
    # for a trial run on a CPU (--allow-cpu)
    "small": {"hidden": 256, "layers": 2, "heads": 4, "intermediate": 512, "vocab": 4096},
}
MAX_PROMPT_TOKENS = 1024
MAX_OUTPUT_TOKENS = 1024
_WORDS = ("the model streams one token at a time while the device works through every layer of the "
          "network and the observer reads how busy it is").split()


class _HfStepper:
    """Greedy decoding with transformers' Llama and its KV cache (``past_key_values`` in
    transformers up to 5.2x, ``cache`` after)."""

    def __init__(self, torch: Any, model: Any, device: Any) -> None:
        import inspect

        self.torch, self.model, self.device = torch, model, device
        self.cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _step(self, ids: list[list[int]], past: Any) -> tuple[Any, int]:
        cache = {self.cache_name: past} if past is not None else {}
        out = self.model(input_ids=self.torch.tensor(ids, device=self.device), use_cache=True, **cache)
        past = out[self.cache_name] if self.cache_name in out else out.get("past_key_values")
        return past, int(out.logits[0, -1].argmax())

    def start(self, ids: list[int]) -> tuple[Any, int]:
        return self._step([ids], None)

    def next(self, past: Any, token: int) -> tuple[Any, int]:
        return self._step([[token]], past)


class _PlainStepper:
    """A residual MLP stack over the last token: GPU work per token without transformers."""

    def __init__(self, torch: Any, spec: Mapping[str, int], device: Any, dtype: Any) -> None:
        nn = torch.nn
        hidden, inter = spec["hidden"], spec["intermediate"]
        self.torch = torch
        self.device = device
        self.embed = nn.Embedding(spec["vocab"], hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, inter), nn.GELU(),
                                                  nn.Linear(inter, hidden)) for _ in range(spec["layers"] * 3))
        self.head = nn.Linear(hidden, spec["vocab"], bias=False)
        self.model = nn.ModuleList([self.embed, self.blocks, self.head]).to(device=device, dtype=dtype).eval()

    def _logits(self, ids: list[int]) -> Any:
        x = self.embed(self.torch.tensor(ids, device=self.device))
        for block in self.blocks:
            x = x + block(x)
        return self.head(x[-1])

    def start(self, ids: list[int]) -> tuple[Any, int]:
        return None, int(self._logits(ids).argmax())

    def next(self, past: Any, token: int) -> tuple[Any, int]:
        return None, int(self._logits([token]).argmax())


class _Engine:
    """The model on its device, one decoding step at a time for every request (a lock between)."""

    def __init__(self, torch: Any, device: Any, size: str, ballast_gib: float) -> None:
        self.torch, self.device = torch, device
        self.spec = SIZES[size]
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens = 0
        self.note: str | None = None
        cuda = device.type == "cuda"
        dtype = torch.bfloat16 if cuda else torch.float32
        torch.manual_seed(0)
        with torch.inference_mode():
            try:
                self.stepper: Any = self._llama(dtype)
                self.kind = "transformers LlamaForCausalLM, random weights"
                self.stepper.start([1, 2, 3])  # proves it runs here
            except Exception as exc:  # a transformers this code does not fit: plain torch still works the GPU
                self.note = f"transformers' Llama could not run here ({type(exc).__name__}: {exc}); plain torch"
                self.stepper = _PlainStepper(torch, self.spec, device, dtype)
                self.kind = "torch residual MLP, random weights"
                self.stepper.start([1, 2, 3])
        self.parameters = sum(p.numel() for p in self.stepper.model.parameters())
        # a known block of memory beside the model, so NVML's readings have something large to agree on
        self.ballast = torch.ones(int(ballast_gib * GIB) // 2, dtype=torch.float16, device=device) \
            if ballast_gib > 0 else None
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()  # the float32 build's blocks: reserved is what the model holds now

    def _llama(self, dtype: Any) -> _HfStepper:
        from transformers import LlamaConfig, LlamaForCausalLM

        spec = self.spec
        config = LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
                             intermediate_size=spec["intermediate"], num_hidden_layers=spec["layers"],
                             num_attention_heads=spec["heads"], num_key_value_heads=spec["heads"],
                             max_position_embeddings=MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS + 64,
                             tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        with self.device:  # the random weights are made on the device itself
            model = LlamaForCausalLM(config)
        model = model.to(device=self.device, dtype=dtype).eval()
        return _HfStepper(self.torch, model, self.device)

    def tokens_of(self, prompt: str) -> list[int]:
        vocab = self.spec["vocab"]
        ids = [3 + byte % (vocab - 3) for byte in prompt.encode()[:MAX_PROMPT_TOKENS]]
        return ids or [1]

    def generate(self, ids: list[int], count: int) -> Iterable[str]:
        """``count`` pieces of text, one GPU step each."""
        self.requests += 1
        past: Any = None
        token = 0
        for index in range(count):
            with self.lock, self.torch.inference_mode():
                past, token = self.stepper.start(ids) if index == 0 else self.stepper.next(past, token)
            self.tokens += 1
            yield _WORDS[token % len(_WORDS)] + " "

    def stats(self) -> dict[str, Any]:
        torch, cuda = self.torch, self.device.type == "cuda"
        reserved = allocated = peak = None
        if cuda:
            reserved = int(torch.cuda.memory_reserved(self.device))
            allocated = int(torch.cuda.memory_allocated(self.device))
            peak = int(torch.cuda.max_memory_reserved(self.device))
        return {"pid": os.getpid(), "cuda": cuda, "memory_reserved": reserved, "memory_allocated": allocated,
                "max_memory_reserved": peak, "model": self.kind, "parameters": self.parameters,
                "ballast_bytes": 0 if self.ballast is None else self.ballast.numel() * self.ballast.element_size(),
                "requests": self.requests, "tokens_generated": self.tokens, "note": self.note}


def _prompt_of(body: Mapping[str, Any]) -> str:
    parts = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "\n".join(parts)


def _handler(engine: _Engine) -> type:
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gpu-check/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._json(200, {"status": "ok"})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "gpu-check"}]})
            elif path == "/gpu-check/torch":
                self._json(200, engine.stats())
            else:
                self._json(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?", 1)[0] != "/v1/chat/completions":
                self._json(404, {"error": {"message": "only /v1/chat/completions"}})
                return
            try:
                body = json.loads(raw or b"{}")
                count = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
            except (ValueError, TypeError, AttributeError):
                self._json(400, {"error": {"message": "not a chat completion request"}})
                return
            count = max(1, min(count, MAX_OUTPUT_TOKENS))
            ids = engine.tokens_of(_prompt_of(body))
            created = int(time.time())
            ident = f"chatcmpl-gpu{engine.requests + 1}"
            usage = {"prompt_tokens": len(ids), "completion_tokens": count, "total_tokens": len(ids) + count}
            try:
                if body.get("stream"):
                    self._stream(ids, count, ident, created, usage,
                                 bool((body.get("stream_options") or {}).get("include_usage")))
                else:
                    text = "".join(engine.generate(ids, count))
                    self._json(200, {"id": ident, "object": "chat.completion", "created": created,
                                     "model": MODEL_NAME, "usage": usage, "choices": [
                                         {"index": 0, "finish_reason": "length",
                                          "message": {"role": "assistant", "content": text}}]})
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _stream(self, ids: list[int], count: int, ident: str, created: int, usage: dict[str, int],
                    with_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(choices: list[Any], **extra: Any) -> None:
                frame = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": MODEL_NAME,
                         "choices": choices, **extra}
                self._chunk(b"data: " + json.dumps(frame).encode() + b"\n\n")

            event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for piece in engine.generate(ids, count):
                event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
            event([{"index": 0, "delta": {}, "finish_reason": "length"}])
            if with_usage:
                event([], usage=usage)
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def _end_with_parent() -> None:
    """Exit when the process that started this server is gone (the server has a session of its own,
    so nothing else would end it)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="gpu-check-parent-watch", daemon=True).start()


def serve(args: argparse.Namespace) -> int:
    """The model server: JSON lines on stdout ({"event": "torch"...}, then {"event": "ready"...})."""
    def emit(**fields: Any) -> None:
        print(json.dumps(fields, default=str), flush=True)

    _end_with_parent()
    try:
        import torch
    except Exception as exc:
        emit(event="torch", importable=False, cuda=False, reason=f"{type(exc).__name__}: {exc}")
        return 3
    report: dict[str, Any] = {"importable": True, "torch": torch.__version__,
                              "cuda_runtime": getattr(torch.version, "cuda", None)}
    try:
        cuda = bool(torch.cuda.is_available())
        reason = None if cuda else "torch.cuda.is_available() is False"
    except Exception as exc:
        cuda, reason = False, f"{type(exc).__name__}: {exc}"
    if not cuda and not args.allow_cpu:
        emit(event="torch", cuda=False, reason=reason, **report)
        return 3
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        props = torch.cuda.get_device_properties(device)
        uuid = getattr(props, "uuid", None)
        report.update(device_name=props.name, device_uuid=f"GPU-{uuid}" if uuid is not None else None,
                      device_memory=int(props.total_memory))
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except Exception as exc:
        report["transformers"] = f"not importable ({type(exc).__name__})"
    emit(event="torch", cuda=cuda, reason=reason, **report)
    started = time.monotonic()
    engine = _Engine(torch, device, args.size if cuda else "small", args.ballast_gib if cuda else 0.0)
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(engine))
    server.daemon_threads = True
    emit(event="ready", port=server.server_address[1], build_seconds=time.monotonic() - started,
         **engine.stats())
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


# -- the run ---------------------------------------------------------------------------------------
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
    prompt = f"[call {index}] " + " ".join(_WORDS * 4)
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
        _nvml_shutdown(self.nvml)
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


def checks_value(checks: Sequence[Check], name: str, key: str) -> Any:
    return next((c.values.get(key) for c in checks if c.name == name), None)


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", metavar="FILE", help="write every check and reading here as JSON")
    parser.add_argument("--calls", type=int, default=6, metavar="N", help="streamed calls to make (default 6)")
    parser.add_argument("--tokens", type=int, default=384, metavar="N",
                        help="tokens each call generates (default 384: a second or two of GPU work)")
    parser.add_argument("--timeout", type=float, default=420.0, metavar="S",
                        help="hard limit of the whole run in seconds, the server stopped within it (default 420)")
    parser.add_argument("--deps", metavar="DIR",
                        help="folder of wheels' contents put first on the path (default .gpu-deps at the "
                             "repository's root, where it exists; make gpu-deps fills it)")
    parser.add_argument("--size", choices=sorted(SIZES), default="medium", help="the server's model (default medium)")
    parser.add_argument("--ballast-gib", type=float, default=4.0, metavar="GIB",
                        help="GPU memory the server holds beside the model (default 4)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="let the server run on the CPU (a trial of the script itself, with a stand-in NVML)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def _deps_dir(option: str | None) -> Path | None:
    if option:
        return Path(option).resolve()
    return DEFAULT_DEPS if DEFAULT_DEPS.is_dir() else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    deps = _deps_dir(args.deps)
    for path in (ROOT, deps):  # deps ends up first
        if path is not None and str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if args.serve:
        return serve(args)
    if args.calls < 1 or args.tokens < 1 or args.timeout <= 20:
        print("gpu_check: --calls and --tokens must be at least 1, --timeout above 20", file=sys.stderr)
        return 2
    return run(args, deps)


if __name__ == "__main__":
    raise SystemExit(main())
