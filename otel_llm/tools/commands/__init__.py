"""The ``otel-llm`` subcommands' front ends, one module per command (``bench``, ``diagnose``,
``gateway``, ``sim``): arguments, output, exit codes. What each one does lives in the package of
the same name beside this one. Imported only by ``otel_llm.tools.main``, one command at a time.
"""
