"""What the gateway may change in a request it relays, when its settings ask: nothing by default.

``stream_usage``: an OpenAI-compatible stream (``/v1/chat/completions`` or ``/v1/completions``
with ``"stream": true``) that does not ask for the usage chunk gets
``stream_options.include_usage: true``. The runtime then ends the stream with one more event, the
usage chunk (``choices: []``), which carries the token counts and, from a vLLM run with
``--enable-per-request-metrics``, its per-request metrics: the relayed call's native counters.
The caller receives that event too.
"""

from __future__ import annotations

import json
from typing import Any

from otel_llm.parse import routes

__all__ = ["with_stream_usage"]

_OPENAI = (routes.API_OPENAI_CHAT, routes.API_OPENAI_COMPLETIONS)


def with_stream_usage(method: str, path: str, body: bytes) -> bytes | None:
    """``body`` asking for the usage chunk, or None when it is left as it is: not a POST to an
    OpenAI-compatible route, not one JSON object, not a stream, or already asking either way."""
    route = routes.match_route(path) if method == "POST" else None
    if route is None or route.api not in _OPENAI:
        return None
    try:
        payload: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or payload.get("stream") is not True:
        return None
    options = payload.get("stream_options")
    if options is None:
        options = payload["stream_options"] = {}
    if not isinstance(options, dict) or "include_usage" in options:
        return None  # the caller chose (or sent something this does not understand): its choice stands
    options["include_usage"] = True
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
