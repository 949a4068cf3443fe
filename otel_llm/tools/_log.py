"""The commands' and servers' own log of failures they survive: each distinct problem once.

The tools are clients of the SDK and keep their own record of what they already logged (the
SDK's is its own); both log under the ``otel_llm`` logger's tree, so one logging setup covers them.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["log_once", "logger"]

logger = logging.getLogger("otel_llm.tools")

_seen: set[str] = set()
_seen_lock = threading.Lock()


def log_once(message: str, *, level: int = logging.WARNING, exc_info: bool = True) -> None:
    """Log ``message`` (with the current exception) the first time this process meets it."""
    with _seen_lock:
        if message in _seen:
            return
        _seen.add(message)
    logger.log(level, "otel-llm: %s (further occurrences are not logged)", message, exc_info=exc_info)
