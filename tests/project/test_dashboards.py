"""The Grafana dashboards of dashboards/: their JSON structure, and every PromQL query of every
panel run against a real Prometheus (Debian's, installed when missing) that scrapes otel_llm.

The backend: an instrumented application (its own process, ``OTEL_METRICS_EXPORTER=prometheus``,
host and runtime observers on) calls the simulator as Ollama (native API, a cold start) and as
llama.cpp (tokens held back and sent in bursts), the real llama.cpp server (one thread, as it
shares 2 cores; its ``--metrics`` gives the runtime's running / waiting requests) and an
``otel-llm gateway`` in front of the llama.cpp simulator (one upstream slot, so requests queue;
plus a refused key), each kind of call in its own loop. The gateway exports its own metrics on a
second Prometheus endpoint. A second application (``dashboards-app-latest``, third endpoint) calls
the llama.cpp simulator with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``: its
model-call metrics carry only semantic-conventions-genai's names, which the call panels read too.
Prometheus scrapes the three every second.

This machine has no GPU: the queries of the GPU panels are the only ones allowed to be empty,
and they are listed below (``GPU_QUERIES``); their metric names are checked against what the
Prometheus exporter makes of the GPU observer's instruments over a fake NVML instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm.tools.sim import SimProcess
from otel_llm_testing import LlamaServer
from otel_llm_testing.subprocesses import clean_env
from otel_llm_testing.dashboards import (BUILTINS, DASHBOARDS, FILES, all_panels, label_values_query, load,
                                         metric_names, queries, referenced_variables, substitute, variables)
from otel_llm_testing.net import LOOPBACK, free_port
from otel_llm_testing.prometheus import Prometheus, finite_values, wait_until

pytestmark = [pytest.mark.timeout(900)]  # the first run may build llama-server (about 8 minutes)

REPO = Path(__file__).resolve().parents[2]
DS = {"type": "prometheus", "uid": "${datasource}"}
EMITTED_PREFIXES = ("gen_ai_", "llm_", "system_", "process_", "hw_", "http_server_", "llamacpp_")

# (file, panel title, refId) of every query on hw.* / process.gpu.* series: empty without a GPU.
GPU_QUERIES = {
    ("otel-llm-host-runtime.json", "GPU utilization", "A"),
    ("otel-llm-host-runtime.json", "GPU memory used and limit", "A"),
    ("otel-llm-host-runtime.json", "GPU memory used and limit", "B"),
    ("otel-llm-host-runtime.json", "GPU memory of the runtime's processes", "A"),
    ("otel-llm-host-runtime.json", "GPU power and temperature", "A"),
    ("otel-llm-host-runtime.json", "GPU power and temperature", "B"),
    ("otel-llm-host-runtime.json", "GPU throttling reasons", "A"),
}
GPU_METRICS = {"hw_gpu_utilization", "hw_gpu_memory_usage_bytes", "hw_gpu_memory_limit_bytes",
               "process_gpu_memory_usage_bytes", "hw_power_watts", "hw_temperature_celsius", "hw_gpu_throttle"}


# --- structure (no backend) -----------------------------------------------------------------------


def test_dashboards_are_generated_by_build_script() -> None:
    """The JSON files are what dashboards/build.py writes (edit the script, not the JSON)."""
    spec = importlib.util.spec_from_file_location("otel_llm_dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert sorted(build.DASHBOARDS) == [p.name for p in FILES]
    for path in FILES:
        assert path.read_text(encoding="utf-8") == build.render(build.DASHBOARDS[path.name]), \
            f"{path.name} is stale: run python dashboards/build.py"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    dashboard = load(path)
    assert dashboard["schemaVersion"] >= 36 and dashboard["title"] and dashboard["uid"]
    assert dashboard["graphTooltip"] == 1  # shared crosshair: every panel on the same time axis
    defined = variables(dashboard)
    source = defined["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    expected = {"service", "model"} | ({"runtime"} if "gateway" not in path.name else set())
    assert expected <= set(defined), sorted(defined)
    for variable in defined.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DS, variable["name"]
            assert variable["definition"].startswith("label_values(") and \
                variable["query"]["query"] == variable["definition"]
            assert not variable["multi"] or variable["allValue"] == ".*"

    ids: list[int] = []
    cells: set[tuple[int, int]] = set()
    for panel in all_panels(dashboard):
        ids.append(panel["id"])
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == DS and t["expr"].strip(), (panel["title"], t["refId"])
        # latency panels: exemplars on, and a link to the traces of the same calls
        latency = panel["fieldConfig"]["defaults"]["unit"] == "s" and any(
            "_seconds_" in t["expr"] for t in panel["targets"])
        if latency:
            assert all(t["exemplar"] for t in panel["targets"] if "_seconds_" in t["expr"]), panel["title"]
            links = panel["fieldConfig"]["defaults"].get("links", [])
            assert any("/explore?" in link["url"] and "tempo" in link["url"] and "${traces}" in link["url"]
                       for link in links), panel["title"]
    assert len(ids) == len(set(ids)), "panel ids are not unique"

    text = json.dumps(dashboard)
    undefined = referenced_variables(text) - set(defined) - set(BUILTINS) - {"__all"}
    assert not undefined, f"undefined variables {sorted(undefined)}"
    assert any(link.get("url", "").startswith("${jaeger_url}/search") for link in dashboard["links"])


@pytest.mark.backend
def test_prometheus_and_grafana_examples(prometheus_binary: str) -> None:
    """The scrape configuration passes promtool; the provisioning files are what Grafana reads."""
    promtool = Path(prometheus_binary).with_name("promtool")
    check = subprocess.run([str(promtool), "check", "config", str(DASHBOARDS / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # (read as text: the test dependencies have no YAML parser)
    sources = (DASHBOARDS / "provisioning" / "datasources.yaml").read_text()
    assert re.search(r"^apiVersion: 1$", sources, re.M) and re.search(r"^\s+type: prometheus$", sources, re.M)
    assert re.search(r"exemplarTraceIdDestinations:\n\s+- name: trace_id\n\s+datasourceUid: tempo\n", sources)
    assert re.search(r"^\s+type: tempo\n\s+uid: tempo$", sources, re.M)
    providers = (DASHBOARDS / "provisioning" / "dashboards.yaml").read_text()
    assert re.search(r"^apiVersion: 1$", providers, re.M) and re.search(r"^\s+type: file$", providers, re.M)


def test_the_required_panels_exist() -> None:
    """What the dashboards were asked to show, each in some panel's query."""
    exprs = " ".join(q.expr for q in queries())
    for needed in ("llm_client_phase_duration_seconds_sum",
                   "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
                   "gen_ai_server_time_to_first_token_seconds_bucket", "llm_runtime_generation_rate_per_second",
                   "gen_ai_client_operation_time_per_output_chunk_seconds", "llm_client_active_requests",
                   "llm_runtime_requests_running", "llm_runtime_requests_waiting", "system_cpu_utilization",
                   "system_memory_usage_bytes", "system_paging_operations_total", "hw_gpu_utilization",
                   "hw_gpu_memory_usage_bytes", "llm_gateway_requests_total", "llm_gateway_queue_depth",
                   "llm_gateway_queue_wait_seconds_bucket"):
        assert needed in exprs, needed
    calls = load(DASHBOARDS / "otel-llm-calls.json")
    phase = next(p for p in all_panels(calls) if p["title"].startswith("Call latency by phase"))
    assert phase["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert "by (llm_phase)" in phase["targets"][0]["expr"]


def test_metric_name_parser() -> None:
    expr = ('histogram_quantile(0.5, sum by (le, a) (rate(x_bucket{b=~"$m", c="y{z}"}[$__rate_interval]))) / '
            'on() group_left() sum(rate(y_count[5m])) - clamp_min(z, 0)')
    assert metric_names(expr) == {"x_bucket", "y_count", "z"}
    assert substitute('f{m=~"$model", s=~"${service}"}[$__rate_interval]') == 'f{m=~".*", s=~".*"}[10s]'


def test_gpu_metric_names_match_the_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: the names and labels the GPU panels query are checked against what
    opentelemetry-exporter-prometheus makes of the GPU observer's instruments over a fake NVML."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider

    from otel_llm.observers.gpu import GpuObserver
    from otel_llm_testing.fake_nvml import FakeGpu, FakeNvml

    FakeNvml([FakeGpu("GPU-aaaa-0000", "NVIDIA Test GPU", processes=[(os.getpid(), 1 << 30)])]).install(monkeypatch)
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    observer = GpuObserver.create(provider.get_meter("otel_llm"), pids=lambda: [os.getpid()])
    assert observer is not None
    try:
        families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    finally:
        observer.shutdown()
        provider.shutdown()
    labels: dict[str, set[str]] = {}
    for family in families:
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    used = {name for q in queries() for name in metric_names(q.expr)} & GPU_METRICS
    assert used == GPU_METRICS
    missing = used - set(labels)
    assert not missing, (missing, sorted(labels))
    for query in queries():
        for name in metric_names(query.expr) & GPU_METRICS:
            by = re.findall(r"by \(([^)]*)\)", query.expr)
            wanted = {label.strip() for group in by for label in group.split(",")} - {"le"}
            assert wanted <= labels[name], (query.panel, name, wanted - labels[name])


# --- the real backend -----------------------------------------------------------------------------

_APP = r"""
import json, os, sys, threading, time, traceback
import httpx, otel_llm

cfg = json.loads(sys.argv[1])
# the simulators play runtimes in processes /proc cannot name: poll every server called
otel_llm.instrument(service_name=cfg.get("service", "dashboards-app"), console_summary=False,
                    traces_file=os.devnull, sample_interval=0.5, poll_runtimes="all")
client = httpx.Client(timeout=60)
MSG = [{"role": "user", "content": "Tell a short story."}]
BURSTS = {"x-sim-buffering": "true", "x-sim-buffer-flush-frames": "4"}


def post(url, body, headers=None, stream=True):
    try:
        if stream:
            with client.stream("POST", url, json=body, headers=headers) as r:
                r.read()
        else:
            client.post(url, json=body, headers=headers)
    except Exception:
        traceback.print_exc()


def ollama(i):
    # the first call unloads the model after it (keep_alive 0): the next one is a cold start too
    post(cfg["ollama"] + "/api/chat", {"model": "llama3.2", "messages": MSG, **({"keep_alive": 0} if i == 0 else {})})
    post(cfg["ollama"] + "/api/chat", {"model": "llama3.2", "messages": MSG, "stream": False}, stream=False)


def llamacpp_sim(i):
    post(cfg["llamacpp"] + "/v1/chat/completions", {"model": "sim-gemma", "messages": MSG, "stream": True}, BURSTS)


def gateway(i):
    body = {"model": "sim-gemma", "messages": MSG, "stream": True}
    key = {"authorization": "Bearer " + cfg["key"]}
    both = [threading.Thread(target=post, args=(cfg["gateway"] + "/v1/chat/completions", body, key)) for _ in range(2)]
    for t in both:
        t.start()
    if i % 5 == 0:  # refused by the gateway (outcome unauthorized), a 401 for the caller
        post(cfg["gateway"] + "/v1/chat/completions", body, {"authorization": "Bearer not-a-key"})
    for t in both:
        t.join()


def llama_server(i):
    body = {"model": "gemma-3-270m", "messages": MSG, "stream": True, "max_tokens": 10, "ignore_eos": True}
    post(cfg["llama"] + "/v1/chat/completions", body)
    time.sleep(0.3)  # the real model shares 2 cores with everything else


def loop(work):
    # each kind of call in its own loop, so a slow one does not hold the others back
    i = 0
    while not os.path.exists(cfg["stop"]):
        work(i)
        print(work.__name__, i, flush=True)
        i += 1
        time.sleep(0.1)


work = [w for w in (ollama, llamacpp_sim, gateway, llama_server) if "work" not in cfg or w.__name__ in cfg["work"]]
threads = [threading.Thread(target=loop, args=(w,)) for w in work]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


LATEST_SERVICE = "dashboards-app-latest"  # the application on semantic-conventions-genai's names
UNRECORDED_CALLS = 3  # through the gateway from a client that records nothing (the stdlib's http.client)


def _unrecorded_call(url: str, key: str) -> None:
    """A streamed chat call through the gateway that no otel_llm client records: the gateway's
    record is its only one."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    body = json.dumps({"model": "sim-gemma", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"authorization": f"Bearer {key}",
                                                            "content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
    finally:
        conn.close()


@dataclass
class Stack:
    prometheus: Prometheus
    app_log: Path
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)

    def evaluate(self) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
        return {q.key: self.prometheus.query(substitute(q.expr)) for q in queries()}


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


# No runtime in this stack reports its KV cache: llama.cpp's server dropped kv_cache_usage_ratio
# and the simulator serves no /metrics. tests/e2e/test_vllm.py checks this panel with a real vLLM.
KV_CACHE_QUERIES = {("otel-llm-host-runtime.json", "Runtime KV cache usage", "A")}
KV_CACHE_METRICS = {"llm_runtime_kv_cache_usage"}
EXPECTED_EMPTY = KV_CACHE_QUERIES | (set() if _gpu_present() else GPU_QUERIES)


@pytest.fixture(scope="module")
def stack(prometheus_binary: str) -> Iterator[Stack]:
    tmp = Path(tempfile.mkdtemp(prefix="otel-llm-dashboards-"))
    app_port, gateway_port, latest_port = free_port(), free_port(), free_port()
    stop = tmp / "stop"
    with contextlib.ExitStack() as exits:
        exits.callback(shutil.rmtree, tmp, True)
        prom = exits.enter_context(Prometheus(prometheus_binary, {
            "otel-llm-app": f"{LOOPBACK}:{app_port}", "otel-llm-gateway": f"{LOOPBACK}:{gateway_port}",
            "otel-llm-app-latest": f"{LOOPBACK}:{latest_port}"}))
        ollama = exits.enter_context(SimProcess(runtime="ollama", model="llama3.2", cold_delay=0.4, tokens=8))
        llamacpp = exits.enter_context(SimProcess(runtime="llama.cpp", model="sim-gemma", tokens=8))
        llama = exits.enter_context(LlamaServer(slots=1, threads=1))
        gateway = exits.enter_context(GatewayProcess(
            llamacpp.base_url, runtime="llama.cpp", max_concurrency=1,
            env={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": LOOPBACK,
                 "OTEL_EXPORTER_PROMETHEUS_PORT": str(gateway_port), "OTEL_LLM_SAMPLE_INTERVAL": "0.5",
                 "OTEL_LLM_TRACES_FILE": str(tmp / "gateway-traces.jsonl")}))
        cfg = {"ollama": ollama.base_url, "llamacpp": llamacpp.base_url, "llama": llama.base_url,
               "gateway": gateway.url, "key": gateway.secrets["default"], "stop": str(stop)}
        (tmp / "app.py").write_text(_APP)
        app_log = tmp / "app.log"
        env = clean_env(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_HOST=LOOPBACK,
                        OTEL_EXPORTER_PROMETHEUS_PORT=str(app_port), PYTHONPATH=str(REPO))
        latest_cfg = {**cfg, "service": LATEST_SERVICE, "work": ["llamacpp_sim"]}
        latest_env = clean_env(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_HOST=LOOPBACK,
                               OTEL_EXPORTER_PROMETHEUS_PORT=str(latest_port), PYTHONPATH=str(REPO),
                               OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental")
        apps = []
        with open(app_log, "wb") as log:
            for app_cfg, app_env in ((cfg, env), (latest_cfg, latest_env)):
                apps.append(subprocess.Popen([sys.executable, str(tmp / "app.py"), json.dumps(app_cfg)], cwd=tmp,
                                             env=app_env, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT))

        def stop_app() -> None:
            stop.touch()
            for app in apps:
                try:
                    app.wait(30)
                except subprocess.TimeoutExpired:
                    app.kill()
                    app.wait()

        exits.callback(stop_app)
        for _ in range(UNRECORDED_CALLS):
            _unrecorded_call(gateway.url, gateway.secrets["default"])
        prom.wait_ready()
        state = Stack(prom, app_log)

        def settled() -> bool:
            state.results = state.evaluate()
            empty = {key for key, samples in state.results.items() if not finite_values(samples)}
            return empty <= EXPECTED_EMPTY

        wait_until(settled, timeout=60, interval=1.0)
        yield state


def _context(stack: Stack) -> str:
    return (f"up: {stack.prometheus.up()}\napp log tail:\n{stack.app_log.read_text(errors='replace')[-3000:]}\n"
            f"prometheus log tail:\n{stack.prometheus.log()[-2000:]}")


@pytest.mark.runtime
@pytest.mark.backend
def test_every_panel_query_returns_data(stack: Stack) -> None:
    """Every query of every panel, with $service / $runtime / $model as .* and $__rate_interval
    as 10s, returns at least one finite sample from the real Prometheus; only the GPU panels'
    queries are empty, because this machine has no GPU, and the KV-cache panel, because no runtime
    of this stack reports one (tests/e2e/test_vllm.py checks it against a real vLLM)."""
    assert stack.prometheus.up() == {"otel-llm-app": 1.0, "otel-llm-gateway": 1.0, "otel-llm-app-latest": 1.0}, \
        _context(stack)
    assert len(stack.results) == len(queries()) > 40
    empty = {key for key, samples in stack.results.items() if not samples}
    not_finite = {key for key, samples in stack.results.items() if samples and not finite_values(samples)}
    assert empty == EXPECTED_EMPTY and not not_finite, (
        f"empty beyond the GPU and KV-cache panels: {sorted(empty - EXPECTED_EMPTY)}\n"
        f"expected empty but not: {sorted(EXPECTED_EMPTY - empty)}\nonly NaN/Inf: {sorted(not_finite)}\n"
        + _context(stack))
    assert "Traceback" not in stack.app_log.read_text(errors="replace"), _context(stack)
    print(f"{len(EXPECTED_EMPTY)} queries empty as expected (GPU, KV cache), all "
          f"{len(stack.results) - len(EXPECTED_EMPTY)} others returned data")


@pytest.mark.runtime
@pytest.mark.backend
def test_every_metric_name_is_one_otel_llm_emits(stack: Stack) -> None:
    """Each metric name in a query is among the names Prometheus scraped from otel_llm (the GPU
    ones are checked against the exporter by test_gpu_metric_names_match_the_exporter, the KV
    cache's by tests/e2e/test_vllm.py)."""
    scraped = stack.prometheus.metric_names()
    used = {name: q for q in queries() for name in metric_names(q.expr)}
    assert len(used) > 30
    for name, query in used.items():
        assert name.startswith(EMITTED_PREFIXES), (name, query.panel)
        if (name in GPU_METRICS and not _gpu_present()) or name in KV_CACHE_METRICS:
            continue
        assert name in scraped, (name, query.panel, sorted(n for n in scraped if n.startswith(EMITTED_PREFIXES)))


@pytest.mark.runtime
@pytest.mark.backend
def test_every_variable_has_values(stack: Stack) -> None:
    """The label_values() of each template variable, as Grafana asks Prometheus for them."""
    for path in FILES:
        for variable in variables(load(path)).values():
            if variable["type"] != "query":
                continue
            selector, label = label_values_query(variable["definition"])
            series = stack.prometheus.api("series", **{"match[]": substitute(selector)})
            values = {s.get(label) for s in series} - {None, ""}
            assert values, (path.name, variable["name"], selector, label)
            if variable["name"] == "service":
                assert ("otel-llm-gateway" if "gateway" in path.name else "dashboards-app") in values, values
            if variable["name"] == "runtime":
                assert values & {"ollama", "llama.cpp"}, values


@pytest.mark.runtime
@pytest.mark.backend
def test_panels_filtered_to_one_value_of_each_variable(stack: Stack) -> None:
    """The calls dashboard narrowed to the real llama.cpp server's model still has data where it
    should: its runtime is llama.cpp and the llama.cpp timings give every runtime panel."""
    calls = [q for q in queries() if q.file == "otel-llm-calls.json"]
    values = {"service": "dashboards-app", "runtime": "llama.cpp", "model": "gemma-3-270m"}
    results = {q.key: stack.prometheus.query(substitute(q.expr, values)) for q in calls}
    empty = sorted(key for key, samples in results.items() if not samples)
    assert not empty, empty


@pytest.mark.runtime
@pytest.mark.backend
def test_a_call_through_the_gateway_counts_once(stack: Stack) -> None:
    """Counted once, never zero times. The app calls the gateway, which calls the simulator: two
    records of each call, the app's and the gateway's; the app's client says in the request's
    baggage that it records the call, and the gateway marks its own record (llm.gateway.relayed).
    A client that records nothing (http.client, UNRECORDED_CALLS calls) is recorded by the gateway
    alone, unmarked. So the calls dashboard, with every service selected, counts what the app
    counts plus the unrecorded calls: calls, tokens, phases, diagnoses; and the gateway's calls in
    flight are split the same way. Each difference is taken in one query, so both sides come from
    the same scrape; the unrecorded calls were over before the stack settled."""
    calls = [q for q in queries() if q.file == "otel-llm-calls.json"]
    call_selector = re.search(r"\{(service_name=~\"\$service\", gen_ai_provider_name[^}]*)\}", calls[0].expr)
    assert call_selector, calls[0].expr
    # every service that records these calls (the application on the new names calls elsewhere)
    every = substitute(call_selector.group(1), {"service": "dashboards-app|otel-llm-gateway"})
    app = substitute(call_selector.group(1), {"service": "dashboards-app"})
    relayed = 'service_name="otel-llm-gateway", llm_gateway_relayed=~"(?i)true"'
    unrecorded = 'service_name="otel-llm-gateway", llm_gateway_relayed!~"(?i)true"'

    def value(query: str) -> float | None:
        samples = stack.prometheus.query(query)
        return float(samples[0]["value"][1]) if samples else None

    assert wait_until(lambda: value(f"sum(gen_ai_client_operation_duration_seconds_count{{{unrecorded}}})")
                      == UNRECORDED_CALLS, timeout=20, interval=1.0), (
        value(f"sum(gen_ai_client_operation_duration_seconds_count{{{unrecorded}}})"), _context(stack))
    for metric in ("gen_ai_client_operation_duration_seconds_count", "gen_ai_client_token_usage_sum",
                   "llm_client_phase_duration_seconds_count", "llm_diagnosis_calls_total"):
        marked = value(f"sum({metric}{{{relayed}}})")
        assert marked is not None and marked > 0, (metric, "the instrumented app's calls are not marked")
        unmarked = value(f"sum({metric}{{{unrecorded}}})")
        assert unmarked is not None and unmarked > 0, (metric, "the unrecorded calls are counted nowhere")
        assert value(f"sum({metric}{{{every}}}) - sum({metric}{{{app}}})") == unmarked, metric
    assert value(f"sum(gen_ai_client_operation_duration_seconds_count{{{unrecorded}}})") == UNRECORDED_CALLS
    in_flight = value(f'count(llm_client_active_requests{{{relayed}}})')
    assert in_flight is not None and in_flight > 0, "the gateway's in-flight gauge is not marked"
    assert value(f'count(llm_client_active_requests{{{unrecorded}}})'), "nor counted apart when not relayed"


@pytest.mark.runtime
@pytest.mark.backend
def test_the_call_panels_chart_a_service_on_the_new_names(stack: Stack) -> None:
    """The application run with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental exports no
    gen_ai.client.operation.* or gen_ai.client.token.usage series, and each query of the calls
    dashboard that reads the model-call metrics, narrowed to that service, still returns data."""
    old = stack.prometheus.query(f'count({{__name__=~"gen_ai_client_(operation|token)_.+", '
                                 f'service_name="{LATEST_SERVICE}"}})')
    assert not old, old
    new = stack.prometheus.query('count(gen_ai_client_inference_duration_seconds_count'
                                 f'{{service_name="{LATEST_SERVICE}"}})')
    assert new, _context(stack)
    calls = [q for q in queries() if q.file == "otel-llm-calls.json"
             and any(name.startswith("gen_ai_client_") for name in metric_names(q.expr))]
    assert len(calls) >= 10
    results = {q.key: stack.prometheus.query(substitute(q.expr, {"service": LATEST_SERVICE})) for q in calls}
    empty = sorted(key for key, samples in results.items() if not finite_values(samples))
    assert not empty, empty
