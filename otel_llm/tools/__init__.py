"""The ``otel-llm`` command and the servers around the SDK: ``view``, ``diagnose``, ``bench``,
``gateway`` and ``sim``. They use the SDK (``otel_llm``) through its modules; the SDK never
imports anything from here.

Deliberately imports nothing: ``python -m otel_llm.tools.main`` would otherwise warn that the
module was already imported by its package, and ``otel-llm view`` must start fast.
"""
