"""``otel-llm`` command line entry point.

Each subcommand is a :class:`Command` in :data:`COMMANDS`. Only the command being run is
configured, so a broken or missing optional module (e.g. ``otel_llm.tools.commands.sim``) can never
break the others. Adding a command implemented elsewhere is one line::

    module_command("diagnose", "find where a slow call spends its time", "otel_llm.tools.commands.diagnose"),

where that module defines ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

__all__ = ["COMMANDS", "Command", "main", "module_command", "version"]

from otel_llm.config import ENV_VARS

ENV_TRACES_FILE = ENV_VARS["traces_file"]
_FALLBACK_VERSION = "0.0.0+unknown"


@dataclass(frozen=True)
class Command:
    """A subcommand: ``configure`` adds its arguments and sets ``handler`` (args -> exit code)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]


def module_command(name: str, help: str, module: str) -> Command:  # noqa: A002 - argparse's own word
    """A command implemented by ``module`` (``add_arguments``/``run``), imported only when run."""

    def configure(parser: argparse.ArgumentParser) -> None:
        mod = importlib.import_module(module)
        mod.add_arguments(parser)
        parser.set_defaults(handler=mod.run)

    return Command(name, help, configure)


def version() -> str:
    """The installed distribution's version, or a placeholder when running from a source tree."""
    try:
        return metadata.version("otel-llm")
    except metadata.PackageNotFoundError:
        return _FALLBACK_VERSION


# --- view -----------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _configure_view(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help=f"OTLP/JSON-lines trace file (default: ${ENV_TRACES_FILE} or otel-llm-traces.jsonl)")
    parser.add_argument("--last", type=_positive_int, metavar="N", help="show only the newest N calls")
    parser.add_argument("--width", type=int, metavar="W", help="output width (default: terminal width)")
    parser.add_argument("--trace", metavar="TRACE_ID", help="show only calls whose trace id starts with this")
    parser.add_argument("--ascii", action="store_true", help="draw bars with ASCII characters only")
    parser.set_defaults(handler=_run_view)


def _can_encode(stream: object, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _run_view(args: argparse.Namespace) -> int:
    # Imported here so `otel-llm --version` and other commands stay fast and independent.
    from otel_llm.tools.view import render_calls
    from otel_llm.export.jsonl import DEFAULT_TRACES_FILE, ReadStats, read_rotated

    path = args.file or os.environ.get(ENV_TRACES_FILE) or DEFAULT_TRACES_FILE
    stats = ReadStats()
    try:
        spans = list(read_rotated(path, stats))  # the rotated files first: calls in time order
    except FileNotFoundError:
        print(f"otel-llm: no trace file {path!r} (pass FILE or set ${ENV_TRACES_FILE})", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"otel-llm: cannot read {path!r}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if stats.malformed:
        print(f"otel-llm: skipped {stats.malformed} malformed line(s) in {path}", file=sys.stderr)
    width = max(40, args.width or shutil.get_terminal_size((100, 24)).columns)
    ascii_only = args.ascii or not _can_encode(sys.stdout, "█░│")
    text = render_calls(spans, width=width, ascii=ascii_only, last=args.last, trace_id=args.trace)
    if not text:
        where = f" with trace id {args.trace}" if args.trace else ""
        text = f"no model calls{where} recorded in {path}"
    return _emit(text)


def _emit(text: str) -> int:
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `otel-llm view | head`: the reader left; silence the flush at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# --- registry and entry point ---------------------------------------------------------------

COMMANDS: tuple[Command, ...] = (
    Command("view", "show recorded model calls as terminal waterfalls", _configure_view),
    module_command("sim", "run a simulated model server", "otel_llm.tools.commands.sim"),
    module_command("diagnose", "find where a slow model call spends its time", "otel_llm.tools.commands.diagnose"),
    module_command("bench", "measure a model server's capacity under load (vllm bench serve's definitions)",
                   "otel_llm.tools.commands.bench"),
    module_command("gateway", "authenticating gateway in front of a model server, traced end to end",
                   "otel_llm.tools.commands.gateway"),
    module_command("proxy", "local tracing proxy: any client's calls to a model server traced as model calls",
                   "otel_llm.tools.commands.proxy"),
)


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand name: top-level options take no values, so it is the first non-option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-llm", description="See where the time of every model call went.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv)
    for command in COMMANDS:
        sub_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        if command.name == chosen:
            command.configure(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``otel-llm`` command line and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = _build_parser(argv)
    except Exception as exc:  # noqa: BLE001 - an optional command failed to load
        print(f"otel-llm: the {_chosen(argv)!r} command is unavailable: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits for --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return int(handler(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
