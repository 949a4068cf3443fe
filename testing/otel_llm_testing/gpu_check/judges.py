"""The GPU check's verdicts: pure functions of readings (NVML's, the metrics otel_llm exported, the
server's torch report), each returning a ``Check``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

__all__ = ["CONTEXT_ALLOWANCE", "DELTA_TOLERANCE", "GIB", "MIB", "NVML_NOT_SUPPORTED", "NVML_NO_PERMISSION",
           "OTHER_HW", "REQUIRED_HW", "SPAN_GPU_MEMORY", "SPAN_GPU_UTILIZATION", "Check", "checks_value",
           "judge_bench", "judge_calls", "judge_hw_fields", "judge_hw_metrics", "judge_memory", "judge_nvml_device",
           "judge_process_memory", "judge_spans", "judge_torch", "summary_line"]

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


def checks_value(checks: Sequence[Check], name: str, key: str) -> Any:
    return next((c.values.get(key) for c in checks if c.name == name), None)
