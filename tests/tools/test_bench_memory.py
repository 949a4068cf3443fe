"""The server's peak memory during a bench level: its process tree found by the listening port,
resident memory summed over a child that grows, GPU memory through the reader it is given, and
a clear reason whenever the server cannot be seen."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from otel_llm.tools.bench.memory import MemoryWatch, server_processes

pytestmark = pytest.mark.timeout(120)

MIB = 2**20
GROW = 300 * MIB

# A "server": listens on a port, starts a child, and on a line on stdin the child allocates GROW
# bytes (touched, so they are resident) and says so.
_SERVER = f"""
import socket, subprocess, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
child = subprocess.Popen([sys.executable, "-c",
    "import sys; sys.stdin.readline(); b = bytearray({GROW}); print('grown', flush=True); sys.stdin.readline()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(s.getsockname()[1], child.pid, flush=True)
sys.stdin.readline(); child.stdin.write("go\\n"); child.stdin.flush()
print(child.stdout.readline().strip(), flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port, child = map(int, proc.stdout.readline().split())
    try:
        yield proc, port, child
    finally:
        proc.kill()
        proc.wait(timeout=10)
        try:
            psutil.Process(child).kill()
        except psutil.Error:
            pass


def test_the_listener_and_its_children_are_watched_and_growth_is_seen(server: tuple) -> None:
    proc, port, child = server
    processes, why = server_processes(f"http://127.0.0.1:{port}/v1")
    assert why is None and sorted(p.pid for p in processes) == sorted([proc.pid, child])
    watch = MemoryWatch(processes, interval=0.05)
    watch.start()
    before = sum(p.memory_info().rss for p in processes)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "grown"
    time.sleep(0.3)  # a few samples of the grown child
    peak = watch.stop()
    assert peak.rss is not None and peak.rss >= before + GROW - 20 * MIB
    assert peak.samples >= 3 and peak.pids == sorted([proc.pid, child]) and peak.gpu is None
    watch.start()  # a second level starts again from what is resident now
    assert watch.stop().rss >= GROW


def test_gpu_memory_of_the_watched_pids_is_summed(server: tuple) -> None:
    proc, port, child = server
    processes, _ = server_processes(f"http://localhost:{port}")
    asked: list[set[int]] = []

    def gpu(pids: set[int]) -> dict[int, int]:
        asked.append(pids)
        return {pid: 100 * MIB for pid in pids if pid == child}

    watch = MemoryWatch(processes, interval=0.05, gpu=gpu)
    watch.start()
    time.sleep(0.15)
    peak = watch.stop()
    assert peak.gpu == 100 * MIB and asked[0] == {proc.pid, child}
    assert peak.to_dict()["peak_gpu_memory_bytes"] == 100 * MIB


def test_a_reader_that_fails_never_stops_the_level(server: tuple) -> None:
    _, port, _ = server
    processes, _ = server_processes(f"http://127.0.0.1:{port}")

    def broken(pids: set[int]) -> dict[int, int]:
        raise RuntimeError("NVML went away")

    watch = MemoryWatch(processes, interval=0.05, gpu=broken)
    watch.start()
    time.sleep(0.1)
    assert watch.stop().rss is None  # no sample counted, no exception


def test_a_server_that_cannot_be_seen_says_why() -> None:
    assert server_processes("http://10.1.2.3:8000")[1] == "the server (10.1.2.3) is not on this host"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert server_processes(f"http://127.0.0.1:{port}")[1] == f"no visible process listens on port {port}"
        s.listen()
        assert server_processes(f"http://127.0.0.1:{port}") == ([], "the server runs inside this process")
    watch = MemoryWatch([], "the server (10.1.2.3) is not on this host")
    watch.start()
    assert watch.stop().to_dict()["not_seen"] == "the server (10.1.2.3) is not on this host"
    assert watch.describe() == "not seen (the server (10.1.2.3) is not on this host)"


def test_a_process_that_ends_is_no_longer_summed(server: tuple) -> None:
    proc, port, child = server
    processes, _ = server_processes(f"http://127.0.0.1:{port}")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "grown"
    psutil.Process(child).kill()  # left a zombie: its parent does not reap it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _status(child) not in (psutil.STATUS_ZOMBIE, None):
        time.sleep(0.02)
    watch = MemoryWatch(processes, interval=0.05)
    watch.start()
    peak = watch.stop()
    assert peak.rss is not None and peak.rss < GROW // 2  # the parent alone


def _status(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None
