"""What each model server is doing, polled in the background: queue, KV cache, loaded models.

``RuntimeStateObserver`` polls the servers of the ``ServerRegistry`` that its ``PollPolicy``
allows (see ``poll_policy``: by default only runtimes the user named and local processes /proc
identifies as runtimes) from its own daemon thread (1 s timeouts) and keeps the newest state in
memory; the OpenTelemetry callbacks and ``latest_state`` only read that memory.

What is polled, by runtime:

* ``ollama``: ``GET /api/ps`` -> ``llm.runtime.model.loaded`` (1 per model),
  ``llm.runtime.model.memory`` (By, ``llm.runtime.memory.location`` = total | vram),
  ``llm.runtime.model.expires_in`` (s, computed at collection time, 0 once past).
* ``llama.cpp`` (needs ``--metrics``), ``vllm``, ``tgi``, ``sglang``: ``GET /metrics``.
* unknown runtime (None): both; an endpoint that is absent is backed off (below). A server
  answering ``/api/ps`` with ``{"models": [...]}`` is treated as Ollama.
* ``lmstudio``: nothing (it has neither endpoint).

Model metadata. Once a server's runtime is known (llama.cpp, vLLM, LM Studio: from its process or
from its answers), its metadata route is read once per runtime process (``parse.runtimes.model_info``:
llama.cpp ``GET /props``, vLLM ``GET /v1/models``, LM Studio ``GET /api/v0/models``): the context
length, model file or name, quantization and slots, which ``model_of`` hands to each call
(``llm.model.*`` and the call's context pressure); Ollama's comes with each ``/api/ps`` poll
(context length, quantization, size and size in VRAM). The route does not depend on the state
route: it is read whether that answers, is absent (llama-server without ``--metrics``) or refuses
the poll; only while the state route finds the server unreachable (refused connection, timeout)
is it not asked. It is asked at polls until it names the model (LM Studio lists it once loaded),
at most ``MAX_FAILURES`` times per runtime process. A metadata route that refuses or lacks the
request (any 4xx, or a 5xx other than 503), refuses the connection or answers something that is
not JSON is not asked again for that process (one log line); a 503 (a server still loading its
model) or a timeout is backed off like a state route's failure.

Prometheus re-emission. Parsed with ``prometheus_client.parser``. Every finite numeric sample is
re-emitted as an observable instrument named after the *sample* with ``:`` replaced by ``.``
(``llamacpp:requests_processing`` -> ``llamacpp.requests_processing``,
``vllm:prompt_tokens_total`` -> ``vllm.prompt_tokens_total``, ``tgi_queue_size`` unchanged; a
counter keeps the name as written, without the ``_total`` the parser appends to TGI's counters);
leading ``_``/``.`` are dropped and a name OpenTelemetry rejects is skipped. Labels become
attributes, plus ``server.address``, ``server.port`` and ``llm.runtime.name``. Counters ->
ObservableCounter; gauges, untyped, info and stateset -> ObservableGauge; histograms and
summaries -> their ``_sum`` and ``_count`` as ObservableCounters (buckets and quantiles are
skipped: they multiply series and cannot become an OTel histogram from a callback);
``_created`` timestamps are skipped. Instruments are created the first time a name is seen; the
first kind seen for a name is kept for the process (OTel forbids re-creating a name with another
kind) and a series that later arrives with another kind is dropped, logged once.

Normalized gauges (``llm.runtime.requests.running`` / ``.waiting`` / ``llm.runtime.kv_cache.usage``)
come from the first series present in ``NORMALIZED_SOURCES``; counts are summed over label sets
(vLLM data-parallel engines), the KV-cache usage (0..1) is averaged.

Failures. Each endpoint (server and path) backs off on its own: after a failure (connection
refused, timeout, any 4xx or 5xx answer, a body that is not the runtime's format) the next poll
of it waits ``interval`` seconds, then twice as long after each further consecutive failure, and
after ``MAX_FAILURES`` consecutive failures the endpoint is no longer polled, with one log line.
A 401 or 403 stops it at once: the poller has no credentials, and an authenticating gateway must
not be hammered. There is never an immediate retry. A success resets the count; a failed
endpoint's series stop being reported until it answers again. When the policy finds another
runtime process listening at a server (a restarted runtime), its endpoints start afresh.

The polls are not model routes, so otel_llm's own instrumentation ignores them, and they run with
OpenTelemetry's HTTP instrumentation suppressed (no span per poll from an application's
opentelemetry-instrumentation-httpx). The client ignores proxy settings (``trust_env=False``).
It is created, and httpx and the Prometheus parser are imported, at the first poll: a process
that never reaches a pollable server never imports them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_llm import semconv as sc
from otel_llm._log import logger
from otel_llm._types import Attributes
from otel_llm.observers.activity import Activity
from otel_llm.observers.poll_policy import PollPolicy
from otel_llm.observers.registry import Server, ServerRegistry
from otel_llm.parse.runtimes import MODEL_RUNTIMES, OBSERVED, model_info, ollama
from otel_llm.parse import runtimes as rt

if TYPE_CHECKING:
    import httpx

from otel_llm.semconv import (  # noqa: F401 - names callers import from here too
    METRIC_RUNTIME_REQUESTS_RUNNING, METRIC_RUNTIME_REQUESTS_WAITING,
    METRIC_RUNTIME_KV_CACHE_USAGE, METRIC_RUNTIME_MODEL_LOADED, METRIC_RUNTIME_MODEL_MEMORY,
    METRIC_RUNTIME_MODEL_EXPIRES_IN, LLM_RUNTIME_MEMORY_LOCATION,
)

# keys of latest_state()
STATE_REQUESTS_RUNNING = rt.STATE_REQUESTS_RUNNING
STATE_REQUESTS_WAITING = rt.STATE_REQUESTS_WAITING
STATE_KV_CACHE_USAGE = rt.STATE_KV_CACHE_USAGE
STATE_MODELS_LOADED = "models.loaded"
STATE_TIMESTAMP = "timestamp"

# Each runtime's module declares its series, metric prefix and state routes (parse/runtimes/<rt>.py).
NORMALIZED_SOURCES: dict[str, tuple[str, ...]] = {
    key: tuple(series for o in OBSERVED.values() for series in o.normalized.get(key, ()))
    for key in (STATE_REQUESTS_RUNNING, STATE_REQUESTS_WAITING, STATE_KV_CACHE_USAGE)
}
_RUNTIME_PREFIXES = tuple((o.metric_prefix, name) for name, o in OBSERVED.items() if o.metric_prefix)

PATH_PS = "/api/ps"
PATH_METRICS = "/metrics"
_PATHS: dict[str | None, tuple[str, ...]] = {name: o.state_paths for name, o in OBSERVED.items()}
_ABSENT_STATUS = frozenset({404, 405, 501})
# runtimes whose model metadata is read once per process; Ollama's comes with every /api/ps poll
_READ_ONCE = MODEL_RUNTIMES - {ollama.NAME}
# The server refuses unauthenticated polls (e.g. behind `otel-llm gateway`): stop at once.
_REFUSED_STATUS = frozenset({401, 403})
MAX_FAILURES = 5  # consecutive failures of an endpoint before it is no longer polled
MAX_SLEEP = 60.0  # the poller wakes at least this often (a server noted meanwhile wakes it too)
IDLE_INTERVAL = 15.0  # between polls while the application makes no model call (a scrape's pace)
TIMEOUT = 1.0


def _http_suppressed() -> contextlib.AbstractContextManager[Any]:
    """OpenTelemetry's HTTP instrumentation suppressed for the polls: the key every contrib HTTP
    instrumentation checks, set without importing ``opentelemetry.instrumentation``."""
    key = getattr(context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)
    if key is None:  # an API release that moved it: the public helper
        from opentelemetry.instrumentation.utils import suppress_http_instrumentation

        return suppress_http_instrumentation()
    return _attached(context.set_value(key, True))


def _callback(observe: Callable[[], Iterable[Observation]]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """An OpenTelemetry callback that reports what ``observe`` yields at each collection."""
    return lambda options: list(observe())


@contextlib.contextmanager
def _attached(ctx: context.Context) -> Iterator[None]:
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


_OTEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,254}\Z")
_COUNTER, _GAUGE = "counter", "gauge"

Point = tuple[float, Attributes]


@dataclass(frozen=True)
class _Model:
    name: str
    size: int | None
    size_vram: int | None
    expires_at: float | None  # epoch seconds
    info: rt.ModelInfo | None = None  # what the entry says of the model (context, quantization, sizes)


@dataclass
class _State:
    """What the latest polls of one server found (each field is replaced, never mutated)."""

    runtime: str | None = None
    series: dict[str, list[Point]] = field(default_factory=dict)  # instrument key -> points
    normalized: dict[str, float | None] = field(default_factory=dict)
    models: tuple[_Model, ...] = ()
    latest: Attributes = field(default_factory=dict)
    retry_at: dict[str, float] = field(default_factory=dict)  # path -> monotonic time (inf: stopped)
    failures: dict[str, int] = field(default_factory=dict)  # path -> consecutive failures
    generation: int = 0  # the policy's generation of the server when last polled
    model: rt.ModelInfo | None = None  # from the runtime's metadata route
    model_read: tuple[tuple[int, str], int] | None = None  # ((generation, runtime), reads so far)
    unreachable: bool = False  # the latest state-route request got no HTTP answer (refused, timed out)


class _NotItsFormat(Exception):
    """The endpoint answered, but not in the format this runtime would use."""


class RuntimeStateObserver:
    """Polls the registry's model servers for their state; see the module docstring."""

    def __init__(self, meter: Meter, registry: ServerRegistry, interval: float = 5.0,
                 client: httpx.Client | None = None, activity: Activity | None = None,
                 policy: PollPolicy | None = None) -> None:
        self._meter = meter
        self._registry = registry
        self.policy = policy or PollPolicy()
        self.interval = interval
        self.activity = activity  # when given, polls slow to IDLE_INTERVAL while no call is made
        self._own_client = client is None
        self._client: httpx.Client | None = client  # created at the first poll (see ``_http``)
        self._states: dict[tuple[str, int], _State] = {}
        self._recognized: dict[tuple[str, int], str] = {}  # server -> runtime, see runtime_of
        self._kinds: dict[str, str] = {}  # lower-cased instrument name -> kind
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._logged: set[tuple[Any, ...]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._register_fixed()

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
        if self._own_client and self._client is not None:
            try:
                self._client.close()
            except Exception:
                logger.debug("otel_llm: closing the runtime-state client failed", exc_info=True)

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
            for path in _PATHS.get(server.runtime, (PATH_PS, PATH_METRICS)):
                soonest = min(soonest, state.retry_at.get(path, 0.0) - now)
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
        with self._poll_lock, _http_suppressed():
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
            state = self._states[key] = _State(runtime=server.runtime)
        generation = self.policy.generation(*key)
        if generation != state.generation:  # another runtime process listens there now: afresh
            state.generation, state.retry_at, state.failures = generation, {}, {}
            state.unreachable = False
        if server.runtime is not None:
            state.runtime = server.runtime
        fresh: dict[str, Any] = {}
        for path in _PATHS.get(server.runtime, (PATH_PS, PATH_METRICS)):
            if self._clock() < state.retry_at.get(path, 0.0):
                continue
            if path == PATH_PS:
                fresh.update(self._poll_ps(server, state))
            else:
                fresh.update(self._poll_metrics(server, state))
        # whatever its state route answered (llama-server serves /metrics only with --metrics),
        # unless the server did not answer at all; a metadata route that fails is not asked again
        if state.runtime in _READ_ONCE and not state.unreachable:
            self._read_model(server, state, generation)
        if fresh:
            base = {STATE_REQUESTS_RUNNING: None, STATE_REQUESTS_WAITING: None, STATE_KV_CACHE_USAGE: None}
            state.latest = {**base, **fresh, STATE_TIMESTAMP: time.perf_counter_ns()}

    @staticmethod
    def _model_pending(state: _State) -> bool:
        """A reachable server whose model metadata is still unread (and may still be asked)."""
        if state.runtime not in _READ_ONCE or state.model is not None or state.unreachable:
            return False
        read = state.model_read
        return read is None or read[0] != (state.generation, state.runtime) or read[1] < MAX_FAILURES

    def _read_model(self, server: Server, state: _State, generation: int) -> None:
        """The metadata route, until it names the model (LM Studio lists it once it is loaded), at
        most MAX_FAILURES times per runtime process, once if it fails for good; afresh when another
        process listens."""
        key = (generation, state.runtime or "")
        if state.model_read is None or state.model_read[0] != key:
            state.model_read, state.model = (key, 0), None
        tries = state.model_read[1]
        if state.model is not None or tries >= MAX_FAILURES:
            return
        routes = _MetadataRoutes(self, server, state)
        state.model = model_info(routes, state.runtime, None, None)
        # a route that refused or lacks the request is not asked again for this process; a read
        # that asked nothing (its route backing off after a 503 or a timeout) is not counted
        state.model_read = (key, MAX_FAILURES if routes.stopped else tries + routes.asked)

    def _poll_ps(self, server: Server, state: _State) -> dict[str, Any]:
        body = self._fetch(server, state, PATH_PS, "application/json")
        models = None
        if body is not None:
            try:
                models = _parse_ps(body)
            except _NotItsFormat as exc:
                self._not_its_format(server, state, PATH_PS, str(exc))
        if models is None:
            state.models = ()
            return {}
        state.failures.pop(PATH_PS, None)
        if state.runtime is None:
            state.runtime = "ollama"
        state.models = tuple(models)
        return {STATE_MODELS_LOADED: tuple(m.name for m in models)}

    def _poll_metrics(self, server: Server, state: _State) -> dict[str, Any]:
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
        state.failures.pop(PATH_METRICS, None)
        samples = _samples(families, _names_in(text))
        if state.runtime is None:
            state.runtime = _infer_runtime(samples)
        state.normalized = _normalize(samples)
        state.series = self._series(server, state, samples)
        return dict(state.normalized)

    def _fetch(self, server: Server, state: _State, path: str, accept: str,
               metadata: bool = False) -> bytes | None:
        """The body of a 2xx answer, or None (the failure counted for the endpoint's back-off).
        ``metadata``: a metadata route, read once per process: a refusal, an absent route or a
        refused connection stops it at once (a 503 or a timeout is backed off)."""
        import httpx  # imported by the first poll, not by instrument()

        url = f"{server.base_url}{path}"
        try:
            response = self._http().get(url, headers={"Accept": accept}, timeout=TIMEOUT)
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

    def _http(self) -> httpx.Client:
        """The polls' client, created at the first poll (callers hold ``_poll_lock``)."""
        if self._client is None:
            if self._stop.is_set():  # stop() has run: a client made now would never be closed
                raise RuntimeError("the runtime-state observer is stopped")
            import httpx

            self._client = httpx.Client(timeout=TIMEOUT, trust_env=False)
        return self._client

    def _not_its_format(self, server: Server, state: _State, path: str, problem: str,
                        at_once: bool = False) -> None:
        """A 2xx answer that is not the runtime's format: a failure like any other (quietly for an
        unknown runtime, which was only probing)."""
        level = logging.DEBUG if server.runtime is None else logging.WARNING
        self._failed(server, state, path, problem, level=level, at_once=at_once)

    def _failed(self, server: Server, state: _State, path: str, problem: str,
                level: int = logging.WARNING, at_once: bool = False) -> None:
        """Back the endpoint off exponentially; stop polling it (one log line) at the bound."""
        failures = state.failures[path] = state.failures.get(path, 0) + 1
        if at_once or failures >= MAX_FAILURES:
            state.retry_at[path] = math.inf
            after = "" if at_once else f" after {failures} consecutive failures"
            self._log_once((server.host, server.port, path, "stopped", state.generation),
                           f"runtime state: {server.base_url}{path}: {problem}; no longer polled{after}", level)
        else:
            state.retry_at[path] = self._clock() + self.interval * 2 ** (failures - 1)

    # -- re-emitted Prometheus series -----------------------------------------------------------
    def _series(self, server: Server, state: _State,
                samples: list[tuple[str, str, dict[str, str], float, str]]) -> dict[str, list[Point]]:
        base = _server_attrs(server, state.runtime)
        series: dict[str, list[Point]] = {}
        for name, kind, labels, value, help_text in samples:
            otel = otel_name(name)
            if otel is None or not self._instrument(otel, kind, help_text, server):
                continue
            series.setdefault(otel.lower(), []).append((value, {**labels, **base}))
        return series

    def _instrument(self, name: str, kind: str, description: str, server: Server) -> bool:
        """Make sure an instrument of this kind exists for ``name``; False if taken by another kind."""
        key = name.lower()
        with self._lock:
            known = self._kinds.get(key)
            if known is None:
                self._kinds[key] = kind
                create = (self._meter.create_observable_counter if kind == _COUNTER
                          else self._meter.create_observable_gauge)
                create(name, [self._callback(key)], unit="", description=description)
                return True
        if known == kind:
            return True
        self._log_once(("kind", key, kind), f"runtime state: series {name} from {server.base_url} is a {kind} "
                       f"but was first seen as a {known}; dropped", logging.WARNING)
        return False

    def _callback(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda options: [Observation(value, attrs) for state in list(self._states.values())
                                for value, attrs in state.series.get(key, ())]

    # -- fixed instruments ----------------------------------------------------------------------
    def _register_fixed(self) -> None:
        meter = self._meter
        fixed = (
            (METRIC_RUNTIME_REQUESTS_RUNNING, "{request}", "Requests the runtime is processing.",
             lambda: self._normalized(STATE_REQUESTS_RUNNING)),
            (METRIC_RUNTIME_REQUESTS_WAITING, "{request}", "Requests queued in the runtime.",
             lambda: self._normalized(STATE_REQUESTS_WAITING)),
            (METRIC_RUNTIME_KV_CACHE_USAGE, "1", "Fraction of the runtime's KV cache in use.",
             lambda: self._normalized(STATE_KV_CACHE_USAGE)),
            (METRIC_RUNTIME_MODEL_LOADED, "1", "1 for each model the runtime has loaded.", self._loaded),
            (METRIC_RUNTIME_MODEL_MEMORY, "By", "Memory of a loaded model (total, and its VRAM share).",
             self._model_memory),
            (METRIC_RUNTIME_MODEL_EXPIRES_IN, "s", "Time until the runtime unloads an idle model.",
             self._expires_in),
        )
        for name, unit, description, observe in fixed:
            self._kinds[name.lower()] = _GAUGE
            meter.create_observable_gauge(name, [_callback(observe)], unit=unit,
                                          description=description)

    def _normalized(self, key: str) -> Iterator[Observation]:
        for (host, port), state in list(self._states.items()):
            value = state.normalized.get(key)
            if value is not None:
                yield Observation(value, _server_attrs(Server(host, port, None), state.runtime))

    def _models(self) -> Iterator[tuple[_Model, dict[str, Any]]]:
        for (host, port), state in list(self._states.items()):
            attrs = _server_attrs(Server(host, port, None), state.runtime)
            for model in state.models:
                yield model, {**attrs, sc.GEN_AI_REQUEST_MODEL: model.name}

    def _loaded(self) -> Iterator[Observation]:
        for _model, attrs in self._models():
            yield Observation(1, attrs)

    def _model_memory(self) -> Iterator[Observation]:
        for model, attrs in self._models():
            for location, size in (("total", model.size), ("vram", model.size_vram)):
                if size is not None:
                    yield Observation(size, {**attrs, LLM_RUNTIME_MEMORY_LOCATION: location})

    def _expires_in(self) -> Iterator[Observation]:
        now = time.time()
        for model, attrs in self._models():
            if model.expires_at is not None:
                yield Observation(max(0.0, model.expires_at - now), attrs)

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


# --- pure helpers --------------------------------------------------------------------------------
class _MetadataRoutes:
    """``parse.runtimes.Routes`` over the poller's client: each route asked once per read; a
    route that refuses or lacks the request, or answers what is not JSON, is stopped at once
    (``stopped``), a 503 or a timeout backs it off like any poll's failure."""

    def __init__(self, observer: RuntimeStateObserver, server: Server, state: _State) -> None:
        self._observer, self._server, self._state = observer, server, state
        self.stopped = False  # a route was stopped: the metadata is not read again for this process
        self.asked = 0  # requests sent

    def json(self, path: str) -> Any:
        text = self.text(path)
        try:
            return json.loads(text) if text is not None else None
        except ValueError:
            self._observer._not_its_format(self._server, self._state, path, "not JSON", at_once=True)
            self.stopped = True
            return None

    def text(self, path: str) -> str | None:
        retry_at = self._state.retry_at.get(path, 0.0)
        if self._observer._clock() < retry_at:
            self.stopped = self.stopped or retry_at == math.inf
            return None  # backing off after a failure, as any polled route
        self.asked += 1
        body = self._observer._fetch(self._server, self._state, path, "application/json", metadata=True)
        if body is None and self._state.retry_at.get(path, 0.0) == math.inf:
            self.stopped = True
        return body.decode("utf-8", errors="replace") if body is not None else None


def otel_name(prometheus_name: str) -> str | None:
    """``llamacpp:requests_processing`` -> ``llamacpp.requests_processing``; None if unusable."""
    name = prometheus_name.replace(":", ".").lstrip("_.")
    return name if _OTEL_NAME.match(name) else None


def _names_in(text: str) -> set[str]:
    """The sample names as written in the exposition text."""
    return {line.split("{", 1)[0].split(None, 1)[0] for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")}


def _samples(families: list[Any], written: set[str]) -> list[tuple[str, str, dict[str, str], float, str]]:
    """(sample name, kind, labels, value, help) for every series worth re-emitting. The parser
    appends ``_total`` to counter samples that lack it (TGI's); the name as written is kept."""
    cumulative = {f.name for f in families if f.type in ("counter", "histogram", "summary", "gaugehistogram")}
    out = []
    for family in families:
        if family.name.endswith("_created") and family.name[: -len("_created")] in cumulative:
            continue
        for sample in family.samples:
            kind = _kind(family.type, family.name, sample.name)
            value = sample.value
            if kind is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name = sample.name
            if family.type == "counter" and name not in written and family.name in written:
                name = family.name
            if math.isfinite(value):
                out.append((name, kind, dict(sample.labels), float(value), family.documentation))
    return out


def _kind(family_type: str, family_name: str, sample_name: str) -> str | None:
    """The OTel kind a sample is re-emitted as, or None to skip it."""
    if sample_name.endswith("_created"):
        return None
    if family_type == "counter":
        return _COUNTER
    if family_type in ("histogram", "summary"):
        if sample_name != family_name and sample_name.endswith(("_sum", "_count")):
            return _COUNTER
        return None
    if family_type == "gaugehistogram":
        return _GAUGE if sample_name.endswith(("_gsum", "_gcount")) else None
    return _GAUGE


def _normalize(samples: list[tuple[str, str, dict[str, str], float, str]]) -> dict[str, float | None]:
    values: dict[str, list[float]] = {}
    for name, _kind_, _labels, value, _help in samples:
        values.setdefault(name, []).append(value)
    out: dict[str, float | None] = {}
    for key, sources in NORMALIZED_SOURCES.items():
        found = next((values[s] for s in sources if s in values), None)
        if found is None:
            out[key] = None
        elif key == STATE_KV_CACHE_USAGE:
            out[key] = sum(found) / len(found)
        else:
            total = sum(found)
            out[key] = int(total) if float(total).is_integer() else total
    return out


def _infer_runtime(samples: list[tuple[str, str, dict[str, str], float, str]]) -> str | None:
    for name, *_rest in samples:
        for prefix, runtime in _RUNTIME_PREFIXES:
            if name.startswith(prefix):
                return runtime
    return None


def _parse_ps(body: bytes) -> list[_Model]:
    """Ollama's /api/ps answer; raises _NotItsFormat if it is not one."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise _NotItsFormat("not JSON") from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise _NotItsFormat('JSON without a "models" list')
    models = []
    for entry in data["models"]:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name") or entry.get("model")
        if isinstance(name, str):
            models.append(_Model(name, _int(entry.get("size")), _int(entry.get("size_vram")),
                                 _epoch(entry.get("expires_at")), ollama.ps_model(entry)))
    return models


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _epoch(value: Any) -> float | None:
    """RFC 3339 (Go writes up to 9 fractional digits; Python reads 6) -> epoch seconds."""
    if not isinstance(value, str):
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", value.strip())
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _server_attrs(server: Server, runtime: str | None) -> Attributes:
    attrs: Attributes = {sc.SERVER_ADDRESS: server.host, sc.SERVER_PORT: server.port}
    if runtime is not None:
        attrs[sc.LLM_RUNTIME_NAME] = runtime
    return attrs
