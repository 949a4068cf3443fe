"""A fake NVML for the GPU observer's tests: pynvml's functions patched to read ``FakeGpu`` devices,
each call counted, any function made to fail per device."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

__all__ = ["GIB", "FakeGpu", "FakeNvml"]

GIB = 1 << 30


@dataclass
class FakeGpu:
    """One device as the fake NVML reports it (its handle too); ``errors`` fail single functions."""

    uuid: str
    name: str
    util: int = 50
    used: int = 2 * GIB
    total: int = 8 * GIB
    power_mw: int = 150_000
    energy_mj: int = 3_600_000
    temp: int = 61
    tx_kbps: int = 1000
    rx_kbps: int = 3000
    sm_mhz: int = 1800
    mem_mhz: int = 7000
    reasons: int = 0x4 | 0x40  # sw_power_cap, hw_thermal_slowdown
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # pynvml function -> NVML error code
    lost: bool = False


class FakeNvml:
    """Records calls; every nvmlDevice* function reads a FakeGpu (the handle)."""

    def __init__(self, devices: list[FakeGpu]) -> None:
        self.devices = devices
        self.calls: dict[str, int] = {}
        self.init_error: int | None = None

    def count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def device_fn(self, name: str, body: Any) -> Any:
        def fn(handle: FakeGpu, *args: Any) -> Any:
            self.count(name)
            if handle.lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            if name in handle.errors:
                raise pynvml.NVMLError(handle.errors[name])
            return body(handle, *args)

        return fn

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Patch pynvml's functions with these devices' for the test."""
        def init() -> None:
            self.count("nvmlInit")
            if self.init_error is not None:
                raise pynvml.NVMLError(self.init_error)

        def clock(gpu: FakeGpu, kind: int) -> int:
            return {pynvml.NVML_CLOCK_SM: gpu.sm_mhz, pynvml.NVML_CLOCK_MEM: gpu.mem_mhz}[kind]

        def pcie(gpu: FakeGpu, counter: int) -> int:
            return gpu.tx_kbps if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.rx_kbps

        def temperature(gpu: FakeGpu, sensor: int) -> int:
            assert sensor == pynvml.NVML_TEMPERATURE_GPU
            return gpu.temp

        functions: dict[str, Any] = {
            "nvmlInit": init,
            "nvmlShutdown": lambda: self.count("nvmlShutdown"),
            "nvmlDeviceGetCount": lambda: len(self.devices),
            "nvmlDeviceGetHandleByIndex": lambda i: self.devices[i],
            "nvmlDeviceGetUUID": self.device_fn("nvmlDeviceGetUUID", lambda g: g.uuid),
            "nvmlDeviceGetName": self.device_fn("nvmlDeviceGetName", lambda g: g.name),
            "nvmlDeviceGetUtilizationRates": self.device_fn(
                "nvmlDeviceGetUtilizationRates", lambda g: SimpleNamespace(gpu=g.util, memory=10)),
            "nvmlDeviceGetMemoryInfo": self.device_fn(
                "nvmlDeviceGetMemoryInfo",
                lambda g: SimpleNamespace(used=g.used, total=g.total, free=g.total - g.used)),
            "nvmlDeviceGetPowerUsage": self.device_fn("nvmlDeviceGetPowerUsage", lambda g: g.power_mw),
            "nvmlDeviceGetTotalEnergyConsumption": self.device_fn(
                "nvmlDeviceGetTotalEnergyConsumption", lambda g: g.energy_mj),
            "nvmlDeviceGetTemperature": self.device_fn("nvmlDeviceGetTemperature", temperature),
            "nvmlDeviceGetPcieThroughput": self.device_fn("nvmlDeviceGetPcieThroughput", pcie),
            "nvmlDeviceGetClockInfo": self.device_fn("nvmlDeviceGetClockInfo", clock),
            "nvmlDeviceGetCurrentClocksEventReasons": self.device_fn(
                "nvmlDeviceGetCurrentClocksEventReasons", lambda g: g.reasons),
            "nvmlDeviceGetCurrentClocksThrottleReasons": self.device_fn(
                "nvmlDeviceGetCurrentClocksThrottleReasons", lambda g: g.reasons),
            "nvmlDeviceGetComputeRunningProcesses": self.device_fn(
                "nvmlDeviceGetComputeRunningProcesses",
                lambda g: [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in g.processes]),
        }
        for name, fn in functions.items():
            monkeypatch.setattr(pynvml, name, fn)
