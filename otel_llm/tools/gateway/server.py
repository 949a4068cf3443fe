"""Run the gateway: its telemetry (core instrumentation included) and uvicorn."""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any

import otel_llm
from otel_llm.config import ENV_VARS as CORE_ENV_VARS
from otel_llm.tools.gateway.app import MAX_HEADER_BYTES, Gateway
from otel_llm.tools.gateway.settings import PROXY, ConfigError, GatewayConfig
from otel_llm.tools.gateway.server_telemetry import GatewayTelemetry, access_logger
from otel_llm.capture.call import CallSink
from otel_llm import current_session

__all__ = ["build_app", "serve"]

DEFAULT_SERVICE_NAME = "otel-llm-gateway"
PROXY_SERVICE_NAME = "otel-llm-proxy"


def _upstream_key(config: GatewayConfig) -> str | None:
    if not config.upstream_key_env:
        return None
    value = os.environ.get(config.upstream_key_env)
    if not value:
        raise ConfigError(f"upstream_key_env names ${config.upstream_key_env}, which is not set")
    return value


def build_app(config: GatewayConfig, **instrument_options: Any) -> tuple[Gateway, Any]:
    """The ASGI app and the providers behind its telemetry (flushed at lifespan shutdown, when the
    session that owns them stops).

    The core instrumentation is switched on in this process and the gateway records with its
    session's providers, so the upstream call becomes a child of the gateway's SERVER span. As the
    proxy (``role`` "proxy") that call is recorded as the caller's own (not marked relayed), with the summary line an
    instrumented application prints."""
    proxy = config.role == PROXY
    defaults: dict[str, Any] = {}
    if not os.environ.get(CORE_ENV_VARS["service_name"]):
        defaults["service_name"] = PROXY_SERVICE_NAME if proxy else DEFAULT_SERVICE_NAME
    if not os.environ.get(CORE_ENV_VARS["console_summary"]) and not proxy:
        defaults["console_summary"] = False  # the access log already has one line per request
    options = {**defaults, **instrument_options}
    runtimes = {config.upstream.rstrip("/"): config.runtime} if config.runtime else None
    otel_llm.instrument(**{**options, **({"runtimes": runtimes} if runtimes else {})})
    session = current_session()
    if session is None:  # instrument() always leaves a session; the type checker cannot know
        raise RuntimeError("otel_llm.instrument() left no session")
    session.watch(config.upstream)  # its runtime is recognized before the first request ends (vLLM)
    call_sink = session.sink
    if not proxy:
        relay = session.relaying_sink()

        def call_sink() -> CallSink | None:
            return relay if session.active else None
    providers = session.providers
    key = _upstream_key(config)
    holder: dict[str, Gateway] = {}
    telemetry = GatewayTelemetry(providers.tracer_provider, providers.meter_provider,
                                 access_logger(config.access_log, config.access_log_max_bytes,
                                               config.access_log_backups),
                                 (lambda: holder["app"].admission.depth) if config.authenticates else None,
                                 user_agent=proxy, sampler=session.sampler)
    app = holder["app"] = Gateway(config, telemetry, key, on_shutdown=[otel_llm.uninstrument],
                                  call_sink=call_sink)
    return app, providers


def serve(config: GatewayConfig) -> int:
    """Serve until SIGINT/SIGTERM; in-flight requests get a few seconds to finish."""
    command = f"otel-llm {config.role}"
    try:
        import uvicorn
    except ImportError:
        print(f"{command} needs uvicorn: pip install 'otel-llm[gateway]'", file=sys.stderr)
        return 2
    try:
        sock = _listen(config.listen_host, config.listen_port)
    except OSError as exc:
        print(f"{command}: cannot listen on {config.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    app, providers = build_app(config)
    from otel_llm.tools.gateway.edge import EdgeLimits, edge_protocol

    limits = EdgeLimits(MAX_HEADER_BYTES, config.header_timeout, config.max_connections,
                        config.max_connections_per_client)
    server_config = uvicorn.Config(
        app, lifespan="on", access_log=False, server_header=False, date_header=False, log_level="warning",
        timeout_graceful_shutdown=5, http=edge_protocol(limits), timeout_keep_alive=config.idle_timeout,  # type: ignore[arg-type]
        proxy_headers=False,  # the gateway is the edge: the client is the TCP peer, not a header
    )
    host, port = sock.getsockname()[:2]
    if config.authenticates:
        detail = (f"{len(config.keys)} key(s), {config.max_concurrency} upstream slot(s), queue {config.max_queue} "
                  f"for {config.max_queue_wait:g} s")
    else:
        detail = "no authentication: loopback only"
    print(f"{command}: listening on http://{_url_host(host)}:{port} -> {config.upstream} ({detail})",
          file=sys.stderr, flush=True)
    # uvicorn restores this handler after draining and re-raises the SIGTERM it caught: a
    # requested, completed graceful stop then exits 0 instead of dying by the signal.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.Server(server_config).run(sockets=[sock])  # telemetry is flushed at lifespan shutdown
    return 0


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _listen(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn, so port 0 works and the real port can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto is TCP.
    # Without it Nagle holds each write that follows an unacknowledged one (a body after its
    # head, a frame after the last) until the client's delayed ACK: up to 40 ms per answer.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

