"""What each model server is doing, polled in the background: queue, KV cache, loaded models, and
the served model for each call (see docs/observers.md: what is polled, from which servers, and
how a failing endpoint backs off).

``RuntimeStateObserver`` polls, from its own daemon thread, the servers of the ``ServerRegistry``
that its ``PollPolicy`` allows, and keeps what it found in memory: the OpenTelemetry callbacks and
the per-call reads (``latest_state``, ``model_of``, ``runtime_of``) read that memory only. Its
parts: the HTTP client (``_runtime_client``), the pace and back-off (``_runtime_schedule``), the
re-emitted Prometheus series (``_runtime_prometheus``) and their normalized state
(``_runtime_normalize``), the instruments of fixed name (``_runtime_gauges``), Ollama's
``/api/ps`` (``_ollama_ps``) and the model metadata (``_runtime_models``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import Meter

from otel_llm._log import logger
from otel_llm._types import Attributes
from otel_llm.observers import _runtime_gauges, _runtime_models
from otel_llm.observers._ollama_ps import PATH_PS, NotItsFormat, parse_ps
from otel_llm.observers._runtime_client import PollClient, http_suppressed
from otel_llm.observers._runtime_normalize import NORMALIZED_SOURCES, infer_runtime, normalize
from otel_llm.observers._runtime_prometheus import Reemitter, names_in, otel_name, samples
from otel_llm.observers._runtime_schedule import IDLE_INTERVAL, MAX_FAILURES, MAX_SLEEP, Backoff
from otel_llm.observers._runtime_server import ServerState, server_attrs
from otel_llm.observers.activity import Activity
from otel_llm.observers.poll_policy import PollPolicy
from otel_llm.observers.registry import Server, ServerRegistry
from otel_llm.parse import runtimes as rt
from otel_llm.parse.runtimes import ollama
from otel_llm.runtimes import OBSERVED
from otel_llm.semconv import (  # noqa: F401 - names callers import from here too
    METRIC_RUNTIME_REQUESTS_RUNNING, METRIC_RUNTIME_REQUESTS_WAITING,
    METRIC_RUNTIME_KV_CACHE_USAGE, METRIC_RUNTIME_MODEL_LOADED, METRIC_RUNTIME_MODEL_MEMORY,
    METRIC_RUNTIME_MODEL_EXPIRES_IN, LLM_RUNTIME_MEMORY_LOCATION,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "IDLE_INTERVAL", "MAX_FAILURES", "MAX_SLEEP", "NORMALIZED_SOURCES", "PATH_METRICS", "PATH_PS",
    "STATE_KV_CACHE_USAGE", "STATE_MODELS_LOADED", "STATE_REQUESTS_RUNNING", "STATE_REQUESTS_WAITING",
    "STATE_TIMESTAMP", "RuntimeStateObserver", "otel_name",
]
# imported from here by tests that check a runtime's series against its declaration
_infer_runtime, _normalize, _samples, _names_in = infer_runtime, normalize, samples, names_in

# keys of latest_state()
STATE_REQUESTS_RUNNING = rt.STATE_REQUESTS_RUNNING
STATE_REQUESTS_WAITING = rt.STATE_REQUESTS_WAITING
STATE_KV_CACHE_USAGE = rt.STATE_KV_CACHE_USAGE
STATE_MODELS_LOADED = "models.loaded"
STATE_TIMESTAMP = "timestamp"

PATH_METRICS = "/metrics"
# the state routes of each runtime (its module's OBSERVED); of an unknown one, both
_PATHS: dict[str | None, tuple[str, ...]] = {name: o.state_paths for name, o in OBSERVED.items()}
_ABSENT_STATUS = frozenset({404, 405, 501})
# The server refuses unauthenticated polls (e.g. behind `otel-llm gateway`): stop at once.
_REFUSED_STATUS = frozenset({401, 403})


class RuntimeStateObserver:
    """Polls the registry's model servers for their state; see the module docstring."""

    def __init__(self, meter: Meter, registry: ServerRegistry, interval: float = 5.0,
                 client: httpx.Client | None = None, activity: Activity | None = None,
                 policy: PollPolicy | None = None) -> None:
        self._registry = registry
        self.policy = policy or PollPolicy()
        self.interval = interval
        self.activity = activity  # when given, polls slow to IDLE_INTERVAL while no call is made
        self._stop = threading.Event()
        self._client = PollClient(client, stopped=self._stop.is_set)
        self._states: dict[tuple[str, int], ServerState] = {}
        self._recognized: dict[tuple[str, int], str] = {}  # server -> runtime, see runtime_of
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._logged: set[tuple[Any, ...]] = set()
        self._thread: threading.Thread | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._reemitter = Reemitter(meter, lambda: [s.series for s in list(self._states.values())], self._log_once)
        _runtime_gauges.register(meter, lambda: list(self._states.items()), self._reemitter)

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Poll now and then every ``interval`` seconds, from a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="otel_llm-runtime-state", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop polling (waits up to ``timeout`` s for a poll in progress)."""
        self._stop.set()
        self._registry.changed.set()
        if self.activity is not None:
            self.activity.wake()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._client.close()

    def _run(self) -> None:
        changed = self._registry.changed
        while not self._stop.is_set():
            changed.clear()
            self.poll_once()
            # no wake-up while every endpoint is backed off; a newly noted server ends the wait
            wait = max(self.interval, min(self._next_due(), MAX_SLEEP))
            if self.activity is not None and self.activity.idle():
                # the gauges stay fresh enough for a dashboard; the next call wakes the poller
                self.activity.rest(max(wait, IDLE_INTERVAL))
            elif changed.wait(wait) and not self._stop.is_set():
                # a newly noted server: recognized at once (from /proc, no request), so that even
                # the first call to it names its runtime; polled one interval after its first
                # call, as when the poller woke every interval (not in the middle of that call)
                self._recognize(self._pollable())
                self._stop.wait(self.interval)

    def _next_due(self) -> float:
        """Seconds until an endpoint of a registered server is due for a poll (0: now)."""
        now = self._clock()
        soonest = math.inf
        for server in self._pollable():
            state = self._states.get((server.host, server.port))
            if state is None or state.generation != self.policy.generation(server.host, server.port):
                return 0.0
            if self._model_pending(state):
                return 0.0  # its model metadata is still to be read (the wait is one interval at least)
            soonest = min(soonest, state.backoff.due_in(_PATHS.get(server.runtime, (PATH_PS, PATH_METRICS)), now))
            if soonest <= 0:
                return 0.0
        return soonest

    # -- polling --------------------------------------------------------------------------------
    def _pollable(self) -> list[Server]:
        """The registry's servers that the policy allows; none if it fails (never poll by mistake)."""
        try:
            with self._poll_lock:
                return self.policy.pollable(self._registry.servers())
        except Exception:
            self._log_once(("policy",), "choosing the servers to poll failed; polling none",
                           logging.WARNING, exc_info=True)
            return []

    def poll_once(self) -> None:
        """Poll every server the policy allows once (endpoints backing off are skipped). Never raises."""
        servers = self._pollable()
        self._forget_unpolled({(s.host, s.port) for s in servers})
        # an application's own HTTP instrumentation (opentelemetry-instrumentation-httpx) would
        # trace every poll: these requests are ours, not the application's
        with self._poll_lock, http_suppressed():
            for server in servers:
                if self._stop.is_set():
                    return
                try:
                    self._poll_server(server)
                except Exception:
                    self._log_once((server, "bug"), f"polling {server.base_url} failed unexpectedly",
                                   logging.WARNING, exc_info=True)
        self._recognize(servers)

    def runtime_of(self, host: str, port: int) -> str | None:
        """The runtime the server at host:port was recognized as: from its process (/proc) or
        its own answers (``/metrics`` names, ``/api/ps``); None until then, or when it is not
        polled. Reads memory only: cheap enough for every call."""
        return self._recognized.get((host, port))

    def _recognize(self, servers: list[Server]) -> None:
        """Remember what each pollable server is: its own answers, else what the policy found."""
        recognized: dict[tuple[str, int], str] = {}
        for server in servers:
            state = self._states.get((server.host, server.port))
            runtime = (state.runtime if state is not None else None) or server.runtime
            if runtime is not None:
                recognized[(server.host, server.port)] = runtime
        self._recognized = recognized  # replaced whole: readers on other threads see one or the other

    def _forget_unpolled(self, polled: set[tuple[str, int]]) -> None:
        """A server the policy no longer allows (its runtime process went away) reports nothing
        stale; its endpoints keep their failure counts."""
        for key, state in list(self._states.items()):
            if key not in polled and (state.series or state.normalized or state.models or state.latest
                                      or state.model):
                state.series, state.normalized, state.models, state.latest = {}, {}, (), {}
                state.model, state.model_read = None, None

    def _poll_server(self, server: Server) -> None:
        key = (server.host, server.port)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = ServerState(runtime=server.runtime)
        generation = self.policy.generation(*key)
        if generation != state.generation:  # another runtime process listens there now: afresh
            state.generation, state.backoff = generation, Backoff()
            state.unreachable = False
        if server.runtime is not None:
            state.runtime = server.runtime
        fresh: dict[str, Any] = {}
        for path in _PATHS.get(server.runtime, (PATH_PS, PATH_METRICS)):
            if state.backoff.waiting(path, self._clock()):
                continue
            if path == PATH_PS:
                fresh.update(self._poll_ps(server, state))
            else:
                fresh.update(self._poll_metrics(server, state))
        # whatever its state route answered (llama-server serves /metrics only with --metrics),
        # unless the server did not answer at all; a metadata route that fails is not asked again
        if state.runtime in _runtime_models.READ_ONCE and not state.unreachable:
            _runtime_models.read(state, generation, lambda: self._metadata_routes(server, state))
        if fresh:
            base = {STATE_REQUESTS_RUNNING: None, STATE_REQUESTS_WAITING: None, STATE_KV_CACHE_USAGE: None}
            state.latest = {**base, **fresh, STATE_TIMESTAMP: time.perf_counter_ns()}

    _model_pending = staticmethod(_runtime_models.pending)

    def _metadata_routes(self, server: Server, state: ServerState) -> _runtime_models.MetadataRoutes:
        return _runtime_models.MetadataRoutes(
            lambda path: self._fetch(server, state, path, "application/json", metadata=True),
            lambda path: self._not_its_format(server, state, path, "not JSON", at_once=True),
            state.backoff, self._clock)

    def _poll_ps(self, server: Server, state: ServerState) -> dict[str, Any]:
        body = self._fetch(server, state, PATH_PS, "application/json")
        models = None
        if body is not None:
            try:
                models = parse_ps(body)
            except NotItsFormat as exc:
                self._not_its_format(server, state, PATH_PS, str(exc))
        if models is None:
            state.models = ()
            return {}
        state.backoff.succeeded(PATH_PS)
        if state.runtime is None:
            state.runtime = "ollama"
        state.models = tuple(models)
        return {STATE_MODELS_LOADED: tuple(m.name for m in models)}

    def _poll_metrics(self, server: Server, state: ServerState) -> dict[str, Any]:
        body = self._fetch(server, state, PATH_METRICS, "text/plain; version=0.0.4")
        families, text = None, ""
        if body is not None:
            try:
                from prometheus_client.parser import text_string_to_metric_families

                text = body.decode("utf-8", errors="replace")
                families = list(text_string_to_metric_families(text))
            except Exception as exc:
                self._not_its_format(server, state, PATH_METRICS, f"malformed Prometheus text ({exc})")
        if families is None:
            state.series, state.normalized = {}, {}
            return {}
        state.backoff.succeeded(PATH_METRICS)
        found = samples(families, names_in(text))
        if state.runtime is None:
            state.runtime = infer_runtime(found)
        state.normalized = normalize(found)
        state.series = self._reemitter.series(found, server_attrs(server, state.runtime), server.base_url)
        return dict(state.normalized)

    def _fetch(self, server: Server, state: ServerState, path: str, accept: str,
               metadata: bool = False) -> bytes | None:
        """The body of a 2xx answer, or None (the failure counted for the endpoint's back-off).
        ``metadata``: a metadata route, read once per process: a refusal, an absent route or a
        refused connection stops it at once (a 503 or a timeout is backed off)."""
        import httpx  # imported by the first poll, not by instrument()

        try:
            response = self._client.get(f"{server.base_url}{path}", accept)
        except httpx.HTTPError as exc:
            if not metadata:
                state.unreachable = True
            transient = isinstance(exc, httpx.TimeoutException)
            self._failed(server, state, path, f"unreachable ({type(exc).__name__})",
                         at_once=metadata and not transient)
            return None
        except RuntimeError:
            if self._stop.is_set():  # stop() closed the client during this poll
                return None
            raise
        if not metadata:
            state.unreachable = False
        status = response.status_code
        if status in _REFUSED_STATUS:
            self._failed(server, state, path, f"answered {status} (it needs credentials)",
                         level=logging.INFO, at_once=True)
        elif status in _ABSENT_STATUS:
            why = " (llama-server needs --metrics)" if state.runtime == "llama.cpp" and path == PATH_METRICS else ""
            level = logging.INFO if server.runtime is not None else logging.DEBUG
            self._failed(server, state, path, f"answered {status}{why}", level=level, at_once=metadata)
        elif not response.is_success:
            self._failed(server, state, path, f"answered HTTP {status}", at_once=metadata and status != 503)
        else:
            return response.content
        return None

    def _not_its_format(self, server: Server, state: ServerState, path: str, problem: str,
                        at_once: bool = False) -> None:
        """A 2xx answer that is not the runtime's format: a failure like any other (quietly for an
        unknown runtime, which was only probing)."""
        level = logging.DEBUG if server.runtime is None else logging.WARNING
        self._failed(server, state, path, problem, level=level, at_once=at_once)

    def _failed(self, server: Server, state: ServerState, path: str, problem: str,
                level: int = logging.WARNING, at_once: bool = False) -> None:
        """Back the endpoint off; when that stops it, one log line."""
        if state.backoff.failed(path, self._clock(), self.interval, at_once):
            after = "" if at_once else f" after {state.backoff.failures[path]} consecutive failures"
            self._log_once((server.host, server.port, path, "stopped", state.generation),
                           f"runtime state: {server.base_url}{path}: {problem}; no longer polled{after}", level)

    # -- per call -------------------------------------------------------------------------------
    def model_of(self, host: str, port: int, model: str | None = None) -> rt.ModelInfo | None:
        """What the runtime at host:port says about its model (``/props``, ``/v1/models``; Ollama:
        the loaded model ``model`` runs on, from the latest ``/api/ps``); None until it was read,
        or where no route says. Reads memory only."""
        state = self._states.get((host, port))
        if state is None:
            return None
        if state.model is not None or not state.models:
            return state.model
        return ollama.loaded_model([m.info for m in state.models if m.info is not None], model)

    def latest_state(self, host: str, port: int) -> Attributes:
        """The newest polled state of a server: ``requests.running``, ``requests.waiting``,
        ``kv_cache.usage`` (None when not reported), ``models.loaded`` (Ollama) and ``timestamp``
        (perf_counter_ns of that poll). Empty before the first successful poll."""
        state = self._states.get((host, port))
        return dict(state.latest) if state is not None else {}

    def _log_once(self, key: tuple[Any, ...], message: str, level: int = logging.WARNING,
                  exc_info: bool = False) -> None:
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        logger.log(level, "otel_llm: %s", message, exc_info=exc_info)
