"""Undo a response's ``Content-Encoding`` for parsing, never for the application.

Transports hand over the body as it came off the wire; a gzip-compressed stream would show no
token at all. The capture layer keeps the application's bytes untouched and, when it folds its
recorded chunks (every 64 KiB and at the end), passes them through a :class:`Decoder`: each
chunk's decoded output keeps that chunk's arrival time, so the time to first token is the time
the compressed bytes carrying it arrived.

gzip and deflate use zlib; ``br`` and ``zstd`` are decoded when their codec is installed
(``brotli``/``brotlicffi``, ``zstandard`` or Python 3.14's ``compression.zstd``), as httpx and
aiohttp decode them. An unknown or undecodable encoding, or output beyond ``MAX_DECODED`` per
fold (a decompression bomb), stops decoding: the call keeps its timings and loses what only the
body could tell (tokens, usage, counters).
"""

from __future__ import annotations

import importlib
import zlib
from typing import Any, Callable

__all__ = ["Decoder", "decoder_for", "supported_encodings"]

MAX_DECODED = 4 * 1024 * 1024  # decoded bytes per fold of 64 KiB of input: a ratio of 64, beyond real JSON

Step = Callable[[bytes, int], bytes]  # (data, output budget) -> decoded


class _ZlibStep:
    """gzip (concatenated members too) or deflate (zlib-wrapped, or raw as some servers send)."""

    __slots__ = ("_wbits", "_obj", "_sniffed")

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._obj: zlib._Decompress = zlib.decompressobj(wbits)
        self._sniffed = wbits != zlib.MAX_WBITS  # only deflate has two framings to tell apart

    def __call__(self, data: bytes, budget: int) -> bytes:
        if not self._sniffed and data:
            self._sniffed = True
            if not _zlib_header(data):  # some servers send raw deflate
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        out = self._obj.decompress(data, budget)
        if self._obj.unconsumed_tail:
            raise _TooLarge
        while self._obj.eof and self._obj.unused_data and self._wbits != zlib.MAX_WBITS:
            rest = self._obj.unused_data  # another gzip member
            self._obj = zlib.decompressobj(self._wbits)
            out += self._obj.decompress(rest, max(1, budget - len(out)))
            if self._obj.unconsumed_tail:
                raise _TooLarge
        return out


def _zlib_header(data: bytes) -> bool:
    if data[0] & 0x0F != 8 or data[0] >> 4 > 7:
        return False
    return len(data) < 2 or (data[0] << 8 | data[1]) % 31 == 0


class _ModuleStep:
    """A decompressor object from an optional codec module (``process`` or ``decompress``)."""

    __slots__ = ("_process",)

    def __init__(self, decompressor: Any) -> None:
        self._process = getattr(decompressor, "process", None) or decompressor.decompress

    def __call__(self, data: bytes, budget: int) -> bytes:
        out: bytes = self._process(data)
        if len(out) > budget:
            raise _TooLarge
        return out


class _TooLarge(Exception):
    pass


def _brotli() -> Any:
    for name in ("brotlicffi", "brotli"):
        try:
            return importlib.import_module(name).Decompressor()
        except ImportError:
            continue
    return None


def _zstd() -> Any:
    for name, attr in (("compression.zstd", "ZstdDecompressor"), ("backports.zstd", "ZstdDecompressor")):
        try:
            return getattr(importlib.import_module(name), attr)()
        except (ImportError, AttributeError):
            continue
    try:
        return importlib.import_module("zstandard").ZstdDecompressor().decompressobj()
    except ImportError:
        return None


def _step(encoding: str) -> Step | None:
    if encoding in ("gzip", "x-gzip"):
        return _ZlibStep(zlib.MAX_WBITS | 16)
    if encoding == "deflate":
        return _ZlibStep(zlib.MAX_WBITS)
    if encoding == "br":
        decompressor = _brotli()
        return _ModuleStep(decompressor) if decompressor is not None else None
    if encoding == "zstd":
        decompressor = _zstd()
        return _ModuleStep(decompressor) if decompressor is not None else None
    return None


def supported_encodings() -> list[str]:
    """The encodings this process can decode (br and zstd depend on installed codecs)."""
    return [e for e in ("gzip", "deflate", "br", "zstd") if _step(e) is not None]


class Decoder:
    """Decodes one response body, batch by batch, keeping each chunk's arrival time."""

    __slots__ = ("_steps", "broken")

    def __init__(self, steps: list[Step]) -> None:
        self._steps = steps
        self.broken = False  # gave up: nothing more is decoded

    def decode(self, times: list[int], chunks: list[bytes]) -> tuple[list[int], list[bytes]]:
        """The decoded pieces of ``chunks`` (empty ones dropped), each with its chunk's time."""
        out_times: list[int] = []
        out_chunks: list[bytes] = []
        if self.broken:
            return out_times, out_chunks
        budget = MAX_DECODED
        try:
            for t, data in zip(times, chunks):
                if budget <= 0 and data:  # spent: zlib would read a max_length of 0 as "no limit"
                    raise _TooLarge
                for step in self._steps:
                    data = step(data, budget)
                if data:
                    budget -= len(data)
                    out_times.append(t)
                    out_chunks.append(data)
        except Exception:  # corrupt data, a bomb: the body is simply not parsed further
            self.broken = True
        return out_times, out_chunks


def decoder_for(content_encoding: str | None) -> Decoder | None:
    """A decoder for a ``Content-Encoding`` header value, or None when there is nothing to undo
    (absent, ``identity``) or it cannot be undone here (an unknown or uninstalled codec)."""
    if not content_encoding:
        return None
    names = [name.strip().lower() for name in content_encoding.split(",")]
    names = [name for name in names if name and name != "identity"]
    if not names:
        return None
    steps = []
    for name in reversed(names):  # applied in the listed order, so undone from the last
        step = _step(name)
        if step is None:
            return Decoder([_Undecodable()])
        steps.append(step)
    return Decoder(steps)


class _Undecodable:
    """An encoding this process cannot undo: parse nothing rather than garbage."""

    def __call__(self, data: bytes, budget: int) -> bytes:
        raise _TooLarge
