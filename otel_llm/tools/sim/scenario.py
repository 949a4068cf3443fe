"""Simulator settings: one frozen dataclass, merged from kwargs, JSON, headers or CLI flags."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COMPRESSIONS", "CONCURRENCY_MODES", "FIELD_HELP", "HEADER_PREFIX", "RUNTIMES", "SimConfig"]

RUNTIMES = ("vllm", "llama.cpp", "ollama", "tgi", "sglang", "lmstudio", "openai")
CONCURRENCY_MODES = ("parallel", "serialized")
COMPRESSIONS = ("off", "gzip", "deflate")
HEADER_PREFIX = "x-sim-"

FIELD_HELP = {
    "headers_delay": "seconds from request body received to response headers (server wait)",
    "first_token_delay": "seconds from headers to the first generated-token frame",
    "token_interval": "seconds between generated-token frames",
    "tokens": "generated tokens per answer (request max_tokens & co. cap it)",
    "cold_delay": "extra seconds before headers on the first request after start or unload",
    "role_frame": "send the runtime's role/metadata frames right after the headers",
    "keepalive_interval": "seconds between keep-alive frames while waiting for the first token; 0 = off",
    "concurrency": "parallel, or serialized (one generation at a time, the rest queue before headers)",
    "buffering": "hold frames and release them in bursts, like a buffering proxy",
    "buffer_flush_interval": "with buffering: release held frames every N seconds; 0 = off",
    "buffer_flush_frames": "with buffering: release held frames every N frames; 0 = off",
    "abort_after_tokens": "close the connection after N token frames; off = never",
    "error_status": "answer every generation with this HTTP status and the runtime's error JSON; off = never",
    "fault_every": "error_status and abort_after_tokens hit only every Nth generation request (1 = each one)",
    "runtime": "flavour of the OpenAI-compatible routes and of /generate: " + ", ".join(RUNTIMES),
    "model": "model name listed and used when a request names none",
    "cached_tokens": "prompt tokens reported as served from the prefix cache",
    "vram_share": "share of the loaded model Ollama's /api/ps puts in VRAM (size_vram / size); below 1: a "
                  "partial offload, the rest in system RAM",
    "compression": "Content-Encoding of generation answers when the client accepts it (each streamed "
                   "chunk flushed): " + ", ".join(COMPRESSIONS),
}

_OFF = ("", "off", "none", "null", "false")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class SimConfig:
    """Injected timings (seconds) and behaviour of the simulated runtime; see ``FIELD_HELP``."""

    headers_delay: float = 0.0
    first_token_delay: float = 0.05
    token_interval: float = 0.01
    tokens: int = 16
    cold_delay: float = 0.0
    role_frame: bool = True
    keepalive_interval: float = 0.0
    concurrency: str = "parallel"
    buffering: bool = False
    buffer_flush_interval: float = 0.0
    buffer_flush_frames: int = 0
    abort_after_tokens: int | None = None
    error_status: int | None = None
    fault_every: int = 1
    runtime: str = "vllm"
    model: str = "sim-model"
    cached_tokens: int = 0
    vram_share: float = 1.0
    compression: str = "off"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"{field.name} must be >= 0, got {value!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if not 0.0 <= self.vram_share <= 1.0:
            raise ValueError(f"vram_share must be within 0..1, got {self.vram_share!r}")
        if self.concurrency not in CONCURRENCY_MODES:
            raise ValueError(f"concurrency must be one of {CONCURRENCY_MODES}, got {self.concurrency!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    def merged(self, updates: Mapping[str, Any]) -> SimConfig:
        """Return a copy with ``updates`` applied; values may be strings (headers, CLI)."""
        known = self.field_names()
        unknown = sorted(set(updates) - set(known))
        if unknown:
            raise ValueError(f"unknown sim config field(s): {', '.join(unknown)}")
        coerced = {name: _coerce(name, value) for name, value in updates.items()}
        return dataclasses.replace(self, **coerced)

    def with_headers(self, headers: Mapping[str, str]) -> SimConfig:
        """Apply per-request ``x-sim-<field-with-dashes>`` overrides."""
        updates = {
            key[len(HEADER_PREFIX) :].replace("-", "_"): value
            for key, value in headers.items()
            if key.lower().startswith(HEADER_PREFIX)
        }
        return self.merged(updates) if updates else self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_cli_args(self) -> list[str]:
        """Flags for ``python -m otel_llm.tools.sim`` that reproduce the non-default fields."""
        args: list[str] = []
        for name, value in self.to_dict().items():
            if value == getattr(_DEFAULT, name):
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + name.replace("_", "-"))
            else:
                args += [flag, "off" if value is None else str(value)]
        return args


def _field_type(name: str) -> str:
    return {field.name: str(field.type) for field in dataclasses.fields(SimConfig)}[name]


def _coerce(name: str, value: Any) -> Any:
    """Convert JSON or string input to the field's type."""
    kind = _field_type(name)
    optional = "None" in kind
    if isinstance(value, str):
        text = value.strip()
        if optional and text.lower() in _OFF:
            return None
        if kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(f"{name}: not a boolean: {value!r}")
        value = text
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name} cannot be null")
    try:
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("int"):
            return int(value)
        if kind == "bool":
            return bool(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: cannot use {value!r}") from exc


_DEFAULT = SimConfig()
