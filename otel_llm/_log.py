"""Logging for failures inside otel_llm: each distinct problem is logged once, never raised."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("otel_llm")

_seen: set[str] = set()
_seen_lock = threading.Lock()


def log_once(message: str, *, level: int = logging.WARNING, exc_info: bool = True) -> None:
    """Log ``message`` (with the current exception) the first time it happens in this process."""
    with _seen_lock:
        if message in _seen:
            return
        _seen.add(message)
    logger.log(level, "otel_llm: %s (further occurrences are not logged)", message, exc_info=exc_info)


def reset_log_once() -> None:
    """Forget which problems were logged (tests)."""
    with _seen_lock:
        _seen.clear()
