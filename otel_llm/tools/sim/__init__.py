"""A loopback LLM-runtime simulator with known, injected timings: ground truth for accuracy tests.

Timeline of one generation request (all delays in seconds, see ``SimConfig``)::

    body received ─ cold_delay (first request after start/unload) ─ slot wait (serialized only)
      ─ headers_delay ─ HEADERS [+ role/metadata frames] ─ first_token_delay ─ token 0
      ─ token_interval ─ token 1 ... token n-1 ─ closing frames (finish, usage, counters, end marker)

Non-streamed answers send headers and body together at the instant of the last token.
Streams use ``Transfer-Encoding: chunked``; every frame is flushed at once (TCP_NODELAY) unless
``buffering`` is on. Generated text is deterministic: "tok0", " tok1", " tok2", ...
Prompt tokens = whitespace words of the prompt text (messages, prompt, input, inputs, text, system) + 4.
``max_tokens``/``max_completion_tokens``/``max_output_tokens``/``n_predict``/``options.num_predict``/
``parameters.max_new_tokens``/``sampling_params.max_new_tokens`` cap ``tokens``; a cap below
``tokens`` finishes with "length", otherwise "stop".

Native counters are *measured* server-side intervals (event-loop clock), so they equal the injected
values plus scheduler jitter (~1 ms):

* load = cold_delay as spent (also by concurrent requests that waited for the same load)
* queue = wait for the slot (serialized mode)
* server wait = headers_delay, prefill = headers -> first token (= first_token_delay),
  decode = first token -> last token (= (tokens-1) * token_interval), total = body received -> last frame
* Ollama: load_duration = load, prompt_eval_duration = prefill (headers_delay is NOT included),
  eval_duration = decode, eval_count = tokens, prompt_eval_count = prompt tokens, total_duration = total;
  integer ns, zero values omitted (Go omitempty).
* llama.cpp ``timings``: prompt_ms = prefill, predicted_ms = decode, prompt_n = prompt - cache_n,
  cache_n = ``cached_tokens``, per-second values are plain divisions (null when dividing by 0).
* TGI headers: x-validation-time = headers_delay, x-queue-time = queue + load, x-inference-time =
  headers -> last token, x-total-time = total, x-time-per-token = inference / tokens (ms, rounded),
  x-compute-time = total in seconds.
* SGLang ``meta_info``: e2e_latency = total, queue_time = queue (finished event only).
* LM Studio: time_to_first_token = headers_delay + first_token_delay (slot granted -> first token),
  generation_time = decode, tokens_per_second = tokens / decode, model_load_time_seconds = load.
* OpenAI ``usage`` on non-streamed answers always, on streams with ``stream_options.include_usage``.

Per-request overrides: any ``SimConfig`` field as header ``x-sim-<field-with-dashes>``, e.g.
``x-sim-headers-delay``, ``x-sim-first-token-delay``, ``x-sim-token-interval``, ``x-sim-tokens``,
``x-sim-cold-delay``, ``x-sim-role-frame``, ``x-sim-keepalive-interval``, ``x-sim-concurrency``,
``x-sim-buffering``, ``x-sim-buffer-flush-interval``, ``x-sim-buffer-flush-frames``,
``x-sim-abort-after-tokens``, ``x-sim-error-status``, ``x-sim-fault-every`` (the error or abort hits
only every Nth generation request), ``x-sim-runtime``, ``x-sim-model``,
``x-sim-cached-tokens``. "off"/"none" clears an optional field.

Control: GET/POST ``/sim/config`` (JSON merge), POST ``/sim/reset`` (start config, cold, zero stats),
POST ``/sim/unload``, GET ``/sim/stats``. ``/sim/*`` requests are not counted in the stats.
"""

from __future__ import annotations

from .scenario import SimConfig
from .process import SimProcess
from .server import SimServer

__all__ = ["SimConfig", "SimProcess", "SimServer"]
