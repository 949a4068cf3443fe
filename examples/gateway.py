"""Call a model server through ``otel-llm gateway``: one trace spans client, gateway and runtime.

The gateway checks a per-application key, queues and rate-limits in front of the runtime, and
traces each request as a SERVER span that continues the caller's ``traceparent``; its upstream
call is traced like any client call (phases, the runtime's counters). The instrumented client
below sees the gateway's share in the ``Server-Timing`` header (``llm.server_timing.*``).

With a gateway of your own (the key is printed once, on stderr, by keygen):

    otel-llm gateway keygen example --routes '/v1/*' >> keys.toml
    otel-llm gateway --upstream http://127.0.0.1:11434 --keys keys.toml &     # 127.0.0.1:8080
    OTEL_LLM_EXAMPLE_GATEWAY=http://127.0.0.1:8080 OTEL_LLM_EXAMPLE_KEY=olk_... \\
        python examples/gateway.py

Without ``OTEL_LLM_EXAMPLE_GATEWAY`` the example starts a gateway itself (a child process, with a
fresh key) in front of ``OTEL_LLM_EXAMPLE_URL`` (default: Ollama on http://127.0.0.1:11434):

    python examples/gateway.py && otel-llm view --last 2

Both processes send their spans where the ``OTEL_LLM_*`` / ``OTEL_EXPORTER_OTLP_*`` variables say
(by default both append to ``otel-llm-traces.jsonl``), so point them at the same backend to see
the whole trace.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import openai

import otel_llm

URL = os.environ.get("OTEL_LLM_EXAMPLE_URL", "http://127.0.0.1:11434")
MODEL = os.environ.get("OTEL_LLM_EXAMPLE_MODEL", "llama3.2")


@contextlib.contextmanager
def gateway() -> Iterator[tuple[str, str]]:
    """(gateway URL, key): the running gateway named by the environment, or one started here."""
    if os.environ.get("OTEL_LLM_EXAMPLE_GATEWAY"):
        yield os.environ["OTEL_LLM_EXAMPLE_GATEWAY"], os.environ["OTEL_LLM_EXAMPLE_KEY"]
        return
    from otel_llm.tools.gateway.process import GatewayProcess

    # one key, "example", allowed on the OpenAI-compatible routes only
    with GatewayProcess(URL, {"example": {"routes": ["/v1/*"]}}) as started:
        print(f"started otel-llm gateway on {started.url} in front of {URL}")
        yield started.url, started.secrets["example"]
    # leaving the block stops the gateway (SIGTERM): it flushes its spans first


def main() -> int:
    otel_llm.instrument(service_name="gateway-example")
    with gateway() as (gateway_url, key):
        # The key goes in "Authorization: Bearer <key>", which the openai client sends for api_key.
        # The gateway never forwards it upstream, and no span records it.
        client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=key)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello through the gateway."}],
            max_tokens=32, stream=True, stream_options={"include_usage": True})
        # auth, queue and upstream first byte, as measured by the gateway (milliseconds)
        print(f"Server-Timing: {raw.headers.get('server-timing')}")
        print("".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices))
    otel_llm.uninstrument()  # flush
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
