"""``otel_llm.gateway``: kept as an import path; the gateway lives in :mod:`otel_llm.tools.gateway`.

    from otel_llm.gateway import load_config, build_app

The SDK itself never imports this module (it needs the ``[gateway]`` extra).
"""

from __future__ import annotations

from otel_llm.tools.gateway import ConfigError, GatewayConfig, KeyPolicy, build_app, load_config

__all__ = ["ConfigError", "GatewayConfig", "KeyPolicy", "build_app", "load_config"]
