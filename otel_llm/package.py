# Literal values only: tooling may exec() this file.
# Any one of these is enough; whichever are importable get instrumented.
_instruments = ()
_instruments_any = ("httpx >= 0.27", "httpx2 >= 2", "aiohttp >= 3.9", "urllib3 >= 2")
_supports_metrics = True
