"""Command line: ``python -m otel_llm.tools.sim`` and ``otel-llm sim`` share ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys

from otel_llm.tools.sim.scenario import COMPRESSIONS, CONCURRENCY_MODES, FIELD_HELP, RUNTIMES, SimConfig
from otel_llm.tools.sim.server import run_precise, running

__all__ = ["add_arguments", "config_from_args", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --host, --port, --log-level and one flag per SimConfig field (e.g. --first-token-delay)."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="bind port; 0 picks a free one (default 0)")
    parser.add_argument("--log-level", default="warning", help="python logging level (default warning)")
    group = parser.add_argument_group("simulated runtime (see otel_llm.tools.sim docs)")
    choices = {"runtime": RUNTIMES, "concurrency": CONCURRENCY_MODES, "compression": COMPRESSIONS}
    for field in dataclasses.fields(SimConfig):
        flag = "--" + field.name.replace("_", "-")
        help_text = f"{FIELD_HELP[field.name]} (default {field.default!r})"
        if field.type == "bool":
            action = argparse.BooleanOptionalAction
            group.add_argument(flag, dest=field.name, action=action, default=None, help=help_text)
        else:
            metavar = "SECONDS" if field.type == "float" else "NAME" if field.type == "str" else "N"
            options = {"choices": choices[field.name]} if field.name in choices else {"metavar": metavar}
            group.add_argument(flag, dest=field.name, default=None, help=help_text, **options)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    given = {name: getattr(args, name) for name in SimConfig.field_names() if getattr(args, name, None) is not None}
    return SimConfig().merged(given)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; the first stdout line names the bound URL."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"otel-llm sim: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=str(args.log_level).upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run_precise(_serve(config, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(config: SimConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running(config, host, port) as app:
        print(f"otel-llm sim listening on http://{host}:{app.port}", flush=True)
        await stop.wait()
