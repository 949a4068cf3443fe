"""Writes the Grafana dashboards of this folder: ``python dashboards/build.py``.

The JSON files are generated, not edited by hand: change a panel here and run this script
(``tests/test_dashboards.py`` fails when a JSON file differs from what this script writes, and
runs every query of every panel against a real Prometheus fed by otel_llm).

Metric names are those of ``otel_llm/semconv.py`` after the OpenTelemetry -> Prometheus
translation of ``opentelemetry-exporter-prometheus`` (``OTEL_METRICS_EXPORTER=prometheus``):
dots become ``_``, the unit becomes a suffix (``s`` -> ``_seconds``, ``By`` -> ``_bytes``,
``{token}/s`` -> ``_per_second``, ``1`` and ``{...}`` -> nothing), counters end in ``_total``
and histograms are ``_bucket`` / ``_sum`` / ``_count``. Resource attribute ``service.name``
is the ``service_name`` label on every series.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
SCHEMA_VERSION = 39
TAGS = ["otel-llm", "llm", "genai"]


# --- template variables ---------------------------------------------------------------------
def datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False}


def traces_variable() -> dict[str, Any]:
    return {"name": "traces", "label": "Traces (Tempo)", "type": "datasource", "query": "tempo",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False,
            "description": "Trace data source the latency panels link to (exemplars use the Prometheus "
                           "data source's exemplarTraceIdDestinations)."}


def jaeger_variable() -> dict[str, Any]:
    url = "http://localhost:16686"
    return {"name": "jaeger_url", "label": "Jaeger UI", "type": "textbox", "query": url,
            "current": {"text": url, "value": url}, "options": [{"selected": True, "text": url, "value": url}],
            "hide": 0, "skipUrlSync": False,
            "description": "Base URL of a Jaeger UI, for the dashboard link to Jaeger's trace search."}


def query_variable(name: str, label: str, definition: str, multi: bool = True) -> dict[str, Any]:
    """A label_values() variable; multi-valued ones have an All option matching everything."""
    variable: dict[str, Any] = {
        "name": name, "label": label, "type": "query", "datasource": DS, "definition": definition,
        "query": {"qryType": 1, "query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2, "sort": 1, "hide": 0, "regex": "", "options": [], "skipUrlSync": False,
        "includeAll": multi, "multi": multi,
    }
    if multi:
        variable["allValue"] = ".*"
        variable["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    else:
        variable["current"] = {}
    return variable


# --- trace links ------------------------------------------------------------------------------
def tempo_link(traceql: str, title: str) -> dict[str, Any]:
    """A data link to Grafana Explore on the ``$traces`` data source with a TraceQL query over
    the panel's time range. The JSON is percent-encoded around the ${...} placeholders."""
    panes = {"traces": {"datasource": "@@DS@@", "queries": [{
        "refId": "A", "datasource": {"type": "tempo", "uid": "@@DS@@"}, "queryType": "traceql",
        "query": traceql, "limit": 20}], "range": {"from": "@@FROM@@", "to": "@@TO@@"}}}
    encoded = quote(json.dumps(panes, separators=(",", ":")), safe="")
    for token, value in (("@@DS@@", "${traces}"), ("@@FROM@@", "${__from}"), ("@@TO@@", "${__to}"),
                         ("@@MODEL@@", "${model:pipe}"), ("@@SERVICE@@", "${service:pipe}")):
        encoded = encoded.replace(quote(token, safe=""), value)
    return {"title": title, "url": f"/explore?schemaVersion=1&orgId=1&panes={encoded}", "targetBlank": True}


CALL_TRACES = tempo_link('{kind=client && span.gen_ai.request.model=~"@@MODEL@@" && '
                         'resource.service.name=~"@@SERVICE@@"}',
                         "Model-call traces in Tempo (selected models, this time range)")
GATEWAY_TRACES = tempo_link('{kind=server && resource.service.name=~"@@SERVICE@@"}',
                            "Gateway request traces in Tempo (this time range)")


# --- panels -----------------------------------------------------------------------------------
def target(expr: str, legend: str = "", ref: str = "A", exemplar: bool = False,
           instant: bool = False) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "editorMode": "code", "expr": expr,
            "legendFormat": legend or "__auto", "range": not instant, "instant": instant,
            "exemplar": exemplar}


class Layout:
    """Places panels left to right, 24 columns wide, and numbers them."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row_height = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        if self.x:
            self.y += self.row_height
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False, "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1
        self.x = self.row_height = 0

    def add(self, panel: dict[str, Any], w: int = 12, h: int = 8) -> None:
        if self.x + w > 24:
            self.y += self.row_height
            self.x = self.row_height = 0
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def timeseries(title: str, description: str, targets: list[dict[str, Any]], unit: str, *,
               stack: bool = False, links: list[dict[str, Any]] | None = None, bars: bool = False,
               min_zero: bool = True, overrides: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    custom: dict[str, Any] = {
        "drawStyle": "bars" if bars else "line", "lineWidth": 1, "fillOpacity": 60 if stack else 10,
        "gradientMode": "none", "showPoints": "never", "pointSize": 4, "spanNulls": False,
        "lineInterpolation": "linear", "axisPlacement": "auto", "axisLabel": "",
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    defaults: dict[str, Any] = {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"}}
    if min_zero:
        defaults["min"] = 0
    if links:
        defaults["links"] = links
    return {"type": "timeseries", "title": title, "description": description, "datasource": DS,
            "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, description: str, targets: list[dict[str, Any]], unit: str) -> dict[str, Any]:
    return {"type": "stat", "title": title, "description": description, "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit, "color": {"mode": "thresholds"},
                                         "thresholds": {"mode": "absolute", "steps": [
                                             {"color": "green", "value": None}, {"color": "orange", "value": 1}]}},
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "none", "textMode": "auto", "justifyMode": "auto",
                        "orientation": "auto"}}


# otel_llm's model-call metrics under today's names and under semantic-conventions-genai's, which
# OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental selects (docs/options.md): the queries
# read "today's or the new", so a service charts in any of the three modes. "or" keeps the left
# side's series where a service emits both (/dup): nothing is counted twice.
DURATION = ("gen_ai_client_operation_duration_seconds", "gen_ai_client_inference_duration_seconds")
FIRST_CHUNK = ("gen_ai_client_operation_time_to_first_chunk_seconds",
               "gen_ai_client_inference_time_to_first_chunk_seconds")
PER_CHUNK = ("gen_ai_client_operation_time_per_output_chunk_seconds",
             "gen_ai_client_inference_time_per_output_chunk_seconds")
CALLS = tuple(name + "_count" for name in DURATION)  # one observation per finished call
SERVICE = 'service_name=~"$service"'
SERVICE_RUNTIME = SERVICE + ', gen_ai_provider_name=~"$runtime"'
Metric = str | tuple[str, ...]  # one name, or the names of the same series in each convention


def either(metric: Metric, query: Callable[[str], str]) -> str:
    """``query`` of the one metric, or of each name joined by ``or`` (first name first)."""
    if isinstance(metric, str):
        return query(metric)
    return "(" + " or ".join(query(name) for name in metric) + ")"


def series(metric: Metric, selector: str) -> str:
    """A series selector for label_values(): the metric's name(s) and ``selector``."""
    if isinstance(metric, str):
        return f"{metric}{{{selector}}}"
    return f'{{__name__=~"{"|".join(metric)}", {selector}}}'


def quantile(q: float, metric: Metric, selector: str, by: str) -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, " + either(
        metric, lambda m: f"sum by ({group}) (rate({m}_bucket{{{selector}}}[{RI}]))") + ")"


def rate_sum(metric: Metric, selector: str, by: str | None = None) -> str:
    """Per-second rate of a counter (or a histogram's ``_count`` / ``_sum``), summed ``by``."""
    group = f" by ({by}) " if by else ""
    return either(metric, lambda m: f"sum{group}(rate({m}{{{selector}}}[{RI}]))")


def mean(metric: Metric, selector: str, by: str) -> str:
    """Mean of a histogram's observations over the rate window."""
    if isinstance(metric, str):
        return (f"sum by ({by}) (rate({metric}_sum{{{selector}}}[{RI}])) / "
                f"sum by ({by}) (rate({metric}_count{{{selector}}}[{RI}]))")
    return (f"{rate_sum(tuple(m + '_sum' for m in metric), selector, by)} / "
            f"{rate_sum(tuple(m + '_count' for m in metric), selector, by)}")


def tokens_per_second(selector: str, by: str) -> str:
    """Tokens per second by gen_ai_token_type (input / output) and ``by``: gen_ai.client.token.usage,
    or the semantic-conventions-genai usage counters labelled the same way."""
    old = f"sum by (gen_ai_token_type, {by}) (rate(gen_ai_client_token_usage_sum{{{selector}}}[{RI}]))"
    new = [f'label_replace(sum by ({by}) (rate(gen_ai_client_inference_usage_{kind}_tokens_total{{{selector}}}'
           f'[{RI}])), "gen_ai_token_type", "{kind}", "", "")' for kind in ("input", "output")]
    return " or ".join([old, *new])


def dashboard(uid: str, title: str, description: str, variables: list[dict[str, Any]], layout: Layout,
              links: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": TAGS, "editable": True,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "graphTooltip": 1, "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "fiscalYearStartMonth": 0,
        "liveNow": False, "weekStart": "",
        "timepicker": {"refresh_intervals": ["10s", "30s", "1m", "5m", "15m"]},
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": variables}, "links": links, "panels": layout.panels,
    }


def dashboard_links(jaeger: bool = True) -> list[dict[str, Any]]:
    links: list[dict[str, Any]] = [{
        "title": "otel-llm dashboards", "type": "dashboards", "tags": ["otel-llm"], "asDropdown": True,
        "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False, "tooltip": "", "url": ""}]
    if jaeger:
        links.append({"title": "Traces in Jaeger (this time range)", "type": "link", "icon": "external link",
                      "url": "${jaeger_url}/search?lookback=custom&limit=20&start=${__from}000&end=${__to}000",
                      "targetBlank": True, "asDropdown": False, "includeVars": False, "keepTime": False,
                      "tags": [], "tooltip": "Jaeger's trace search over the dashboard's time range"})
    return links


# --- "LLM calls" ------------------------------------------------------------------------------
# A call an otel-llm gateway relays is also recorded by its caller: the fleet's calls are counted
# once, from the caller's side (the gateway dashboard shows the relayed ones).
NOT_RELAYED = 'llm_gateway_relayed!~"(?i)true"'
CALL = ('service_name=~"$service", gen_ai_provider_name=~"$runtime", gen_ai_request_model=~"$model", '
        + NOT_RELAYED)
MR = "gen_ai_request_model, gen_ai_provider_name"  # by model and runtime
MR_LEGEND = "{{gen_ai_request_model}} ({{gen_ai_provider_name}})"


def calls_dashboard() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("service", "Service", f"label_values({series(CALLS, NOT_RELAYED)}, service_name)"),
        query_variable("runtime", "Runtime", f"label_values({series(CALLS, SERVICE + ', ' + NOT_RELAYED)}, "
                                             "gen_ai_provider_name)"),
        query_variable("model", "Model", f"label_values({series(CALLS, SERVICE_RUNTIME + ', ' + NOT_RELAYED)}, "
                                         "gen_ai_request_model)"),
        traces_variable(), jaeger_variable(),
    ]
    lay = Layout()
    lay.row("Latency: where the time of a model call goes")
    lay.add(timeseries(
        "Call latency by phase (mean per call, stacked)",
        "Mean time per model call spent in each phase (llm.client.phase.duration by llm.phase, divided by the "
        "number of calls). The phases tile the call, so the stack is the mean call duration. http.pool_wait / "
        "http.dns / http.connect / http.tls: getting a connection; http.upload: sending the request; "
        "llm.server_wait: until response headers (queueing, model load, prefill when not streamed); "
        "llm.first_token: headers to the first generated token; llm.decode: first to last token; "
        "http.download: body of a non-streamed answer.",
        [target(f"sum by (llm_phase) (rate(llm_client_phase_duration_seconds_sum{{{CALL}}}[{RI}])) / on() "
                f"group_left() {rate_sum(CALLS, CALL)}", "{{llm_phase}}", exemplar=True)],
        "s", stack=True, links=[CALL_TRACES]), w=12, h=9)
    lay.add(timeseries(
        "Call duration p50 / p95 by model",
        "gen_ai.client.operation.duration: whole model call as the client saw it, request start to the end of "
        "the response body. Exemplars (when your pipeline carries them) open the trace of one call.",
        [target(quantile(0.5, DURATION, CALL, MR), "p50 " + MR_LEGEND,
                exemplar=True),
         target(quantile(0.95, DURATION, CALL, MR), "p95 " + MR_LEGEND, "B",
                exemplar=True)],
        "s", links=[CALL_TRACES]), w=12, h=9)
    lay.add(timeseries(
        "Time to first token p50 / p95 by model and runtime",
        "gen_ai.client.operation.time_to_first_chunk: request start to the first chunk carrying generated output "
        "(streamed calls only; role-only deltas, keep-alives and progress events do not count).",
        [target(quantile(0.5, FIRST_CHUNK, CALL, MR), "p50 " + MR_LEGEND,
                exemplar=True),
         target(quantile(0.95, FIRST_CHUNK, CALL, MR), "p95 " + MR_LEGEND,
                "B", exemplar=True)],
        "s", links=[CALL_TRACES]))
    lay.add(timeseries(
        "Time to first token: client vs runtime-reported (p50)",
        "Client: gen_ai.client.operation.time_to_first_chunk. Runtime: gen_ai.server.time_to_first_token, from "
        "the runtime's own counters in the response (queue + model load + prompt evaluation). The gap is time "
        "the runtime does not account for: network, proxies, queueing it does not report.",
        [target(quantile(0.5, FIRST_CHUNK, CALL, MR), "client " + MR_LEGEND,
                exemplar=True),
         target(quantile(0.5, "gen_ai_server_time_to_first_token_seconds", CALL, MR), "runtime " + MR_LEGEND, "B",
                exemplar=True)],
        "s", links=[CALL_TRACES]))
    lay.add(timeseries(
        "Slowest phases: p95 per phase",
        "95th percentile of each phase's duration (llm.client.phase.duration): which phase has the slow tail.",
        [target(quantile(0.95, "llm_client_phase_duration_seconds", CALL, "llm_phase"), "{{llm_phase}}",
                exemplar=True)],
        "s", links=[CALL_TRACES]), w=24)

    lay.row("Generation")
    lay.add(timeseries(
        "Generation rate: client vs runtime (mean tokens/s)",
        "Client: 1 / mean interval between output chunks after the first "
        "(gen_ai.client.operation.time_per_output_chunk; one chunk is one token for most runtimes). Runtime: mean of "
        "llm.runtime.generation.rate, the rate the runtime reports (llama.cpp predicted_per_second, Ollama "
        "eval_count / eval_duration). A client rate well below the runtime's means the tokens are slowed on the way.",
        [target(f"{rate_sum(tuple(m + '_count' for m in PER_CHUNK), CALL, MR)} / "
                f"{rate_sum(tuple(m + '_sum' for m in PER_CHUNK), CALL, MR)}",
                "client " + MR_LEGEND),
         target(mean("llm_runtime_generation_rate_per_second", CALL, MR), "runtime " + MR_LEGEND, "B")],
        "tok/s"))
    lay.add(timeseries(
        "Generation rate percentiles by model and runtime (p50, p10)",
        "p10 is the slowest tenth of calls. Runtime: llm.runtime.generation.rate buckets. Client: the inverse of the "
        "per-call mean chunk interval's p50 and p90 (histogram buckets double, so the client values are coarse).",
        [target(quantile(0.5, "llm_runtime_generation_rate_per_second", CALL, MR), "runtime p50 " + MR_LEGEND),
         target(quantile(0.1, "llm_runtime_generation_rate_per_second", CALL, MR), "runtime p10 " + MR_LEGEND, "B"),
         target("1 / " + quantile(0.5, PER_CHUNK, CALL, MR),
                "client p50 " + MR_LEGEND, "C"),
         target("1 / " + quantile(0.9, PER_CHUNK, CALL, MR),
                "client p10 " + MR_LEGEND, "D")],
        "tok/s"))
    lay.add(timeseries(
        "Prompt evaluation rate (runtime-reported, p50)",
        "llm.runtime.prompt_eval.rate: prompt tokens evaluated per second (cached tokens excluded), as the runtime "
        "reports it. A drop with long prompts or concurrent calls shows prefill contention.",
        [target(quantile(0.5, "llm_runtime_prompt_eval_rate_per_second", CALL, MR), "p50 " + MR_LEGEND)],
        "tok/s"))
    lay.add(timeseries(
        "Tokens per second (input / output)",
        "gen_ai.client.token.usage as reported by the responses, summed per second by token type.",
        [target(tokens_per_second(CALL, "gen_ai_request_model"), "{{gen_ai_token_type}} {{gen_ai_request_model}}")],
        "tok/s", stack=True))
    lay.add(timeseries(
        "Model calls per second by model and error",
        "Calls finished per second (gen_ai.client.operation.duration count); error_type is set on failed calls "
        "(HTTP status, timeout, ...).",
        [target(rate_sum(CALLS, CALL, f"{MR}, error_type"), MR_LEGEND + " {{error_type}}")],
        "reqps", stack=True), w=24)

    lay.row("Diagnosis: cold starts, unaccounted wait, buffering, bottlenecks")
    diag = "llm_diagnosis_calls_total"
    true = '=~"(?i)true"'  # bools are "True" scraped directly, "true" through a collector
    lay.add(stat(
        "Cold starts, this time range",
        "Calls diagnosed as cold starts (llm.diagnosis.calls with llm.diagnosis.cold_start=true): the runtime "
        "reported a model load, or the call came right after an unload. Keep the model resident to avoid them.",
        [target(f"sum(increase({diag}{{{CALL}, llm_diagnosis_cold_start{true}}}[$__range])) or vector(0)",
                "cold starts", instant=True)],
        "none"), w=6)
    lay.add(timeseries(
        "Cold starts per minute by model",
        "Rate of calls diagnosed as cold starts (llm.diagnosis.cold_start=true).",
        # "or 0 * all calls": a model with calls but no cold start shows 0, not a gap
        [target(f"60 * sum by ({MR}) (rate({diag}{{{CALL}, llm_diagnosis_cold_start{true}}}[{RI}])) "
                f"or 0 * sum by ({MR}) (rate({diag}{{{CALL}}}[{RI}]))", MR_LEGEND)],
        "none", bars=True), w=6)
    lay.add(timeseries(
        "Unaccounted wait p50 / p95",
        "llm.diagnosis.unaccounted_wait: wait before the first token that the runtime's own queue, load and "
        "prefill counters do not explain (network, proxies, a gateway's queue, queueing the runtime does not "
        "report). Only calls whose runtime reports its counters.",
        [target(quantile(0.5, "llm_diagnosis_unaccounted_wait_seconds", CALL, MR), "p50 " + MR_LEGEND,
                exemplar=True),
         target(quantile(0.95, "llm_diagnosis_unaccounted_wait_seconds", CALL, MR), "p95 " + MR_LEGEND, "B",
                exemplar=True)],
        "s", links=[CALL_TRACES]))
    lay.add(timeseries(
        "Buffered streams (share of streamed calls)",
        "Share of streamed calls whose tokens arrived in bursts after silences (llm.diagnosis.stream_buffered=true): "
        "an intermediary buffers the stream.",
        [target(f"(sum by ({MR}) (rate({diag}{{{CALL}, llm_diagnosis_stream_buffered{true}}}[{RI}])) "
                f'or 0 * sum by ({MR}) (rate({diag}{{{CALL}, llm_diagnosis_stream_buffered=~".+"}}[{RI}]))) / '
                f'sum by ({MR}) (rate({diag}{{{CALL}, llm_diagnosis_stream_buffered=~".+"}}[{RI}]))', MR_LEGEND)],
        "percentunit"))
    lay.add(timeseries(
        "Bottleneck per call",
        "Calls per second by llm.diagnosis.bottleneck: the phase that dominated each call (queue, load, prefill, "
        "decode, network, buffering, none).",
        [target(f"sum by (llm_diagnosis_bottleneck) (rate({diag}{{{CALL}}}[{RI}]))", "{{llm_diagnosis_bottleneck}}")],
        "reqps", stack=True), w=24)
    lay.add(timeseries(
        "Token pacing: client chunk interval vs runtime token interval",
        "Mean interval between output chunks seen by the client (gen_ai.client.operation.time_per_output_chunk) "
        "against the runtime-reported time per output token (gen_ai.server.time_per_output_token). Equal when "
        "tokens stream one by one; a client interval several times larger means tokens arrive in bursts "
        "(a buffering proxy; per call: llm.diagnosis.stream_buffered).",
        [target(mean(PER_CHUNK, CALL, MR), "client " + MR_LEGEND,
                exemplar=True),
         target(mean("gen_ai_server_time_per_output_token_seconds", CALL, MR), "runtime " + MR_LEGEND, "B",
                exemplar=True)],
        "s", links=[CALL_TRACES]))
    lay.add(timeseries(
        "Tokens per client chunk (burstiness)",
        "Client chunk interval / runtime token interval: about 1 when tokens stream one by one, above 1.5 when "
        "they are held back and delivered in bursts.",
        [target(f"({mean(PER_CHUNK, CALL, MR)}) / "
                f"({mean('gen_ai_server_time_per_output_token_seconds', CALL, MR)})", MR_LEGEND)],
        "none"))

    lay.row("Concurrency")
    lay.add(timeseries(
        "Calls in flight (client) vs runtime running / waiting",
        "llm.client.active_requests: model calls this service has in flight per server. "
        "llm.runtime.requests.running / .waiting: what the runtime itself reports (llama.cpp --metrics, vLLM, TGI, "
        "SGLang), polled in the background. More calls in flight than the runtime runs means they queue.",
        [target('sum by (server_address, server_port) (llm_client_active_requests{service_name=~"$service", '
                + NOT_RELAYED + '})',
                "in flight {{server_address}}:{{server_port}}"),
         target('max by (server_address, server_port, llm_runtime_name) (llm_runtime_requests_running'
                '{service_name=~"$service", llm_runtime_name=~"$runtime"})',
                "running {{llm_runtime_name}} {{server_address}}:{{server_port}}", "B"),
         target('max by (server_address, server_port, llm_runtime_name) (llm_runtime_requests_waiting'
                '{service_name=~"$service", llm_runtime_name=~"$runtime"})',
                "waiting {{llm_runtime_name}} {{server_address}}:{{server_port}}", "C")],
        "short"), w=24)
    return dashboard("otel-llm-calls", "LLM calls (otel-llm)",
                     "Model calls traced by otel_llm: latency by phase, time to first token, generation rates "
                     "(client and runtime-reported), diagnosis signals and concurrency.",
                     variables, lay, dashboard_links())


# --- "LLM host & runtime" ---------------------------------------------------------------------
HOST = 'service_name=~"$service"'
RUNTIME = 'service_name=~"$service", llm_runtime_name=~"$runtime"'
PROC_BY = "process_executable_name, process_pid, llm_runtime_name"
PROC_LEGEND = "{{llm_runtime_name}} {{process_executable_name}} {{process_pid}}"


def host_dashboard() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("service", "Service", "label_values(system_cpu_utilization, service_name)", multi=False),
        query_variable("runtime", "Runtime", 'label_values(process_cpu_utilization{service_name=~"$service"}, '
                                             "llm_runtime_name)"),
        query_variable("model", "Model", f"label_values({series(CALLS, SERVICE)}, gen_ai_request_model)"),
        traces_variable(), jaeger_variable(),
    ]
    call = 'service_name=~"$service", gen_ai_request_model=~"$model"'
    lay = Layout()
    lay.row("Model calls and runtime load (same time axis as the host below)")
    lay.add(timeseries(
        "Model call duration and time to first token (p95)",
        "To read against CPU, memory, paging and GPU below: a latency rise with a saturated resource points at it.",
        [target(quantile(0.95, DURATION, call, ""), "call duration p95",
                exemplar=True),
         target(quantile(0.95, FIRST_CHUNK, call, ""),
                "time to first token p95", "B", exemplar=True)],
        "s", links=[CALL_TRACES]))
    lay.add(timeseries(
        "Calls in flight vs runtime running / waiting",
        "llm.client.active_requests (this service's calls in flight, all servers) and llm.runtime.requests.running / "
        ".waiting as each runtime reports them.",
        [target('sum(llm_client_active_requests{service_name=~"$service", ' + NOT_RELAYED + '})', "calls in flight"),
         target(f"max by (llm_runtime_name, server_address, server_port) (llm_runtime_requests_running{{{RUNTIME}}})",
                "running {{llm_runtime_name}} {{server_address}}:{{server_port}}", "B"),
         target(f"max by (llm_runtime_name, server_address, server_port) (llm_runtime_requests_waiting{{{RUNTIME}}})",
                "waiting {{llm_runtime_name}} {{server_address}}:{{server_port}}", "C")],
        "short"))
    lay.add(timeseries(
        "Runtime KV cache usage",
        "llm.runtime.kv_cache.usage: the share of the runtime's KV cache in use (0..1) as it reports it (vLLM "
        "kv_cache_usage_perc, SGLang token_usage, llama.cpp kv_cache_usage_ratio in builds that still export it). "
        "Near 1, new requests wait or earlier ones are preempted.",
        [target(f"max by (llm_runtime_name, server_address, server_port) (llm_runtime_kv_cache_usage{{{RUNTIME}}})",
                "{{llm_runtime_name}} {{server_address}}:{{server_port}}")],
        "percentunit"))

    lay.row("Host: CPU, memory, paging")
    lay.add(timeseries(
        "Host CPU by mode (stacked)",
        "system.cpu.utilization: fraction of all CPUs' time per mode (idle left out). iowait: waiting on disk; "
        "steal: taken by the hypervisor.",
        [target(f'avg by (cpu_mode) (system_cpu_utilization{{{HOST}, cpu_mode!="idle"}})', "{{cpu_mode}}")],
        "percentunit", stack=True))
    lay.add(timeseries(
        "CPU of the runtime and of this service, per process",
        "process.cpu.utilization (user + system, per CPU) of this service's process and of the model runtime's "
        "processes found on this host (llm_runtime_name set).",
        [target(f"max by ({PROC_BY}) (sum without (cpu_mode) (process_cpu_utilization{{{HOST}}}))", PROC_LEGEND)],
        "percentunit"))
    lay.add(timeseries(
        "Host memory by state (stacked)",
        "system.memory.usage by state: used, cached (page cache), buffers, free.",
        [target(f"avg by (system_memory_state) (system_memory_usage_bytes{{{HOST}}})", "{{system_memory_state}}")],
        "bytes", stack=True))
    lay.add(timeseries(
        "Resident memory of the runtime and of this service",
        "process.memory.usage (RSS) of this service's process and of the runtime's processes: a runtime holding a "
        "model shows its size here.",
        [target(f"max by ({PROC_BY}) (process_memory_usage_bytes{{{HOST}}})", PROC_LEGEND)],
        "bytes"))
    lay.add(timeseries(
        "Paging: swap in / out and major page faults per second",
        "system.paging.operations (major = pages swapped) and system.paging.faults (major = read from disk). "
        "Sustained swapping while a model runs means the weights or KV cache do not fit in memory.",
        [target(f'avg by (system_paging_direction) (rate(system_paging_operations_total{{{HOST}, '
                f'system_paging_fault_type="major"}}[{RI}]))', "swap {{system_paging_direction}}"),
         target(f'avg(rate(system_paging_faults_total{{{HOST}, system_paging_fault_type="major"}}[{RI}]))',
                "major faults", "B")],
        "ops"))
    lay.add(timeseries(
        "Swap space",
        "system.paging.usage: swap used and free.",
        [target(f"avg by (system_paging_state) (system_paging_usage_bytes{{{HOST}}})", "{{system_paging_state}}")],
        "bytes", stack=True))
    lay.add(timeseries(
        "Disk and network I/O",
        "system.disk.io and system.network.io, bytes per second (model loads read the weights from disk).",
        [target(f"avg by (disk_io_direction) (rate(system_disk_io_bytes_total{{{HOST}}}[{RI}]))",
                "disk {{disk_io_direction}}"),
         target(f"avg by (network_io_direction) (rate(system_network_io_bytes_total{{{HOST}}}[{RI}]))",
                "network {{network_io_direction}}", "B")],
        "Bps"), w=24)

    lay.row("GPU (NVIDIA, through NVML)")
    gpu = "hw_id, hw_name"
    lay.add(timeseries(
        "GPU utilization",
        "hw.gpu.utilization per device. Empty without an NVIDIA GPU and driver (the observer stays off).",
        [target(f"max by ({gpu}) (hw_gpu_utilization{{{HOST}}})", "{{hw_name}} {{hw_id}}")],
        "percentunit"))
    lay.add(timeseries(
        "GPU memory used and limit",
        "hw.gpu.memory.usage and hw.gpu.memory.limit per device.",
        [target(f"max by ({gpu}) (hw_gpu_memory_usage_bytes{{{HOST}}})", "used {{hw_name}} {{hw_id}}"),
         target(f"max by ({gpu}) (hw_gpu_memory_limit_bytes{{{HOST}}})", "limit {{hw_name}} {{hw_id}}", "B")],
        "bytes"))
    lay.add(timeseries(
        "GPU memory of the runtime's processes",
        "process.gpu.memory.usage: GPU memory held by each runtime process (compute processes).",
        [target(f"max by (hw_id, process_pid) (process_gpu_memory_usage_bytes{{{HOST}}})",
                "pid {{process_pid}} on {{hw_id}}")],
        "bytes"))
    lay.add(timeseries(
        "GPU power and temperature",
        "hw.power (W) and hw.temperature (degrees Celsius, right axis) per device.",
        [target(f"max by ({gpu}) (hw_power_watts{{{HOST}}})", "power {{hw_name}} {{hw_id}}"),
         target(f"max by ({gpu}) (hw_temperature_celsius{{{HOST}}})", "temperature {{hw_name}} {{hw_id}}", "B")],
        "watt", overrides=[{"matcher": {"id": "byFrameRefID", "options": "B"}, "properties": [
            {"id": "unit", "value": "celsius"}, {"id": "custom.axisPlacement", "value": "right"}]}]))
    lay.add(timeseries(
        "GPU throttling reasons",
        "hw.gpu.throttle: 1 while the clocks are held down for that reason (power cap, thermal slowdown, ...).",
        [target(f"max by (hw_id, hw_gpu_throttle_reason) (hw_gpu_throttle{{{HOST}}})",
                "{{hw_gpu_throttle_reason}} {{hw_id}}")],
        "short"), w=24)

    lay.row("Runtime state (polled from the runtimes)")
    lay.add(timeseries(
        "Models loaded (Ollama /api/ps)",
        "llm.runtime.model.loaded: 1 per model the runtime holds in memory. A model that disappears was unloaded: "
        "the next call to it is a cold start.",
        [target(f'max by (gen_ai_request_model, server_address, server_port) (llm_runtime_model_loaded{{{RUNTIME}, '
                f'gen_ai_request_model=~"$model"}})', "{{gen_ai_request_model}} @ {{server_address}}:{{server_port}}")],
        "short", stack=True))
    lay.add(timeseries(
        "Model memory (total and VRAM share)",
        "llm.runtime.model.memory by llm.runtime.memory.location: total size of each loaded model and the part in "
        "GPU memory. A VRAM share below the total means layers run on the CPU.",
        [target(f'max by (gen_ai_request_model, llm_runtime_memory_location) (llm_runtime_model_memory_bytes'
                f'{{{RUNTIME}, gen_ai_request_model=~"$model"}})',
                "{{gen_ai_request_model}} {{llm_runtime_memory_location}}")],
        "bytes"))
    lay.add(timeseries(
        "Time until an idle model is unloaded",
        "llm.runtime.model.expires_in: Ollama's keep-alive countdown per loaded model.",
        [target(f'max by (gen_ai_request_model) (llm_runtime_model_expires_in_seconds{{{RUNTIME}, '
                f'gen_ai_request_model=~"$model"}})', "{{gen_ai_request_model}}")],
        "s"))
    lay.add(timeseries(
        "llama.cpp throughput from its own /metrics",
        "Tokens per second that llama-server reports having processed (llamacpp:prompt_tokens_total and "
        "llamacpp:tokens_predicted_total, re-emitted by otel_llm's runtime-state observer).",
        [target(f"max by (server_address, server_port) (rate(llamacpp_tokens_predicted_total{{{HOST}}}[{RI}]))",
                "generated {{server_address}}:{{server_port}}"),
         target(f"max by (server_address, server_port) (rate(llamacpp_prompt_tokens_total{{{HOST}}}[{RI}]))",
                "prompt {{server_address}}:{{server_port}}", "B")],
        "tok/s"))
    return dashboard("otel-llm-host-runtime", "LLM host & runtime (otel-llm)",
                     "Host, process, GPU and runtime-state metrics from otel_llm's observers, on the same time axis "
                     "as model-call latency.", variables, lay, dashboard_links())


# --- "LLM gateway" ----------------------------------------------------------------------------
GW = 'service_name=~"$service"'


def gateway_dashboard() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("service", "Gateway service", "label_values(llm_gateway_requests_total, service_name)"),
        query_variable("model", "Model", f"label_values({series(CALLS, SERVICE)}, gen_ai_request_model)"),
        traces_variable(), jaeger_variable(),
    ]
    lay = Layout()
    lay.row("Requests")
    lay.add(timeseries(
        "Requests by outcome",
        "llm.gateway.requests per second by llm.gateway.outcome: allowed, unauthorized, forbidden, rate_limited, "
        "overloaded (queue full), upstream_error, client_closed, bad_request.",
        [target(f"sum by (llm_gateway_outcome) (rate(llm_gateway_requests_total{{{GW}}}[{RI}]))",
                "{{llm_gateway_outcome}}")],
        "reqps", stack=True))
    lay.add(timeseries(
        "Requests by key and status",
        "llm.gateway.requests per second by API key id and HTTP status.",
        [target(f"sum by (llm_gateway_key_id, http_response_status_code) "
                f"(rate(llm_gateway_requests_total{{{GW}}}[{RI}]))",
                "{{llm_gateway_key_id}} {{http_response_status_code}}")],
        "reqps", stack=True))
    lay.add(timeseries(
        "Refused requests",
        "Requests the gateway answered itself without reaching the model (any outcome but allowed).",
        [target(f'sum by (llm_gateway_outcome) (rate(llm_gateway_requests_total{{{GW}, '
                f'llm_gateway_outcome!="allowed"}}[{RI}]))', "{{llm_gateway_outcome}}")],
        "reqps", bars=True))
    lay.add(timeseries(
        "Gateway request duration p50 / p95 by status",
        "http.server.request.duration: from the request's arrival to the end of the relayed response.",
        [target(quantile(0.5, "http_server_request_duration_seconds", GW, "http_response_status_code"),
                "p50 {{http_response_status_code}}", exemplar=True),
         target(quantile(0.95, "http_server_request_duration_seconds", GW, "http_response_status_code"),
                "p95 {{http_response_status_code}}", "B", exemplar=True)],
        "s", links=[GATEWAY_TRACES]))

    lay.row("Upstream queue")
    lay.add(timeseries(
        "Queue depth",
        "llm.gateway.queue.depth: requests waiting for an upstream slot (max_concurrency) right now.",
        [target(f"sum by (service_name) (llm_gateway_queue_depth{{{GW}}})", "{{service_name}}")],
        "short"))
    lay.add(timeseries(
        "Queue wait p50 / p95 / p99",
        "llm.gateway.queue.wait: time each admitted request waited for an upstream slot.",
        [target(quantile(0.5, "llm_gateway_queue_wait_seconds", GW, ""), "p50", exemplar=True),
         target(quantile(0.95, "llm_gateway_queue_wait_seconds", GW, ""), "p95", "B", exemplar=True),
         target(quantile(0.99, "llm_gateway_queue_wait_seconds", GW, ""), "p99", "C", exemplar=True)],
        "s", links=[GATEWAY_TRACES]))

    lay.row("Upstream model calls (traced by the gateway's own instrumentation)")
    up = 'service_name=~"$service", gen_ai_request_model=~"$model"'
    lay.add(timeseries(
        "Upstream time to first token and duration (p95) by model",
        "The gateway's calls to the runtime: gen_ai.client.operation.time_to_first_chunk and "
        "gen_ai.client.operation.duration, p95.",
        [target(quantile(0.95, FIRST_CHUNK, up, "gen_ai_request_model"),
                "TTFT p95 {{gen_ai_request_model}}", exemplar=True),
         target(quantile(0.95, DURATION, up, "gen_ai_request_model"),
                "duration p95 {{gen_ai_request_model}}", "B", exemplar=True)],
        "s", links=[GATEWAY_TRACES]))
    lay.add(timeseries(
        "Upstream calls in flight",
        "llm.client.active_requests of the gateway process: calls relayed to each runtime right now.",
        [target(f"sum by (server_address, server_port) (llm_client_active_requests{{{GW}}})",
                "{{server_address}}:{{server_port}}")],
        "short"))
    return dashboard("otel-llm-gateway", "LLM gateway (otel-llm)",
                     "otel-llm gateway: requests by outcome and key, queue depth and wait, upstream latency.",
                     variables, lay, dashboard_links())


DASHBOARDS = {
    "otel-llm-calls.json": calls_dashboard,
    "otel-llm-host-runtime.json": host_dashboard,
    "otel-llm-gateway.json": gateway_dashboard,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    for name, build in DASHBOARDS.items():
        (HERE / name).write_text(render(build), encoding="utf-8")
        print(f"wrote {HERE / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
