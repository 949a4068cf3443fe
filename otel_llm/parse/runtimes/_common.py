"""RuntimeCounters and the value checks shared by the runtime adapters.

Every reader here returns None for a missing or unusable value and never raises; a value
that is present but unusable is dropped with one ``logging.debug`` line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Reader = Callable[[str, object], Any]
Field = tuple[str, str, Reader]  # (RuntimeCounters attribute, source key, reader)

log = logging.getLogger("otel_llm.parse.runtimes")

MAX_SECONDS = 1e7          # ~116 days: anything longer is garbage
MAX_TOKENS = 10**9
MAX_RATE = 1e9             # tokens per second
_MAX_MS = MAX_SECONDS * 1e3
_MAX_NUMBER_CHARS = 40
MISSING: Any = object()    # a key that is absent (not logged) as opposed to null (logged)

# Finish reasons of APIs any runtime may serve (Anthropic Messages, OpenAI Responses).
COMMON_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "max_output_tokens": "length",
}


# keys of a runtime's normalized state (observers.runtime_state.latest_state; each runtime's series
# behind them: otel_llm.runtimes)
STATE_REQUESTS_RUNNING = "requests.running"
STATE_REQUESTS_WAITING = "requests.waiting"
STATE_KV_CACHE_USAGE = "kv_cache.usage"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a runtime's side-effect-free metadata routes say about the model it serves."""

    source: str  # the route it was read from, e.g. "/props"
    context_length: int | None = None  # tokens one request may hold, prompt and output together
    model: str | None = None  # the model's name or path as the runtime gives it
    quantization: str | None = None
    slots: int | None = None  # requests it serves at once (llama.cpp's slots)
    size: int | None = None  # bytes the loaded model takes (Ollama /api/ps size)
    size_vram: int | None = None  # of which in GPU memory (Ollama size_vram): less = a partial offload
    parameter_count: int | None = None  # the model's parameters (Ollama /api/show general.parameter_count)
    kv_bytes_per_token: int | None = None  # KV cache per context token at f16 (Ollama /api/show shape)
    parameter_size: str | None = None  # as the runtime writes it (Ollama /api/ps details.parameter_size)
    expires_at: str | None = None  # when an idle model is unloaded, as the runtime says (Ollama /api/ps)

    @property
    def partial_offload(self) -> bool | None:
        """Part of the model is in VRAM and the rest in system RAM; None when unknown (no size, or
        nothing on a GPU at all: a CPU-only runtime is not an offload)."""
        if self.size is None or self.size_vram is None or self.size == 0:
            return None
        return 0 < self.size_vram < self.size


def positive_int(value: object) -> int | None:
    """``value`` if it is a positive int below MAX_TOKENS (bools do not count), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value < MAX_TOKENS else None


def text_or_none(value: object) -> str | None:
    return value[:256] if isinstance(value, str) and value else None


@dataclass(slots=True)
class RuntimeCounters:
    """A runtime's own account of one request, normalized: seconds, tokens, tokens/s.
    None = not reported (never invent a zero)."""

    runtime: str | None = None                # one of KNOWN_RUNTIMES when the response proves it
    load_duration: float | None = None        # model load (Ollama, LM Studio)
    queue_duration: float | None = None       # TGI x-queue-time, SGLang queue_time
    validation_duration: float | None = None  # TGI x-validation-time
    prompt_tokens: int | None = None          # prompt tokens actually evaluated (not cached)
    prompt_eval_duration: float | None = None
    prompt_eval_rate: float | None = None     # as reported, else prompt_tokens / duration
    cached_tokens: int | None = None          # prompt tokens reused from cache
    generation_tokens: int | None = None
    generation_duration: float | None = None
    generation_rate: float | None = None      # as reported, else tokens / duration
    time_to_first_token: float | None = None  # as reported by the runtime (LM Studio)
    time_per_output_token: float | None = None  # as reported, else duration / tokens
    total_duration: float | None = None       # Ollama total, TGI x-total-time, SGLang e2e
    inference_duration: float | None = None   # TGI x-inference-time
    draft_tokens: int | None = None           # speculative decoding (llama.cpp draft_n)
    draft_tokens_accepted: int | None = None
    finish_reasons: list[str] | None = None   # OpenAI-style where known, else as sent
    truncated: bool | None = None             # llama.cpp /completion: prompt was truncated


# --- raw access -----------------------------------------------------------------------------


def as_dict(v: object) -> dict[str, Any]:
    """``v`` if it is a dict, else an empty dict."""
    return v if isinstance(v, dict) else {}


def native_of(info: object) -> dict[str, Any]:
    """``info.native`` when it is a dict."""
    return as_dict(getattr(info, "native", None))


def get(d: Mapping[str, object], key: str) -> Any:
    """``d[key]``, or MISSING when absent."""
    try:
        return d.get(key, MISSING)
    except Exception:  # noqa: BLE001 - odd mappings
        return MISSING


_INT64_LIMIT = 2**63


def drop(name: str, value: object, why: str) -> None:
    """Log one dropped value (callers then return None)."""
    log.debug("otel_llm: runtime counter %s=%.80r dropped (%s)", name, value, why)


# --- numbers --------------------------------------------------------------------------------


def _number(v: object) -> int | float | None:
    """An int or float from a JSON number or a numeric ASCII string; bools are not numbers."""
    if v.__class__ is int or v.__class__ is float:
        return v
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).decode("latin-1")
    if not isinstance(v, str) or not v.isascii() or not 0 < len(v) <= _MAX_NUMBER_CHARS:
        return None
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return None


def _non_negative(name: str, v: object) -> int | float | None:
    """A finite number >= 0 within int64, else None (logged unless MISSING)."""
    cls = v.__class__  # JSON numbers first: every response carries several
    if cls is int:
        if 0 <= v <= _INT64_LIMIT:  # type: ignore[operator]
            return v  # type: ignore[return-value]
    elif cls is float and 0.0 <= v < math.inf:  # type: ignore[operator]  # NaN compares false
        return v  # type: ignore[return-value]
    if v is MISSING:
        return None
    n = _number(v)
    if n is None:
        drop(name, v, "not a number")
        return None
    if n.__class__ is int and n > _INT64_LIMIT:
        drop(name, v, "too large")
        return None
    if not math.isfinite(n):
        drop(name, v, "not finite")
        return None
    if n < 0:
        drop(name, v, "negative")
        return None
    return n


def seconds(name: str, v: object, per_second: float = 1.0) -> float | None:
    """A duration in seconds from a value counted in 1/per_second units (1e9 for ns)."""
    cls = v.__class__  # a plain JSON number in range first: every llama.cpp answer carries several
    if (cls is float or cls is int) and 0 <= v <= MAX_SECONDS * per_second:  # type: ignore[operator]
        return float(v / per_second)  # type: ignore[operator]
    n = _non_negative(name, v)
    if n is None:
        return None
    s = n / per_second
    if s > MAX_SECONDS:
        drop(name, v, "absurdly long")
        return None
    return float(s)


def tokens(name: str, v: object) -> int | None:
    """A whole, plausible token count."""
    if v.__class__ is int and 0 <= v <= MAX_TOKENS:
        return v
    n = _non_negative(name, v)
    if n is None:
        return None
    if n.__class__ is float and not n.is_integer():
        drop(name, v, "not a whole number")
        return None
    if n > MAX_TOKENS:
        drop(name, v, "absurdly large")
        return None
    return int(n)


def rate(name: str, v: object) -> float | None:
    """A plausible tokens-per-second rate."""
    cls = v.__class__
    if (cls is float or cls is int) and 0 <= v <= MAX_RATE:  # type: ignore[operator]
        return float(v)  # type: ignore[arg-type]
    n = _non_negative(name, v)
    if n is None:
        return None
    if n > MAX_RATE:
        drop(name, v, "absurdly large")
        return None
    return float(n)


def ms(name: str, v: object) -> float | None:
    """Milliseconds to seconds."""
    cls = v.__class__
    if (cls is float or cls is int) and 0 <= v <= _MAX_MS:  # type: ignore[operator]
        return v / 1e3  # type: ignore[operator]
    return seconds(name, v, 1e3)


def ns(name: str, v: object) -> float | None:
    """Nanoseconds to seconds."""
    return seconds(name, v, 1e9)


def flag(name: str, v: object) -> bool | None:
    """A JSON boolean."""
    if v is MISSING:
        return None
    if isinstance(v, bool):
        return v
    drop(name, v, "not a boolean")
    return None


def evaluated(name: str, total: int | None, cached: int | None) -> int | None:
    """Prompt tokens actually evaluated: total minus cached (total when cached is unknown)."""
    if total is None or cached is None:
        return total
    if cached > total:
        drop(name, (total, cached), "cached > total")
        return None
    return total - cached


# --- tables -------------------------------------------------------------------------------


def fill(c: RuntimeCounters, src: Mapping[str, object], spec: Iterable[Field], prefix: str) -> None:
    """For each (attribute, key, reader) set c.attribute from src[key] unless already set.
    Absent keys are skipped: every reader gives None for MISSING."""
    lookup: Callable[[str, object], object] = (
        src.get if src.__class__ is dict else (lambda key, _default: get(src, key))
    )
    for attr, key, reader in spec:
        value = lookup(key, MISSING)
        if value is not MISSING and getattr(c, attr) is None:
            setattr(c, attr, reader(f"{prefix}.{key}", value))


def reasons_of(info: object) -> list[Any] | None:
    """info.finish_reasons when it is a non-empty list."""
    reasons = getattr(info, "finish_reasons", None)
    return reasons if isinstance(reasons, list) and reasons else None


# --- finish reasons -------------------------------------------------------------------------


def map_reasons(reasons: object, table: Mapping[str, str]) -> list[str] | None:
    """Map runtime finish reasons to OpenAI-style values; unknown ones pass unchanged."""
    if isinstance(reasons, str):
        reasons = [reasons]
    if not isinstance(reasons, (list, tuple)):
        return None
    out = [table.get(r, COMMON_REASONS.get(r, r)) for r in _strings(reasons)]
    return out or None


def _strings(values: Iterable[object]) -> list[str]:
    return [v for v in values if isinstance(v, str) and v]


# --- derived values -------------------------------------------------------------------------


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or num <= 0 or den <= 0:
        return None
    return num / den


def derive(c: RuntimeCounters) -> None:
    """Fill rates and time per output token from counts and durations (both > 0) when the
    runtime did not report them."""
    if c.prompt_eval_rate is None:
        c.prompt_eval_rate = _derived(rate, "prompt_eval_rate", c.prompt_tokens,
                                      c.prompt_eval_duration)
    if c.generation_rate is None:
        c.generation_rate = _derived(rate, "generation_rate", c.generation_tokens,
                                     c.generation_duration)
    if c.time_per_output_token is None:
        c.time_per_output_token = _derived(seconds, "time_per_output_token",
                                           c.generation_duration, c.generation_tokens)


def _derived(check: Reader, name: str, num: float | None, den: float | None) -> Any:
    r = _ratio(num, den)
    return None if r is None else check(f"{name} (derived)", r)
