"""Every attribute, span and metric name that otel_llm emits, in one place.

The GenAI conventions are still "Development"; when one is renamed, change it here only.
Project-specific names live in the ``llm.`` families.
"""

from __future__ import annotations

__all__ = [
    "BAGGAGE_RECORDED", "CLIENT_ADDRESS", "CLIENT_PORT", "CPU_MODE", "DISK_IO_DIRECTION", "DNS_QUESTION_NAME",
    "DURATION_BUCKETS", "ENV_CAPTURE_CONTENT", "ERROR_TYPE", "EVENT_RUNTIME_RESTARTED", "GEN_AI_INPUT_MESSAGES",
    "GEN_AI_OPERATION_NAME", "GEN_AI_OUTPUT_MESSAGES", "GEN_AI_PROVIDER_NAME", "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_REQUEST_MODEL", "GEN_AI_REQUEST_SEED", "GEN_AI_REQUEST_STOP_SEQUENCES", "GEN_AI_REQUEST_STREAM",
    "GEN_AI_REQUEST_TEMPERATURE", "GEN_AI_REQUEST_TOP_K", "GEN_AI_REQUEST_TOP_P", "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_ID", "GEN_AI_RESPONSE_MODEL", "GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK", "GEN_AI_SYSTEM_INSTRUCTIONS",
    "GEN_AI_TOKEN_MODALITY", "GEN_AI_TOKEN_TYPE", "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS", "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS", "GEN_AI_USAGE_REASONING_OUTPUT_TOKENS", "HTTP_REQUEST_BODY_SIZE",
    "HTTP_REQUEST_METHOD", "HTTP_RESPONSE_STATUS_CODE", "HTTP_ROUTE", "HW_GPU_CLOCK_DOMAIN", "HW_GPU_TASK",
    "HW_GPU_THROTTLE_REASON", "HW_ID", "HW_MODEL", "HW_NAME", "HW_SENSOR_LOCATION", "HW_TYPE", "HW_VENDOR",
    "INSTRUMENTATION_NAME", "LLM_API", "LLM_BESIDE_INSTRUMENTATION",
    "LLM_CLIENT_CHUNKS", "LLM_CLIENT_CONNECTION_REUSED", "LLM_CLIENT_END_REASON",
    "LLM_CLIENT_GENERATION_DURATION", "LLM_CLIENT_GENERATION_RATE", "LLM_CLIENT_MAX_CHUNK_GAP",
    "LLM_CLIENT_RESPONSE_BYTES", "LLM_CLIENT_TIME_TO_FIRST_BYTE", "LLM_CLIENT_TIME_TO_FIRST_TOKEN",
    "LLM_DIAGNOSIS_BOTTLENECK", "LLM_DIAGNOSIS_COLD_START", "LLM_DIAGNOSIS_CONCURRENT_REQUESTS",
    "LLM_DIAGNOSIS_CONTEXT_PRESSURE", "LLM_DIAGNOSIS_PARTIAL_OFFLOAD", "LLM_DIAGNOSIS_RETRY",
    "LLM_DIAGNOSIS_STREAM_BUFFERED", "LLM_DIAGNOSIS_UNACCOUNTED_WAIT", "LLM_GATEWAY_KEY_ID", "LLM_GATEWAY_OUTCOME",
    "LLM_GATEWAY_QUEUE_DEPTH", "LLM_GATEWAY_QUEUE_WAIT", "LLM_GATEWAY_RELAYED", "LLM_GATEWAY_RESPONSE_BYTES",
    "LLM_GATEWAY_UPSTREAM_FIRST_BYTE", "LLM_HOST_CPU_UTILIZATION", "LLM_HOST_GPU_MEMORY_USAGE",
    "LLM_HOST_GPU_UTILIZATION", "LLM_HOST_MEMORY_UTILIZATION", "LLM_HOST_PAGING_MAJOR_FAULTS", "LLM_HOST_SWAP_IN",
    "LLM_HOST_SWAP_OUT", "LLM_MODEL_CONTEXT_LENGTH", "LLM_MODEL_EXPIRES_AT", "LLM_MODEL_MEMORY_TOTAL",
    "LLM_MODEL_MEMORY_VRAM", "LLM_MODEL_NAME", "LLM_MODEL_PARAMETER_SIZE", "LLM_MODEL_QUANTIZATION", "LLM_MODEL_SLOTS",
    "LLM_PHASE", "LLM_PROXY_TIME_TO_FIRST_BYTE", "LLM_PROXY_TIME_TO_FIRST_TOKEN", "LLM_PROXY_WRITE_WAIT",
    "LLM_REQUEST_ATTACHMENTS", "LLM_REQUEST_CONTEXT_PRESSURE", "LLM_REQUEST_LARGEST_MESSAGE_BYTES",
    "LLM_REQUEST_MESSAGES", "LLM_REQUEST_MESSAGES_PREFIX", "LLM_REQUEST_ROLES", "LLM_REQUEST_SYSTEM_BYTES",
    "LLM_REQUEST_TOOLS", "LLM_REQUEST_TOOLS_BYTES", "LLM_RUNTIME_CACHED_TOKENS", "LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE",
    "LLM_RUNTIME_DRAFT_TOKENS", "LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED", "LLM_RUNTIME_GENERATION_DURATION",
    "LLM_RUNTIME_GENERATION_RATE", "LLM_RUNTIME_GENERATION_TOKENS", "LLM_RUNTIME_KV_CACHE_USAGE",
    "LLM_RUNTIME_LOAD_DURATION", "LLM_RUNTIME_MEMORY_LOCATION", "LLM_RUNTIME_NAME", "LLM_RUNTIME_PID",
    "LLM_RUNTIME_PREVIOUS_PID", "LLM_RUNTIME_PROMPT_EVAL_DURATION", "LLM_RUNTIME_PROMPT_EVAL_RATE",
    "LLM_RUNTIME_PROMPT_TOKENS", "LLM_RUNTIME_QUEUE_DURATION", "LLM_RUNTIME_REQUESTS_RUNNING",
    "LLM_RUNTIME_REQUESTS_WAITING", "LLM_RUNTIME_TOTAL_DURATION", "LLM_SAMPLING_ADJUSTED_COUNT",
    "LLM_SAMPLING_REASON", "LLM_SERVER_TIMING_PREFIX", "LLM_SYNTHESIZED",
    "METRIC_ACTIVE_REQUESTS", "METRIC_DIAGNOSIS_CALLS", "METRIC_DIAGNOSIS_UNACCOUNTED_WAIT",
    "METRIC_GATEWAY_QUEUE_DEPTH", "METRIC_GATEWAY_QUEUE_WAIT", "METRIC_GATEWAY_REQUESTS", "METRIC_HOST_OOM_KILLS",
    "METRIC_HTTP_SERVER_ACTIVE", "METRIC_HTTP_SERVER_DURATION", "METRIC_HW_ENERGY", "METRIC_HW_GPU_CLOCK_FREQUENCY",
    "METRIC_HW_GPU_IO", "METRIC_HW_GPU_MEMORY_LIMIT", "METRIC_HW_GPU_MEMORY_USAGE", "METRIC_HW_GPU_MEMORY_UTILIZATION",
    "METRIC_HW_GPU_THROTTLE", "METRIC_HW_GPU_UTILIZATION", "METRIC_HW_POWER", "METRIC_HW_TEMPERATURE",
    "METRIC_INFERENCE_DURATION", "METRIC_INFERENCE_OPERATION_INPUT_TOKENS", "METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS",
    "METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK", "METRIC_INFERENCE_TIME_TO_FIRST_CHUNK",
    "METRIC_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS", "METRIC_INFERENCE_USAGE_INPUT_TOKENS",
    "METRIC_INFERENCE_USAGE_OUTPUT_TOKENS", "METRIC_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS",
    "METRIC_OPERATION_DURATION", "METRIC_PHASE_DURATION", "METRIC_PROCESS_CPU_UTILIZATION",
    "METRIC_PROCESS_GPU_MEMORY_USAGE", "METRIC_PROCESS_MEMORY_USAGE", "METRIC_RUNTIME_GENERATION_RATE",
    "METRIC_RUNTIME_KV_CACHE_USAGE", "METRIC_RUNTIME_MODEL_EXPIRES_IN", "METRIC_RUNTIME_MODEL_LOADED",
    "METRIC_RUNTIME_MODEL_MEMORY", "METRIC_RUNTIME_PROMPT_EVAL_RATE", "METRIC_RUNTIME_REQUESTS_RUNNING",
    "METRIC_RUNTIME_REQUESTS_WAITING", "METRIC_RUNTIME_RESTARTS", "METRIC_SERVER_TIME_PER_OUTPUT_TOKEN",
    "METRIC_SERVER_TIME_TO_FIRST_TOKEN", "METRIC_SYSTEM_CPU_UTILIZATION", "METRIC_SYSTEM_DISK_IO",
    "METRIC_SYSTEM_MEMORY_USAGE", "METRIC_SYSTEM_MEMORY_UTILIZATION", "METRIC_SYSTEM_NETWORK_IO",
    "METRIC_SYSTEM_PAGING_FAULTS", "METRIC_SYSTEM_PAGING_OPERATIONS", "METRIC_SYSTEM_PAGING_USAGE",
    "METRIC_TIME_PER_OUTPUT_CHUNK", "METRIC_TIME_TO_FIRST_CHUNK", "METRIC_TOKEN_USAGE", "NETWORK_IO_DIRECTION",
    "NETWORK_PEER_ADDRESS", "NETWORK_PEER_PORT", "NETWORK_PROTOCOL_VERSION", "OTEL_METRIC_OVERFLOW", "PHASE_BUCKETS",
    "PROCESS_EXECUTABLE_NAME", "PROCESS_PID", "QUEUE_WAIT_BUCKETS", "RATE_BUCKETS", "SERVER_ADDRESS", "SERVER_PORT",
    "SERVER_TPOT_BUCKETS", "SERVER_TTFT_BUCKETS", "SPAN_CONNECT", "SPAN_DECODE", "SPAN_DNS", "SPAN_DOWNLOAD",
    "SPAN_FIRST_TOKEN", "SPAN_GATEWAY_AUTH", "SPAN_GATEWAY_QUEUE", "SPAN_POOL_WAIT", "SPAN_RUNTIME_DECODE",
    "SPAN_RUNTIME_LOAD", "SPAN_RUNTIME_PREFILL", "SPAN_RUNTIME_QUEUE", "SPAN_SERVER_WAIT", "SPAN_TLS", "SPAN_UPLOAD",
    "SYSTEM_MEMORY_STATE", "SYSTEM_PAGING_DIRECTION", "SYSTEM_PAGING_FAULT_TYPE", "SYSTEM_PAGING_STATE", "TLS_CIPHER",
    "TLS_NEXT_PROTOCOL", "TLS_PROTOCOL_VERSION", "TOKEN_BUCKETS", "TRACESTATE_OT", "URL_FULL", "URL_PATH", "URL_SCHEME",
    "USER_AGENT_ORIGINAL", "VLLM_COMPLETION_TOKENS", "VLLM_E2E", "VLLM_LATENCY_PREFIX", "VLLM_PROMPT_TOKENS",
    "VLLM_TIME_IN_DECODE", "VLLM_TIME_IN_PREFILL", "VLLM_TIME_IN_QUEUE", "VLLM_TIME_TO_FIRST_TOKEN",
]

# --- GenAI (semantic-conventions v1.41) ---------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
# the inference usage counters' attribute (semantic-conventions-genai, docs/gen-ai/gen-ai-token-metrics.md):
# otel_llm reads no per-modality breakdown, so it records "unknown", as that document prescribes
GEN_AI_TOKEN_MODALITY = "gen_ai.token.modality"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

# --- HTTP, network, TLS, DNS (each name's status is in semconv_reference.py) ---------------
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
URL_FULL = "url.full"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_REQUEST_BODY_SIZE = "http.request.body.size"  # bytes of the request body as sent
ERROR_TYPE = "error.type"
OTEL_METRIC_OVERFLOW = "otel.metric.overflow"  # the attribute set past a metric's cardinality limit
NETWORK_PEER_ADDRESS = "network.peer.address"
NETWORK_PEER_PORT = "network.peer.port"
NETWORK_PROTOCOL_VERSION = "network.protocol.version"
TLS_PROTOCOL_VERSION = "tls.protocol.version"
TLS_CIPHER = "tls.cipher"
TLS_NEXT_PROTOCOL = "tls.next_protocol"
DNS_QUESTION_NAME = "dns.question.name"

# --- otel_llm: client-side timing on the call span -----------------------------------------
LLM_RUNTIME_NAME = "llm.runtime.name"
LLM_API = "llm.api"
LLM_CLIENT_TIME_TO_FIRST_BYTE = "llm.client.time_to_first_byte"
LLM_CLIENT_TIME_TO_FIRST_TOKEN = "llm.client.time_to_first_token"
LLM_CLIENT_GENERATION_DURATION = "llm.client.generation_duration"
LLM_CLIENT_GENERATION_RATE = "llm.client.generation_rate"
LLM_CLIENT_CHUNKS = "llm.client.chunks"
LLM_CLIENT_MAX_CHUNK_GAP = "llm.client.max_chunk_gap"
LLM_CLIENT_CONNECTION_REUSED = "llm.client.connection_reused"
LLM_CLIENT_RESPONSE_BYTES = "llm.client.response_bytes"
LLM_CLIENT_END_REASON = "llm.client.end_reason"
LLM_PHASE = "llm.phase"
# + the metric name of each `Server-Timing` entry the response carried (seconds), e.g.
# llm.server_timing.queue from otel-llm gateway
LLM_SERVER_TIMING_PREFIX = "llm.server_timing."

# --- otel_llm: the runtime's own counters, normalized (seconds, tokens, tokens/s) ------------
LLM_RUNTIME_LOAD_DURATION = "llm.runtime.load_duration"
LLM_RUNTIME_QUEUE_DURATION = "llm.runtime.queue_duration"
LLM_RUNTIME_PROMPT_TOKENS = "llm.runtime.prompt_tokens"
LLM_RUNTIME_PROMPT_EVAL_DURATION = "llm.runtime.prompt_eval_duration"
LLM_RUNTIME_PROMPT_EVAL_RATE = "llm.runtime.prompt_eval_rate"
LLM_RUNTIME_CACHED_TOKENS = "llm.runtime.cached_tokens"
LLM_RUNTIME_GENERATION_TOKENS = "llm.runtime.generation_tokens"
LLM_RUNTIME_GENERATION_DURATION = "llm.runtime.generation_duration"
LLM_RUNTIME_GENERATION_RATE = "llm.runtime.generation_rate"
LLM_RUNTIME_TOTAL_DURATION = "llm.runtime.total_duration"
LLM_RUNTIME_DRAFT_TOKENS = "llm.runtime.draft_tokens"
LLM_RUNTIME_DRAFT_TOKENS_ACCEPTED = "llm.runtime.draft_tokens_accepted"
LLM_RUNTIME_DRAFT_ACCEPTANCE_RATE = "llm.runtime.draft_acceptance_rate"
LLM_SYNTHESIZED = "llm.synthesized"

# --- otel_llm: why a call's spans were kept when sampling (otel_llm.telemetry.sampling) ----------
LLM_SAMPLING_REASON = "llm.sampling.reason"  # string[]: failed, slow, ... or rate, parent
LLM_SAMPLING_ADJUSTED_COUNT = "llm.sampling.adjusted_count"  # 1 / the probability the call was kept
TRACESTATE_OT = "ot"  # OpenTelemetry's tracestate entry: th:<hex> the rejection threshold

# --- otel_llm: diagnosis derived per call ---------------------------------------------------
LLM_DIAGNOSIS_UNACCOUNTED_WAIT = "llm.diagnosis.unaccounted_wait"
LLM_DIAGNOSIS_COLD_START = "llm.diagnosis.cold_start"
LLM_DIAGNOSIS_STREAM_BUFFERED = "llm.diagnosis.stream_buffered"
LLM_DIAGNOSIS_CONCURRENT_REQUESTS = "llm.diagnosis.concurrent_requests"
LLM_DIAGNOSIS_RETRY = "llm.diagnosis.retry"
LLM_DIAGNOSIS_BOTTLENECK = "llm.diagnosis.bottleneck"
LLM_DIAGNOSIS_CONTEXT_PRESSURE = "llm.diagnosis.context_pressure"  # the prompt fills over 80 % of the context
LLM_DIAGNOSIS_PARTIAL_OFFLOAD = "llm.diagnosis.partial_offload"  # part of the model in VRAM, the rest in RAM

# --- otel_llm: host and runtime evidence for the call's own time window -----------------------
LLM_HOST_CPU_UTILIZATION = "llm.host.cpu.utilization"
LLM_HOST_MEMORY_UTILIZATION = "llm.host.memory.utilization"
LLM_HOST_PAGING_MAJOR_FAULTS = "llm.host.paging.major_faults"
LLM_HOST_SWAP_IN = "llm.host.swap.in"
LLM_HOST_SWAP_OUT = "llm.host.swap.out"
LLM_HOST_GPU_UTILIZATION = "llm.host.gpu.utilization"
LLM_HOST_GPU_MEMORY_USAGE = "llm.host.gpu.memory.usage"
LLM_RUNTIME_REQUESTS_RUNNING = "llm.runtime.requests.running"
LLM_RUNTIME_REQUESTS_WAITING = "llm.runtime.requests.waiting"
LLM_RUNTIME_KV_CACHE_USAGE = "llm.runtime.kv_cache.usage"

# --- host and process metrics (semconv system.* / process.*) --------------------------------
METRIC_SYSTEM_CPU_UTILIZATION = "system.cpu.utilization"
METRIC_SYSTEM_MEMORY_USAGE = "system.memory.usage"
METRIC_SYSTEM_MEMORY_UTILIZATION = "system.memory.utilization"
METRIC_SYSTEM_PAGING_USAGE = "system.paging.usage"
METRIC_SYSTEM_PAGING_OPERATIONS = "system.paging.operations"
METRIC_SYSTEM_PAGING_FAULTS = "system.paging.faults"
METRIC_SYSTEM_DISK_IO = "system.disk.io"
METRIC_SYSTEM_NETWORK_IO = "system.network.io"
METRIC_PROCESS_CPU_UTILIZATION = "process.cpu.utilization"
METRIC_PROCESS_MEMORY_USAGE = "process.memory.usage"
CPU_MODE = "cpu.mode"
SYSTEM_MEMORY_STATE = "system.memory.state"
SYSTEM_PAGING_STATE = "system.paging.state"
SYSTEM_PAGING_DIRECTION = "system.paging.direction"
SYSTEM_PAGING_FAULT_TYPE = "system.paging.fault.type"
DISK_IO_DIRECTION = "disk.io.direction"
NETWORK_IO_DIRECTION = "network.io.direction"
PROCESS_PID = "process.pid"
PROCESS_EXECUTABLE_NAME = "process.executable.name"

# --- GPU metrics (semconv hw.*) and runtime-state metrics -------------------------------------
METRIC_HW_GPU_UTILIZATION = "hw.gpu.utilization"
METRIC_HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"
METRIC_HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"
METRIC_HW_GPU_MEMORY_UTILIZATION = "hw.gpu.memory.utilization"
METRIC_HW_GPU_IO = "hw.gpu.io"
METRIC_HW_GPU_CLOCK_FREQUENCY = "hw.gpu.clock.frequency"
METRIC_HW_GPU_THROTTLE = "hw.gpu.throttle"
METRIC_HW_POWER = "hw.power"
METRIC_HW_ENERGY = "hw.energy"
METRIC_HW_TEMPERATURE = "hw.temperature"
METRIC_PROCESS_GPU_MEMORY_USAGE = "process.gpu.memory.usage"
HW_ID = "hw.id"
HW_NAME = "hw.name"
HW_VENDOR = "hw.vendor"
HW_MODEL = "hw.model"
HW_TYPE = "hw.type"
HW_GPU_TASK = "hw.gpu.task"
HW_SENSOR_LOCATION = "hw.sensor_location"
HW_GPU_CLOCK_DOMAIN = "hw.gpu.clock.domain"
HW_GPU_THROTTLE_REASON = "hw.gpu.throttle.reason"
METRIC_RUNTIME_REQUESTS_RUNNING = LLM_RUNTIME_REQUESTS_RUNNING  # the gauge and the call attribute share a name
METRIC_RUNTIME_REQUESTS_WAITING = LLM_RUNTIME_REQUESTS_WAITING
METRIC_RUNTIME_KV_CACHE_USAGE = LLM_RUNTIME_KV_CACHE_USAGE
METRIC_RUNTIME_MODEL_LOADED = "llm.runtime.model.loaded"
METRIC_RUNTIME_MODEL_MEMORY = "llm.runtime.model.memory"
METRIC_RUNTIME_MODEL_EXPIRES_IN = "llm.runtime.model.expires_in"
LLM_RUNTIME_MEMORY_LOCATION = "llm.runtime.memory.location"

# --- runtime restarts and the kernel's OOM kills (observers.restarts, observers.oom) ----------
# No semantic convention names these yet (semconv has only k8s' "OOMKilled" reason value).
METRIC_RUNTIME_RESTARTS = "llm.runtime.restarts"  # counter {restart}: the process at host:port changed or went
METRIC_HOST_OOM_KILLS = "llm.host.oom_kills"  # counter {kill}: growth of /proc/vmstat's oom_kill
EVENT_RUNTIME_RESTARTED = "llm.runtime.restarted"  # span event on the first call after a restart
LLM_RUNTIME_PID = "llm.runtime.pid"  # the process listening now (absent: none seen)
LLM_RUNTIME_PREVIOUS_PID = "llm.runtime.previous_pid"

# --- phase (child) span names --------------------------------------------------------------
SPAN_POOL_WAIT = "http.pool_wait"
SPAN_DNS = "http.dns"
SPAN_CONNECT = "http.connect"
SPAN_TLS = "http.tls"
SPAN_UPLOAD = "http.upload"
SPAN_SERVER_WAIT = "llm.server_wait"
SPAN_FIRST_TOKEN = "llm.first_token"
SPAN_DECODE = "llm.decode"
SPAN_DOWNLOAD = "http.download"
# synthesized from the runtime's counters, placed on the client clock (llm.synthesized=true)
SPAN_RUNTIME_QUEUE = "runtime.queue"
SPAN_RUNTIME_LOAD = "runtime.load"
SPAN_RUNTIME_PREFILL = "runtime.prefill"
SPAN_RUNTIME_DECODE = "runtime.decode"

# --- metrics --------------------------------------------------------------------------------
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
METRIC_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
METRIC_PHASE_DURATION = "llm.client.phase.duration"
METRIC_SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
METRIC_SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
METRIC_RUNTIME_PROMPT_EVAL_RATE = "llm.runtime.prompt_eval.rate"
METRIC_RUNTIME_GENERATION_RATE = "llm.runtime.generation.rate"
METRIC_ACTIVE_REQUESTS = "llm.client.active_requests"
METRIC_DIAGNOSIS_CALLS = "llm.diagnosis.calls"  # by bottleneck, cold_start, stream_buffered
METRIC_DIAGNOSIS_UNACCOUNTED_WAIT = LLM_DIAGNOSIS_UNACCOUNTED_WAIT
# The client metrics as renamed by the GenAI conventions' own repository,
# open-telemetry/semantic-conventions-genai (status Development), emitted instead of (or beside)
# the four above when OTEL_SEMCONV_STABILITY_OPT_IN asks for them (otel_llm.config.genai_semconv).
# docs/gen-ai/client-inference.md: the same histograms (seconds, DURATION_BUCKETS) renamed
METRIC_INFERENCE_DURATION = "gen_ai.client.inference.duration"
METRIC_INFERENCE_TIME_TO_FIRST_CHUNK = "gen_ai.client.inference.time_to_first_chunk"
METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
# docs/gen-ai/gen-ai-token-metrics.md: gen_ai.client.token.usage replaced by counters (with
# gen_ai.token.modality) and per-operation histograms (TOKEN_BUCKETS, successful calls only).
# Its cache_write counter is not emitted: otel_llm keeps no cache-write count on the span.
METRIC_INFERENCE_USAGE_INPUT_TOKENS = "gen_ai.client.inference.usage.input_tokens"
METRIC_INFERENCE_USAGE_OUTPUT_TOKENS = "gen_ai.client.inference.usage.output_tokens"
METRIC_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.client.inference.usage.cache_read.input_tokens"
METRIC_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.client.inference.usage.reasoning.output_tokens"
METRIC_INFERENCE_OPERATION_INPUT_TOKENS = "gen_ai.client.inference.operation.input_tokens"
METRIC_INFERENCE_OPERATION_OUTPUT_TOKENS = "gen_ai.client.inference.operation.output_tokens"

DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864
# Phases are often sub-10 ms (dns, connect, upload on loopback): finer low buckets.
PHASE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
    5.12, 10.24, 20.48, 40.96, 81.92,
)

SERVER_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SERVER_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)

# --- a runtime's own spans, as it exports them (read by `otel-llm view`, never written) ---------
# vLLM's `llm_request` SERVER span (--otlp-traces-endpoint): seconds, from vLLM's clock; its token
# counts keep the older usage names
VLLM_LATENCY_PREFIX = "gen_ai.latency."
VLLM_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
VLLM_TIME_IN_PREFILL = "gen_ai.latency.time_in_model_prefill"
VLLM_TIME_IN_DECODE = "gen_ai.latency.time_in_model_decode"
VLLM_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
VLLM_E2E = "gen_ai.latency.e2e"
VLLM_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
VLLM_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"

# --- gateway (otel-llm gateway): server spans, children, metrics ----------------------------
HTTP_ROUTE = "http.route"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
CLIENT_ADDRESS = "client.address"
CLIENT_PORT = "client.port"
USER_AGENT_ORIGINAL = "user_agent.original"
LLM_GATEWAY_KEY_ID = "llm.gateway.key_id"
LLM_GATEWAY_OUTCOME = "llm.gateway.outcome"
LLM_GATEWAY_QUEUE_DEPTH = "llm.gateway.queue.depth"  # also the metric
LLM_GATEWAY_QUEUE_WAIT = "llm.gateway.queue.wait"  # also the metric
LLM_GATEWAY_UPSTREAM_FIRST_BYTE = "llm.gateway.upstream.time_to_first_byte"
LLM_GATEWAY_RESPONSE_BYTES = "llm.gateway.response_bytes"
# On the gateway's own model calls (span and metrics): the call relays a request the gateway
# received, whose caller recorded the same call itself (its baggage says otel_llm.recorded=1);
# fleet-wide sums leave these out. Absent when the caller records nothing: counted from the gateway.
LLM_GATEWAY_RELAYED = "llm.gateway.relayed"
# On otel_llm's call span when it is the transport view under another instrumentation's GenAI span
# (telemetry.beside): that instrumentation's scope name
LLM_BESIDE_INSTRUMENTATION = "llm.beside.instrumentation"
# On the proxy's SERVER span (otel-llm proxy): the caller's side of the relay, from the request's arrival
LLM_PROXY_TIME_TO_FIRST_BYTE = "llm.proxy.time_to_first_byte"
LLM_PROXY_TIME_TO_FIRST_TOKEN = "llm.proxy.time_to_first_token"
LLM_PROXY_WRITE_WAIT = "llm.proxy.write_wait"
SPAN_GATEWAY_AUTH = "gateway.auth"
SPAN_GATEWAY_QUEUE = "gateway.queue"
METRIC_GATEWAY_REQUESTS = "llm.gateway.requests"
METRIC_GATEWAY_QUEUE_DEPTH = LLM_GATEWAY_QUEUE_DEPTH
METRIC_GATEWAY_QUEUE_WAIT = LLM_GATEWAY_QUEUE_WAIT
METRIC_HTTP_SERVER_DURATION = "http.server.request.duration"
METRIC_HTTP_SERVER_ACTIVE = "http.server.active_requests"
QUEUE_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# --- content capture switch -----------------------------------------------------------------
ENV_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# the W3C baggage entry (value "1") otel_llm's client adds to each model request: it records the
# call itself, so a gateway on the way marks its own record of the call relayed
BAGGAGE_RECORDED = "otel_llm.recorded"

INSTRUMENTATION_NAME = "otel_llm"

# --- Request size without content (what an application resends on every turn) -------------
LLM_REQUEST_MESSAGES = "llm.request.messages"  # messages (a prompt string counts as one user message)
LLM_REQUEST_MESSAGES_PREFIX = "llm.request.messages."  # + one of LLM_REQUEST_ROLES: messages of it
# the roles counted by name; any other role is counted as "other" (a bounded set of attributes)
LLM_REQUEST_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "other")
LLM_REQUEST_SYSTEM_BYTES = "llm.request.system.bytes"  # UTF-8 bytes of system/developer instructions
LLM_REQUEST_LARGEST_MESSAGE_BYTES = "llm.request.largest_message.bytes"  # text and tool-call arguments
LLM_REQUEST_TOOLS = "llm.request.tools"  # tool/function definitions sent
LLM_REQUEST_TOOLS_BYTES = "llm.request.tools.bytes"  # their compact JSON
LLM_REQUEST_ATTACHMENTS = "llm.request.attachments"  # images, audio, files in the messages
LLM_REQUEST_CONTEXT_PRESSURE = "llm.request.context_pressure"  # prompt tokens / llm.model.context_length

# --- the served model, from the runtime's metadata route (observers.runtime_state.model_of) ------
LLM_MODEL_CONTEXT_LENGTH = "llm.model.context_length"  # tokens one request may hold (llama.cpp: per slot)
LLM_MODEL_NAME = "llm.model.name"  # the runtime's model file or name (/props model_path, /v1/models id)
LLM_MODEL_QUANTIZATION = "llm.model.quantization"  # as the runtime names it (llama.cpp model_ftype)
LLM_MODEL_SLOTS = "llm.model.slots"  # requests the runtime serves at once (llama.cpp total_slots)
LLM_MODEL_MEMORY_TOTAL = "llm.model.memory.total"  # bytes the loaded model takes (Ollama /api/ps size)
LLM_MODEL_MEMORY_VRAM = "llm.model.memory.vram"  # of which in GPU memory (Ollama size_vram)
LLM_MODEL_PARAMETER_SIZE = "llm.model.parameter_size"  # as the runtime writes it (Ollama details.parameter_size)
LLM_MODEL_EXPIRES_AT = "llm.model.expires_at"  # when the runtime unloads it if idle, as it says (Ollama expires_at)
