"""Run the gateway: its telemetry (core instrumentation included) and uvicorn."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import uuid
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
SDK_OWN_METRICS = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"
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
    """Serve until SIGINT/SIGTERM; in-flight requests get a few seconds to finish. With
    ``workers`` above 1, that many processes serve the port, each on a listening socket of its
    own (``SO_REUSEPORT``: the kernel spreads connections evenly, where one shared socket piles
    them onto a few workers), and one that dies is replaced."""
    command = f"otel-llm {config.role}"
    try:
        import uvicorn  # noqa: F401 - before binding: a missing extra is said first
    except ImportError:
        print(f"{command} needs uvicorn: pip install 'otel-llm[gateway]'", file=sys.stderr)
        return 2
    # What the span pipeline drops (a full queue, an exporter that is down) is counted by the SDK's
    # own metrics (otel.sdk.processor.span.processed with error.type, otel.sdk.exporter.span.*),
    # exported with the gateway's; the SDK logs the first drop. The variable set to false turns them off.
    os.environ.setdefault(SDK_OWN_METRICS, "true")
    try:
        sockets = _listen_all(config.listen_host, config.listen_port, config.workers)
    except OSError as exc:
        print(f"{command}: cannot listen on {config.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    host, port = sockets[0].getsockname()[:2]
    if config.authenticates:
        detail = (f"{len(config.keys)} key(s), {config.max_concurrency} upstream slot(s), queue {config.max_queue} "
                  f"for {config.max_queue_wait:g} s")
    else:
        detail = "no authentication: loopback only"
    if config.workers > 1:
        detail += f"; {config.workers} workers, limits apply in each"
    if config.workers == 1:
        app, _ = build_app(config)
        _announce(command, host, port, config, detail)
        return _serve_one(config, app, sockets[0])
    _announce(command, host, port, config, detail)
    return _Supervisor(command, config, sockets).run()


def _announce(command: str, host: str, port: int, config: GatewayConfig, detail: str) -> None:
    print(f"{command}: listening on http://{_url_host(host)}:{port} -> {config.upstream} ({detail})",
          file=sys.stderr, flush=True)


def _serve_one(config: GatewayConfig, app: Gateway, sock: socket.socket) -> int:
    """One worker: uvicorn on ``sock`` until a signal stops it."""
    import uvicorn

    from otel_llm.tools.gateway.edge import EdgeLimits, edge_protocol

    limits = EdgeLimits(MAX_HEADER_BYTES, config.header_timeout, config.max_connections,
                        config.max_connections_per_client)
    server_config = uvicorn.Config(
        app, lifespan="on", access_log=False, server_header=False, date_header=False, log_level="warning",
        timeout_graceful_shutdown=5, http=edge_protocol(limits), timeout_keep_alive=config.idle_timeout,  # type: ignore[arg-type]
        proxy_headers=False,  # the gateway is the edge: the client is the TCP peer, not a header
    )
    # uvicorn restores this handler after draining and re-raises the SIGTERM it caught: a
    # requested, completed graceful stop then exits 0 instead of dying by the signal.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.Server(server_config).run(sockets=[sock])  # telemetry is flushed at lifespan shutdown
    return 0


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


class _Supervisor:
    """Forks the workers (before any telemetry thread exists: each builds its own providers),
    replaces one that exits while serving, and passes SIGTERM/SIGINT on to all of them.

    Each worker keeps its listening socket in this process too, so a replacement takes over the
    connections queued on it: only the requests the dead worker was serving are lost."""

    RESTART_DELAY = 1.0  # seconds before replacing a worker that died within its first seconds
    STOP_GRACE = 15.0  # seconds the workers get to drain before they are killed

    def __init__(self, command: str, config: GatewayConfig, sockets: list[socket.socket]) -> None:
        self.command, self.config, self.sockets = command, config, sockets
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, started)
        self.stopping = False
        self._deadline = 0.0

    def run(self) -> int:
        for index in range(len(self.sockets)):
            self._start(index)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG if self.stopping else 0)
            except ChildProcessError:
                break
            if pid == 0:  # stopping: poll until the deadline
                if time.monotonic() > self._deadline:
                    for child in self.children:
                        _signal(child, signal.SIGKILL)
                time.sleep(0.05)
                continue
            index, started = self.children.pop(pid)
            if self.stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            print(f"{self.command}: worker {index} (pid {pid}) {how}; starting another", file=sys.stderr, flush=True)
            if time.monotonic() - started < self.RESTART_DELAY * 5:
                time.sleep(self.RESTART_DELAY)  # a worker that cannot start must not spin
            if not self.stopping:
                self._start(index)
        return 0

    def _start(self, index: int) -> None:
        pid = os.fork()
        if pid:
            self.children[pid] = (index, time.monotonic())
            return
        code = 1
        try:  # the worker: never returns into the supervisor's loop
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for other, sock in enumerate(self.sockets):
                if other != index:
                    sock.close()
            _distinct_instance()
            app, _ = build_app(self.config)
            code = _serve_one(self.config, app, self.sockets[index])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _stop(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            self.stopping = True
            self._deadline = time.monotonic() + self.STOP_GRACE
            for pid in self.children:
                _signal(pid, signal.SIGTERM)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _distinct_instance() -> None:
    """Each worker is its own ``service.instance.id`` (unless the user named the instance), so a
    backend keeps the workers' cumulative metrics apart instead of taking them for one series."""
    variable = "OTEL_RESOURCE_ATTRIBUTES"
    current = os.environ.get(variable, "")
    if "service.instance.id=" in current:
        return
    instance = f"service.instance.id={uuid.uuid4()}"
    os.environ[variable] = f"{current},{instance}" if current.strip() else instance


def _listen_all(host: str, port: int, workers: int) -> list[socket.socket]:
    """One listening socket per worker, all on one port (the first one's, when ``port`` is 0)."""
    first = _listen(host, port, reuse_port=workers > 1)
    sockets = [first]
    try:
        for _ in range(workers - 1):
            sockets.append(_listen(host, first.getsockname()[1], reuse_port=True))
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """Bind here rather than in uvicorn, so port 0 works and the real port can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto is TCP.
    # Without it Nagle holds each write that follows an unacknowledged one (a body after its
    # head, a frame after the last) until the client's delayed ACK: up to 40 ms per answer.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

