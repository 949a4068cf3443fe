# Literal values only: tooling may exec() this file.
# Either httpx or httpx2 is enough; whichever is importable gets instrumented.
_instruments = ()
_instruments_any = ("httpx >= 0.27", "httpx2 >= 2")
_supports_metrics = True
