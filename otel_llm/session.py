"""The instrumentation session ``otel_llm.instrument()`` starts: one per process.

A :class:`Session` owns what a process's model calls are recorded with: the tracer and meter
providers (``export.providers``, the one builder), the observers, the sink capture hands calls
to (``telemetry.calls.Telemetry``) and capture's hooks, and it ends them in order. The tools
(``otel-llm`` gateway, proxy, bench, diagnose) reach otel_llm through it:
``otel_llm.current_session()``, its providers and tracer, :meth:`Session.relaying_sink` and
:meth:`Session.watch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

    from otel_llm.capture.call import CallSink
    from otel_llm.config import Options
    from otel_llm.export.providers import Providers
    from otel_llm.observers.manager import Observers
    from otel_llm.telemetry.calls import Telemetry
    from otel_llm.telemetry.sampling import Sampler

__all__ = ["Session"]


class Session:
    """The providers, observers, sink and hooks of one instrumentation, from start to stop."""

    def __init__(self, options: Options) -> None:
        from otel_llm.config import genai_semconv
        from otel_llm.export.providers import build_providers
        from otel_llm.telemetry.calls import CallSettings, Telemetry

        self.options = options
        self.providers: Providers = build_providers(options)
        self.observers: Observers | None = _start_observers(options, self.providers.meter_provider)
        settings = CallSettings(options.capture_content, options.runtimes, options.llm_routes, genai_semconv(),
                                _sampler(options), options.record_suppressed, options.chunk_metric,
                                options.beside_genai)
        self.telemetry: Telemetry = Telemetry(self.providers.tracer_provider, self.providers.meter_provider,
                                              settings, self.observers)
        self.active = False

    @property
    def sampler(self) -> Sampler | None:
        """The keep decision after each call when ``sample_rate`` is set, else None."""
        return self.telemetry.sampler

    @property
    def tracer_provider(self) -> TracerProvider:
        return self.providers.tracer_provider

    @property
    def meter_provider(self) -> MeterProvider:
        return self.providers.meter_provider

    def tracer(self) -> Tracer:
        """otel_llm's own tracer (its instrumentation scope) on the session's tracer provider."""
        return self.telemetry.tracer

    def sink(self) -> CallSink | None:
        """The sink of model calls while the session runs, else None (capture's getter)."""
        return self.telemetry if self.active else None

    def relaying_sink(self) -> Telemetry:
        """A sink for calls this process relays for callers that may record them too (the
        gateway's upstream calls), beside the session's own; see ``Telemetry.relaying_sink``."""
        return self.telemetry.relaying_sink()

    def watch(self, url: str) -> None:
        """Have the observers watch the model server at ``url`` before any call to it, so its
        runtime is recognized before the first call ends. Never raises."""
        self.telemetry.watch(url)

    def start(self) -> None:
        """Hook the HTTP stacks: from now on model calls are recorded."""
        from otel_llm.capture import install

        self.active = True
        install.activate(self.sink)

    def stop(self) -> None:
        """Unhook, stop the observers, flush and shut down the providers otel_llm created."""
        from otel_llm.capture import install

        self.active = False
        install.deactivate()
        if self.observers is not None:
            self.observers.stop()
        self.providers.shutdown()

    def end(self) -> None:
        """At process exit: end the calls still open, then flush and shut down the providers."""
        from otel_llm.capture import install

        if self.active:
            install.end_calls(1.0)
        self.providers.shutdown()


def _sampler(options: Options) -> Sampler | None:
    """The keep decision after each call, when ``sample_rate`` is set (else every call is kept)."""
    if options.sample_rate is None:
        return None
    from otel_llm.telemetry.sampling import Sampler

    return Sampler(options.sample_rate, options.sample_keep, options.slow_ttft, options.slow_duration)


def _start_observers(options: Options, meter_provider: Any) -> Observers | None:
    if not (options.host_metrics or options.gpu_metrics or options.runtime_metrics):
        return None
    from urllib.parse import urlsplit

    from otel_llm.observers.manager import Observers

    runtimes = {}
    for base, name in options.runtimes.items():
        parts = urlsplit(base)
        if parts.hostname:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            runtimes[(parts.hostname, port, parts.scheme or "http")] = name
    return Observers(meter_provider, host=options.host_metrics, gpu=options.gpu_metrics,
                     runtime=options.runtime_metrics, interval=options.sample_interval, runtimes=runtimes,
                     poll=options.poll_runtimes)

