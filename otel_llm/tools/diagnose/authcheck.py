"""Test an endpoint's security controls the way a remote caller would (raw httpx, not traced).

Checks, after one baseline request with the valid token (when given):

* ``no_credentials``: a generation request without credentials is rejected (401/403) before inference:
  quickly and without generated tokens in the body;
* ``invalid_credentials``: the same with a made-up token;
* ``route_denied``: a documented admin/diagnostic route (``/metrics``, ``/api/tags``, ``/props``) is refused;
* ``burst``: N concurrent small requests with the valid token are answered predictably: some 429/503 with
  ``Retry-After`` (limited) or all served within the timeout; never left hanging.

The token is sent in ``Authorization: Bearer`` and never stored: details are redacted, results hold no
headers.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from otel_llm.runtimes import ADMIN_PATHS
from otel_llm.tools.bench.workload import OPENAI_APIS

from .trials import request_for
from .verdicts import Verdict

__all__ = ["AuthCheck", "AuthCheckResult", "auth_check", "auth_findings", "auth_verdicts"]

ADMIN_ROUTES = {api: (path,) for api, path in ADMIN_PATHS.items()}
REJECTED = (401, 403)
LIMITED = (429, 503)
BURST = 8
BURST_MAX_TOKENS = 4
_TOKEN_MARKERS = ('"content":"', '"content": "', '"response":"', '"response": "', '"delta"', '"choices"')


@dataclass
class AuthCheck:
    name: str
    passed: bool
    status: int | None = None
    elapsed_s: float | None = None
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class AuthCheckResult:
    url: str
    api: str
    model: str
    token_sent: bool
    checks: list[AuthCheck] = field(default_factory=list)

    def check(self, name: str) -> AuthCheck | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


def _has_tokens(body: str) -> bool:
    """True when the body looks like generated output (stream frames or a completion)."""
    text = body.replace("\r", "")
    if "data:" in text and "[DONE]" in text:
        return True
    return any(marker in text for marker in _TOKEN_MARKERS)


def _send(client: httpx.Client, method: str, url: str, headers: dict[str, str], payload: Any | None,
          redact: Any) -> tuple[int | None, float, str, dict[str, str], str | None]:
    """(status, elapsed, body head, response headers, error) of one bounded request."""
    started = time.perf_counter()
    try:
        with client.stream(method, url, headers=headers, json=payload) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():  # bounded: at most 64 kB kept, read timeout per chunk
                if size < 65536:
                    chunks.append(chunk)
                size += len(chunk)
            body = b"".join(chunks).decode("utf-8", "replace")
            return response.status_code, time.perf_counter() - started, body, dict(response.headers), None
    except httpx.TimeoutException as exc:
        return None, time.perf_counter() - started, "", {}, f"timeout: {redact(type(exc).__name__)}"
    except httpx.HTTPError as exc:
        return None, time.perf_counter() - started, "", {}, f"error: {redact(str(exc))[:200]}"


def auth_check(base_url: str, api: str, model: str, token: str | None, timeout: float = 10,
               *, burst: int = BURST, admin_route: str | None = None,
               fast_rejection_s: float | None = None) -> AuthCheckResult:
    """Run the four checks against ``base_url``; never raises for HTTP failures, never stores ``token``."""

    def redact(text: str) -> str:
        return text.replace(token, "***") if token else text

    url, payload = request_for(api, base_url, model, BURST_MAX_TOKENS)
    valid = {"Authorization": f"Bearer {token}"} if token else {}
    result = AuthCheckResult(url=base_url, api=api, model=model, token_sent=bool(token))
    client_timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
    limits = httpx.Limits(max_connections=max(burst, 1) + 4, max_keepalive_connections=0)
    with httpx.Client(timeout=client_timeout, limits=limits) as client:
        # Baseline: how long a served request takes, to judge whether a rejection skipped inference.
        baseline = None
        if token:
            status, elapsed, body, _, error = _send(client, "POST", url, valid, payload, redact)
            baseline = elapsed if status == 200 else None
            result.checks.append(AuthCheck(
                "valid_credentials", status == 200, status, round(elapsed, 4),
                error or ("served" if status == 200 else f"the valid token was answered with {status}")))
        limit = fast_rejection_s if fast_rejection_s is not None else \
            (max(0.1, 0.5 * baseline) if baseline is not None else 1.0)

        invalid_token = "invalid-" + uuid.uuid4().hex
        for name, headers in (("no_credentials", {}),
                              ("invalid_credentials", {"Authorization": f"Bearer {invalid_token}"})):
            status, elapsed, body, _, error = _send(client, "POST", url, headers, payload, redact)
            rejected = status in REJECTED
            tokens = _has_tokens(body)
            fast = elapsed <= limit
            passed = rejected and fast and not tokens
            if error:
                detail = error
            elif not rejected:
                detail = f"answered {status}: the request was accepted" + (" and generated tokens" if tokens else "")
            elif tokens:
                detail = f"rejected with {status} but the body carries generated tokens"
            elif not fast:
                detail = f"rejected with {status} only after {elapsed:.3f} s (> {limit:.3f} s): inference may have run"
            else:
                detail = f"rejected with {status} in {elapsed * 1000:.0f} ms, no tokens"
            result.checks.append(AuthCheck(name, passed, status, round(elapsed, 4), redact(detail),
                                           {"rejected": rejected, "fast": fast, "body_tokens": tokens,
                                            "fast_limit_s": round(limit, 4)}))

        route = admin_route or ADMIN_ROUTES.get(api, ("/metrics",))[0]
        route_url = _origin(base_url, api) + route
        status, elapsed, _, _, error = _send(client, "GET", route_url, valid, None, redact)
        refused = status in (401, 403, 404)
        result.checks.append(AuthCheck(
            "route_denied", refused, status, round(elapsed, 4),
            error or (f"{route} refused with {status}" + (" (forbidden)" if status == 403 else
                                                          " (not found)" if status == 404 else "")
                      if refused else f"{route} answered {status}: an admin/diagnostic route is reachable"),
            {"route": route}))

        result.checks.append(_burst(client, url, valid, payload, burst, timeout, redact))
    return result


def _origin(base_url: str, api: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if api in OPENAI_APIS and base.endswith("/v1") else base


def _burst(client: httpx.Client, url: str, headers: dict[str, str], payload: Any, n: int, timeout: float,
           redact: Any) -> AuthCheck:
    outcomes: list[tuple[int | None, float, dict[str, str], str | None]] = [(None, 0.0, {}, "not run")] * n
    barrier = threading.Barrier(n) if n > 1 else None

    def one(i: int) -> None:
        if barrier is not None:
            try:
                barrier.wait(timeout=timeout)
            except threading.BrokenBarrierError:
                pass
        status, elapsed, _, resp_headers, error = _send(client, "POST", url, headers, payload, redact)
        outcomes[i] = (status, elapsed, resp_headers, error)

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:  # each request is bounded by the client timeout; this join bounds the whole burst
        t.join(timeout=max(0.0, 2 * timeout + 5 - (time.perf_counter() - started)))
    wall = time.perf_counter() - started
    statuses = [o[0] for o in outcomes]
    served = [o for o in outcomes if o[0] == 200]
    limited = [o for o in outcomes if o[0] in LIMITED]
    with_retry = [o for o in limited if "retry-after" in {k.lower() for k in o[2]}]
    hung = [o for o in outcomes if o[3] is not None and o[3].startswith(("timeout", "not run"))]
    other = [o for o in outcomes if o[0] not in (200, *LIMITED) and o not in hung]
    served_times = sorted(o[1] for o in served)
    queued = len(served_times) >= 2 and served_times[-1] > 3 * max(served_times[0], 0.01) \
        and served_times[-1] - served_times[0] > 0.1
    if hung:
        outcome, passed = "hung", False
        detail = f"{len(hung)} of {n} requests got no answer within {timeout} s: unbounded queueing"
    elif limited and len(with_retry) == len(limited):
        outcome, passed = "limited", True
        rejected = sorted({o[0] for o in limited if o[0] is not None})
        detail = f"{len(limited)} of {n} rejected with {rejected} and Retry-After, {len(served)} served"
    elif limited:
        outcome, passed = "limited_without_retry_after", False
        detail = f"{len(limited)} of {n} rejected with 429/503 but without Retry-After"
    elif len(served) == n:
        outcome, passed = ("queued" if queued else "served"), True
        detail = f"all {n} served within {served_times[-1]:.3f} s" + (
            f" (the last {served_times[-1] / max(served_times[0], 0.001):.1f}x later than the first: "
            "requests queue instead of being rejected)" if queued else "")
    else:
        outcome, passed = "errors", False
        detail = f"unexpected answers: {statuses}"
    return AuthCheck("burst", passed, limited[0][0] if limited else (200 if served else None), round(wall, 4),
                     redact(detail), {"outcome": outcome, "requests": n, "statuses": statuses,
                                      "served": len(served), "limited": len(limited),
                                      "retry_after": len(with_retry), "hung": len(hung), "other": len(other),
                                      "served_elapsed_s": [round(t, 4) for t in served_times]})


def _evidence(result: AuthCheckResult) -> dict[str, Any]:
    evidence: dict[str, Any] = {c.name: {"passed": c.passed, "status": c.status, "elapsed_s": c.elapsed_s,
                                         "detail": c.detail} for c in result.checks}
    burst = result.check("burst")
    if burst is not None:
        outcome = burst.data.get("outcome")
        evidence["burst_outcome"] = outcome
        evidence["rate_limit_missing"] = outcome in ("queued", "hung")
    route = result.check("route_denied")
    if route is not None:
        evidence["admin_route_open"] = not route.passed
    return evidence


def auth_verdicts(result: AuthCheckResult) -> list[Verdict]:
    """``auth_missing`` when a request without or with invalid credentials was not rejected; else []."""
    failed = [c for c in result.checks if c.name in ("no_credentials", "invalid_credentials")
              and not c.data.get("rejected", False)]
    if not failed:
        return []
    names = " and ".join(c.name.replace("_", " ") for c in failed)
    return [Verdict(
        "auth_missing",
        f"the API accepts unauthenticated callers ({names} answered {', '.join(str(c.status) for c in failed)}): "
        "put an authenticated gateway in front",
        _evidence(result),
        "place an authenticated gateway or application proxy in front of the model API and point the tunnel at "
        "the gateway, not the model listener; it should verify callers, authorize routes and apply request and "
        "concurrency limits",
    )]


def auth_findings(result: AuthCheckResult) -> list[str]:
    """Informational lines for every check (printable: the token never appears)."""
    lines = [f"{'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}" for c in result.checks]
    burst = result.check("burst")
    if burst is not None and burst.data.get("outcome") in ("queued", "hung"):
        lines.append("rate_limit_missing: a burst over the limit is queued without bound instead of being "
                     "rejected with 429/503 and Retry-After")
    return lines
