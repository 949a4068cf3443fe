"""The GPU check's command line: ``python benchmarks/gpu_check.py`` (or ``python -m
otel_llm_testing.gpu_check``) ``[--out FILE] [--calls N] ...``; ``--serve`` runs the model server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import otel_llm_testing.gpu_check as package
from otel_llm_testing.gpu_check.runner import ROOT, run
from otel_llm_testing.gpu_check.server import SIZES, serve

__all__ = ["DEFAULT_DEPS", "main"]

DEFAULT_DEPS = ROOT / ".gpu-deps"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(package.__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", metavar="FILE", help="write every check and reading here as JSON")
    parser.add_argument("--calls", type=int, default=6, metavar="N", help="streamed calls to make (default 6)")
    parser.add_argument("--tokens", type=int, default=384, metavar="N",
                        help="tokens each call generates (default 384: a second or two of GPU work)")
    parser.add_argument("--timeout", type=float, default=420.0, metavar="S",
                        help="hard limit of the whole run in seconds, the server stopped within it (default 420)")
    parser.add_argument("--deps", metavar="DIR",
                        help="folder of wheels' contents put first on the path (default .gpu-deps at the "
                             "repository's root, where it exists; make gpu-deps fills it)")
    parser.add_argument("--size", choices=sorted(SIZES), default="medium", help="the server's model (default medium)")
    parser.add_argument("--ballast-gib", type=float, default=4.0, metavar="GIB",
                        help="GPU memory the server holds beside the model (default 4)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="let the server run on the CPU (a trial of the script itself, with a stand-in NVML)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def _deps_dir(option: str | None) -> Path | None:
    if option:
        return Path(option).resolve()
    return DEFAULT_DEPS if DEFAULT_DEPS.is_dir() else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    deps = _deps_dir(args.deps)
    for path in (ROOT, deps):  # deps ends up first
        if path is not None and str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if args.serve:
        return serve(args)
    if args.calls < 1 or args.tokens < 1 or args.timeout <= 20:
        print("gpu_check: --calls and --tokens must be at least 1, --timeout above 20", file=sys.stderr)
        return 2
    return run(args, deps)


if __name__ == "__main__":
    raise SystemExit(main())
