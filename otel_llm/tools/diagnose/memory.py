"""What the model should take in memory next to what its runtime process holds.

The estimate is what the runtime itself says or what this host can read, never a guess from the
model's name: the weights from the size the runtime reports (Ollama ``/api/ps`` ``size``, which
also holds its KV cache and buffers) or from the model file the runtime names (llama.cpp
``/props`` ``model_path``, when the file is on this host); the KV cache only where the runtime
gives its layers and heads (Ollama ``/api/show``, at f16, its default cache type) and the
context length, else None with the reason. Beside it, the resident memory of the runtime's process tree (the
process listening on the URL's port and its children, from /proc, as ``otel-llm bench`` reads
it) and, where the runtime says, the share in VRAM.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from otel_llm.tools.bench.memory import server_processes
from otel_llm.parse.runtimes import ModelInfo

__all__ = ["MemoryEstimate", "estimate"]


@dataclass
class MemoryEstimate:
    """Bytes (None = not known; the ``*_source`` fields say where each figure comes from or why not)."""

    weights_bytes: int | None = None
    weights_source: str | None = None
    kv_cache_bytes: int | None = None
    kv_cache_source: str | None = None
    vram_bytes: int | None = None  # of the loaded model, where the runtime says (Ollama size_vram)
    runtime_rss_bytes: int | None = None
    runtime_pids: tuple[int, ...] = ()
    runtime_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _weights(info: ModelInfo | None) -> tuple[int | None, str]:
    if info is None:
        return None, "the runtime's metadata route said nothing of the model"
    if info.size is not None:
        return info.size, f"{info.source} size (weights with the KV cache and buffers)"
    path = info.model
    if path and os.path.isabs(path):
        try:
            return os.path.getsize(path), f"the model file {path} ({info.source} model path)"
        except OSError:
            return None, f"the model file {path} is not readable on this host"
    return None, f"{info.source} gives no size or file for the model"


def _resident(url: str) -> tuple[int | None, tuple[int, ...], str]:
    processes, why = server_processes(url)
    if not processes:
        return None, (), why or "no process seen"
    total, pids = 0, []
    for proc in processes:
        try:
            total += proc.memory_info().rss
            pids.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    if not pids:
        return None, (), "its processes could not be read"
    return total, tuple(sorted(pids)), "resident memory of the listening process and its children (/proc)"


def estimate(info: ModelInfo | None, url: str) -> MemoryEstimate:
    """The estimate for the server at ``url`` now (after the warm trials: the model is loaded).
    Never raises."""
    weights, weights_source = _weights(info)
    try:
        rss, pids, runtime_source = _resident(url)
    except Exception as exc:  # noqa: BLE001 - /proc oddities give no figure, never an error
        rss, pids, runtime_source = None, (), f"reading the runtime's processes failed ({type(exc).__name__})"
    kv, kv_source = _kv_cache(info)
    return MemoryEstimate(weights, weights_source, kv, kv_source, info.size_vram if info is not None else None,
                          rss, pids, runtime_source)


def _kv_cache(info: ModelInfo | None) -> tuple[int | None, str]:
    if info is None or info.kv_bytes_per_token is None:
        return None, "the runtime reports no layer, head or element sizes"
    if not info.context_length:
        return None, "the runtime reports no context length"
    return (info.kv_bytes_per_token * info.context_length,
            f"{info.kv_bytes_per_token} bytes per token (layers x KV heads x key and value width, f16, "
            f"/api/show) x {info.context_length} tokens of context")
