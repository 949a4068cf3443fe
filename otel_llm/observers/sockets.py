"""Who listens on a TCP port of this host, asked of the kernel for those sockets only.

psutil's ``net_connections`` has the kernel format every socket of the host as text
(``/proc/net/tcp`` and ``tcp6``) and then maps every descriptor of every process: about 10 ms of
CPU on a quiet machine, more with thousands of connections, and the observers ask it during a new
server's first call. On Linux the sock_diag netlink interface lists the listening sockets alone
(a fraction of a millisecond); their owners are then found by socket inode among the processes'
descriptors. :func:`listeners` returns None where that is not possible (another system, netlink
refused), and the caller asks psutil instead.
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["listeners"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_SPORT = struct.Struct(">H")  # inet_diag_msg's source port (network order), after 4 bytes
_INODE = struct.Struct("=I")  # inet_diag_msg's inode, after family..id (52) and expires..uid (16)
_MESSAGE = 72  # sizeof(struct inet_diag_msg)
_MAX_BYTES = 4 * 1024 * 1024  # a host with more listening sockets than this answers through psutil
_TIMEOUT = 1.0


def listeners(ports: set[int]) -> list[tuple[int, int | None]] | None:
    """(port, pid) of each process listening on one of ``ports`` over TCP; pid None when the
    socket's owner cannot be seen (another user's process). None: not answerable this way."""
    if not ports or not hasattr(socket, "AF_NETLINK"):
        return None
    inodes = _listening_inodes(ports)
    if inodes is None:
        return None
    owners = _owners(set(inodes))
    found: list[tuple[int, int | None]] = []
    for inode, port in inodes.items():
        pids: list[int | None] = list(owners.get(inode, ())) or [None]
        found.extend((port, pid) for pid in pids)
    return found


def _listening_inodes(ports: set[int]) -> dict[int, int] | None:
    """inode -> port of the listening TCP sockets (IPv4 and IPv6) on ``ports``."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(_TIMEOUT)
            found: dict[int, int] = {}
            for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
                sock.send(_HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                       _NLM_F_REQUEST | _NLM_F_DUMP, sequence, 0) + request)
                if not _read_dump(sock, sequence, ports, found):
                    return None
            return found
    except (OSError, struct.error):
        return None


def _read_dump(sock: socket.socket, sequence: int, ports: set[int], found: dict[int, int]) -> bool:
    """Read one dump's answers into ``found``; False on an error answer or an oversized dump."""
    received = 0
    while received < _MAX_BYTES:
        data = sock.recv(65536)
        if not data:
            return False
        received += len(data)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, seq, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                return False
            if seq == sequence:
                if kind == _NLMSG_DONE:
                    return True
                if kind == _NLMSG_ERROR:
                    return False
                body = offset + _HEADER.size
                if body + _MESSAGE <= offset + length:
                    port = _SPORT.unpack_from(data, body + 4)[0]
                    if port in ports:
                        found[_INODE.unpack_from(data, body + 68)[0]] = port
            offset += (length + 3) & ~3
    return False


def _owners(inodes: set[int]) -> dict[int, list[int]]:
    """inode -> the pids holding a descriptor on that socket (those whose descriptors are
    readable: all of them for root, the user's own otherwise)."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    owners: dict[int, list[int]] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return owners
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with os.scandir(f"/proc/{entry.name}/fd") as descriptors:
                for fd in descriptors:
                    inode = wanted.get(_readlink(fd.path))
                    if inode is not None and int(entry.name) not in owners.setdefault(inode, []):
                        owners[inode].append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return owners


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
