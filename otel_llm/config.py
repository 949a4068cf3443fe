"""Options of ``otel_llm.instrument()`` and their ``OTEL_LLM_*`` environment variables.

An explicit keyword wins over the environment; a bad value is reported once in the log and
replaced by the default, never raised into the application.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from otel_llm import semconv as sc
from otel_llm._log import logger

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = [
    "DEFAULT_TRACES_FILE", "ENV_SEMCONV_OPT_IN", "ENV_VARS", "GENAI_DEFAULT", "GENAI_DUP", "GENAI_LATEST", "Options",
    "KEEP_REASONS", "POLL_MODES", "genai_semconv", "resolve",
]

DEFAULT_TRACES_FILE = "otel-llm-traces.jsonl"
PROTOCOLS = ("grpc", "http/protobuf")
# which servers the runtime-state poller may send requests to (otel_llm.observers.poll_policy)
POLL_MODES = ("configured", "local", "all")

# option name -> environment variable (documented in the README table)
ENV_VARS: dict[str, str] = {
    "service_name": "OTEL_LLM_SERVICE_NAME",
    "endpoint": "OTEL_LLM_ENDPOINT",
    "protocol": "OTEL_LLM_PROTOCOL",
    "capture_content": "OTEL_LLM_CAPTURE_CONTENT",
    "runtimes": "OTEL_LLM_RUNTIMES",
    "llm_routes": "OTEL_LLM_LLM_ROUTES",
    "traces_file": "OTEL_LLM_TRACES_FILE",
    "traces_file_max_bytes": "OTEL_LLM_TRACES_FILE_MAX_BYTES",
    "traces_file_backups": "OTEL_LLM_TRACES_FILE_BACKUPS",
    "console_summary": "OTEL_LLM_CONSOLE_SUMMARY",
    "host_metrics": "OTEL_LLM_HOST_METRICS",
    "gpu_metrics": "OTEL_LLM_GPU_METRICS",
    "runtime_metrics": "OTEL_LLM_RUNTIME_METRICS",
    "poll_runtimes": "OTEL_LLM_POLL_RUNTIMES",
    "sample_interval": "OTEL_LLM_SAMPLE_INTERVAL",
    "sample_rate": "OTEL_LLM_SAMPLE_RATE",
    "sample_keep": "OTEL_LLM_SAMPLE_KEEP",
    "slow_ttft": "OTEL_LLM_SLOW_TTFT",
    "slow_duration": "OTEL_LLM_SLOW_DURATION",
    "record_suppressed": "OTEL_LLM_RECORD_SUPPRESSED",
    "chunk_metric": "OTEL_LLM_CHUNK_METRIC",
    "beside_genai": "OTEL_LLM_BESIDE_GENAI",
}
# the calls kept whatever the sample rate (otel_llm.telemetry.sampling); all by default
KEEP_REASONS = ("failed", "slow", "cold", "buffered", "queued", "restart", "retry")
# OpenTelemetry's switch from one version of a domain's semantic conventions to the next: a
# comma-separated list, each domain reading its own values (``http``, ``database``... are others').
ENV_SEMCONV_OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
GENAI_DEFAULT = "default"  # today's gen_ai.client.operation.* and gen_ai.client.token.usage
GENAI_LATEST = "gen_ai_latest_experimental"  # semantic-conventions-genai's gen_ai.client.inference.* instead
GENAI_DUP = "gen_ai_latest_experimental/dup"  # both
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass
class Options:
    service_name: str | None = None
    endpoint: str | None = None
    protocol: str | None = None
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    capture_content: bool = False
    runtimes: Mapping[str, str] = field(default_factory=dict)
    llm_routes: Sequence[str] = ()
    traces_file: str = DEFAULT_TRACES_FILE
    traces_file_max_bytes: int = 100 * 1024 * 1024  # rotated past this size (0: never)
    traces_file_backups: int = 1  # previous files kept
    console_summary: bool = True
    host_metrics: bool = True
    gpu_metrics: bool = True
    runtime_metrics: bool = True
    poll_runtimes: str = "local"  # configured | local | all (otel_llm.observers.poll_policy)
    sample_interval: float = 1.0
    sample_rate: float | None = None  # None: every call recorded (the tracer's sampler decides)
    sample_keep: tuple[str, ...] = KEEP_REASONS
    slow_ttft: float | None = None  # seconds: a fixed "slow" threshold beside the typical value's
    slow_duration: float | None = None
    record_suppressed: bool = False  # model calls inside suppress_instrumentation() recorded anyway
    chunk_metric: bool = True  # time_per_output_chunk: one record per output chunk after the first
    beside_genai: bool = True  # under another instrumentation's GenAI call span: join it, leave gen_ai metrics to it


def _warn(name: str, value: Any, why: str) -> None:
    logger.warning("otel_llm: ignoring %s=%r: %s", name, value, why)


def _parse_bool(name: str, value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    _warn(name, value, "expected true or false")
    return default


def _parse_float(name: str, value: Any, ok: Callable[[float], bool], why: str) -> float | None:
    """``value`` as a number ``ok`` accepts (NaN never is), else None with ``why`` in the log."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if number != number or not ok(number):
        _warn(name, value, why)
        return None
    return number


def _parse_interval(name: str, value: Any, default: float) -> float:
    seconds = _parse_float(name, value, lambda v: 0.05 <= v <= 3600, "expected seconds between 0.05 and 3600")
    return default if seconds is None else seconds


def _parse_count(name: str, value: Any, default: int) -> int:
    try:
        count = int(str(value).strip())
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        _warn(name, value, "expected a whole number, 0 or more")
        return default
    return count


def _parse_rate(name: str, value: Any) -> float | None:
    return _parse_float(name, value, lambda v: 0.0 <= v <= 1.0,
                        "expected a probability between 0 and 1; every call is recorded")


def _parse_seconds(name: str, value: Any) -> float | None:
    return _parse_float(name, value, lambda v: 0.0 < v < float("inf"), "expected seconds, more than 0")


def _parse_keep(name: str, value: Any) -> tuple[str, ...]:
    """``"failed,slow"``, ``["failed", "slow"]``, or ``"none"`` / empty: nothing kept by rule."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip().lower() for item in items if str(item).strip()]
    if names in (["none"], []):
        return ()
    unknown = [n for n in names if n not in KEEP_REASONS]
    if unknown:
        _warn(name, value, f"unknown {', '.join(unknown)}; expected some of {', '.join(KEEP_REASONS)} or none")
    return tuple(r for r in KEEP_REASONS if r in names)


def _parse_runtimes(name: str, value: Any) -> dict[str, str]:
    """``{"http://host:11434": "ollama"}`` or ``"http://host:11434=ollama,http://h:8000=vllm"``."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    result: dict[str, str] = {}
    for item in str(value).split(","):
        base, sep, runtime = item.strip().rpartition("=")
        if not sep or not base or not runtime:
            if item.strip():
                _warn(name, item, "expected BASE_URL=RUNTIME")
            continue
        result[base.strip()] = runtime.strip()
    return result


def _parse_poll(name: str, value: Any, default: str) -> str:
    text = str(value).strip().lower()
    if text in POLL_MODES:
        return text
    _warn(name, value, f"expected one of {', '.join(POLL_MODES)}")
    return default


def _parse_routes(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple("/" + str(r).strip().lstrip("/") for r in items if str(r).strip())


def resolve(kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Options:
    """Options from keywords, then ``OTEL_LLM_*`` variables, then defaults."""
    env = os.environ if environ is None else environ
    options = Options()
    known = set(Options.__dataclass_fields__)
    for name in kwargs:
        if name not in known:
            _warn(name, kwargs[name], "unknown option")
    raw: dict[str, Any] = {}
    for name, variable in ENV_VARS.items():
        if variable in env:
            raw[name] = env[variable]
    if "capture_content" not in raw and sc.ENV_CAPTURE_CONTENT in env:
        raw["capture_content"] = env[sc.ENV_CAPTURE_CONTENT]
    raw.update({k: v for k, v in kwargs.items() if k in known and v is not None})
    _apply(options, raw)
    return options


def _apply(options: Options, raw: Mapping[str, Any]) -> None:
    for name, value in raw.items():
        if name in ("capture_content", "console_summary", "host_metrics", "gpu_metrics", "runtime_metrics",
                    "record_suppressed", "chunk_metric", "beside_genai"):
            setattr(options, name, _parse_bool(name, value, getattr(options, name)))
        elif name in ("traces_file_max_bytes", "traces_file_backups"):
            setattr(options, name, _parse_count(name, value, getattr(options, name)))
        elif name == "sample_interval":
            options.sample_interval = _parse_interval(name, value, options.sample_interval)
        elif name == "sample_rate":
            options.sample_rate = _parse_rate(name, value)
        elif name == "sample_keep":
            options.sample_keep = _parse_keep(name, value)
        elif name in ("slow_ttft", "slow_duration"):
            setattr(options, name, _parse_seconds(name, value))
        elif name == "runtimes":
            options.runtimes = _parse_runtimes(name, value)
        elif name == "llm_routes":
            options.llm_routes = _parse_routes(value)
        elif name == "poll_runtimes":
            options.poll_runtimes = _parse_poll(name, value, options.poll_runtimes)
        elif name == "protocol":
            protocol = str(value).strip().lower()
            if protocol in PROTOCOLS:
                options.protocol = protocol
            else:
                _warn(name, value, f"expected one of {', '.join(PROTOCOLS)}")
        elif name in ("tracer_provider", "meter_provider"):
            setattr(options, name, value)
        else:
            setattr(options, name, str(value).strip() or getattr(options, name))


def genai_semconv(environ: Mapping[str, str] | None = None) -> str:
    """Which names the model-call metrics get, from ``OTEL_SEMCONV_STABILITY_OPT_IN``: one of
    GENAI_DEFAULT, GENAI_LATEST or GENAI_DUP (both values given: GENAI_DUP). Read once, when
    ``instrument()`` builds the instruments; an unknown ``gen_ai`` value is logged and ignored."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_SEMCONV_OPT_IN, "")
    mode = GENAI_DEFAULT
    bad = False
    for item in value.split(","):
        token = item.strip()
        if token == GENAI_DUP:
            mode = GENAI_DUP
        elif token == GENAI_LATEST:
            mode = GENAI_DUP if mode == GENAI_DUP else GENAI_LATEST
        elif token.lower().startswith("gen_ai"):
            bad = True
    if bad:
        _warn(ENV_SEMCONV_OPT_IN, value, f"its gen_ai value is neither {GENAI_LATEST} nor {GENAI_DUP}")
    return mode
