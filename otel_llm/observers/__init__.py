"""Observers: host, GPU and runtime-state evidence as metrics, and per-call correlation."""

__all__: list[str] = []
