"""Static checks of the collector configurations (collector-config/) and the compose stack (deploy/).

No collector, Jaeger, Tempo, Prometheus or Grafana runs here, so each file is checked for what
would stop it from starting or from doing its job: YAML that parses, pipelines whose components
are all defined and all used, component types that the pinned collector-contrib distribution
contains (tests/fixtures/collector/), connectors wired from one pipeline into another of the right
signal, privacy processors that delete every content attribute otel_llm can emit, sampling and
span-metrics settings that name attributes otel_llm really emits (otel_llm/semconv.py), and a
compose file whose mounts exist and whose ports, host names and URLs agree with the configs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest

from otel_llm import semconv as sc
from otel_llm_testing.tail_sampling import SpanFacts, kept_traces

yaml = pytest.importorskip("yaml", reason="PyYAML (the `pyyaml` package) is needed to read the configs")

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "collector-config"
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "collector"
COLLECTOR_CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
SAMPLED = CONFIG_DIR / "otel-collector-sampled.yaml"

SECTIONS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter",
            "connectors": "connector", "extensions": "extension"}
SIGNALS = ("traces", "metrics", "logs")
CONTENT_ATTRIBUTES = (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS)
CREDENTIAL_ATTRIBUTES = ("http.request.header.authorization", "http.request.header.x-api-key",
                         "http.request.header.api-key", "http.request.header.cookie")
# Facts about the backends' images that their own config files here do not state.
JAEGER_OTLP_GRPC_PORT = 4317      # Jaeger v2 all-in-one's OTLP gRPC receiver
JAEGER_QUERY_PORT = 16686         # its UI and query API
PROMETHEUS_PORT = 9090            # Prometheus' default --web.listen-address
GRAFANA_PORT = 3000


# --- loading -------------------------------------------------------------------------------------

def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def _manifest() -> tuple[dict[str, set[str]], str]:
    """The vendored otelcol-contrib manifest: module basenames per kind, and the version."""
    modules: dict[str, set[str]] = {kind: set() for kind in SECTIONS.values()}
    versions: set[str] = set()
    kind = None
    for line in (FIXTURES / "otelcol-contrib-components.txt").read_text(encoding="utf-8").splitlines():
        if re.fullmatch(r"[a-z]+:", line):
            kind = SECTIONS[line[:-1]]
        elif line.startswith("  - gomod: "):
            assert kind is not None, line
            module, version = line.removeprefix("  - gomod: ").split()
            modules[kind].add(module.rsplit("/", 1)[1])
            versions.add(version)
    assert len(versions) == 1, versions
    return modules, versions.pop().lstrip("v")


def _types() -> dict[tuple[str, str], tuple[set[str], str]]:
    """(kind, type) -> (signals, module basename) from component-types.txt."""
    table = {}
    for line in (FIXTURES / "component-types.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, type_, signals, module, *_source = line.split()
        table[(kind, type_)] = (set(signals.split(",")) - {"-"}, module)
    return table


MANIFEST, MANIFEST_VERSION = _manifest()
TYPES = _types()


def _semconv_names() -> set[str]:
    """Every attribute name otel_llm.semconv defines (span, metric and instrument names excluded)."""
    names = set()
    for const, value in vars(sc).items():
        if not const.isupper() or not isinstance(value, str):
            continue
        if const.startswith(("SPAN_", "ENV_", "METRIC_")) or const in ("INSTRUMENTATION_NAME",
                                                                       "LLM_SERVER_TIMING_PREFIX"):
            continue
        names.add(value)
    return names


def _is_semconv_attribute(name: str) -> bool:
    return name in SEMCONV_ATTRIBUTES or (name.startswith(sc.LLM_SERVER_TIMING_PREFIX)
                                          and len(name) > len(sc.LLM_SERVER_TIMING_PREFIX))


SEMCONV_ATTRIBUTES = _semconv_names()
# Attributes whose values are doubles (seconds, rates, ratios): the tail-sampling
# `numeric_attribute` policy reads attributes as int64 and sees 0 for these.
DOUBLE_ATTRIBUTES = {
    value for const, value in vars(sc).items()
    if const.isupper() and isinstance(value, str) and not const.startswith(("METRIC_", "SPAN_"))
    and re.search(r"DURATION|TIME_TO_FIRST|_RATE$|GAP|UTILIZATION|QUEUE_WAIT|UNACCOUNTED_WAIT|"
                  r"UPSTREAM_FIRST_BYTE|KV_CACHE_USAGE|TEMPERATURE|TOP_P|REQUEST_CONTEXT_PRESSURE", const)
}
# Unbounded values: never a metric dimension.
HIGH_CARDINALITY = {sc.URL_FULL, sc.URL_PATH, sc.GEN_AI_RESPONSE_ID, sc.NETWORK_PEER_ADDRESS, sc.NETWORK_PEER_PORT,
                    sc.CLIENT_ADDRESS, sc.CLIENT_PORT, sc.USER_AGENT_ORIGINAL, sc.DNS_QUESTION_NAME,
                    *CONTENT_ATTRIBUTES}


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _signal(pipeline_id: str) -> str:
    return _type(pipeline_id)


def _pipelines(config: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    pipelines: dict[str, dict[str, list[str]]] = config["service"]["pipelines"]
    return pipelines


def _endpoint(value: str) -> tuple[str, int]:
    """'host:port' (as collector and Tempo endpoints are written) -> (host, port)."""
    host, _, port = value.rpartition(":")
    return host, int(port)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _go_duration(text: str) -> float:
    """A Go time.Duration string (what the collector's duration settings take), in seconds."""
    parts = _DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _full_configs() -> list[Path]:
    """The configs that sample by themselves (with span metrics before): not the one that follows
    the applications' own decisions (otel-collector-sampled.yaml)."""
    return [p for p in COLLECTOR_CONFIGS
            if "tail_sampling" in (_load(p).get("processors") or {}) and p != SAMPLED]


# --- the vendored component list -----------------------------------------------------------------

def test_vendored_manifest_names_its_source_and_is_complete() -> None:
    header = (FIXTURES / "otelcol-contrib-components.txt").read_text(encoding="utf-8")[:1200]
    assert "open-telemetry/opentelemetry-collector-releases" in header
    assert "distributions/otelcol-contrib/manifest.yaml" in header
    assert re.search(r"commit:\s+[0-9a-f]{40}", header)
    # the contrib distribution has dozens of each kind; a truncated copy would not
    assert {kind: len(mods) >= 10 for kind, mods in MANIFEST.items()} == dict.fromkeys(MANIFEST, True)
    for (kind, type_), (_signals, module) in TYPES.items():
        assert module in MANIFEST[kind], f"{kind} {type_}: module {module} is not in otelcol-contrib"


def test_configs_exist() -> None:
    names = {p.name for p in COLLECTOR_CONFIGS}
    assert {"otel-collector.yaml", "otel-collector-full.yaml", "otel-collector-loadbalancer.yaml",
            SAMPLED.name} <= names
    assert _full_configs(), "no collector config with tail sampling"


# --- every collector config ----------------------------------------------------------------------

@pytest.fixture(params=COLLECTOR_CONFIGS, ids=lambda p: p.name)
def config(request: pytest.FixtureRequest) -> dict[str, Any]:
    loaded: dict[str, Any] = _load(request.param)
    assert isinstance(loaded, dict), f"{request.param.name} is not a YAML mapping"
    return loaded


def test_has_the_required_sections(config: dict[str, Any]) -> None:
    for section in ("receivers", "processors", "exporters", "service"):
        assert isinstance(config.get(section), dict) and config[section], f"missing or empty {section}"
    assert set(config) <= {*SECTIONS, "service"}, f"unknown top-level keys {set(config) - {*SECTIONS, 'service'}}"
    pipelines = _pipelines(config)
    assert pipelines, "no pipelines"
    for pipeline_id, pipeline in pipelines.items():
        assert _signal(pipeline_id) in SIGNALS, f"pipeline {pipeline_id}: not a traces/metrics/logs pipeline"
        assert set(pipeline) <= {"receivers", "processors", "exporters"}, pipeline_id
        assert pipeline.get("receivers") and pipeline.get("exporters"), \
            f"pipeline {pipeline_id} needs receivers and exporters"


def test_every_referenced_component_is_defined(config: dict[str, Any]) -> None:
    defined = {section: set(config.get(section) or {}) for section in SECTIONS}
    for pipeline_id, pipeline in _pipelines(config).items():
        for role, sections in (("receivers", ("receivers", "connectors")), ("processors", ("processors",)),
                               ("exporters", ("exporters", "connectors"))):
            for component_id in pipeline.get(role) or []:
                assert any(component_id in defined[s] for s in sections), \
                    f"pipeline {pipeline_id}: {role} {component_id!r} is not defined"
            assert len(set(pipeline.get(role) or [])) == len(pipeline.get(role) or []), \
                f"{pipeline_id}: duplicate {role}"
    for extension in config["service"].get("extensions") or []:
        assert extension in defined["extensions"], f"service.extensions: {extension!r} is not defined"


def test_every_defined_component_is_used(config: dict[str, Any]) -> None:
    used = {role: {c for p in _pipelines(config).values() for c in p.get(role) or []}
            for role in ("receivers", "processors", "exporters")}
    for section in ("receivers", "processors", "exporters"):
        unused = set(config.get(section) or {}) - used[section]
        assert not unused, f"{section} defined but in no pipeline: {sorted(unused)}"
    unused = set(config.get("connectors") or {}) - used["receivers"] - used["exporters"]
    assert not unused, f"connectors in no pipeline: {sorted(unused)}"
    unused = set(config.get("extensions") or {}) - set(config["service"].get("extensions") or [])
    assert not unused, f"extensions not enabled in service.extensions: {sorted(unused)}"


def test_every_component_type_is_in_the_contrib_distribution(config: dict[str, Any]) -> None:
    for section, kind in SECTIONS.items():
        for component_id in config.get(section) or {}:
            type_ = _type(component_id)
            assert (kind, type_) in TYPES, (
                f"{kind} type {type_!r} ({component_id}) is not a known otelcol-contrib component: if it is one, "
                f"add it to tests/fixtures/collector/component-types.txt from its metadata.yaml")
            module = TYPES[(kind, type_)][1]
            assert module in MANIFEST[kind], f"{component_id}: {module} is not in the contrib distribution"


def test_components_support_their_pipelines_signal(config: dict[str, Any]) -> None:
    connectors = set(config.get("connectors") or {})
    for pipeline_id, pipeline in _pipelines(config).items():
        signal = _signal(pipeline_id)
        for role, kind in (("receivers", "receiver"), ("processors", "processor"), ("exporters", "exporter")):
            for component_id in pipeline.get(role) or []:
                if component_id in connectors:
                    continue
                signals = TYPES[(kind, _type(component_id))][0]
                assert signal in signals, f"{pipeline_id}: {component_id} does not support {signal}"


def test_connectors_join_two_pipelines_of_the_right_signals(config: dict[str, Any]) -> None:
    pipelines = _pipelines(config)
    for connector_id in config.get("connectors") or {}:
        into = [p for p, body in pipelines.items() if connector_id in (body.get("exporters") or [])]
        out_of = [p for p, body in pipelines.items() if connector_id in (body.get("receivers") or [])]
        assert into, f"connector {connector_id} is the exporter of no pipeline"
        assert out_of, f"connector {connector_id} is the receiver of no pipeline"
        allowed = {tuple(pair.split(">")) for pair in TYPES[("connector", _type(connector_id))][0]}
        for src in into:
            for dst in out_of:
                assert src != dst, f"connector {connector_id} loops on pipeline {src}"
                assert (_signal(src), _signal(dst)) in allowed, \
                    f"connector {connector_id} cannot go from {src} to {dst} (allowed: {sorted(allowed)})"


def test_memory_limiter_first_and_batch_last(config: dict[str, Any]) -> None:
    connectors = set(config.get("connectors") or {})
    limiters = [p for p in config["processors"] if _type(p) == "memory_limiter"]
    assert limiters, "no memory_limiter"
    for limiter in limiters:
        settings = config["processors"][limiter]
        assert _go_duration(settings["check_interval"]) > 0
        assert "limit_mib" in settings or "limit_percentage" in settings
        if "limit_mib" in settings and "spike_limit_mib" in settings:
            assert settings["spike_limit_mib"] < settings["limit_mib"]
    for pipeline_id, pipeline in _pipelines(config).items():
        processors = pipeline.get("processors") or []
        if set(pipeline["receivers"]) - connectors:  # fed by a real receiver
            assert processors and _type(processors[0]) == "memory_limiter", \
                f"{pipeline_id}: memory_limiter must be the first processor"
        batches = [i for i, p in enumerate(processors) if _type(p) == "batch"]
        assert batches in ([], [len(processors) - 1]), f"{pipeline_id}: batch must be the last processor"
    assert any(_type(p) == "batch" for body in _pipelines(config).values() for p in body.get("processors") or []), \
        "no pipeline batches its exports"


def _deleted_keys(processor: dict[str, Any]) -> tuple[set[str], list[re.Pattern[str]]]:
    keys, patterns = set(), []
    for action in processor.get("actions") or []:
        assert action.get("action") in {"insert", "update", "upsert", "delete", "hash", "extract", "convert"}, action
        assert ("key" in action) != ("pattern" in action), f"an action needs a key or a pattern: {action}"
        if action["action"] == "delete":
            if "key" in action:
                keys.add(action["key"])
            else:
                patterns.append(re.compile(action["pattern"]))
    return keys, patterns


def _deletes(config: dict[str, Any], processor_ids: list[str], name: str) -> bool:
    for processor_id in processor_ids:
        if _type(processor_id) != "attributes":
            continue
        settings = config["processors"][processor_id]
        assert not settings.get("include") and not settings.get("exclude"), \
            f"{processor_id}: a match filter would let some spans keep the attributes"
        keys, patterns = _deleted_keys(settings)
        if name in keys or any(p.search(name) for p in patterns):
            return True
    return False


def test_content_and_credentials_are_deleted_on_the_way_in(config: dict[str, Any]) -> None:
    connectors = set(config.get("connectors") or {})
    for pipeline_id, pipeline in _pipelines(config).items():
        if set(pipeline["receivers"]) <= connectors:
            continue  # fed by another pipeline of this file, which cleaned the data already
        processors = pipeline.get("processors") or []
        if _signal(pipeline_id) == "traces":
            for name in CONTENT_ATTRIBUTES:
                assert _deletes(config, processors, name), f"{pipeline_id} does not delete {name}"
        for name in CREDENTIAL_ATTRIBUTES:
            assert _deletes(config, processors, name), f"{pipeline_id} does not delete {name}"
        # the pattern catches other spellings, and nothing that is not a credential
        for name in ("http.request.header.x_api_key", "http.request.header.proxy-authorization"):
            assert _deletes(config, processors, name), f"{pipeline_id} does not delete {name}"
        for name in ("http.request.header.content-type", sc.GEN_AI_REQUEST_MODEL, sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN):
            assert not _deletes(config, processors, name), f"{pipeline_id} deletes {name}"


def test_otlp_receiver_serves_both_protocols_on_the_standard_ports(config: dict[str, Any]) -> None:
    protocols = config["receivers"]["otlp"]["protocols"]
    assert _endpoint(protocols["grpc"]["endpoint"])[1] == 4317
    assert _endpoint(protocols["http"]["endpoint"])[1] == 4318


def test_exporters_to_plain_endpoints_say_so(config: dict[str, Any]) -> None:
    for exporter_id, settings in config["exporters"].items():
        if _type(exporter_id) == "otlp":
            host, port = _endpoint(settings["endpoint"])
            assert host and 0 < port < 65536
            assert "://" not in settings["endpoint"], f"{exporter_id}: the otlp (gRPC) exporter takes host:port"
            assert settings.get("tls", {}).get("insecure") is True, \
                f"{exporter_id}: the backends here speak plain gRPC; without tls.insecure the exporter uses TLS"


# --- the existing minimal config keeps working ---------------------------------------------------

def test_minimal_config_keeps_its_host_local_setup() -> None:
    config = _load(CONFIG_DIR / "otel-collector.yaml")
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "127.0.0.1:4317"
    assert protocols["http"]["endpoint"] == "127.0.0.1:4318"
    assert "otlp/traces" in _pipelines(config)["traces"]["exporters"]
    assert "attributes/drop-content" in _pipelines(config)["traces"]["processors"]


# --- tail sampling -------------------------------------------------------------------------------

POLICY_TYPES = {"always_sample", "latency", "numeric_attribute", "probabilistic", "status_code", "string_attribute",
                "rate_limiting", "span_count", "trace_state", "boolean_attribute", "ottl_condition", "and",
                "composite", "not", "drop", "bytes_limiting"}
_OTTL_ATTRIBUTE = re.compile(r'(?<![\w.])attributes\["([^"]+)"\]')


def _policies(policies: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every policy, sub-policies of and/composite/not/drop included."""
    for policy in policies:
        yield policy
        block = policy.get(policy["type"]) or {}
        for key in ("and_sub_policy", "composite_sub_policy", "drop_sub_policy"):
            yield from _policies(block.get(key) or [])
        if "not_sub_policy" in block:
            yield from _policies([block["not_sub_policy"]])


def _policy_attributes(policy: dict[str, Any]) -> set[str]:
    block = policy.get(policy["type"]) or {}
    if policy["type"] in ("numeric_attribute", "string_attribute", "boolean_attribute"):
        return {block["key"]}
    if policy["type"] == "ottl_condition":
        conditions = [*(block.get("span") or []), *(block.get("spanevent") or [])]
        assert conditions, f"policy {policy['name']}: no OTTL condition"
        return {m for c in conditions for m in _OTTL_ATTRIBUTE.findall(c)}
    return set()


@pytest.fixture(params=_full_configs(), ids=lambda p: p.name)
def full(request: pytest.FixtureRequest) -> dict[str, Any]:
    loaded: dict[str, Any] = _load(request.param)
    return loaded


def test_tail_sampling_keeps_failed_and_slow_calls_and_a_share_of_the_rest(full: dict[str, Any]) -> None:
    settings = full["processors"]["tail_sampling"]
    assert _go_duration(settings["decision_wait"]) >= 5, "shorter than the SDK's 5 s batch delay"
    assert settings["num_traces"] > 0
    policies = settings["policies"]
    names = [p["name"] for p in policies]
    assert len(names) == len(set(names)), "policy names must be unique"
    for policy in _policies(policies):
        assert policy["type"] in POLICY_TYPES, f"unknown policy type {policy['type']!r}"
        if policy["type"] != "always_sample":
            assert isinstance(policy.get(policy["type"]), dict), \
                f"policy {policy['name']}: its settings go under `{policy['type']}:`"
    by_type: dict[str, list[dict[str, Any]]] = {}
    for policy in policies:
        by_type.setdefault(policy["type"], []).append(policy[policy["type"]] if policy["type"] in policy else {})
    assert "always_sample" not in by_type, "always_sample would keep everything"
    assert any("ERROR" in p["status_codes"] for p in by_type.get("status_code", [])), "failed calls are not kept"
    latency = [p["threshold_ms"] for p in by_type.get("latency", [])]
    assert latency and all(0 < t <= 30_000 for t in latency), "slow calls are not kept"
    ttft = [p for p in policies if sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN in _policy_attributes(p)]
    assert ttft, "no policy on the time to first token"
    percentages = [p["sampling_percentage"] for p in by_type.get("probabilistic", [])]
    assert percentages and all(0 < pct < 100 for pct in percentages), "no probabilistic share of ordinary calls"


def test_tail_sampling_names_only_attributes_otel_llm_emits(full: dict[str, Any]) -> None:
    for policy in _policies(full["processors"]["tail_sampling"]["policies"]):
        for name in _policy_attributes(policy):
            assert _is_semconv_attribute(name), f"policy {policy['name']}: {name!r} is not in otel_llm/semconv.py"
        if policy["type"] == "numeric_attribute":
            key = policy["numeric_attribute"]["key"]
            assert key not in DOUBLE_ATTRIBUTES and not key.startswith(sc.LLM_SERVER_TIMING_PREFIX), (
                f"policy {policy['name']}: {key} is a double; numeric_attribute reads int64 values only "
                f"(a double reads as 0): use an ottl_condition policy")


def test_sampling_comes_after_span_metrics(full: dict[str, Any]) -> None:
    """Span metrics count every call: the pipeline feeding spanmetrics samples nothing."""
    pipelines = _pipelines(full)
    feeding = [p for p, body in pipelines.items() if "spanmetrics" in (body.get("exporters") or [])]
    assert feeding
    for pipeline_id in feeding:
        assert "tail_sampling" not in (pipelines[pipeline_id].get("processors") or []), pipeline_id
    sampled = [p for p, body in pipelines.items() if "tail_sampling" in (body.get("processors") or [])]
    assert len(sampled) == 1 and _signal(sampled[0]) == "traces"
    exporters = {_type(e) for e in pipelines[sampled[0]]["exporters"]}
    assert exporters == {"otlp"} and {"otlp/jaeger", "otlp/tempo"} <= set(pipelines[sampled[0]]["exporters"])


# --- following the applications' sampling (otel-collector-sampled.yaml) -----------------------------

VLLM_SCOPE = "vllm.tracing.otel"   # vLLM's tracer (tests/e2e/test_vllm.py checks it on the real one)


def _span(trace: str, scope: str, parent: str = "", **attributes: Any) -> SpanFacts:
    return SpanFacts(trace, format(hash((trace, scope, parent)) & 0xFFFF_FFFF_FFFF, "016x"), parent, scope, attributes)


def test_sampled_config_keeps_the_runtime_s_spans_only_where_someone_kept_the_trace() -> None:
    config = _load(SAMPLED)
    spans = [
        # otel_llm dropped the call: only vLLM's span, under a parent that never arrives
        _span("a" * 32, VLLM_SCOPE, parent="1" * 16),
        # otel_llm kept the call (with its phases): vLLM's span rides with it
        _span("b" * 32, sc.INSTRUMENTATION_NAME, **{sc.LLM_SAMPLING_REASON: ("slow",)}),
        _span("b" * 32, sc.INSTRUMENTATION_NAME, parent="2" * 16),
        _span("b" * 32, VLLM_SCOPE, parent="3" * 16),
        # the gateway kept its tree for a caller that does not sample (its upstream call is otel_llm's)
        _span("c" * 32, f"{sc.INSTRUMENTATION_NAME}.gateway"),
        _span("c" * 32, VLLM_SCOPE, parent="4" * 16),
        # a client with no trace context: vLLM's span is a root
        _span("d" * 32, VLLM_SCOPE),
        # the application's own spans of a trace it kept, with no model call in it
        _span("e" * 32, "my.app", parent="5" * 16),
    ]
    assert kept_traces(config, spans) == {"b" * 32, "c" * 32, "d" * 32, "e" * 32}
    # a proxy of the user's between otel_llm and vLLM records every call too: named beside the runtime
    # (as the file says), its spans of a dropped call no longer keep the trace
    proxied = [_span("f" * 32, "my.proxy", parent="6" * 16), _span("f" * 32, VLLM_SCOPE, parent="7" * 16)]
    assert kept_traces(config, proxied) == {"f" * 32}
    (upstream,) = [p for p in config["processors"]["tail_sampling"]["policies"] if p["name"] == "kept-upstream"]
    upstream["ottl_condition"]["span"] = [c + ' and instrumentation_scope.name != "my.proxy"'
                                          for c in upstream["ottl_condition"]["span"]]
    assert kept_traces(config, proxied) == set()
    assert kept_traces(config, spans) == {"b" * 32, "c" * 32, "d" * 32, "e" * 32}


def test_sampled_config_samples_nothing_by_itself() -> None:
    """No share, no latency rule: the applications chose; the policies are only the two readings."""
    config = _load(SAMPLED)
    policies = config["processors"]["tail_sampling"]["policies"]
    assert {p["type"] for p in _policies(policies)} == {"ottl_condition"}
    conditions = [c for p in policies for c in p["ottl_condition"]["span"]]
    assert any(VLLM_SCOPE in c for c in conditions) and "IsRootSpan()" in conditions
    pipelines = _pipelines(config)
    assert [p for p, body in pipelines.items() if "tail_sampling" in (body.get("processors") or [])] == ["traces"]
    assert _go_duration(config["processors"]["tail_sampling"]["decision_wait"]) >= 10, \
        "the call's and the runtime's spans each wait up to the SDKs' 5 s batch delay"


def test_sampled_config_is_described_where_users_look() -> None:
    readme = (CONFIG_DIR / "README.md").read_text(encoding="utf-8")
    sampling = (ROOT / "docs" / "sampling.md").read_text(encoding="utf-8")
    assert SAMPLED.name in readme and SAMPLED.name in sampling


# --- span metrics --------------------------------------------------------------------------------

def test_span_metrics_dimensions_exist_and_stay_low_cardinality(full: dict[str, Any]) -> None:
    settings = full["connectors"]["spanmetrics"]
    names = [d["name"] for d in settings["dimensions"]]
    assert len(names) == len(set(names)), "duplicate dimension"
    assert not {"service.name", "span.name", "span.kind", "status.code"} & set(names), "a default dimension is repeated"
    for name in names:
        assert _is_semconv_attribute(name), f"dimension {name!r} is not in otel_llm/semconv.py"
        assert name not in HIGH_CARDINALITY, f"dimension {name!r} has unbounded values"
    assert {sc.GEN_AI_REQUEST_MODEL, sc.LLM_RUNTIME_NAME} <= set(names)


def test_span_metrics_buckets_are_the_phase_buckets_in_seconds(full: dict[str, Any]) -> None:
    histogram = full["connectors"]["spanmetrics"]["histogram"]
    assert histogram["unit"] == "s"
    buckets = [_go_duration(b) for b in histogram["explicit"]["buckets"]]
    assert buckets == pytest.approx(list(sc.PHASE_BUCKETS), rel=1e-9)
    assert full["connectors"]["spanmetrics"]["exemplars"]["enabled"] is True


def test_metrics_reach_prometheus_both_ways(full: dict[str, Any]) -> None:
    metrics = _pipelines(full)["metrics"]
    assert {"otlp", "spanmetrics"} <= set(metrics["receivers"])
    assert {"prometheus", "prometheusremotewrite"} <= set(metrics["exporters"])
    assert full["exporters"]["prometheus"]["enable_open_metrics"] is True, "exemplars need OpenMetrics"
    for exporter in ("prometheus", "prometheusremotewrite"):
        # service.name becomes a `service_name` label (dashboards filter on it), not only `job`
        assert full["exporters"][exporter]["resource_to_telemetry_conversion"]["enabled"] is True, exporter


# --- the compose stack ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = _load(COMPOSE)
    assert isinstance(loaded.get("services"), dict) and loaded["services"]
    return loaded


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume in short syntax."""
    mounts = []
    for volume in service.get("volumes") or []:
        assert isinstance(volume, str), f"use the short volume syntax: {volume}"
        source, target, *mode = volume.split(":")
        assert mode in ([], ["ro"], ["rw"]), volume
        mounts.append((source, target))
    return mounts


def _mounted(service: dict[str, Any], target: str) -> Path:
    """The repository path mounted at `target` in the container."""
    for source, mounted_at in _mounts(service):
        if mounted_at == target:
            assert source.startswith("."), f"{target} is not a bind mount of a repository file"
            return (DEPLOY / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


def _published(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port)."""
    ports = {}
    for entry in service.get("ports") or []:
        parts = str(entry).split(":")
        if len(parts) == 1:
            parts = [parts[0], parts[0]]
        if len(parts) == 2:
            parts = ["0.0.0.0", *parts]
        ip, host, container = parts
        ports[int(container)] = (ip, int(host))
    return ports


def _flag(command: list[str], name: str) -> str | None:
    for arg in command:
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _config_file(service: dict[str, Any], flag: str) -> Path:
    """The repository file that `flag=PATH` in the service's command names, through its mounts."""
    target = _flag(service["command"], flag)
    assert target, f"no {flag}= in {service['command']}"
    return _mounted(service, target)


def _collector_config(compose: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    collector = compose["services"]["otel-collector"]
    path = _config_file(collector, "--config")
    assert path.parent == CONFIG_DIR, path
    return path, _load(path)


def test_every_service_has_a_pinned_image(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        image = service.get("image")
        assert image, f"service {name} has no image"
        assert ":" in image and not image.endswith(":latest"), f"service {name}: pin the image version ({image})"
    assert {"otel-collector", "jaeger", "tempo", "prometheus", "grafana"} <= set(compose["services"])


def test_collector_image_is_the_version_the_component_list_describes(compose: dict[str, Any]) -> None:
    image = compose["services"]["otel-collector"]["image"]
    assert image.startswith("otel/opentelemetry-collector-contrib:")
    assert image.rsplit(":", 1)[1] == MANIFEST_VERSION, \
        "the vendored component list is for another collector version: update both together"


def test_every_mount_exists_and_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for source, target in _mounts(service):
            assert target.startswith("/"), f"{name}: {target}"
            if source.startswith("."):
                path = (DEPLOY / source).resolve()
                assert path.is_relative_to(ROOT), f"{name}: {source} is outside the repository"
                if path == ROOT / "dashboards":
                    continue  # written by the dashboards work; checked in its own test
                assert path.exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared under `volumes:`"


def test_published_ports_are_local_and_distinct(compose: dict[str, Any]) -> None:
    seen: dict[int, str] = {}
    for name, service in compose["services"].items():
        for container, (ip, host) in _published(service).items():
            assert ip == "127.0.0.1", f"{name}: port {host} is published on every interface"
            assert host not in seen, f"host port {host} published by {seen.get(host)} and {name}"
            seen[host] = name


def test_collector_listens_where_compose_publishes(compose: dict[str, Any]) -> None:
    path, config = _collector_config(compose)
    assert path.name == "otel-collector-full.yaml"
    published = _published(compose["services"]["otel-collector"])
    for protocol, port in (("grpc", 4317), ("http", 4318)):
        host, listen = _endpoint(config["receivers"]["otlp"]["protocols"][protocol]["endpoint"])
        assert host == "0.0.0.0", f"in a container the OTLP {protocol} receiver must listen on 0.0.0.0"
        assert listen == port and published.get(port, (None, None))[1] == port, f"OTLP {protocol} port not published"
    host, port = _endpoint(config["exporters"]["prometheus"]["endpoint"])
    assert host == "0.0.0.0" and port in published


def test_trace_exporters_reach_jaeger_and_tempo(compose: dict[str, Any]) -> None:
    _path, config = _collector_config(compose)
    services = compose["services"]
    assert _endpoint(config["exporters"]["otlp/jaeger"]["endpoint"]) == ("jaeger", JAEGER_OTLP_GRPC_PORT)
    tempo_config = _load(_config_file(services["tempo"], "-config.file"))
    tempo_host, tempo_port = _endpoint(
        tempo_config["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    assert tempo_host == "0.0.0.0", "Tempo's OTLP receiver must listen on 0.0.0.0 to be reached from the collector"
    assert _endpoint(config["exporters"]["otlp/tempo"]["endpoint"]) == ("tempo", tempo_port)
    assert services["jaeger"]["environment"]["JAEGER_LISTEN_HOST"] == "0.0.0.0"


def test_prometheus_scrapes_the_exporter_and_accepts_remote_write(compose: dict[str, Any]) -> None:
    _path, config = _collector_config(compose)
    prometheus = compose["services"]["prometheus"]
    command = prometheus["command"]
    assert "--web.enable-remote-write-receiver" in command
    assert "--enable-feature=exemplar-storage" in command
    assert _flag(command, "--web.listen-address") in (None, f"0.0.0.0:{PROMETHEUS_PORT}", f":{PROMETHEUS_PORT}")
    scrape = _load(_config_file(prometheus, "--config.file"))
    targets = {t: job for job in scrape["scrape_configs"] for sc_ in job["static_configs"] for t in sc_["targets"]}

    exporter_port = _endpoint(config["exporters"]["prometheus"]["endpoint"])[1]
    job = targets.get(f"otel-collector:{exporter_port}")
    assert job, f"no scrape job for the prometheus exporter (otel-collector:{exporter_port})"
    assert job.get("scrape_protocols", ["OpenMetricsText1.0.0"])[0].startswith("OpenMetrics"), \
        "exemplars need OpenMetrics"
    readers = config["service"]["telemetry"]["metrics"]["readers"]
    internal = readers[0]["pull"]["exporter"]["prometheus"]
    assert internal["host"] == "0.0.0.0" and f"otel-collector:{internal['port']}" in targets

    url = urlsplit(config["exporters"]["prometheusremotewrite"]["endpoint"])
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "prometheus", PROMETHEUS_PORT, "/api/v1/write")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_grafana_datasources_point_at_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    grafana = services["grafana"]
    folder = _mounted(grafana, "/etc/grafana/provisioning/datasources")
    files = sorted(folder.glob("*.yaml"))
    assert files
    tempo_config = _load(_config_file(services["tempo"], "-config.file"))
    ports = {"prometheus": PROMETHEUS_PORT, "jaeger": JAEGER_QUERY_PORT,
             "tempo": tempo_config["server"]["http_listen_port"]}
    datasources = []
    for path in files:
        loaded = _load(path)
        # Grafana expands $VAR and ${VAR} in provisioned values: a literal $ must be written $$
        for value in _strings(loaded):
            assert "$" not in value.replace("$$", ""), f"{path.name}: unescaped $ in {value!r}"
        assert loaded["apiVersion"] == 1
        datasources += loaded["datasources"]
    by_uid = {d["uid"]: d for d in datasources}
    assert len(by_uid) == len(datasources), "duplicate datasource uid"
    assert {d["type"] for d in datasources} >= {"prometheus", "tempo", "jaeger"}
    for source in datasources:
        url = urlsplit(source["url"])
        assert url.hostname in services, f"datasource {source['name']}: {url.hostname} is not a compose service"
        assert url.port == ports[url.hostname], f"datasource {source['name']}: wrong port"
    assert sum(d.get("isDefault", False) for d in datasources) == 1
    prometheus = next(d for d in datasources if d["type"] == "prometheus")
    links = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert {link["datasourceUid"] for link in links} == {by_uid[u]["uid"] for u in by_uid
                                                         if by_uid[u]["type"] in ("tempo", "jaeger")}
    assert {link["name"] for link in links} == {"trace_id"}, "the collector's exemplars carry the trace id as trace_id"
    for source in datasources:
        related = source.get("jsonData", {}).get("tracesToMetrics", {}).get("datasourceUid")
        assert related in (None, *by_uid), f"{source['name']}: tracesToMetrics to unknown datasource {related}"


def test_grafana_dashboard_provider_loads_the_repository_dashboards(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    folder = _mounted(grafana, "/etc/grafana/provisioning/dashboards")
    providers = [p for path in sorted(folder.glob("*.yaml")) for p in _load(path)["providers"]]
    assert providers
    for provider in providers:
        assert provider["type"] == "file"
        source = _mounted(grafana, provider["options"]["path"])
        assert source == ROOT / "dashboards", f"provider {provider['name']} does not load the repository's dashboards/"


def test_provisioned_dashboards_parse() -> None:
    folder = ROOT / "dashboards"
    if not folder.is_dir():
        pytest.skip("dashboards/ is not in the repository yet")
    files = sorted(folder.glob("*.json"))
    assert files, "dashboards/ has no .json file for Grafana to load"
    for path in files:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(dashboard, dict) and dashboard.get("title"), f"{path.name}: not a dashboard"
        assert "__inputs" not in dashboard, (
            f"{path.name}: an export 'for sharing externally' (__inputs, ${{DS_...}}) does not load through "
            f"file provisioning; refer to the datasource uids (prometheus, tempo, jaeger)")


def test_depends_on_names_services(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for dependency in service.get("depends_on") or []:
            assert dependency in compose["services"], f"{name} depends on unknown {dependency}"
