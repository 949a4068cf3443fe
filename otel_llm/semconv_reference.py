"""What each name in :mod:`otel_llm.semconv` is: kind, type or instrument, unit, when it is set,
and its status in the OpenTelemetry semantic conventions.

The documentation site's reference page is generated from this table when the site is built
(``docs/hooks/reference.py``), and :func:`check` holds the table to ``semconv``: a public string
constant there without an entry here (or an entry naming no constant) fails ``make docs`` and
``tests/project/test_docs.py``. Add the entry when you add the constant.

Nothing in the SDK imports this module, so it costs nothing when ``otel_llm`` is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from otel_llm import semconv

__all__ = ["ATTRIBUTE_TYPES", "ENTRIES", "INSTRUMENTS", "KINDS", "NOT_NAMES", "SEMCONV_VERSION", "SPAN_KINDS",
           "STATUSES", "GENAI_COMMIT", "GENAI_REPOSITORY", "Name", "check", "entries", "public_constants"]

# The semantic-conventions release the statuses below were checked against (its model/ YAML).
SEMCONV_VERSION = "1.41.0"
# The GenAI names' own repository (open-telemetry/semantic-conventions-genai) and the commit whose
# model/ and docs/gen-ai/ the gen_ai.* names and definitions here follow.
GENAI_REPOSITORY = "open-telemetry/semantic-conventions-genai"
GENAI_COMMIT = "024a4f944a1291fcb627c9c47da69e79868dd15e"

KINDS = {
    "span": "Span names",
    "event": "Span events",
    "attribute": "Attributes",
    "metric": "Metrics",
    "scope": "Instrumentation scope",
}
STATUSES = {
    "stable": "Stable in the OpenTelemetry semantic conventions: will not change.",
    "development": "Development in the semantic conventions: may still be renamed or changed there "
                   "(then `otel_llm/semconv.py` follows).",
    "deprecated": "Deprecated in the semantic conventions (read from a runtime that still writes it).",
    "specification": "Defined by the OpenTelemetry specification (the metrics SDK), not by the semantic "
                     "conventions.",
    "otel_llm": "otel_llm's own name: no semantic convention defines it, even where the namespace is a "
                "semantic-conventions one.",
    "runtime": "A model runtime's own name (vLLM's), read by `otel-llm view`, never written.",
}
ATTRIBUTE_TYPES = ("string", "int", "double", "boolean", "string[]")
INSTRUMENTS = ("histogram", "counter", "updowncounter", "observable counter", "observable updowncounter",
               "observable gauge")
SPAN_KINDS = ("CLIENT", "SERVER", "INTERNAL")

# Public string constants of ``semconv`` that name no span, attribute, metric or event.
NOT_NAMES = {
    "ENV_CAPTURE_CONTENT": "an environment variable that switches content capture on (an alias of "
                           "OTEL_LLM_CAPTURE_CONTENT), not a name in the telemetry",
    "VLLM_LATENCY_PREFIX": "how `otel-llm view` recognizes vLLM's span; each name under it has its own entry",
    "TRACESTATE_OT": "the `ot` entry of the W3C `tracestate` (OpenTelemetry's probability sampling: "
                     "`th:<hex>`, the rejection threshold a kept call span carries), not a name in the telemetry",
    "BAGGAGE_RECORDED": "a W3C baggage entry (`otel_llm.recorded=1`) on each model request otel_llm's client "
                        "sends, read by `otel-llm gateway`, not a name in the telemetry",
}


@dataclass(frozen=True)
class Name:
    """One emitted (or read) name and what the reference says about it."""

    constants: tuple[str, ...]  # the semconv constants holding it (an alias shares the entry)
    kind: str  # a key of KINDS
    type: str  # attribute: its value type; metric: its instrument; span: its span kind
    unit: str  # UCUM, as emitted ("s", "By", "{token}"); "" where none applies
    status: str  # a key of STATUSES
    when: str  # where it appears and when it is set (Markdown)
    suffix: str = ""  # a family of names: the constant is a prefix, completed by this placeholder
    emitted: bool = True  # False: read from a runtime's spans, or defined but not emitted


def _span(constant: str, span_kind: str, when: str) -> Name:
    return Name((constant,), "span", span_kind, "", "otel_llm", when)


def _attr(constant: str, type_: str, unit: str, status: str, when: str, *, suffix: str = "",
          emitted: bool = True) -> Name:
    return Name((constant,), "attribute", type_, unit, status, when, suffix, emitted)


def _metric(constants: str | tuple[str, ...], instrument: str, unit: str, status: str, when: str, *,
            emitted: bool = True) -> Name:
    names = (constants,) if isinstance(constants, str) else constants
    return Name(names, "metric", instrument, unit, status, when, "", emitted)


_CALL = "On the call span"
_CALL_METRICS = ("the model-call metrics (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`, "
                 "`gen_ai.client.operation.time_to_first_chunk`, `gen_ai.client.operation.time_per_output_chunk`)")
_RUNTIME = "On the call span, when the runtime reported it (never a made-up zero)"
_SAMPLED = "On the call span, from the host samples of the call's own time window (`host_metrics`)"
_MODEL = ("On each call to a recognized runtime whose metadata route answered, read once per server process "
          "(llama.cpp `/props`, vLLM `/v1/models`, LM Studio `/api/v0/models`, Ollama `/api/ps`)")
_SHAPE = "On the call span, from the parsed request body (counts and sizes, never content)"
_GATEWAY = "On the gateway's SERVER span (`otel-llm gateway`)"
_CONTENT = ("Only with content capture on (`capture_content`, `OTEL_LLM_CAPTURE_CONTENT` or "
            "`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`)")
_VLLM = "Read, not written: on vLLM's own `llm_request` SERVER span, which `otel-llm view` shows beside the call"
_OPT_IN = ("Only with `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` (instead of the "
           "`gen_ai.client.operation.*` and `gen_ai.client.token.usage` names) or `gen_ai_latest_experimental/dup` "
           "(beside them)")

ENTRIES: tuple[Name, ...] = (
    # --- spans -------------------------------------------------------------------------------------
    _span("SPAN_POOL_WAIT", "INTERNAL", "Child of the call span: call start until a pooled connection is "
          "available; only when the request really queued (all connections busy)."),
    _span("SPAN_DNS", "INTERNAL", "Child of the call span: name resolution (host names only, not IP literals); "
          "carries `dns.question.name`. Absent on a reused connection."),
    _span("SPAN_CONNECT", "INTERNAL", "Child of the call span: TCP connect start until connected. Absent on a "
          "reused keep-alive connection. Where the client does the TLS handshake inside it (aiohttp) it carries "
          "the `tls.*` attributes."),
    _span("SPAN_TLS", "INTERNAL", "Child of the call span: TLS handshake start until done; carries "
          "`tls.protocol.version`, `tls.cipher`, `tls.next_protocol`."),
    _span("SPAN_UPLOAD", "INTERNAL", "Child of the call span: request headers start until the request body "
          "was sent."),
    _span("SPAN_SERVER_WAIT", "INTERNAL", "Child of the call span: request sent until the response headers "
          "arrived."),
    _span("SPAN_FIRST_TOKEN", "INTERNAL", "Child of the call span (streamed calls): headers received until the "
          "first chunk carrying generated output."),
    _span("SPAN_DECODE", "INTERNAL", "Child of the call span (streamed calls): first generated token until the "
          "end of the response body."),
    _span("SPAN_DOWNLOAD", "INTERNAL", "Child of the call span (calls not streamed): headers received until the "
          "body is complete."),
    _span("SPAN_RUNTIME_QUEUE", "INTERNAL", "Child of the call span, synthesized from the queue time the runtime "
          "reported, placed on the client's clock before prefill (`llm.synthesized=true`)."),
    _span("SPAN_RUNTIME_LOAD", "INTERNAL", "Child of the call span, synthesized from the model-load time the "
          "runtime reported, placed before prefill (`llm.synthesized=true`)."),
    _span("SPAN_RUNTIME_PREFILL", "INTERNAL", "Child of the call span, synthesized from the prompt-evaluation "
          "time the runtime reported; when streaming it ends when the first token arrived "
          "(`llm.synthesized=true`)."),
    _span("SPAN_RUNTIME_DECODE", "INTERNAL", "Child of the call span, synthesized from the generation time the "
          "runtime reported; when streaming it starts at the first token, else it ends when the response "
          "arrived (`llm.synthesized=true`)."),
    _span("SPAN_GATEWAY_AUTH", "INTERNAL", "Child of the gateway's SERVER span: the credentials, path and route "
          "checks, the body read and the model check."),
    _span("SPAN_GATEWAY_QUEUE", "INTERNAL", "Child of the gateway's SERVER span: the wait for an upstream slot in "
          "the admission queue; carries `llm.gateway.queue.depth`."),
    # --- span events ---------------------------------------------------------------------------------
    Name(("EVENT_RUNTIME_RESTARTED",), "event", "span event", "", "otel_llm",
         "On the first call to a local model server after the process listening on its port changed or went "
         "(`host_metrics`); carries `llm.runtime.previous_pid` and `llm.runtime.pid`."),
    # --- instrumentation scope -----------------------------------------------------------------------
    Name(("INSTRUMENTATION_NAME",), "scope", "tracer and meter", "", "otel_llm",
         "The instrumentation scope of every call span and metric; the gateway's own spans and metrics use "
         "`otel_llm.gateway`."),
    # --- GenAI attributes ----------------------------------------------------------------------------
    _attr("GEN_AI_OPERATION_NAME", "string", "", "development", f"{_CALL} and {_CALL_METRICS}: the operation "
          "the route implies (`chat`, `text_completion`, `generate_content`)."),
    _attr("GEN_AI_PROVIDER_NAME", "string", "", "development", f"{_CALL} and its metrics: the runtime when known "
          "(`ollama`, `llama.cpp`, `vllm`...), else the hosted vendor named by the host (`openai`, "
          "`anthropic`...), else `openai_compatible` or `_OTHER`."),
    _attr("GEN_AI_REQUEST_MODEL", "string", "", "development", f"{_CALL} and its metrics, when the request names "
          "the model; on the runtime-state model metrics; on the gateway's SERVER span when the key restricts "
          "models."),
    _attr("GEN_AI_REQUEST_MAX_TOKENS", "int", "{token}", "development", f"{_CALL}, when the request sets an output "
          "limit (`max_tokens`, `max_completion_tokens`, `max_output_tokens`, `n_predict`, `num_predict`...)."),
    _attr("GEN_AI_REQUEST_TEMPERATURE", "double", "", "development", f"{_CALL}, when the request sets it."),
    _attr("GEN_AI_REQUEST_TOP_P", "double", "", "development", f"{_CALL}, when the request sets it."),
    _attr("GEN_AI_REQUEST_TOP_K", "int", "", "development", f"{_CALL}, when the request sets it (an integer: "
          "the semantic conventions type it as a double)."),
    _attr("GEN_AI_REQUEST_SEED", "int", "", "development", f"{_CALL}, when the request sets it."),
    _attr("GEN_AI_REQUEST_STOP_SEQUENCES", "string[]", "", "development", f"{_CALL}, when the request sets stop "
          "sequences (`stop_sequences` or `stop`)."),
    _attr("GEN_AI_REQUEST_STREAM", "boolean", "", "development", f"{_CALL}: `true` when the request asks for a "
          "stream (absent otherwise)."),
    _attr("GEN_AI_RESPONSE_MODEL", "string", "", "development", f"{_CALL} and its metrics, when the response "
          "names the model."),
    _attr("GEN_AI_RESPONSE_ID", "string", "", "development", f"{_CALL}, when the response carries an id."),
    _attr("GEN_AI_RESPONSE_FINISH_REASONS", "string[]", "", "development", f"{_CALL}, when the response or the "
          "runtime's counters say why generation stopped, mapped to `stop` / `length` / `tool_calls` / ..."),
    _attr("GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK", "double", "s", "development", f"{_CALL} (streamed calls): the "
          "same value as `llm.client.time_to_first_token`."),
    _attr("GEN_AI_USAGE_INPUT_TOKENS", "int", "{token}", "development", f"{_CALL}, when the response reports "
          "its usage; recorded into `gen_ai.client.token.usage`."),
    _attr("GEN_AI_USAGE_OUTPUT_TOKENS", "int", "{token}", "development", f"{_CALL}, when the response reports "
          "its usage; recorded into `gen_ai.client.token.usage`."),
    _attr("GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS", "int", "{token}", "development", f"{_CALL}, when the response "
          "or the runtime reports prompt tokens served from its cache."),
    _attr("GEN_AI_USAGE_REASONING_OUTPUT_TOKENS", "int", "{token}", "development", f"{_CALL}, when the response "
          "reports reasoning tokens."),
    _attr("GEN_AI_TOKEN_TYPE", "string", "", "development", "On `gen_ai.client.token.usage`: `input` or "
          "`output`."),
    _attr("GEN_AI_TOKEN_MODALITY", "string", "", "development", "On the `gen_ai.client.inference.usage.*` "
          "counters (`OTEL_SEMCONV_STABILITY_OPT_IN`, see Options): always `unknown`, the responses giving no "
          "breakdown by modality."),
    _attr("GEN_AI_INPUT_MESSAGES", "string", "", "development", f"{_CALL}, as JSON (at most 64 KiB). {_CONTENT}."),
    _attr("GEN_AI_OUTPUT_MESSAGES", "string", "", "development", f"{_CALL}, as JSON (at most 64 KiB). "
          f"{_CONTENT}."),
    _attr("GEN_AI_SYSTEM_INSTRUCTIONS", "string", "", "development", f"{_CALL}, as JSON (at most 64 KiB), when "
          f"the request has system instructions. {_CONTENT}."),
    # --- HTTP, network and TLS attributes ------------------------------------------------------------
    _attr("SERVER_ADDRESS", "string", "", "stable", f"{_CALL} and its metrics: the host the request went to; "
          "on the runtime-state, restart and `llm.client.active_requests` metrics; on the gateway's SERVER "
          "span: the address it listens on."),
    _attr("SERVER_PORT", "int", "", "stable", f"{_CALL} and its metrics (80 or 443 when the URL names none); "
          "on the runtime-state, restart and `llm.client.active_requests` metrics; on the gateway's SERVER "
          "span."),
    _attr("URL_FULL", "string", "", "stable", f"{_CALL}: the request URL without user info, secret-looking "
          "query values replaced by `REDACTED`."),
    _attr("HTTP_REQUEST_METHOD", "string", "", "stable", f"{_CALL}; {_GATEWAY[3:]} and on "
          "`http.server.request.duration`."),
    _attr("HTTP_RESPONSE_STATUS_CODE", "int", "", "stable", f"{_CALL}, when a response arrived; {_GATEWAY[3:]}, "
          "on `http.server.request.duration` and `llm.gateway.requests`."),
    _attr("HTTP_REQUEST_BODY_SIZE", "int", "By", "development", f"{_CALL}: bytes of the request body as sent."),
    _attr("ERROR_TYPE", "string", "", "stable", f"{_CALL} and its metrics, when the call failed: the "
          "exception's class (`httpx.ConnectError`) or the HTTP status (`500`) for a status of 400 or more; "
          f"{_GATEWAY[3:]}: the status, for 5xx answers."),
    _attr("OTEL_METRIC_OVERFLOW", "boolean", "", "specification", "On `llm.diagnosis.calls`: `true` on the one "
          "count that takes every new attribute set past 2000 distinct ones, as the SDK does past its "
          "cardinality limit."),
    _attr("NETWORK_PEER_ADDRESS", "string", "", "stable", f"{_CALL}: the address of the socket the request "
          "used, when the client exposes it."),
    _attr("NETWORK_PEER_PORT", "int", "", "stable", f"{_CALL}: the port of that socket."),
    _attr("NETWORK_PROTOCOL_VERSION", "string", "", "stable", f"{_CALL}: the response's HTTP version (`1.1`, "
          f"`2`); {_GATEWAY[3:]}: the request's."),
    _attr("TLS_PROTOCOL_VERSION", "string", "", "development", "On the `http.tls` span (or `http.connect` when "
          "the handshake happens inside it): the negotiated TLS version."),
    _attr("TLS_CIPHER", "string", "", "development", "On the `http.tls` span (or `http.connect`): the "
          "negotiated cipher."),
    _attr("TLS_NEXT_PROTOCOL", "string", "", "development", "On the `http.tls` span (or `http.connect`): the "
          "protocol negotiated with ALPN, when one was."),
    _attr("DNS_QUESTION_NAME", "string", "", "development", "On the `http.dns` span: the host name resolved."),
    _attr("HTTP_ROUTE", "string", "", "stable", f"{_GATEWAY}: the request path, when it is a model route."),
    _attr("URL_PATH", "string", "", "stable", f"{_GATEWAY}: the request path (at most 256 characters kept)."),
    _attr("URL_SCHEME", "string", "", "stable", f"{_GATEWAY}."),
    _attr("CLIENT_ADDRESS", "string", "", "stable", f"{_GATEWAY} and the proxy's (`otel-llm proxy`): the "
          "caller's address (the TCP peer)."),
    _attr("CLIENT_PORT", "int", "", "stable", f"{_GATEWAY} and the proxy's: the caller's port."),
    _attr("USER_AGENT_ORIGINAL", "string", "", "stable", "On the proxy's SERVER span (`otel-llm proxy`): the "
          "caller's `User-Agent` (first 256 characters). The gateway's SERVER span carries no header value, "
          "not even this one."),
    # --- otel_llm: the call, as the client saw it ---------------------------------------------------
    _attr("LLM_RUNTIME_NAME", "string", "", "otel_llm", f"{_CALL}: the runtime, from the `runtimes` option, "
          "else what the response proves, else the route, else what the runtime-state observer recognized "
          "at that server; also on the runtime-state, process and restart metrics."),
    _attr("LLM_API", "string", "", "otel_llm", f"{_CALL}: the API the request path speaks (`openai.chat`, "
          "`openai.completions`, `openai.responses`, `anthropic.messages`, `ollama.chat`, `ollama.generate`, "
          "`llamacpp.completion`, `tgi.generate`, `tgi.generate_stream`, `lmstudio.v1.chat`, `generic`)."),
    _attr("LLM_CLIENT_TIME_TO_FIRST_BYTE", "double", "s", "otel_llm", f"{_CALL}: call start until the response "
          "headers arrived."),
    _attr("LLM_CLIENT_TIME_TO_FIRST_TOKEN", "double", "s", "otel_llm", f"{_CALL} (streamed calls): call start "
          "until the first chunk that carries generated text, reasoning or tool-call output (role-only deltas, "
          "empty content, SSE comments, keep-alives, progress events and usage frames do not count)."),
    _attr("LLM_CLIENT_GENERATION_DURATION", "double", "s", "otel_llm", f"{_CALL} (streamed calls): first to "
          "last generated token."),
    _attr("LLM_CLIENT_GENERATION_RATE", "double", "{token}/s", "otel_llm", f"{_CALL} (streamed calls): tokens "
          "after the first / generation duration, using the response's token count when it has one, else the "
          "counted generated chunks."),
    _attr("LLM_CLIENT_CHUNKS", "int", "{chunk}", "otel_llm", f"{_CALL} (streamed calls): chunks that carried "
          "generated output."),
    _attr("LLM_CLIENT_MAX_CHUNK_GAP", "double", "s", "otel_llm", f"{_CALL} (streamed calls): the longest "
          "silence after the first token."),
    _attr("LLM_CLIENT_CONNECTION_REUSED", "boolean", "", "otel_llm", f"{_CALL}, once sending began: `true` on a "
          "reused keep-alive connection (no dns, connect or tls children)."),
    _attr("LLM_CLIENT_RESPONSE_BYTES", "int", "By", "otel_llm", f"{_CALL} (streamed calls): bytes of the "
          "response body the application read."),
    _attr("LLM_CLIENT_END_REASON", "string", "", "otel_llm", f"{_CALL}: how the response ended: `eof`, "
          "`closed`, `cancelled`, `error`, `garbage_collected`, `process_exit`; `untraced` when a failure "
          "inside otel_llm (logged once) kept it from following the response body."),
    _attr("LLM_PHASE", "string", "", "otel_llm", "On `llm.client.phase.duration`: the phase span's name "
          "(`http.connect`, `llm.server_wait`...)."),
    _attr("LLM_SERVER_TIMING_PREFIX", "double", "s", "otel_llm", f"{_CALL}: each entry of the response's "
          "`Server-Timing` header that has a duration (at most 8), in seconds; `otel-llm gateway` sends "
          "`auth`, `queue`, `upstream` and `total`.", suffix="<name>"),
    # --- otel_llm: the runtime's own counters -------------------------------------------------------
    _attr("LLM_RUNTIME_LOAD_DURATION", "double", "s", "otel_llm", f"{_RUNTIME}: time spent loading the model."),
    _attr("LLM_RUNTIME_QUEUE_DURATION", "double", "s", "otel_llm", f"{_RUNTIME}: time the request queued in the "
          "runtime."),
    _attr("LLM_RUNTIME_PROMPT_TOKENS", "int", "{token}", "otel_llm", f"{_RUNTIME}: prompt tokens evaluated "
          "(without cached ones)."),
    _attr("LLM_RUNTIME_PROMPT_EVAL_DURATION", "double", "s", "otel_llm", f"{_RUNTIME}: prompt evaluation "
          "(prefill) time."),
    _attr("LLM_RUNTIME_PROMPT_EVAL_RATE", "double", "{token}/s", "otel_llm", f"{_RUNTIME}: prompt evaluation "
          "rate."),
    _attr("LLM_RUNTIME_CACHED_TOKENS", "int", "{token}", "otel_llm", f"{_RUNTIME}: prompt tokens served from its "
          "cache."),
    _attr("LLM_RUNTIME_GENERATION_TOKENS", "int", "{token}", "otel_llm", f"{_RUNTIME}: tokens generated."),
    _attr("LLM_RUNTIME_GENERATION_DURATION", "double", "s", "otel_llm", f"{_RUNTIME}: generation (decode) "
          "time."),
    _attr("LLM_RUNTIME_GENERATION_RATE", "double", "{token}/s", "otel_llm", f"{_RUNTIME}: generation rate."),
    _attr("LLM_RUNTIME_TOTAL_DURATION", "double", "s", "otel_llm", f"{_RUNTIME}: the request's total time in "
          "the runtime."),
    _attr("LLM_RUNTIME_DRAFT_TOKENS", "int", "{token}", "otel_llm", f"{_RUNTIME}: tokens drafted for "
          "speculative decoding (llama.cpp `draft_n`)."),
    _attr("LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED", "int", "{token}", "otel_llm", f"{_RUNTIME}: drafted tokens "
          "accepted (llama.cpp `draft_n_accepted`)."),
    _attr("LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE", "double", "1", "otel_llm", f"{_RUNTIME}: the share of drafted "
          "tokens the model accepted (accepted / drafted), when the runtime reported both and drafted any."),
    _attr("LLM_SYNTHESIZED", "boolean", "", "otel_llm", "On the `runtime.*` spans: `true`, they were "
          "synthesized from the runtime's counters."),
    # --- otel_llm: sampling ----------------------------------------------------------------------------
    _attr("LLM_SAMPLING_REASON", "string[]", "", "otel_llm", f"{_CALL}, when `sample_rate` is set: why the "
          "call's spans were kept: the `sample_keep` rules it matched (`failed`, `slow`, `cold`, `buffered`, "
          "`queued`, `restart`, `retry`), else `rate` (kept at the rate by its trace id) or `parent` (under "
          "the application's sampled span)."),
    _attr("LLM_SAMPLING_ADJUSTED_COUNT", "double", "{call}", "otel_llm", f"{_CALL}, when `sample_rate` is set: "
          "how many calls this one stands for (1 / the probability it was kept; the same as the `th` of its "
          "`ot` tracestate entry); absent when the application's sampler kept the parent without saying "
          "its probability. Sum it over the call spans to count the calls made."),
    # --- otel_llm: diagnosis ---------------------------------------------------------------------------
    _attr("LLM_DIAGNOSIS_UNACCOUNTED_WAIT", "double", "s", "otel_llm", f"{_CALL}, when the runtime is known: the "
          "wait before the first token (before the answer, when not streaming) that the runtime's queue, load "
          "and prefill (and generation) durations do not explain; never negative."),
    _attr("LLM_DIAGNOSIS_COLD_START", "boolean", "", "otel_llm", f"{_CALL}: the runtime reported a model load of "
          "at least 0.25 s, or an earlier request unloaded the model (Ollama `keep_alive: 0`)."),
    _attr("LLM_DIAGNOSIS_STREAM_BUFFERED", "boolean", "", "otel_llm", f"{_CALL} (streams the rule can judge): "
          "the stream was buffered on its way (tokens in bursts after silences, or held back and released "
          "together)."),
    _attr("LLM_DIAGNOSIS_CONCURRENT_REQUESTS", "int", "{request}", "otel_llm", f"{_CALL}: other model calls to "
          "the same server in flight when this one started."),
    _attr("LLM_DIAGNOSIS_RETRY", "boolean", "", "otel_llm", f"{_CALL}: `true` when the call is a retry "
          "(`x-stainless-retry-count` above zero, or the same request body to the same server still in "
          "flight)."),
    _attr("LLM_DIAGNOSIS_BOTTLENECK", "string", "", "otel_llm", f"{_CALL}: the largest share of the call: "
          "`network`, `queue`, `load`, `prefill`, `decode`, `buffering` or `download`; also on "
          "`llm.diagnosis.calls`."),
    _attr("LLM_DIAGNOSIS_CONTEXT_PRESSURE", "boolean", "", "otel_llm", f"{_MODEL}: `true` when the prompt fills "
          "over 80 % of the context length."),
    _attr("LLM_DIAGNOSIS_PARTIAL_OFFLOAD", "boolean", "", "otel_llm", f"{_MODEL}: `true` when only part of the "
          "model is in VRAM, the rest in system RAM (Ollama)."),
    # --- otel_llm: host and runtime evidence of the call's time window ------------------------------
    _attr("LLM_HOST_CPU_UTILIZATION", "double", "1", "otel_llm", f"{_SAMPLED}: mean host CPU utilization."),
    _attr("LLM_HOST_MEMORY_UTILIZATION", "double", "1", "otel_llm", f"{_SAMPLED}: maximum memory utilization."),
    _attr("LLM_HOST_PAGING_MAJOR_FAULTS", "int", "{fault}", "otel_llm", f"{_SAMPLED}: major page faults during "
          "the call."),
    _attr("LLM_HOST_SWAP_IN", "int", "{page}", "otel_llm", f"{_SAMPLED}: pages swapped in during the call."),
    _attr("LLM_HOST_SWAP_OUT", "int", "{page}", "otel_llm", f"{_SAMPLED}: pages swapped out during the call."),
    _attr("LLM_HOST_GPU_UTILIZATION", "double", "1", "otel_llm", f"{_SAMPLED}, when a GPU is observed: mean GPU "
          "utilization."),
    _attr("LLM_HOST_GPU_MEMORY_USAGE", "double", "By", "otel_llm", f"{_SAMPLED}, when a GPU is observed: maximum "
          "GPU memory in use."),
    _attr("LLM_RUNTIME_REQUESTS_RUNNING", "int", "{request}", "otel_llm", f"{_CALL}: requests the runtime "
          "reported running at its last poll before the call started (`runtime_metrics`)."),
    _attr("LLM_RUNTIME_REQUESTS_WAITING", "int", "{request}", "otel_llm", f"{_CALL}: requests the runtime "
          "reported waiting at its last poll before the call started (`runtime_metrics`)."),
    # --- otel_llm: the request's shape ----------------------------------------------------------------
    _attr("LLM_REQUEST_MESSAGES", "int", "{message}", "otel_llm", f"{_SHAPE}: messages (a prompt string counts as "
          "one user message)."),
    _attr("LLM_REQUEST_MESSAGES_PREFIX", "int", "{message}", "otel_llm", f"{_SHAPE}: messages of one role "
          "(`system`, `developer`, `user`, `assistant`, `tool`, `function`; any other role counts as "
          "`other`).", suffix="<role>"),
    _attr("LLM_REQUEST_SYSTEM_BYTES", "int", "By", "otel_llm", f"{_SHAPE}: UTF-8 bytes of the system and "
          "developer instructions."),
    _attr("LLM_REQUEST_LARGEST_MESSAGE_BYTES", "int", "By", "otel_llm", f"{_SHAPE}: UTF-8 bytes of the largest "
          "message (text and tool-call arguments)."),
    _attr("LLM_REQUEST_TOOLS", "int", "{tool}", "otel_llm", f"{_SHAPE}: tool and function definitions sent."),
    _attr("LLM_REQUEST_TOOLS_BYTES", "int", "By", "otel_llm", f"{_SHAPE}: bytes of those definitions as compact "
          "JSON."),
    _attr("LLM_REQUEST_ATTACHMENTS", "int", "{attachment}", "otel_llm", f"{_SHAPE}: images, audio and files in "
          "the messages, when there are any."),
    _attr("LLM_REQUEST_CONTEXT_PRESSURE", "double", "1", "otel_llm", f"{_MODEL}, when it reports a context "
          "length: the call's prompt tokens over that context length."),
    # --- otel_llm: the served model -------------------------------------------------------------------
    _attr("LLM_MODEL_CONTEXT_LENGTH", "int", "{token}", "otel_llm", f"{_MODEL}: tokens one request may hold "
          "(llama.cpp: per slot)."),
    _attr("LLM_MODEL_NAME", "string", "", "otel_llm", f"{_MODEL}: the model file or served name."),
    _attr("LLM_MODEL_QUANTIZATION", "string", "", "otel_llm", f"{_MODEL}: the quantization as the runtime names "
          "it, where it says."),
    _attr("LLM_MODEL_SLOTS", "int", "{request}", "otel_llm", f"{_MODEL}: requests the runtime serves at once "
          "(llama.cpp `total_slots`)."),
    _attr("LLM_MODEL_MEMORY_TOTAL", "int", "By", "otel_llm", f"{_MODEL}: bytes the loaded model takes (Ollama "
          "`size`)."),
    _attr("LLM_MODEL_MEMORY_VRAM", "int", "By", "otel_llm", f"{_MODEL}: of which in GPU memory (Ollama "
          "`size_vram`)."),
    _attr("LLM_MODEL_PARAMETER_SIZE", "string", "", "otel_llm", f"{_MODEL}: as Ollama writes it (`3.2B`)."),
    _attr("LLM_MODEL_EXPIRES_AT", "string", "", "otel_llm", f"{_MODEL}: when Ollama unloads the model if idle, "
          "as `/api/ps` gave it at the last poll."),
    # --- otel_llm: metric attributes and restarts ----------------------------------------------------
    _attr("LLM_RUNTIME_MEMORY_LOCATION", "string", "", "otel_llm", "On `llm.runtime.model.memory`: `total` or "
          "`vram`."),
    _attr("LLM_RUNTIME_PID", "int", "", "otel_llm", "On the `llm.runtime.restarted` event: the process listening "
          "now (absent while none is)."),
    _attr("LLM_RUNTIME_PREVIOUS_PID", "int", "", "otel_llm", "On the `llm.runtime.restarted` event: the process "
          "that listened before."),
    # --- otel_llm: gateway ---------------------------------------------------------------------------
    _attr("LLM_GATEWAY_KEY_ID", "string", "", "otel_llm", f"{_GATEWAY}: the id of the caller's key (never the "
          "key), when it sent a valid one; on `llm.gateway.requests` (`-` when none)."),
    _attr("LLM_GATEWAY_OUTCOME", "string", "", "otel_llm", f"{_GATEWAY}, `llm.gateway.requests` and "
          "`llm.gateway.queue.wait`: `allowed`, `unauthorized`, `forbidden`, `rate_limited`, `overloaded`, "
          "`bad_request`, `upstream_error`, `client_closed` or `address_limited`. Also on the proxy's SERVER span "
          "(`otel-llm proxy`), where `client_closed` says the caller hung up before the response ended."),
    _attr("LLM_GATEWAY_QUEUE_DEPTH", "int", "{request}", "otel_llm", "On the `gateway.queue` span: requests "
          "already waiting when this one joined the queue."),
    _attr("LLM_GATEWAY_QUEUE_WAIT", "double", "s", "otel_llm", f"{_GATEWAY}, when the request went through the "
          "admission queue: its wait there."),
    _attr("LLM_GATEWAY_UPSTREAM_FIRST_BYTE", "double", "s", "otel_llm", f"{_GATEWAY}: upstream request start "
          "until the runtime's first byte."),
    _attr("LLM_GATEWAY_RESPONSE_BYTES", "int", "By", "otel_llm", f"{_GATEWAY}: bytes sent back to the caller."),
    _attr("LLM_GATEWAY_RELAYED", "boolean", "", "otel_llm", "On the gateway's own upstream call span and its "
          "metrics: `true`, the call relays a request whose caller recorded the same call itself (its baggage "
          "has `otel_llm.recorded=1`; fleet-wide sums leave these out). Absent on a call from a caller that "
          "records nothing (curl): the gateway's record is the call's only one."),
    _attr("LLM_BESIDE_INSTRUMENTATION", "string", "", "otel_llm", "On the call span when the call ran under "
          "another instrumentation's GenAI span (the official OpenTelemetry ones, openlit, OpenLLMetry, "
          "OpenInference): that instrumentation's scope name, e.g. `opentelemetry.instrumentation.genai.openai`. "
          "The span is then the call's transport view, a child of that span named after the HTTP request "
          "(`POST /v1/chat/completions`), without `gen_ai.*` attributes "
          "([beside other instrumentations](beside.md))."),
    _attr("LLM_PROXY_TIME_TO_FIRST_BYTE", "double", "s", "otel_llm", "On the proxy's SERVER span (`otel-llm "
          "proxy`): from the request's arrival until the response head was written to the caller."),
    _attr("LLM_PROXY_TIME_TO_FIRST_TOKEN", "double", "s", "otel_llm", "On the proxy's SERVER span, for a stream "
          "with a token: from the request's arrival until the chunk holding the first token was written to the "
          "caller (the call span's `llm.client.time_to_first_token` is when it reached the proxy)."),
    _attr("LLM_PROXY_WRITE_WAIT", "double", "s", "otel_llm", "On the proxy's SERVER span: time the relay spent "
          "waiting to write the response to a caller that read it more slowly than it arrived (0 for a caller "
          "that keeps up)."),
    # --- host, process and GPU metric attributes --------------------------------------------------------
    _attr("CPU_MODE", "string", "", "development", "On `system.cpu.utilization` and `process.cpu.utilization`: "
          "the CPU mode (`user`, `system`, `idle`...)."),
    _attr("SYSTEM_MEMORY_STATE", "string", "", "development", "On `system.memory.usage` and "
          "`system.memory.utilization`: `used`, `free`, `cached`, `buffers`."),
    _attr("SYSTEM_PAGING_STATE", "string", "", "development", "On `system.paging.usage`: `used` or `free`."),
    _attr("SYSTEM_PAGING_DIRECTION", "string", "", "development", "On `system.paging.operations`: `in` or "
          "`out`."),
    _attr("SYSTEM_PAGING_FAULT_TYPE", "string", "", "development", "On `system.paging.operations` (swapping is "
          "`major`, page-cache paging `minor`) and `system.paging.faults`."),
    _attr("DISK_IO_DIRECTION", "string", "", "development", "On `system.disk.io`: `read` or `write`."),
    _attr("NETWORK_IO_DIRECTION", "string", "", "development", "On `system.network.io` and `hw.gpu.io`: "
          "`receive` or `transmit`."),
    _attr("PROCESS_PID", "int", "", "development", "On `process.cpu.utilization`, `process.memory.usage` and "
          "`process.gpu.memory.usage`: this process or the model runtime's."),
    _attr("PROCESS_EXECUTABLE_NAME", "string", "", "development", "On `process.cpu.utilization` and "
          "`process.memory.usage`, when the process name can be read."),
    _attr("HW_ID", "string", "", "development", "On the GPU metrics: the GPU's UUID."),
    _attr("HW_NAME", "string", "", "development", "On the GPU metrics: `gpu0`, `gpu1`..."),
    _attr("HW_VENDOR", "string", "", "development", "On the GPU metrics: `NVIDIA`."),
    _attr("HW_MODEL", "string", "", "development", "On the GPU metrics: the model NVML names."),
    _attr("HW_TYPE", "string", "", "development", "On `hw.power`, `hw.energy` and `hw.temperature`: `gpu`."),
    _attr("HW_GPU_TASK", "string", "", "development", "On `hw.gpu.utilization`: `general`."),
    _attr("HW_SENSOR_LOCATION", "string", "", "development", "On `hw.temperature`: `gpu`."),
    _attr("HW_GPU_CLOCK_DOMAIN", "string", "", "otel_llm", "On `hw.gpu.clock.frequency`: `sm` or `memory`."),
    _attr("HW_GPU_THROTTLE_REASON", "string", "", "otel_llm", "On `hw.gpu.throttle`: the NVML clock-throttle "
          "reason (`gpu_idle`...)."),
    # --- vLLM's own span, read by otel-llm view ---------------------------------------------------------
    _attr("VLLM_TIME_IN_QUEUE", "double", "s", "runtime", f"{_VLLM}: time in vLLM's queue.", emitted=False),
    _attr("VLLM_TIME_IN_PREFILL", "double", "s", "runtime", f"{_VLLM}: prefill time.", emitted=False),
    _attr("VLLM_TIME_IN_DECODE", "double", "s", "runtime", f"{_VLLM}: decode time.", emitted=False),
    _attr("VLLM_TIME_TO_FIRST_TOKEN", "double", "s", "runtime", f"{_VLLM}: vLLM's time to first token.",
          emitted=False),
    _attr("VLLM_E2E", "double", "s", "runtime", f"{_VLLM}: the request's end-to-end time in vLLM.", emitted=False),
    _attr("VLLM_PROMPT_TOKENS", "int", "{token}", "deprecated", f"{_VLLM}: prompt tokens (replaced by "
          "`gen_ai.usage.input_tokens` in the semantic conventions).", emitted=False),
    _attr("VLLM_COMPLETION_TOKENS", "int", "{token}", "deprecated", f"{_VLLM}: completion tokens (replaced by "
          "`gen_ai.usage.output_tokens`).", emitted=False),
    # --- metrics of every model call --------------------------------------------------------------------
    _metric("METRIC_OPERATION_DURATION", "histogram", "s", "development", "Every model call: its duration, with "
            "exemplars (trace ids)."),
    _metric("METRIC_TOKEN_USAGE", "histogram", "{token}", "development", "Every call whose response reports its "
            "usage: input and output tokens (`gen_ai.token.type`)."),
    _metric("METRIC_TIME_TO_FIRST_CHUNK", "histogram", "s", "development", "Streamed calls: "
            "`llm.client.time_to_first_token`, with exemplars."),
    _metric("METRIC_TIME_PER_OUTPUT_CHUNK", "histogram", "s", "development", "Streamed calls: one value for each "
            "output chunk after the first (an event carrying generated text, reasoning or tool-call arguments), "
            "from the previous output chunk's arrival to its own; chunks read together are 0 apart; at most "
            "16,384 values per call."),
    # semantic-conventions-genai's names, with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental[/dup]
    _metric("METRIC_INFERENCE_DURATION", "histogram", "s", "development", f"{_OPT_IN}: the value of "
            "`gen_ai.client.operation.duration`, renamed (semantic-conventions-genai `client-inference.md`)."),
    _metric("METRIC_INFERENCE_TIME_TO_FIRST_CHUNK", "histogram", "s", "development", f"{_OPT_IN}: the value of "
            "`gen_ai.client.operation.time_to_first_chunk`, renamed."),
    _metric("METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK", "histogram", "s", "development", f"{_OPT_IN}: the value of "
            "`gen_ai.client.operation.time_per_output_chunk`, renamed."),
    _metric("METRIC_INFERENCE_USAGE_INPUT_TOKENS", "counter", "{token}", "development", f"{_OPT_IN}: input tokens "
            "of every call whose response reports its usage, with `gen_ai.token.modality` "
            "(semantic-conventions-genai `gen-ai-token-metrics.md`)."),
    _metric("METRIC_INFERENCE_USAGE_OUTPUT_TOKENS", "counter", "{token}", "development", f"{_OPT_IN}: output "
            "tokens, as the input counter."),
    _metric("METRIC_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS", "counter", "{token}", "development", f"{_OPT_IN}: "
            "`gen_ai.usage.cache_read.input_tokens` of the calls that have it."),
    _metric("METRIC_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS", "counter", "{token}", "development", f"{_OPT_IN}: "
            "`gen_ai.usage.reasoning.output_tokens` of the calls that have it."),
    _metric("METRIC_INFERENCE_OPERATION_INPUT_TOKENS", "histogram", "{token}", "development", f"{_OPT_IN}: input "
            "tokens per successful call (no `gen_ai.token.modality`), for percentiles."),
    _metric("METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS", "histogram", "{token}", "development", f"{_OPT_IN}: "
            "output tokens per successful call, for percentiles."),
    _metric("METRIC_PHASE_DURATION", "histogram", "s", "otel_llm", "Every phase span of a call (`llm.phase`)."),
    _metric("METRIC_SERVER_TIME_TO_FIRST_TOKEN", "histogram", "s", "development", "When the runtime reports what "
            "it needs: its time to first token (queue, load and prefill)."),
    _metric("METRIC_SERVER_TIME_PER_OUTPUT_TOKEN", "histogram", "s", "development", "When the runtime reports "
            "it: its time per output token after the first."),
    _metric("METRIC_RUNTIME_PROMPT_EVAL_RATE", "histogram", "{token}/s", "otel_llm", "When the runtime reports "
            "it: the prompt evaluation rate."),
    _metric("METRIC_RUNTIME_GENERATION_RATE", "histogram", "{token}/s", "otel_llm", "When the runtime reports "
            "it: the generation rate."),
    _metric("METRIC_ACTIVE_REQUESTS", "observable updowncounter", "{request}", "otel_llm", "At each collection: "
            "model calls in flight, by server."),
    _metric("METRIC_DIAGNOSIS_CALLS", "observable counter", "{call}", "otel_llm", "At each collection: model "
            "calls counted by `llm.diagnosis.bottleneck` (`none` when none), `llm.diagnosis.cold_start` and "
            "`llm.diagnosis.stream_buffered`."),
    _metric("METRIC_DIAGNOSIS_UNACCOUNTED_WAIT", "histogram", "s", "otel_llm", "Each call that carries "
            "`llm.diagnosis.unaccounted_wait`."),
    # --- host and process metrics (host_metrics) ------------------------------------------------------
    _metric("METRIC_SYSTEM_CPU_UTILIZATION", "observable gauge", "1", "development", "`host_metrics`: CPU time "
            "fraction per `cpu.mode` since the last collection."),
    _metric("METRIC_SYSTEM_MEMORY_USAGE", "observable updowncounter", "By", "development", "`host_metrics`: "
            "memory per `system.memory.state`."),
    _metric("METRIC_SYSTEM_MEMORY_UTILIZATION", "observable gauge", "1", "development", "`host_metrics`: "
            "fraction of memory per `system.memory.state`."),
    _metric("METRIC_SYSTEM_PAGING_USAGE", "observable updowncounter", "By", "development", "`host_metrics`: swap "
            "space used and free."),
    _metric("METRIC_SYSTEM_PAGING_OPERATIONS", "observable counter", "{operation}", "development",
            "`host_metrics` (Linux): pages swapped (major) and paged through the page cache (minor), in and "
            "out."),
    _metric("METRIC_SYSTEM_PAGING_FAULTS", "observable counter", "{fault}", "development", "`host_metrics` "
            "(Linux): page faults, major and minor."),
    _metric("METRIC_SYSTEM_DISK_IO", "observable counter", "By", "development", "`host_metrics`: bytes read from "
            "and written to disks, where the host exposes them."),
    _metric("METRIC_SYSTEM_NETWORK_IO", "observable counter", "By", "development", "`host_metrics`: bytes "
            "received and transmitted on all interfaces."),
    _metric("METRIC_PROCESS_CPU_UTILIZATION", "observable gauge", "1", "development", "`host_metrics`: CPU time "
            "of this process and of the model runtime's processes since the last collection, per CPU."),
    _metric("METRIC_PROCESS_MEMORY_USAGE", "observable updowncounter", "By", "development", "`host_metrics`: "
            "resident memory of this process and of the model runtime's processes."),
    # --- GPU metrics (gpu_metrics, NVML) ------------------------------------------------------------------
    _metric("METRIC_HW_GPU_UTILIZATION", "observable gauge", "1", "development", "`gpu_metrics`, when NVML sees "
            "a GPU: fraction of time it was busy."),
    _metric("METRIC_HW_GPU_MEMORY_USAGE", "observable updowncounter", "By", "development", "`gpu_metrics`: GPU "
            "memory in use."),
    _metric("METRIC_HW_GPU_MEMORY_LIMIT", "observable updowncounter", "By", "development", "`gpu_metrics`: GPU "
            "memory size."),
    _metric("METRIC_HW_GPU_MEMORY_UTILIZATION", "observable gauge", "1", "development", "`gpu_metrics`: used / "
            "total GPU memory."),
    _metric("METRIC_HW_GPU_IO", "observable counter", "By", "development", "`gpu_metrics`: PCIe bytes moved, "
            "integrated from NVML's throughput rate."),
    _metric("METRIC_HW_GPU_CLOCK_FREQUENCY", "observable gauge", "Hz", "otel_llm", "`gpu_metrics`: SM and memory "
            "clock frequency (`hw.gpu.clock.domain`)."),
    _metric("METRIC_HW_GPU_THROTTLE", "observable gauge", "1", "otel_llm", "`gpu_metrics`: 1 while NVML reports "
            "the clock-throttle reason (`hw.gpu.throttle.reason`) active, else 0."),
    _metric("METRIC_HW_POWER", "observable gauge", "W", "development", "`gpu_metrics`: GPU power draw."),
    _metric("METRIC_HW_ENERGY", "observable counter", "J", "development", "`gpu_metrics`: GPU energy consumed "
            "since the driver loaded."),
    _metric("METRIC_HW_TEMPERATURE", "observable gauge", "Cel", "development", "`gpu_metrics`: GPU core "
            "temperature."),
    _metric("METRIC_PROCESS_GPU_MEMORY_USAGE", "observable updowncounter", "By", "otel_llm", "`gpu_metrics`: GPU "
            "memory used by the model runtime's processes."),
    # --- runtime state (runtime_metrics) --------------------------------------------------------------
    _metric(("METRIC_RUNTIME_REQUESTS_RUNNING",), "observable gauge", "{request}", "otel_llm",
            "`runtime_metrics`: requests the runtime is processing, where its metrics report them."),
    _metric(("METRIC_RUNTIME_REQUESTS_WAITING",), "observable gauge", "{request}", "otel_llm",
            "`runtime_metrics`: requests queued in the runtime, where its metrics report them."),
    _metric(("METRIC_RUNTIME_KV_CACHE_USAGE", "LLM_RUNTIME_KV_CACHE_USAGE"), "observable gauge", "1", "otel_llm",
            "`runtime_metrics`: fraction of the runtime's KV cache in use, where its metrics report it."),
    _metric("METRIC_RUNTIME_MODEL_LOADED", "observable gauge", "1", "otel_llm", "`runtime_metrics` (Ollama "
            "`/api/ps`): 1 for each model the runtime has loaded (`gen_ai.request.model`)."),
    _metric("METRIC_RUNTIME_MODEL_MEMORY", "observable gauge", "By", "otel_llm", "`runtime_metrics` (Ollama): "
            "memory of a loaded model, in total and in VRAM (`llm.runtime.memory.location`)."),
    _metric("METRIC_RUNTIME_MODEL_EXPIRES_IN", "observable gauge", "s", "otel_llm", "`runtime_metrics` (Ollama): "
            "time until the runtime unloads an idle model."),
    _metric("METRIC_RUNTIME_RESTARTS", "counter", "{restart}", "otel_llm", "`host_metrics`: grows by one when "
            "the process listening on a local model server's port changes or goes."),
    _metric("METRIC_HOST_OOM_KILLS", "counter", "{kill}", "otel_llm", "`host_metrics` (Linux): the kernel's OOM "
            "kills (growth of `/proc/vmstat` `oom_kill`) since the session started."),
    # --- gateway metrics ------------------------------------------------------------------------------
    _metric("METRIC_GATEWAY_REQUESTS", "counter", "{request}", "otel_llm", "`otel-llm gateway`: every request, by "
            "outcome, status and key id."),
    _metric("METRIC_GATEWAY_QUEUE_DEPTH", "observable gauge", "{request}", "otel_llm", "`otel-llm gateway`: "
            "requests waiting for an upstream slot."),
    _metric("METRIC_GATEWAY_QUEUE_WAIT", "histogram", "s", "otel_llm", "`otel-llm gateway`: each request's wait "
            "for an upstream slot, by outcome."),
    _metric("METRIC_HTTP_SERVER_DURATION", "histogram", "s", "stable", "`otel-llm gateway`: every request's "
            "duration, by method and status."),
    _metric("METRIC_HTTP_SERVER_ACTIVE", "updowncounter", "{request}", "development", "Not emitted at present: "
            "the gateway counts its requests in `llm.gateway.requests` and times them in "
            "`http.server.request.duration`, but keeps no count of those in flight.", emitted=False),
)


def public_constants(module: ModuleType = semconv) -> dict[str, str]:
    """Every public string constant of ``module``: ``NAME = "value"`` with an upper-case name."""
    return {name: value for name, value in vars(module).items()
            if name.isupper() and not name.startswith("_") and isinstance(value, str)}


def check(module: ModuleType = semconv, table: tuple[Name, ...] = ENTRIES) -> list[str]:
    """What is wrong between ``module``'s constants and ``table`` (empty: nothing)."""
    constants = public_constants(module)
    problems: list[str] = []
    named: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    for entry in table:
        for constant in entry.constants:
            named[constant] = named.get(constant, 0) + 1
            if constant not in constants:
                problems.append(f"{constant}: in the reference table but not a string constant of {module.__name__}")
        values = {constants[c] for c in entry.constants if c in constants}
        if len(values) > 1:
            problems.append(f"{entry.constants}: one entry, different values {sorted(values)}")
        if entry.kind not in KINDS:
            problems.append(f"{entry.constants}: unknown kind {entry.kind!r}")
        if entry.status not in STATUSES:
            problems.append(f"{entry.constants}: unknown status {entry.status!r}")
        allowed = {"attribute": ATTRIBUTE_TYPES, "metric": INSTRUMENTS, "span": SPAN_KINDS}.get(entry.kind)
        if allowed is not None and entry.type not in allowed:
            problems.append(f"{entry.constants}: {entry.type!r} is not one of {allowed}")
        if not entry.when:
            problems.append(f"{entry.constants}: says nothing about when it is set")
        value = values.pop() if len(values) == 1 else ""
        if value.startswith("llm.") and entry.status != "otel_llm":
            problems.append(f"{value}: an llm.* name is otel_llm's own, not {entry.status!r}")
        key = (entry.kind, value + entry.suffix)
        if value and key in seen:
            problems.append(f"{key}: listed twice")
        seen.add(key)
    for constant in sorted(set(constants) - set(named) - set(NOT_NAMES)):
        problems.append(f"{constant} = {constants[constant]!r}: not in the reference table "
                        "(add its entry to otel_llm/semconv_reference.py)")
    problems += [f"{constant}: in more than one entry" for constant, count in sorted(named.items()) if count > 1]
    problems += [f"{constant}: listed as not a name, but has an entry" for constant in NOT_NAMES if constant in named]
    return problems


def entries(module: ModuleType = semconv, table: tuple[Name, ...] = ENTRIES) -> list[tuple[str, Name]]:
    """``(name, entry)`` for every entry of ``table``, the name read from ``module`` (a family's name ends
    with its placeholder, e.g. ``llm.server_timing.<name>``); ValueError when :func:`check` finds a problem."""
    problems = check(module, table)
    if problems:
        raise ValueError("otel_llm/semconv.py and its reference table disagree:\n  " + "\n  ".join(problems))
    constants = public_constants(module)
    return [(constants[entry.constants[0]] + entry.suffix, entry) for entry in table]
