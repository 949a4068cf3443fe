"""``python -m otel_llm.tools.sim``."""

from __future__ import annotations

import argparse
import sys

from otel_llm.tools.commands.sim import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_llm.tools.sim", description="LLM runtime simulator")
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
