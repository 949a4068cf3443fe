# Literal values only: tooling may exec() this file.
# The names are OpenTelemetry's convention for an instrumentation package: underscored, yet what
# the instrumentor and that tooling read.
__all__ = ["_instruments", "_instruments_any", "_supports_metrics"]

# Any one of these is enough; whichever are importable get instrumented.
_instruments = ()
_instruments_any = ("httpx >= 0.27", "httpx2 >= 2", "aiohttp >= 3.9", "urllib3 >= 2")
_supports_metrics = True
