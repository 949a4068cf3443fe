"""Gateway settings: command line over ``OTEL_LLM_GATEWAY_*`` variables over the config file.

Unlike ``instrument()`` options, a bad gateway setting stops the gateway from starting with a
message naming the setting: a security component must not run on a half-understood config.

Keys file (TOML; the same ``[keys.*]`` tables may also sit in the config file)::

    [keys.alice]                      # the key id: logged and traced, never the key itself
    hash = "sha256:9f86d0..."         # `otel-llm gateway keygen alice` prints key and hash
    routes = ["/v1/chat/completions", "GET /api/tags"]   # [METHODS ]path glob; default: every route
    models = ["gemma3:270m"]          # allowed "model" values; default: any
    rate = 2.0                        # requests per second, sustained; default: unlimited
    burst = 5                         # requests allowed at once above the rate; default: max(1, rate)
    max_concurrency = 2               # requests in flight for this key; default: unlimited
"""

from __future__ import annotations

import ipaddress
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from otel_llm.tools.gateway.keys import parse_hash

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the gateway extra installs tomli there
    import tomli as tomllib

__all__ = ["ConfigError", "GatewayConfig", "KeyPolicy", "ENV_VARS", "PROXY", "is_loopback", "load_config",
           "split_route"]

GATEWAY, PROXY = "gateway", "proxy"  # GatewayConfig.role
MAX_WORKERS = 256

ENV_PREFIX = "OTEL_LLM_GATEWAY_"
ENV_VARS: dict[str, str] = {  # setting -> environment variable (README table)
    "upstream": "OTEL_LLM_GATEWAY_UPSTREAM",
    "listen": "OTEL_LLM_GATEWAY_LISTEN",
    "keys_file": "OTEL_LLM_GATEWAY_KEYS",
    "config_file": "OTEL_LLM_GATEWAY_CONFIG",
    "max_concurrency": "OTEL_LLM_GATEWAY_MAX_CONCURRENCY",
    "max_queue": "OTEL_LLM_GATEWAY_MAX_QUEUE",
    "max_queue_wait": "OTEL_LLM_GATEWAY_MAX_QUEUE_WAIT",
    "max_body_bytes": "OTEL_LLM_GATEWAY_MAX_BODY_BYTES",
    "upstream_timeout": "OTEL_LLM_GATEWAY_UPSTREAM_TIMEOUT",
    "upstream_key_env": "OTEL_LLM_GATEWAY_UPSTREAM_KEY_ENV",
    "runtime": "OTEL_LLM_GATEWAY_RUNTIME",
    "access_log": "OTEL_LLM_GATEWAY_ACCESS_LOG",
    "header_timeout": "OTEL_LLM_GATEWAY_HEADER_TIMEOUT",
    "body_timeout": "OTEL_LLM_GATEWAY_BODY_TIMEOUT",
    "idle_timeout": "OTEL_LLM_GATEWAY_IDLE_TIMEOUT",
    "max_connections": "OTEL_LLM_GATEWAY_MAX_CONNECTIONS",
    "max_connections_per_client": "OTEL_LLM_GATEWAY_MAX_CONNECTIONS_PER_CLIENT",
    "refusal_rate": "OTEL_LLM_GATEWAY_REFUSAL_RATE",
    "refusal_burst": "OTEL_LLM_GATEWAY_REFUSAL_BURST",
    "access_log_max_bytes": "OTEL_LLM_GATEWAY_ACCESS_LOG_MAX_BYTES",
    "access_log_backups": "OTEL_LLM_GATEWAY_ACCESS_LOG_BACKUPS",
    "stream_usage": "OTEL_LLM_GATEWAY_STREAM_USAGE",
    "workers": "OTEL_LLM_GATEWAY_WORKERS",
}
_KEY_FIELDS = {"hash", "routes", "models", "rate", "burst", "max_concurrency"}


class ConfigError(ValueError):
    """A setting the gateway cannot run with; the message names it."""


@dataclass(frozen=True)
class KeyPolicy:
    """What one API key may do."""

    key_id: str
    digest: bytes = field(repr=False)
    routes: tuple[str, ...] = ("*",)
    models: tuple[str, ...] | None = None
    rate: float | None = None
    burst: int | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True)
class GatewayConfig:
    upstream: str = ""
    listen: str = "127.0.0.1:8080"
    keys_file: str | None = None
    config_file: str | None = None
    keys: tuple[KeyPolicy, ...] = ()
    max_concurrency: int = 8  # upstream requests in flight
    max_queue: int = 64  # requests waiting for one of those slots
    max_queue_wait: float = 30.0  # seconds a request may wait before 503
    max_body_bytes: int = 4 * 1024 * 1024
    upstream_timeout: float = 600.0  # seconds of upstream silence (connect: 10 s)
    upstream_key_env: str | None = None  # variable holding the runtime's own key, if it has one
    runtime: str | None = None  # the upstream runtime's name, when responses cannot tell
    access_log: str = "-"  # "-" = stderr, "off", or a file path
    header_timeout: float = 10.0  # seconds to receive a request head, from its first byte or the connection
    body_timeout: float = 30.0  # seconds to receive a request body, after its head
    idle_timeout: float = 30.0  # seconds a kept-alive connection may sit idle between requests
    max_connections: int = 512  # open client connections (each is a file descriptor)
    max_connections_per_client: int = 64  # open connections from one client address
    refusal_rate: float = 5.0  # refused requests per second per address that are answered and recorded
    refusal_burst: int = 20  # refused requests at once above that rate
    access_log_max_bytes: int = 100 * 1024 * 1024  # an access log file is rotated past this size (0: never)
    access_log_backups: int = 1  # previous access log files kept
    # add stream_options.include_usage to OpenAI-compatible streams that do not ask (rewrite.py)
    stream_usage: bool = False
    # processes serving the listening port (SO_REUSEPORT), each with its own limits and telemetry;
    # one that dies is replaced
    workers: int = 1
    # "proxy" (``otel-llm proxy``): the upstream call is the model call itself, not a relayed hop;
    # without keys there is no authentication, no queue, and only a loopback address may be used
    role: str = GATEWAY

    @property
    def authenticates(self) -> bool:
        """Callers present a key (always for the gateway; for the proxy when given keys)."""
        return self.role != PROXY or bool(self.keys)

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "127.0.0.1"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])


def load_config(overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Merge defaults, config file, keys file, environment and ``overrides`` (CLI); validate."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    from_env = {name: environ[var] for name, var in ENV_VARS.items() if environ.get(var)}
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    config_file = cli.get("config_file") or from_env.get("config_file")
    keys_tables: dict[str, Any] = {}
    if config_file:
        data = _read_toml(config_file)
        keys_tables.update(data.pop("keys", {}) or {})
        unknown = (set(data) - {f.name for f in fields(GatewayConfig)} - {"keys"}) | ({"role"} & set(data))
        if unknown:
            raise ConfigError(f"{config_file}: unknown setting(s) {', '.join(sorted(unknown))}")
        raw.update(data)
    raw.update(from_env)
    raw.update(cli)
    keys_file = raw.get("keys_file")
    if keys_file:
        data = _read_toml(keys_file)
        tables = data.get("keys", data)  # `[keys.alice]` or bare `[alice]` tables
        keys_tables.update(tables)
    raw.pop("keys", None)
    settings = _coerce(raw)
    settings["keys"] = tuple(_key_policy(key_id, table) for key_id, table in keys_tables.items())
    config = replace(GatewayConfig(), **settings)
    _validate(config)
    return config


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


_INTS = {"max_concurrency", "max_queue", "max_body_bytes", "max_connections", "max_connections_per_client",
         "refusal_burst", "access_log_max_bytes", "access_log_backups", "workers"}
_FLOATS = {"max_queue_wait", "upstream_timeout", "header_timeout", "body_timeout", "idle_timeout", "refusal_rate"}
_BOOLS = {"stream_usage"}
_TRUE, _FALSE = {"true", "on", "yes", "1"}, {"false", "off", "no", "0"}


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in _TRUE | _FALSE:
        raise ConfigError(f"{name} must be on or off, got {value!r}")
    return text in _TRUE


def _coerce(raw: Mapping[str, Any]) -> dict[str, Any]:
    known = {f.name for f in fields(GatewayConfig)}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in known:
            raise ConfigError(f"unknown setting {name!r}")
        if name in _BOOLS:
            out[name] = _boolean(name, value)
            continue
        try:
            if name in _INTS:
                value = int(value)
            elif name in _FLOATS:
                value = float(value)
            elif value is not None:
                value = str(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a number, got {value!r}") from None
        out[name] = value
    return out


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")


def _validate(config: GatewayConfig) -> None:
    parts = urlsplit(config.upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"upstream must be an http(s) URL such as http://127.0.0.1:11434, got {config.upstream!r}")
    if parts.username or parts.password:
        raise ConfigError("upstream must not carry credentials in the URL (use upstream_key_env)")
    host, _, port = config.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"listen must be HOST:PORT, got {config.listen!r}")
    _positive("max_concurrency", config.max_concurrency)
    _positive("max_queue", config.max_queue, allow_zero=True)
    _positive("max_queue_wait", config.max_queue_wait, allow_zero=True)
    _positive("max_body_bytes", config.max_body_bytes)
    _positive("upstream_timeout", config.upstream_timeout)
    for name in ("header_timeout", "body_timeout", "idle_timeout", "max_connections", "max_connections_per_client",
                 "refusal_rate", "refusal_burst", "workers"):
        _positive(name, getattr(config, name))
    _positive("access_log_max_bytes", config.access_log_max_bytes, allow_zero=True)
    _positive("access_log_backups", config.access_log_backups, allow_zero=True)
    if config.workers > MAX_WORKERS:
        raise ConfigError(f"workers must be at most {MAX_WORKERS}, got {config.workers}")
    if config.access_log == "":
        raise ConfigError("access_log must be '-', 'off' or a file path")
    if config.role not in (GATEWAY, PROXY):
        raise ConfigError(f"role must be {GATEWAY!r} or {PROXY!r}, got {config.role!r}")
    if config.role == PROXY and not config.keys and not is_loopback(config.listen_host):
        raise ConfigError(
            f"refusing to listen on {config.listen} without authentication: anyone who can reach that address "
            "could use the model server through the proxy. Listen on a loopback address (127.0.0.1 or ::1), "
            "or pass --keys FILE to require keys there (create one with `otel-llm gateway keygen ID`)")
    if not config.keys and config.role != PROXY:
        raise ConfigError("no API keys configured: pass --keys FILE (create one with `otel-llm gateway keygen ID`)")
    seen: dict[bytes, str] = {}
    for policy in config.keys:
        if policy.digest in seen:
            raise ConfigError(f"keys {seen[policy.digest]!r} and {policy.key_id!r} have the same hash")
        seen[policy.digest] = policy.key_id


def is_loopback(host: str) -> bool:
    """``host`` (an address, or ``localhost``) can only be reached from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def _key_policy(key_id: str, table: Any) -> KeyPolicy:
    where = f"key {key_id!r}"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table with at least a hash")
    unknown = set(table) - _KEY_FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    if "hash" not in table:
        raise ConfigError(f"{where} has no hash (never store the key itself)")
    try:
        digest = parse_hash(str(table["hash"]))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    routes = _strings(where, "routes", table.get("routes", ["*"]))
    for route in routes:
        try:
            split_route(route)
        except ValueError as exc:
            raise ConfigError(f"{where}: routes: {route!r}: {exc}") from None
    models = _strings(where, "models", table["models"]) if "models" in table else None
    rate = _optional_number(where, "rate", table.get("rate"))
    burst = _optional_number(where, "burst", table.get("burst"))
    concurrency = _optional_number(where, "max_concurrency", table.get("max_concurrency"))
    if burst is not None and rate is None:
        raise ConfigError(f"{where}: burst needs a rate")
    return KeyPolicy(
        key_id=key_id, digest=digest, routes=routes, models=models, rate=rate,
        burst=int(burst) if burst is not None else (max(1, math.ceil(rate)) if rate else None),
        max_concurrency=int(concurrency) if concurrency is not None else None,
    )


_METHOD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def split_route(route: str) -> tuple[frozenset[str] | None, str]:
    """``"GET,POST /v1/*"`` -> ({"GET", "POST"}, "/v1/*"); ``"/v1/*"`` -> (None, "/v1/*"): the
    route's API's methods; ``"* /v1/*"``: any method. ValueError for a malformed route."""
    methods_text, _, pattern = route.strip().rpartition(" ")
    if not pattern.startswith(("/", "*")):
        raise ValueError("a route is a path glob starting with '/' (or '*'), after optional methods")
    if not methods_text:
        return None, pattern
    methods = frozenset(m.strip().upper() for m in methods_text.split(","))
    if methods != frozenset("*") and not all(m and set(m) <= _METHOD_CHARS for m in methods):
        raise ValueError("methods are comma-separated names such as GET,POST (or *)")
    return methods, pattern


def _strings(where: str, name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {name} must be a list of strings")
    return tuple(value)


def _optional_number(where: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)
