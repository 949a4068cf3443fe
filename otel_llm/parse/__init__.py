"""Parsers for model-API requests and responses, and the incremental scanner of a stream: no I/O."""

__all__: list[str] = []
