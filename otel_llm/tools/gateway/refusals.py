"""Bounded refusals: what a flood of bad requests from one address may cost the gateway.

Every refused request (no or a wrong key, a route or model not allowed, a malformed request)
would otherwise write a span and an access line: one connection sending bad keys as fast as it can
wrote about 1.8 KB per refusal, some 3 MB a second. Each client address has a token bucket of
refusals: within it a refusal is answered and recorded as any request; past it the request is
answered 429 (``Retry-After``, connection closed) and only counted in the metrics, and a summary
line is logged at most once a minute. Requests with a valid key are never held back by it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from otel_llm.tools.gateway.limits import TokenBucket

__all__ = ["REFUSED_OUTCOMES", "RefusalLimiter"]

# outcomes decided before the runtime and caused by the request itself
REFUSED_OUTCOMES = frozenset({"unauthorized", "forbidden", "bad_request"})
_SUMMARY_EVERY = 60.0  # seconds between two summary log lines at most

_log = logging.getLogger("otel_llm.gateway")


class RefusalLimiter:
    """``rate`` refusals per second per address (``burst`` at once), for at most ``max_addresses``
    addresses (the least recently refused ones are forgotten first)."""

    def __init__(self, rate: float = 5.0, burst: int = 20, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_addresses = rate, burst, max_addresses
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.suppressed = 0  # refusals answered 429 and not recorded, since the last summary
        self._addresses: set[str] = set()
        self._reported: float | None = None

    def allow(self, address: str | None) -> float:
        """Count one refusal of ``address``: 0 when it may be answered and recorded as usual, else
        the seconds until this address may be refused again (answer 429, record nothing)."""
        if address is None:
            return 0.0
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = self._buckets[address] = TokenBucket(self.rate, self.burst, self._clock)
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(address)
        wait = bucket.take()
        if wait > 0:
            self.suppressed += 1
            if len(self._addresses) < 100:
                self._addresses.add(address)
            self._summarize()
        return wait

    def _summarize(self) -> None:
        now = self._clock()
        if self._reported is not None and now - self._reported < _SUMMARY_EVERY:
            return
        shown = ", ".join(sorted(self._addresses)[:5]) + (", ..." if len(self._addresses) > 5 else "")
        if self._reported is None:
            _log.warning("otel-llm gateway: too many refused requests from %s: further ones are answered 429 "
                         "and counted, not traced or logged (a summary at most once a minute)", shown)
        else:
            _log.warning("otel-llm gateway: %d refused requests answered 429 and not recorded in the last %.0f s "
                         "(from %s)", self.suppressed, now - self._reported, shown)
        self.suppressed, self._addresses, self._reported = 0, set(), now
