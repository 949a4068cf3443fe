"""Every attribute, span and metric name that otel_llm emits, in one place.

The GenAI conventions are still "Development"; when one is renamed, change it here only.
Project-specific names live in the ``llm.`` families.
"""

from __future__ import annotations

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
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

# --- HTTP / network (stable) ---------------------------------------------------------------
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
URL_FULL = "url.full"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
ERROR_TYPE = "error.type"
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

# --- metrics --------------------------------------------------------------------------------
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
METRIC_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
METRIC_PHASE_DURATION = "llm.client.phase.duration"

DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864
# Phases are often sub-10 ms (dns, connect, upload on loopback): finer low buckets.
PHASE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
    5.12, 10.24, 20.48, 40.96, 81.92,
)

# --- content capture switch -----------------------------------------------------------------
ENV_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

INSTRUMENTATION_NAME = "otel_llm"
