"""A file of whole lines that never grows past a size: ``path`` is renamed ``path.1`` (and
``path.1`` to ``path.2``...) once the next line would take it over ``max_bytes``, keeping
``backups`` previous files.

Several processes may append to the same file (an application and its workers): each line is one
``write()`` on an ``O_APPEND`` descriptor, and a rotation happens under an exclusive ``flock`` of
the file being rotated, after which a writer that waited on the old file reopens the new one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: rotation without the cross-process lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_BACKUPS", "DEFAULT_MAX_BYTES", "RotatingAppender", "rotated_files"]

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 1
_MAX_BACKUPS = 100


class RotatingAppender:
    """``append(data)`` writes ``data`` (one or more whole lines) to ``path``; ``max_bytes`` 0
    never rotates."""

    def __init__(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> None:
        self.path = path
        self.max_bytes = max(0, int(max_bytes))
        self.backups = max(0, min(_MAX_BACKUPS, int(backups)))

    def append(self, data: bytes) -> None:
        """Raises OSError when the file cannot be written."""
        fh: BinaryIO = open(self.path, "ab")
        try:
            if self.max_bytes:
                fh = self._locked_current(fh)
                size = os.fstat(fh.fileno()).st_size
                if size and size + len(data) > self.max_bytes:
                    self._rotate()
                    fh.close()
                    fh = self._locked_current(open(self.path, "ab"))
            fh.write(data)
        finally:
            fh.close()  # releases the lock

    def _locked_current(self, fh: BinaryIO) -> BinaryIO:
        """``fh`` locked, or the file now at ``path`` (locked) if another process rotated it away
        while this one waited for the lock."""
        for _ in range(10):
            if fcntl is None:
                return fh
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_ino == os.fstat(fh.fileno()).st_ino:
                    return fh
            except FileNotFoundError:
                pass
            fh.close()
            fh = open(self.path, "ab")
        return fh

    def _rotate(self) -> None:
        if self.backups == 0:
            os.truncate(self.path, 0)
            return
        for index in range(self.backups - 1, 0, -1):
            older = f"{self.path}.{index}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{index + 1}")
        os.replace(self.path, f"{self.path}.1")


def rotated_files(path: str) -> Iterator[str]:
    """``path``'s previous files, oldest first, then ``path`` itself (whether or not it exists)."""
    index = 1
    while index <= _MAX_BACKUPS and os.path.exists(f"{path}.{index}"):
        index += 1
    for older in range(index - 1, 0, -1):
        yield f"{path}.{older}"
    yield path
