"""Headless Chromium (Debian's package, installed on first use) for the tests that look at a page
as a browser draws it, and a reader of the screenshots it takes."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

from otel_llm_testing import markers

__all__ = ["CHROMIUM", "ChromiumMissing", "install_chromium", "read_png", "run_chromium"]

CHROMIUM = "/usr/bin/chromium"


class ChromiumMissing(RuntimeError):
    """Chromium could not be installed."""


def install_chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (as root); its path."""
    markers.need("backend", "headless Chromium")
    if not os.path.exists(CHROMIUM):
        started = time.monotonic()
        logs = []
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                  env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
            logs.append(f"$ {' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            if proc.returncode != 0:
                raise ChromiumMissing("installing chromium failed:\n" + "\n".join(logs))
        print(f"installed chromium in {time.monotonic() - started:.1f}s")
    if not os.path.exists(CHROMIUM):
        raise ChromiumMissing(f"no {CHROMIUM} after the install ({shutil.which('chromium')} on PATH)")
    return CHROMIUM


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB/RGBA non-interlaced PNG, stdlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat += body
        elif ctype == b"IEND":
            break
    assert header is not None
    width, height, depth, color, _c, _f, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line) if bpp == 3 else bytes(v for j, v in enumerate(line) if j % 4 != 3))
        prev = line
    return width, height, rows


def run_chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a profile of its own in ``tmp``, nothing fetched beside the page."""
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--disable-quic", f"--user-data-dir={tmp / 'profile'}", "--window-size=1200,2000", *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp)
