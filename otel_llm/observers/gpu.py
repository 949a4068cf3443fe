"""NVIDIA GPU metrics from NVML, read per device at collection time.

``GpuObserver.create(meter)`` returns None (after one INFO line) when there is no NVML library,
no driver or no GPU. Otherwise it registers asynchronous instruments whose callbacks read NVML
when the SDK collects. Every field is read on its own: an NVML error on one field drops that field
only (logged once per field); a device that disappears is dropped (logged once), the others go on.

Choices made here (names are proposals for ``semconv``, listed below):

* ``hw.gpu.clock.frequency`` (Gauge, Hz) with ``hw.gpu.clock.domain`` = ``sm`` | ``memory``.
* ``hw.gpu.throttle`` (Gauge, 0/1) with ``hw.gpu.throttle.reason`` = one of ``THROTTLE_REASONS``;
  read with ``nvmlDeviceGetCurrentClocksEventReasons``, falling back to the older
  ``nvmlDeviceGetCurrentClocksThrottleReasons`` on drivers without it.
* ``hw.gpu.io`` (Counter, By): NVML only gives the PCIe throughput as a rate (KB/s, taken as
  1024 bytes, sampled by the driver over ~20 ms). Each collection integrates it over the time since
  the previous collection with the trapezoid rule, so the counter is an estimate of the bytes moved
  (exact for a steady rate, coarse for bursts shorter than the collection interval). It starts at 0.
* ``process.gpu.memory.usage`` (UpDownCounter, By) with ``process.pid``: compute processes only,
  for the pids the caller passes in (NVML reports pids of the host's PID namespace).
* ``hw.gpu.memory.utilization`` is used / total memory (not NVML's memory-controller busy rate).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_llm._log import logger

from otel_llm.semconv import (  # noqa: F401 - names callers import from here too
    METRIC_HW_GPU_UTILIZATION, METRIC_HW_GPU_MEMORY_USAGE, METRIC_HW_GPU_MEMORY_LIMIT,
    METRIC_HW_GPU_MEMORY_UTILIZATION, METRIC_HW_GPU_IO, METRIC_HW_GPU_CLOCK_FREQUENCY,
    METRIC_HW_GPU_THROTTLE, METRIC_HW_POWER, METRIC_HW_ENERGY, METRIC_HW_TEMPERATURE,
    METRIC_PROCESS_GPU_MEMORY_USAGE, HW_ID, HW_NAME, HW_VENDOR, HW_MODEL, HW_TYPE, HW_GPU_TASK,
    HW_SENSOR_LOCATION, HW_GPU_CLOCK_DOMAIN, HW_GPU_THROTTLE_REASON, NETWORK_IO_DIRECTION,
    PROCESS_PID,
)

__all__ = ["GpuObserver", "THROTTLE_REASONS"]

# keys of sample()
SAMPLE_GPU_UTILIZATION = "gpu.utilization"
SAMPLE_GPU_MEMORY_USAGE = "gpu.memory.usage"

# NVML clocks-event (throttle) bits, identical in the old and new API.
THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# NVML return codes (stable C API values; pynvml exposes the same as NVML_ERROR_*).
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
_ERR_GPU_NOT_FOUND = 28
# the device (or its handle) is gone: drop the device
_DEVICE_GONE = frozenset({_ERR_INVALID_ARGUMENT, _ERR_GPU_IS_LOST, _ERR_RESET_REQUIRED, _ERR_GPU_NOT_FOUND})
# the field will never work on this device: stop asking (other errors are retried next time)
_FIELD_NEVER = frozenset({_ERR_NOT_SUPPORTED, _ERR_NO_PERMISSION, _ERR_NOT_FOUND, _ERR_FUNCTION_NOT_FOUND})

_KB = 1024
_PCIE_TX = 0  # NVML_PCIE_UTIL_TX_BYTES
_PCIE_RX = 1  # NVML_PCIE_UTIL_RX_BYTES
_CLOCK_SM = 1  # NVML_CLOCK_SM
_CLOCK_MEM = 2  # NVML_CLOCK_MEM
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU


@dataclass
class _Device:
    """One GPU: its handle, identity attributes and per-device state."""

    index: int
    handle: Any
    attrs: dict[str, str]
    dropped: set[str] = field(default_factory=set)
    lost: bool = False
    io_total: dict[str, float] = field(default_factory=lambda: {"transmit": 0.0, "receive": 0.0})
    io_last: tuple[float, dict[str, float]] | None = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _off(reason: str) -> None:
    logger.info("otel_llm: no NVIDIA GPU observed (%s); GPU metrics off", reason)


class GpuObserver:
    """NVML-backed GPU metrics; build it with ``create``."""

    def __init__(self, nvml: Any, devices: list[_Device],
                 pids: Callable[[], Iterable[int]] | None = None) -> None:
        self._nvml = nvml
        self._devices = devices
        self._pids = pids
        self._lock = threading.Lock()
        self._logged: set[tuple[str, ...]] = set()
        self._closed = False
        self._throttle_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._clock: Callable[[], float] = time.monotonic

    # -- life cycle -----------------------------------------------------------------------------
    @classmethod
    def create(cls, meter: Meter, pids: Callable[[], Iterable[int]] | None = None) -> GpuObserver | None:
        """Start observing every NVIDIA GPU, or return None (one INFO line) if there is none."""
        try:
            import pynvml
        except ImportError:
            _off("nvidia-ml-py (pynvml) is not installed")
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError (no library, no driver) or OSError from ctypes
            _off(f"NVML did not start: {str(exc) or type(exc).__name__}")
            return None
        try:
            devices = _discover(pynvml)
        except Exception as exc:
            _shutdown_quietly(pynvml)
            _off(f"listing devices failed: {str(exc) or type(exc).__name__}")
            return None
        if not devices:
            _shutdown_quietly(pynvml)
            _off("NVML found no device")
            return None
        observer = cls(pynvml, devices, pids)
        observer._register(meter)
        return observer

    def shutdown(self) -> None:
        """Stop reading NVML and release it (once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _shutdown_quietly(self._nvml)

    @property
    def device_count(self) -> int:
        return len(self._devices)

    # -- per-call sampler -----------------------------------------------------------------------
    def sample(self) -> dict[str, float]:
        """Mean utilization (0..1) and total used memory (By) over the devices, for the sampler."""
        utilizations: list[float] = []
        used: list[float] = []
        for device in self._live():
            rates = self._read(device, "utilization", "nvmlDeviceGetUtilizationRates")
            if rates is not None:
                utilizations.append(rates.gpu / 100.0)
            memory = self._read(device, "memory", "nvmlDeviceGetMemoryInfo")
            if memory is not None:
                used.append(float(memory.used))
        out: dict[str, float] = {}
        if utilizations:
            out[SAMPLE_GPU_UTILIZATION] = sum(utilizations) / len(utilizations)
        if used:
            out[SAMPLE_GPU_MEMORY_USAGE] = sum(used)
        return out

    # -- instruments ----------------------------------------------------------------------------
    def _register(self, meter: Meter) -> None:
        def cb(fn: Callable[[], Iterator[Observation]]) -> list[Callable[[CallbackOptions], Iterable[Observation]]]:
            return [lambda options: list(fn())]

        meter.create_observable_gauge(METRIC_HW_GPU_UTILIZATION, cb(self._utilization), unit="1",
                                      description="Fraction of time the GPU was busy (NVML utilization).")
        meter.create_observable_up_down_counter(METRIC_HW_GPU_MEMORY_USAGE, cb(self._memory_usage), unit="By",
                                                description="GPU memory in use.")
        meter.create_observable_up_down_counter(METRIC_HW_GPU_MEMORY_LIMIT, cb(self._memory_limit), unit="By",
                                                description="GPU memory size.")
        meter.create_observable_gauge(METRIC_HW_GPU_MEMORY_UTILIZATION, cb(self._memory_utilization), unit="1",
                                      description="Fraction of GPU memory in use.")
        meter.create_observable_gauge(METRIC_HW_POWER, cb(self._power), unit="W",
                                      description="GPU power draw.")
        meter.create_observable_counter(METRIC_HW_ENERGY, cb(self._energy), unit="J",
                                        description="GPU energy consumed since the driver loaded.")
        meter.create_observable_gauge(METRIC_HW_TEMPERATURE, cb(self._temperature), unit="Cel",
                                      description="GPU core temperature.")
        meter.create_observable_counter(METRIC_HW_GPU_IO, cb(self._io), unit="By",
                                        description="PCIe bytes moved, integrated from NVML's throughput rate.")
        meter.create_observable_gauge(METRIC_HW_GPU_CLOCK_FREQUENCY, cb(self._clocks), unit="Hz",
                                      description="Current SM and memory clock frequency.")
        meter.create_observable_gauge(METRIC_HW_GPU_THROTTLE, cb(self._throttle), unit="1",
                                      description="1 while NVML reports this clock-throttle reason active, else 0.")
        if self._pids is not None:
            meter.create_observable_up_down_counter(METRIC_PROCESS_GPU_MEMORY_USAGE, cb(self._process_memory),
                                                    unit="By", description="GPU memory used by a process.")

    def _utilization(self) -> Iterator[Observation]:
        for device in self._live():
            rates = self._read(device, "utilization", "nvmlDeviceGetUtilizationRates")
            if rates is not None:
                yield Observation(rates.gpu / 100.0, {**device.attrs, HW_GPU_TASK: "general"})

    def _memory_usage(self) -> Iterator[Observation]:
        for device in self._live():
            memory = self._read(device, "memory", "nvmlDeviceGetMemoryInfo")
            if memory is not None:
                yield Observation(int(memory.used), device.attrs)

    def _memory_limit(self) -> Iterator[Observation]:
        for device in self._live():
            memory = self._read(device, "memory", "nvmlDeviceGetMemoryInfo")
            if memory is not None:
                yield Observation(int(memory.total), device.attrs)

    def _memory_utilization(self) -> Iterator[Observation]:
        for device in self._live():
            memory = self._read(device, "memory", "nvmlDeviceGetMemoryInfo")
            if memory is not None and memory.total:
                yield Observation(memory.used / memory.total, device.attrs)

    def _power(self) -> Iterator[Observation]:
        for device in self._live():
            milliwatts = self._read(device, "power", "nvmlDeviceGetPowerUsage")
            if milliwatts is not None:
                yield Observation(milliwatts / 1000.0, {**device.attrs, HW_TYPE: "gpu"})

    def _energy(self) -> Iterator[Observation]:
        for device in self._live():
            millijoules = self._read(device, "energy", "nvmlDeviceGetTotalEnergyConsumption")
            if millijoules is not None:
                yield Observation(millijoules / 1000.0, {**device.attrs, HW_TYPE: "gpu"})

    def _temperature(self) -> Iterator[Observation]:
        for device in self._live():
            celsius = self._read(device, "temperature", "nvmlDeviceGetTemperature", _TEMPERATURE_GPU)
            if celsius is not None:
                yield Observation(celsius, {**device.attrs, HW_TYPE: "gpu", HW_SENSOR_LOCATION: "gpu"})

    def _io(self) -> Iterator[Observation]:
        for device in self._live():
            tx = self._read(device, "pcie_throughput", "nvmlDeviceGetPcieThroughput", _PCIE_TX)
            rx = self._read(device, "pcie_throughput", "nvmlDeviceGetPcieThroughput", _PCIE_RX)
            if tx is None or rx is None:
                continue
            totals = self._integrate(device, {"transmit": tx * _KB, "receive": rx * _KB})
            for direction, total in totals.items():
                yield Observation(int(total), {**device.attrs, NETWORK_IO_DIRECTION: direction})

    def _integrate(self, device: _Device, rates: dict[str, float]) -> dict[str, float]:
        """Add the bytes moved since the last reading (trapezoid rule); return the totals."""
        now = self._clock()
        with self._lock:
            if device.io_last is not None:
                then, before = device.io_last
                elapsed = max(0.0, now - then)
                for direction, rate in rates.items():
                    device.io_total[direction] += (before[direction] + rate) / 2.0 * elapsed
            device.io_last = (now, rates)
            return dict(device.io_total)

    def _clocks(self) -> Iterator[Observation]:
        for device in self._live():
            for domain, clock in (("sm", _CLOCK_SM), ("memory", _CLOCK_MEM)):
                mhz = self._read(device, f"clock.{domain}", "nvmlDeviceGetClockInfo", clock)
                if mhz is not None:
                    yield Observation(mhz * 1_000_000, {**device.attrs, HW_GPU_CLOCK_DOMAIN: domain})

    def _throttle(self) -> Iterator[Observation]:
        for device in self._live():
            mask = self._throttle_mask(device)
            if mask is None:
                continue
            for reason, bit in THROTTLE_REASONS.items():
                yield Observation(1 if mask & bit else 0, {**device.attrs, HW_GPU_THROTTLE_REASON: reason})

    def _throttle_mask(self, device: _Device) -> int | None:
        """The current reasons bitmask, via the newer NVML name or, without it, the older one."""
        if device.lost or "throttle" in device.dropped or self._closed:
            return None
        if self._throttle_fn == "nvmlDeviceGetCurrentClocksEventReasons":
            try:
                fn = getattr(self._nvml, self._throttle_fn)
                return int(fn(device.handle))
            except AttributeError:
                pass
            except self._nvml.NVMLError as exc:
                if getattr(exc, "value", None) != _ERR_FUNCTION_NOT_FOUND:
                    self._nvml_error(device, "throttle", exc)
                    return None
            self._throttle_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        mask = self._read(device, "throttle", self._throttle_fn)
        return None if mask is None else int(mask)

    def _process_memory(self) -> Iterator[Observation]:
        wanted = self._wanted_pids()
        if not wanted:
            return
        for device in self._live():
            for pid, memory in self._used_by(device, wanted).items():
                yield Observation(memory, {**device.attrs, PROCESS_PID: pid})

    def process_memory(self, pids: set[int]) -> dict[int, int]:
        """GPU memory (By) each of ``pids`` uses now, summed over the devices; absent pids use none."""
        used: dict[int, int] = {}
        for device in self._live():
            for pid, memory in self._used_by(device, pids).items():
                used[pid] = used.get(pid, 0) + memory
        return used

    def _used_by(self, device: _Device, pids: set[int]) -> dict[int, int]:
        processes = self._read(device, "processes", "nvmlDeviceGetComputeRunningProcesses")
        used: dict[int, int] = {}
        for process in processes or ():
            pid, memory = getattr(process, "pid", None), getattr(process, "usedGpuMemory", None)
            if pid in pids and memory is not None:
                used[pid] = used.get(pid, 0) + int(memory)
        return used

    def _wanted_pids(self) -> set[int]:
        try:
            return {int(pid) for pid in self._pids()} if self._pids is not None else set()
        except Exception:
            self._log_once(("pids",), "otel_llm: listing the processes to watch on the GPU failed", exc_info=True)
            return set()

    # -- reading NVML ---------------------------------------------------------------------------
    def _live(self) -> list[_Device]:
        return [] if self._closed else [d for d in self._devices if not d.lost]

    def _read(self, device: _Device, name: str, function: str, *args: Any) -> Any:
        """Call ``pynvml.<function>(handle, *args)``; None if this field (or device) failed."""
        if device.lost or name in device.dropped or self._closed:
            return None
        try:
            return getattr(self._nvml, function)(device.handle, *args)
        except self._nvml.NVMLError as exc:
            self._nvml_error(device, name, exc)
        except Exception as exc:  # a binding without the function, a ctypes failure: never works
            device.dropped.add(name)
            self._log_once(("field", name, type(exc).__name__),
                           f"otel_llm: GPU field {name} cannot be read ({type(exc).__name__}: {exc}); dropped")
        return None

    def _nvml_error(self, device: _Device, name: str, exc: Exception) -> None:
        code = getattr(exc, "value", None)
        if code in _DEVICE_GONE:
            self._lose(device, exc)
            return
        never = code in _FIELD_NEVER
        if never:
            device.dropped.add(name)
        self._log_once(("field", name, type(exc).__name__),
                       f"otel_llm: GPU field {name} not available ({exc}); "
                       + ("dropped" if never else "skipped while it fails"))

    def _lose(self, device: _Device, exc: Exception) -> None:
        with self._lock:
            device.lost = True
            self._devices = [d for d in self._devices if d is not device]
        self._log_once(("lost", device.attrs[HW_ID]),
                       f"otel_llm: GPU {device.attrs[HW_NAME]} ({device.attrs[HW_ID]}) is gone ({exc}); "
                       "its metrics stop", level=logging.WARNING)

    def _log_once(self, key: tuple[str, ...], message: str, level: int = logging.INFO,
                  exc_info: bool = False) -> None:
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        logger.log(level, message, exc_info=exc_info)


def _discover(nvml: Any) -> list[_Device]:
    """Every device NVML lists, with its identity (a device that fails here is skipped)."""
    devices = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            logger.debug("otel_llm: GPU %d skipped (%s)", index, exc)
            continue
        try:
            model = _text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError:
            model = "unknown"
        attrs = {HW_ID: uuid, HW_NAME: f"gpu{index}", HW_VENDOR: "NVIDIA", HW_MODEL: model}
        devices.append(_Device(index, handle, attrs))
    return devices


def _shutdown_quietly(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        logger.debug("otel_llm: nvmlShutdown failed", exc_info=True)
