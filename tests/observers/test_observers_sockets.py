"""The listeners of a port, from the kernel's sock_diag answers and /proc: found for real sockets
of this process and of another, agreeing with psutil, and None whenever that way is closed."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from otel_llm.observers import sockets
from otel_llm.observers.sockets import listeners
from otel_llm_testing.net import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag is Linux's")


@pytest.fixture
def listening() -> Iterator[tuple[int, int]]:
    """An IPv4 and an IPv6 listening socket of this process: their ports."""
    v4 = socket.socket()
    v6 = socket.socket(socket.AF_INET6)
    try:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        v6.bind(("::1", 0))
        v6.listen()
        yield v4.getsockname()[1], v6.getsockname()[1]
    finally:
        v4.close()
        v6.close()


@pytest.fixture
def child_listener() -> Iterator[tuple[int, int]]:
    """Another process listening on a port: (port, pid)."""
    code = ("import socket,sys,time\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen()\n"
            "print(s.getsockname()[1],flush=True)\ntime.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield int(child.stdout.readline()), child.pid
    finally:
        child.kill()
        child.wait()



def test_this_process_listening_on_both_families(listening: tuple[int, int]) -> None:
    v4, v6 = listening
    found = listeners({v4, v6})
    assert found is not None
    assert sorted(found) == sorted([(v4, psutil.Process().pid), (v6, psutil.Process().pid)])


def test_another_process_and_a_port_nobody_listens_on(child_listener: tuple[int, int]) -> None:
    port, pid = child_listener
    nobody = free_port()
    assert listeners({port, nobody}) == [(port, pid)]
    assert listeners({nobody}) == []


def test_a_connected_socket_is_not_a_listener(listening: tuple[int, int]) -> None:
    v4, _ = listening
    with socket.create_connection(("127.0.0.1", v4)) as client:
        local_port = client.getsockname()[1]
        found = listeners({v4, local_port})
    assert found is not None and {port for port, _ in found} == {v4}


def test_agrees_with_psutil(child_listener: tuple[int, int], listening: tuple[int, int]) -> None:
    ports = {child_listener[0], *listening}
    expected = sorted((c.laddr.port, c.pid) for c in psutil.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports)
    found = listeners(ports)
    assert found is not None and sorted(found) == expected


def test_a_process_that_exited_no_longer_listens(child_listener: tuple[int, int]) -> None:
    port, pid = child_listener
    psutil.Process(pid).kill()
    deadline = time.monotonic() + 10
    while listeners({port}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listeners({port}) == []


def test_an_owner_that_cannot_be_seen_is_none(listening: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    v4, _ = listening
    monkeypatch.setattr(sockets, "_owners", lambda inodes: {})  # as for another user's process
    assert listeners({v4}) == [(v4, None)]


def test_no_ports_and_no_netlink_answer_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert listeners(set()) is None
    monkeypatch.delattr(socket, "AF_NETLINK")
    assert listeners({80}) is None


class _FakeNetlink:
    """A netlink socket that answers with the given datagrams, whatever is asked."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers

    def __enter__(self) -> _FakeNetlink:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def settimeout(self, seconds: float) -> None:
        pass

    def send(self, data: bytes) -> int:
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.answers.pop(0) if self.answers else b""


def _message(kind: int, sequence: int, body: bytes = b"") -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 0, sequence, 0) + body


@pytest.mark.parametrize("answers", [
    [_message(2, 1, struct.pack("=i", -13))],  # EACCES: sock_diag refused
    [b""],  # the socket closed
    [struct.pack("=IHHII", 4, 20, 0, 1, 0)],  # a header whose length is shorter than itself
])
def test_a_refused_or_broken_answer_falls_back(answers: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sockets, "_MAX_BYTES", 4096)
    monkeypatch.setattr(sockets.socket, "socket", lambda *args: _FakeNetlink(list(answers)))
    assert listeners({80}) is None


def test_a_dump_that_never_ends_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    class Endless(_FakeNetlink):
        def recv(self, size: int) -> bytes:
            self.answers.append(b"")
            return _message(20, 1, b"\0" * 72)

    monkeypatch.setattr(sockets, "_MAX_BYTES", 4096)
    fake = Endless([])
    monkeypatch.setattr(sockets.socket, "socket", lambda *args: fake)
    assert listeners({80}) is None
    assert 4096 / 88 <= len(fake.answers) <= 4096 / 88 + 1  # read up to the bound, then no more


def test_a_socket_that_cannot_be_opened_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise PermissionError("netlink not allowed here")

    monkeypatch.setattr(sockets.socket, "socket", refuse)
    assert listeners({80}) is None


def test_a_dump_parsed_by_port_and_inode(monkeypatch: pytest.MonkeyPatch) -> None:
    def entry(port: int, inode: int) -> bytes:
        sockid = struct.pack(">HH", port, 0) + b"\0" * 44
        return struct.pack("=BBBB", 2, 10, 0, 0) + sockid + struct.pack("=IIIII", 0, 0, 0, 0, inode)

    v4 = _message(20, 1, entry(8080, 111)) + _message(20, 1, entry(9999, 222)) + _message(3, 1, b"\0" * 4)
    v6 = _message(20, 2, entry(8080, 333)) + _message(3, 2, b"\0" * 4)
    monkeypatch.setattr(sockets.socket, "socket", lambda *args: _FakeNetlink([v4, v6]))
    monkeypatch.setattr(sockets, "_owners", lambda inodes: {111: [7], 333: [7, 8]} if inodes == {111, 333} else {})
    assert sorted(listeners({8080}) or []) == [(8080, 7), (8080, 7), (8080, 8)]
