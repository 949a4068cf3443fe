"""NVML read directly (nvidia-ml-py), every answer kept as JSON: the devices, each field the GPU
observer reads, the compute processes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NVML_FIELDS", "nvml_processes", "nvml_shutdown", "plain", "probe_nvml", "read_nvml_fields"]

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


def plain(value: Any) -> Any:
    """An NVML answer as JSON: structures as dicts of their fields, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    fields = getattr(value, "_fields_", None)  # a ctypes structure (utilization, memory...)
    if fields:
        return {name: plain(getattr(value, name, None)) for name, *_ in fields}
    if hasattr(value, "__dict__"):  # nvidia-ml-py's friendly objects (processes)
        return {name: plain(v) for name, v in vars(value).items() if not name.startswith("_")}
    return str(value)


def _nvml_call(nvml: Any, function: str, *args: Any) -> Any:
    """``{"value": ...}`` or ``{"error": code, "message": ...}``, never raising."""
    try:
        fn = getattr(nvml, function)
    except AttributeError:
        return {"error": None, "message": f"this nvidia-ml-py has no {function}"}
    try:
        return {"value": plain(fn(*args))}
    except Exception as exc:  # NVMLError and ctypes failures
        return {"error": getattr(exc, "value", None), "message": f"{type(exc).__name__}: {exc}"}


def read_nvml_fields(nvml: Any, handle: Any) -> dict[str, Any]:
    """Every field the GPU observer reads, as NVML returns it for ``handle`` (see NVML_FIELDS)."""
    found = {key: _nvml_call(nvml, function, handle, *args) for key, (function, args) in NVML_FIELDS.items()}
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            found["memory_v2"] = {"value": plain(nvml.nvmlDeviceGetMemoryInfo(handle, version=version))}
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
        driver = plain(_nvml_call(pynvml, "nvmlSystemGetDriverVersion").get("value"))
        nvml_version = plain(_nvml_call(pynvml, "nvmlSystemGetNVMLVersion").get("value"))
        cuda_driver = _nvml_call(pynvml, "nvmlSystemGetCudaDriverVersion_v2").get("value")
        devices = []
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append({"index": index, "handle": handle, "count": count,
                            "name": plain(pynvml.nvmlDeviceGetName(handle)),
                            "uuid": plain(pynvml.nvmlDeviceGetUUID(handle)),
                            "driver_version": driver, "nvml_version": nvml_version,
                            "cuda_driver_version": cuda_driver,
                            "memory_total": int(memory.total), "memory_used": int(memory.used)})
    except Exception as exc:
        nvml_shutdown(pynvml)
        return None, None, f"NVML could not list the devices: {exc or type(exc).__name__}"
    if not devices:
        nvml_shutdown(pynvml)
        return None, None, "NVML found no device"
    return pynvml, devices, None


def nvml_shutdown(nvml: Any) -> None:
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
