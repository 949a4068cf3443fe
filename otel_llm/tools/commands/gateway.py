"""``otel-llm gateway``: serve, or ``otel-llm gateway keygen ID`` to create a key.

    otel-llm gateway keygen alice --routes '/v1/*' >> keys.toml   # key on stderr, hash on stdout
    otel-llm gateway --upstream http://127.0.0.1:11434 --listen 127.0.0.1:8080 --keys keys.toml
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from otel_llm.tools.gateway.settings import ENV_VARS, ConfigError, load_config, split_route
from otel_llm.tools.gateway.keys import format_hash, generate_key

__all__ = ["SETTING_FLAGS", "add_arguments", "run"]

_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# (flag, setting, type, help) for each setting (``otel-llm proxy`` offers the same ones)
SETTING_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--upstream", "upstream", str, "the model server, e.g. http://127.0.0.1:11434"),
    ("--listen", "listen", str, "HOST:PORT to listen on (default 127.0.0.1:8080)"),
    ("--keys", "keys_file", str, "TOML file of [keys.ID] tables with hashed keys"),
    ("--config", "config_file", str, "TOML file with any of these settings"),
    ("--max-concurrency", "max_concurrency", int, "upstream requests in flight (default 8)"),
    ("--max-queue", "max_queue", int, "requests waiting beyond that (default 64)"),
    ("--max-queue-wait", "max_queue_wait", float, "seconds a request may wait (default 30)"),
    ("--max-body-bytes", "max_body_bytes", int, "largest request body (default 4 MiB)"),
    ("--upstream-timeout", "upstream_timeout", float, "seconds of upstream silence (default 600)"),
    ("--upstream-key-env", "upstream_key_env", str, "variable holding the runtime's own API key"),
    ("--runtime", "runtime", str, "the upstream runtime's name (ollama, llama.cpp, vllm, ...)"),
    ("--access-log", "access_log", str, "'-' (stderr, default), 'off' or a file"),
    ("--header-timeout", "header_timeout", float, "seconds to receive a request head (default 10)"),
    ("--body-timeout", "body_timeout", float, "seconds to receive a request body (default 30)"),
    ("--idle-timeout", "idle_timeout", float, "seconds a kept-alive connection may idle (default 30)"),
    ("--max-connections", "max_connections", int, "open client connections (default 512)"),
    ("--max-connections-per-client", "max_connections_per_client", int,
     "open connections from one address (default 64)"),
    ("--refusal-rate", "refusal_rate", float, "refused requests per second per address answered and recorded "
                                              "(default 5; past it and the burst: 429, counted only)"),
    ("--refusal-burst", "refusal_burst", int, "refused requests at once above that rate (default 20)"),
    ("--access-log-max-bytes", "access_log_max_bytes", int, "rotate an access log file past this size "
                                                            "(default 100 MiB; 0 never)"),
    ("--access-log-backups", "access_log_backups", int, "previous access log files kept (default 1)"),
    ("--workers", "workers", int, "processes serving the port, one per core at most; limits and the queue "
                                  "apply in each (default 1)"),
    ("--stream-usage", "stream_usage", str, "on: ask OpenAI-compatible streams for their usage chunk, which "
                                            "also brings vLLM's per-request metrics (default off)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("An authenticating gateway in front of a model server; one trace spans "
                          "client, gateway and runtime. 'keygen ID' creates a key instead.")
    parser.add_argument("action", nargs="?", choices=("serve", "keygen"), default="serve",
                        help="serve (default) or keygen")
    parser.add_argument("key_id", nargs="?", metavar="ID", help="keygen: the new key's id (logged, not secret)")
    for flag, setting, kind, text in SETTING_FLAGS:
        parser.add_argument(flag, dest=setting, type=kind, metavar=setting.split("_")[-1].upper(),
                            help=f"{text} [${ENV_VARS[setting]}]")
    keygen = parser.add_argument_group("keygen options")
    keygen.add_argument("--routes", nargs="+", metavar="ROUTE",
                        help="allowed routes, '[METHODS ]GLOB' such as '/v1/*' or 'GET /api/tags' (default: all)")
    keygen.add_argument("--models", nargs="+", metavar="MODEL", help="allowed models (default: all)")
    keygen.add_argument("--rate", type=float, help="requests per second")
    keygen.add_argument("--burst", type=int, help="requests at once above the rate")
    keygen.add_argument("--key-max-concurrency", type=int, metavar="N", help="requests in flight for this key")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "keygen":
        return _keygen(args)
    return serve_settings("otel-llm gateway", {name: getattr(args, name, None) for name in ENV_VARS})


def serve_settings(command: str, settings: dict[str, Any], environ: Mapping[str, str] | None = None) -> int:
    """Load the settings and serve until stopped; a configuration error is one line and exit code 2."""
    try:
        config = load_config(settings, environ=environ)
        from otel_llm.tools.gateway.server import serve

        return serve(config)
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2


def _keygen(args: argparse.Namespace) -> int:
    if not args.key_id or not _KEY_ID.match(args.key_id):
        print("otel-llm gateway keygen: give an ID of letters, digits, '_', '.' or '-'", file=sys.stderr)
        return 2
    for route in args.routes or ():
        try:
            split_route(route)
        except ValueError as exc:
            print(f"otel-llm gateway keygen: route {route!r}: {exc}", file=sys.stderr)
            return 2
    key = generate_key()
    # a bare TOML key may not contain '.', which would nest tables: quote such IDs
    table = args.key_id if re.fullmatch(r"[A-Za-z0-9_-]+", args.key_id) else json.dumps(args.key_id)
    lines = [f"[keys.{table}]", f'hash = "{format_hash(key)}"']
    for name, value in (("routes", args.routes), ("models", args.models), ("rate", args.rate),
                        ("burst", args.burst), ("max_concurrency", args.key_max_concurrency)):
        if value is not None:
            lines.append(f"{name} = {json.dumps(value)}")
    print(f"otel-llm gateway: key for {args.key_id!r} (shown once; only its hash is stored):\n{key}",
          file=sys.stderr)
    print("\n".join(lines) + "\n")
    return 0
