"""``otel-llm proxy``: a local tracing proxy, so a client in any language gets the trace an
instrumented Python application would record.

    otel-llm proxy --upstream http://127.0.0.1:11434            # then point the client at http://127.0.0.1:8081

It is the gateway (``otel_llm.tools.gateway``) in its ``proxy`` role: the same server, edge limits and
streaming, with each relayed request recorded as the model call itself. Without ``--keys`` it
authenticates nobody, so it listens only on a loopback address; with them it checks keys and
applies every limit the gateway does.
"""

from __future__ import annotations

import argparse
import sys

from otel_llm.tools.commands.gateway import SETTING_FLAGS, serve_settings
from otel_llm.tools.gateway.settings import PROXY

__all__ = ["DEFAULT_LISTEN", "add_arguments", "run"]

DEFAULT_LISTEN = "127.0.0.1:8081"  # next to the gateway's 8080
_HELP = {
    "listen": f"HOST:PORT to listen on (default {DEFAULT_LISTEN}; port 0: any free port, printed); "
              "a non-loopback address needs --keys",
    "keys_file": "TOML file of [keys.ID] tables with hashed keys (`otel-llm gateway keygen ID`): callers must "
                 "present one, and every gateway limit applies",
    "access_log": "'off' (default), '-' (stderr) or a file: one JSON line per request",
}
_WITH_KEYS = {"max_concurrency", "max_queue", "max_queue_wait"}  # the queue exists only with keys
_FLAGS = [flag for flag in SETTING_FLAGS if flag[1] != "config_file"]  # the command line is the whole config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("A local proxy in front of a model server that traces each request as the model call, "
                          "as an instrumented application would: point any client at it.")
    parser.epilog = ("Settings come from the command line only, not from the gateway's OTEL_LLM_GATEWAY_* "
                     "variables; telemetry goes where OTEL_LLM_* says, as for an instrumented application.")
    for flag, setting, kind, text in _FLAGS:
        text = _HELP.get(setting, text)
        if setting in _WITH_KEYS:
            text += "; only with --keys"
        parser.add_argument(flag, dest=setting, type=kind, metavar=setting.split("_")[-1].upper(), help=text)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = {name: getattr(args, name, None) for _, name, _, _ in _FLAGS}
    settings["listen"] = settings["listen"] or DEFAULT_LISTEN
    settings["access_log"] = settings["access_log"] or "off"  # the summary line says as much per call
    settings["role"] = PROXY
    if not settings["upstream"]:
        print("otel-llm proxy: give the model server with --upstream URL, e.g. --upstream http://127.0.0.1:11434",
              file=sys.stderr)
        return 2
    return serve_settings("otel-llm proxy", settings, environ={})
