"""Parsers for model-API requests and responses: pure functions, no I/O."""
