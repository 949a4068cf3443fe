"""``otel-llm gateway``: an authenticating, admission-controlled, streaming gateway in front of a
model server, traced with the same core so one trace spans client, gateway and runtime.

In its ``proxy`` role (``otel-llm proxy``; ``load_config({"role": "proxy", ...})``) the same
server records each relayed request as the model call itself and, without keys, serves loopback
callers without authentication.

    from otel_llm.tools.gateway import load_config, build_app
    app, providers = build_app(load_config({"upstream": "http://127.0.0.1:11434", "keys_file": "keys.toml"}))
    # any ASGI server: uvicorn.run(app)
"""

from __future__ import annotations

from otel_llm.tools.gateway.settings import ConfigError, GatewayConfig, KeyPolicy, load_config

__all__ = ["ConfigError", "GatewayConfig", "KeyPolicy", "build_app", "load_config"]


def build_app(config: GatewayConfig, **instrument_options: object) -> tuple[object, object]:
    """See :func:`otel_llm.tools.gateway.server.build_app`."""
    from otel_llm.tools.gateway.server import build_app as _build

    return _build(config, **instrument_options)
