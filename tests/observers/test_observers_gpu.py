"""GpuObserver against a fake NVML (two devices, patched at the pynvml function boundary), and
the no-NVML path for real on this machine (which has no GPU)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Metric, Sum

from otel_llm.observers.gpu import THROTTLE_REASONS, GpuObserver
from otel_llm_testing.fake_nvml import GIB, FakeGpu, FakeNvml

@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([
        FakeGpu("GPU-aaaa-0000", "NVIDIA GeForce RTX 4090", processes=[(100, GIB), (200, 512 << 20), (300, None)]),
        FakeGpu("GPU-bbbb-1111", "NVIDIA A100-SXM4-40GB", util=100, used=30 * GIB, total=40 * GIB,
                power_mw=300_500, reasons=0, processes=[(100, 3 * GIB)]),
    ])
    fake.install(monkeypatch)
    return fake


@dataclass
class Rig:
    reader: InMemoryMetricReader
    provider: MeterProvider

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        return {m.name: m for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
                for m in sm.metrics}


@pytest.fixture
def rig() -> Iterator[Rig]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield Rig(reader, provider)
    provider.shutdown()


def by_device(metric: Metric, *extra: str) -> dict[tuple[Any, ...], float]:
    return {(p.attributes["hw.id"], *(p.attributes[k] for k in extra)): p.value for p in metric.data.data_points}


DEV0 = {"hw.id": "GPU-aaaa-0000", "hw.name": "gpu0", "hw.vendor": "NVIDIA", "hw.model": "NVIDIA GeForce RTX 4090"}
DEV1 = {"hw.id": "GPU-bbbb-1111", "hw.name": "gpu1", "hw.vendor": "NVIDIA", "hw.model": "NVIDIA A100-SXM4-40GB"}


def gpu_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_llm"]


# --- the machine itself ------------------------------------------------------------------------------
def test_no_nvml_on_this_machine_for_real(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    assert GpuObserver.create(rig.provider.get_meter("t")) is None
    logs = gpu_logs(caplog)
    assert len(logs) == 1, logs
    assert logs[0].startswith("otel_llm: no NVIDIA GPU observed (") and logs[0].endswith("); GPU metrics off")
    assert [r.levelno for r in caplog.records if r.name == "otel_llm"] == [logging.INFO]
    assert rig.metrics() == {}


# --- two fake devices --------------------------------------------------------------------------------
def test_metrics_names_units_attributes_values(nvml: FakeNvml, rig: Rig) -> None:
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None and observer.device_count == 2
    m = rig.metrics()

    util = m["hw.gpu.utilization"]
    assert isinstance(util.data, Gauge) and util.unit == "1"
    assert sorted((p.value, dict(p.attributes)) for p in util.data.data_points) == sorted([
        (0.5, {**DEV0, "hw.gpu.task": "general"}), (1.0, {**DEV1, "hw.gpu.task": "general"})], key=str)

    usage, limit = m["hw.gpu.memory.usage"], m["hw.gpu.memory.limit"]
    assert isinstance(usage.data, Sum) and not usage.data.is_monotonic and usage.unit == "By"
    assert isinstance(limit.data, Sum) and not limit.data.is_monotonic and limit.unit == "By"
    assert by_device(usage) == {("GPU-aaaa-0000",): 2 * GIB, ("GPU-bbbb-1111",): 30 * GIB}
    assert by_device(limit) == {("GPU-aaaa-0000",): 8 * GIB, ("GPU-bbbb-1111",): 40 * GIB}
    assert dict(usage.data.data_points[0].attributes) in (DEV0, DEV1)
    mem_util = m["hw.gpu.memory.utilization"]
    assert isinstance(mem_util.data, Gauge) and mem_util.unit == "1"
    assert by_device(mem_util) == {("GPU-aaaa-0000",): 0.25, ("GPU-bbbb-1111",): 0.75}

    power = m["hw.power"]
    assert isinstance(power.data, Gauge) and power.unit == "W"
    assert by_device(power, "hw.type") == {("GPU-aaaa-0000", "gpu"): 150.0, ("GPU-bbbb-1111", "gpu"): 300.5}
    energy = m["hw.energy"]
    assert isinstance(energy.data, Sum) and energy.data.is_monotonic and energy.unit == "J"
    assert by_device(energy, "hw.type")[("GPU-aaaa-0000", "gpu")] == 3600.0
    temp = m["hw.temperature"]
    assert isinstance(temp.data, Gauge) and temp.unit == "Cel"
    assert by_device(temp, "hw.sensor_location")[("GPU-aaaa-0000", "gpu")] == 61

    clocks = m["hw.gpu.clock.frequency"]
    assert isinstance(clocks.data, Gauge) and clocks.unit == "Hz"
    assert by_device(clocks, "hw.gpu.clock.domain") == {
        ("GPU-aaaa-0000", "sm"): 1.8e9, ("GPU-aaaa-0000", "memory"): 7e9,
        ("GPU-bbbb-1111", "sm"): 1.8e9, ("GPU-bbbb-1111", "memory"): 7e9}

    throttle = m["hw.gpu.throttle"]
    assert isinstance(throttle.data, Gauge) and throttle.unit == "1"
    reasons = by_device(throttle, "hw.gpu.throttle.reason")
    assert len(reasons) == 2 * len(THROTTLE_REASONS)
    assert {r for (d, r), v in reasons.items() if v == 1} == {"sw_power_cap", "hw_thermal_slowdown"}
    assert reasons[("GPU-aaaa-0000", "sw_power_cap")] == 1 and reasons[("GPU-bbbb-1111", "sw_power_cap")] == 0

    io = m["hw.gpu.io"]
    assert isinstance(io.data, Sum) and io.data.is_monotonic and io.unit == "By"
    assert set(by_device(io, "network.io.direction").values()) == {0}  # nothing integrated yet
    assert "process.gpu.memory.usage" not in m  # no pids given
    observer.shutdown()


def test_pcie_throughput_is_integrated_over_time(nvml: FakeNvml, rig: Rig) -> None:
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None
    now = [100.0]
    observer._clock = lambda: now[0]
    rig.metrics()
    now[0] += 2.0  # 2 s at a steady 1000 KB/s transmit, 3000 KB/s receive
    io = by_device(rig.metrics()["hw.gpu.io"], "network.io.direction")
    assert io[("GPU-aaaa-0000", "transmit")] == 2 * 1000 * 1024
    assert io[("GPU-aaaa-0000", "receive")] == 2 * 3000 * 1024
    nvml.devices[0].tx_kbps = 3000  # rising linearly: the trapezoid rule takes the mean rate
    now[0] += 1.0
    io = by_device(rig.metrics()["hw.gpu.io"], "network.io.direction")
    assert io[("GPU-aaaa-0000", "transmit")] == 2 * 1000 * 1024 + 2000 * 1024


def test_process_memory_for_given_pids(nvml: FakeNvml, rig: Rig) -> None:
    observer = GpuObserver.create(rig.provider.get_meter("t"), pids=lambda: [100, 300, 999])
    assert observer is not None
    metric = rig.metrics()["process.gpu.memory.usage"]
    assert isinstance(metric.data, Sum) and not metric.data.is_monotonic and metric.unit == "By"
    points = {(p.attributes["hw.id"], p.attributes["process.pid"]): p.value for p in metric.data.data_points}
    # pid 200 is not asked for; pid 300's usage is unavailable (None)
    assert points == {("GPU-aaaa-0000", 100): GIB, ("GPU-bbbb-1111", 100): 3 * GIB}
    assert dict(metric.data.data_points[0].attributes).keys() == {*DEV0, "process.pid"}


def test_process_memory_read_sums_the_devices(nvml: FakeNvml) -> None:
    observer = GpuObserver.create(MeterProvider().get_meter("t"))
    assert observer is not None
    assert observer.process_memory({100, 200, 300, 999}) == {100: 4 * GIB, 200: 512 << 20}
    assert observer.process_memory(set()) == {}


def test_sample(nvml: FakeNvml) -> None:
    observer = GpuObserver.create(MeterProvider().get_meter("t"))
    assert observer is not None
    assert observer.sample() == {"gpu.utilization": 0.75, "gpu.memory.usage": 32 * GIB}
    nvml.devices[1].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert observer.sample() == {"gpu.utilization": 0.5, "gpu.memory.usage": 32 * GIB}


# --- failures ----------------------------------------------------------------------------------------
def test_not_supported_drops_that_field_only(nvml: FakeNvml, rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    nvml.devices[0].errors["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.devices[1].errors["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.devices[1].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None
    for _ in range(3):
        m = rig.metrics()
    assert "hw.energy" not in m
    assert by_device(m["hw.power"]) == {("GPU-aaaa-0000",): 150.0}
    assert len(by_device(m["hw.temperature"])) == 2
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2  # once per device, never again
    energy_logs = [line for line in gpu_logs(caplog) if "energy" in line]
    assert len(energy_logs) == 1 and "dropped" in energy_logs[0]
    assert len([line for line in gpu_logs(caplog) if "power" in line]) == 1


def test_other_nvml_error_skips_the_field_while_it_fails(nvml: FakeNvml, rig: Rig,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None
    nvml.devices[0].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    rig.metrics()
    m = rig.metrics()
    assert by_device(m["hw.temperature"]) == {("GPU-bbbb-1111",): 61}
    assert len(by_device(m["hw.power"])) == 2
    assert len([line for line in gpu_logs(caplog) if "temperature" in line]) == 1
    del nvml.devices[0].errors["nvmlDeviceGetTemperature"]
    assert len(by_device(rig.metrics()["hw.temperature"])) == 2  # transient: read again


def test_device_that_disappears_is_dropped(nvml: FakeNvml, rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None
    assert len(by_device(rig.metrics()["hw.gpu.utilization"])) == 2
    nvml.devices[0].lost = True
    for _ in range(3):
        m = rig.metrics()
    for name in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.gpu.clock.frequency", "hw.gpu.throttle"):
        assert {key[0] for key in by_device(m[name])} == {"GPU-bbbb-1111"}, name
    assert observer.device_count == 1
    lost = [line for line in gpu_logs(caplog) if "gone" in line]
    assert len(lost) == 1 and "GPU-aaaa-0000" in lost[0]
    assert observer.sample()["gpu.memory.usage"] == 30 * GIB


def test_older_driver_without_clocks_event_reasons(nvml: FakeNvml, rig: Rig) -> None:
    for gpu in nvml.devices:
        gpu.errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None
    rig.metrics()
    reasons = by_device(rig.metrics()["hw.gpu.throttle"], "hw.gpu.throttle.reason")
    assert reasons[("GPU-aaaa-0000", "hw_thermal_slowdown")] == 1
    assert nvml.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # not asked again
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 4


def test_init_failure_and_no_device(nvml: FakeNvml, rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm")
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert GpuObserver.create(rig.provider.get_meter("t")) is None
    assert gpu_logs(caplog) == ["otel_llm: no NVIDIA GPU observed (NVML did not start: Driver Not Loaded); "
                                "GPU metrics off"]
    assert "nvmlShutdown" not in nvml.calls
    caplog.clear()
    nvml.init_error = None
    nvml.devices.clear()
    assert GpuObserver.create(rig.provider.get_meter("t")) is None
    assert gpu_logs(caplog) == ["otel_llm: no NVIDIA GPU observed (NVML found no device); GPU metrics off"]
    assert nvml.calls["nvmlShutdown"] == 1
    assert rig.metrics() == {}


def test_shutdown_once_and_no_reads_after(nvml: FakeNvml, rig: Rig) -> None:
    observer = GpuObserver.create(rig.provider.get_meter("t"))
    assert observer is not None
    observer.shutdown()
    observer.shutdown()
    assert nvml.calls["nvmlShutdown"] == 1
    reads = nvml.calls.get("nvmlDeviceGetPowerUsage", 0)
    assert rig.metrics() == {}
    assert observer.sample() == {}
    assert nvml.calls.get("nvmlDeviceGetPowerUsage", 0) == reads
