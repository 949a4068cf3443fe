"""The kernel's OOM kills (otel_llm.observers.oom): the victim found in the kernel log, ``dmesg``
run without privileges, and the counter of growth between readings. The vmstat file and the
host sampler are in test_observers_restarts.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.observers.oom import OomWatch, Victim, dmesg_victim, oom_victim


class Watch:
    """An OomWatch on an in-memory meter, with a victim the test sets."""

    def __init__(self, victim: Victim | None = None) -> None:
        self.reader = InMemoryMetricReader()
        self.victim = victim
        self.asked = 0
        self.oom = OomWatch(MeterProvider(metric_readers=[self.reader]).get_meter("test"), victim=self._victim)

    def _victim(self) -> Victim | None:
        self.asked += 1
        return self.victim

    def counted(self) -> int | None:
        data = self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else []:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == sc.METRIC_HOST_OOM_KILLS:
                        point: Any
                        (point,) = metric.data.data_points
                        return int(point.value)
        return None


@pytest.fixture(autouse=True)
def fresh_log() -> None:
    reset_log_once()


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_llm" and r.levelno >= logging.WARNING]


def fake_dmesg(folder: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A ``dmesg`` on PATH that runs ``script`` (sh)."""
    path = folder / "dmesg"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}/usr/bin:/bin")


# --- oom_victim and dmesg_victim ----------------------------------------------------------------


def test_a_victim_whose_name_has_spaces() -> None:
    log = "[ 5.0] Out of memory: Killed process 3141 (Web Content) total-vm:9kB, anon-rss:9kB\n"
    assert oom_victim(log) == (3141, "Web Content")


def test_victim_lines_without_timestamps_and_among_other_lines() -> None:
    log = ("kernel: llama-server invoked oom-killer: gfp_mask=0x140cca\n"
           "kernel: Out of memory: Killed process 77 (llama-server) total-vm:1kB\n"
           "kernel: oom_reaper: reaped process 77 (llama-server), now anon-rss:0kB\n")
    assert oom_victim(log) == (77, "llama-server")


@pytest.mark.parametrize("log", [
    "",
    "[ 1.0] Memory cgroup out of memory: Killed process 12 (python3)\n",  # a cgroup limit, not the host
    "[ 1.0] Out of memory: Killed process abc (python3)\n",
    "[ 1.0] Out of memory: Killed process 12 python3\n",
])
def test_no_victim(log: str) -> None:
    assert oom_victim(log) is None


def test_dmesg_victim_reads_the_kernel_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dmesg(tmp_path, monkeypatch,
               "echo '[ 1.0] Out of memory: Killed process 10 (a)'\n"
               "echo '[ 2.0] Out of memory: Killed process 20 (ollama)'")
    assert dmesg_victim() == (20, "ollama")


def test_dmesg_victim_with_no_oom_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dmesg(tmp_path, monkeypatch, "echo '[ 1.0] usb 1-1: new device'")
    assert dmesg_victim() is None


def test_a_restricted_kernel_log_is_no_victim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel.dmesg_restrict: dmesg fails (even if it printed an OOM line first)."""
    fake_dmesg(tmp_path, monkeypatch,
               "echo '[ 1.0] Out of memory: Killed process 10 (a)'\n"
               "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    assert dmesg_victim() is None


def test_dmesg_output_that_is_not_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dmesg(tmp_path, monkeypatch, r"printf '\377\376 Out of memory: Killed process 9 (x\377y)\n'")
    assert dmesg_victim() == (9, "x\ufffdy")


def test_an_unrunnable_dmesg_is_no_victim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dmesg").write_text("#!/bin/sh\necho unreachable\n")
    (tmp_path / "dmesg").chmod(0o644)  # not executable
    monkeypatch.setenv("PATH", str(tmp_path))
    assert dmesg_victim() is None


# --- OomWatch.observe ---------------------------------------------------------------------------


def test_the_first_reading_is_the_baseline() -> None:
    watch = Watch((1, "x"))
    assert watch.oom.observe(40) == 0
    assert watch.counted() is None and watch.asked == 0


def test_growth_is_counted_and_the_victim_logged(caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch((4242, "vllm"))
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        watch.oom.observe(0)
        assert watch.oom.observe(1) == 1
        assert watch.oom.observe(4) == 3
    assert watch.counted() == 4
    assert watch.asked == 2
    assert warnings(caplog) == [
        f"otel_llm: the kernel killed {n} process(es) for lack of memory (oom_kill +{n}); "
        "the latest victim: vllm (pid 4242)" for n in (1, 3)]


def test_without_a_readable_kernel_log_the_warning_has_no_victim(caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch(None)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        watch.oom.observe(2)
        assert watch.oom.observe(3) == 1
    assert warnings(caplog) == ["otel_llm: the kernel killed 1 process(es) for lack of memory (oom_kill +1)"]


def test_no_growth_neither_counts_nor_asks_for_a_victim(caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch((1, "x"))
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        for total in (5, 5, 5):
            assert watch.oom.observe(total) == 0
    assert watch.asked == 0 and warnings(caplog) == [] and watch.counted() is None


def test_a_count_that_goes_back_becomes_the_new_baseline() -> None:
    """A reading lower than the previous one (a container's view, a counter reset) counts
    nothing; growth is then measured from it."""
    watch = Watch()
    watch.oom.observe(10)
    assert watch.oom.observe(3) == 0
    assert watch.oom.observe(5) == 2
    assert watch.counted() == 2


def test_a_missing_reading_keeps_the_previous_baseline() -> None:
    watch = Watch()
    watch.oom.observe(10)
    assert watch.oom.observe(None) == 0
    assert watch.oom.observe(12) == 2
    assert watch.counted() == 2


def test_a_failing_victim_lookup_still_counts_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Victim | None:
        raise RuntimeError("no kernel log")

    reader = InMemoryMetricReader()
    oom = OomWatch(MeterProvider(metric_readers=[reader]).get_meter("test"), victim=broken)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        oom.observe(0)
        assert oom.observe(2) == 2
        assert oom.observe(3) == 1
    assert [m for m in warnings(caplog) if "reporting OOM kills failed" in m] == [
        "otel_llm: reporting OOM kills failed (further occurrences are not logged)"]
    data: Any = reader.get_metrics_data()
    (point,) = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert point.value == 3


def test_a_failing_counter_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenCounter:
        def add(self, amount: int) -> None:
            raise ValueError("meter gone")

    class BrokenMeter:
        def create_counter(self, *args: Any, **kwargs: Any) -> BrokenCounter:
            return BrokenCounter()

    oom = OomWatch(BrokenMeter(), victim=lambda: None)
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        oom.observe(1)
        assert oom.observe(2) == 1
    assert any("reporting OOM kills failed" in m for m in warnings(caplog))


# --- OomWatch.on_sample and check -----------------------------------------------------------------


def test_on_sample_reads_the_samples_oom_kills() -> None:
    watch = Watch()
    watch.oom.on_sample(SimpleNamespace(oom_kills=7))
    watch.oom.on_sample(SimpleNamespace())  # a sample without the field: nothing
    watch.oom.on_sample(SimpleNamespace(oom_kills=None))
    watch.oom.on_sample(SimpleNamespace(oom_kills=9))
    assert watch.counted() == 2


def test_check_reads_a_vmstat_file(tmp_path: Path) -> None:
    watch = Watch()
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 4\npgmajfault 2\n")
    assert watch.oom.check(str(vmstat)) == 0
    vmstat.write_text("nr_free_pages 1\noom_kill 6\npgmajfault 2\n")
    assert watch.oom.check(str(vmstat)) == 2
    assert watch.counted() == 2


def test_check_logs_once_when_the_count_is_unreadable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch()
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill many\n")
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        assert watch.oom.check(str(vmstat)) == 0
        assert watch.oom.check(str(vmstat)) == 0
    assert [m for m in warnings(caplog) if "reading the OOM-kill count failed" in m] == [
        "otel_llm: reading the OOM-kill count failed (further occurrences are not logged)"]
    vmstat.write_text("oom_kill 1\n")
    watch.oom.check(str(vmstat))
    vmstat.write_text("oom_kill 2\n")
    assert watch.oom.check(str(vmstat)) == 1  # the bad readings left no baseline behind
