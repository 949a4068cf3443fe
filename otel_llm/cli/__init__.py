"""The ``otel-llm`` command line; the entry point is :func:`otel_llm.cli.main.main`.

Deliberately imports nothing: ``python -m otel_llm.cli.main`` would otherwise warn that the
module was already imported by its package.
"""
