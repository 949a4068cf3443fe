"""Verdicts: pure functions from measured results to stable codes with evidence and remedy.

Codes (stable; scripts may rely on them): ``unreachable``, ``http_error``, ``auth_missing``,
``runtime_restarted``, ``memory_pressure``, ``cold_start``, ``prefill_bound``, ``decode_bound``,
``queueing``, ``shared_compute``, ``buffering``, ``network_path``, ``partial_offload``,
``context_pressure``, ``healthy``. The first verdict of the list is the
primary one: a restart or memory pressure during the trials comes first, as it also bends every
timing measured across it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from otel_llm.telemetry.diagnosis import CONTEXT_PRESSURE

from .hoststate import HostReading
from .trials import TargetResult, Trial

__all__ = ["CODES", "THRESHOLDS", "Verdict", "median", "verdicts"]

CODES = ("unreachable", "http_error", "auth_missing", "runtime_restarted", "memory_pressure", "cold_start",
         "prefill_bound", "decode_bound", "queueing", "shared_compute", "buffering", "network_path", "partial_offload",
         "context_pressure", "healthy")

THRESHOLDS = {
    # cold trial's ttft exceeds the warm median by this much (s) and by this factor
    "cold_excess_s": 0.25,
    "cold_factor": 2.0,
    # native prompt evaluation is this share of the warm ttft, and the ttft is at least this long
    "prefill_share": 0.6,
    "prefill_min_ttft_s": 0.5,
    # decode is this share of the warm call time and the generation rate is below this (tokens/s)
    "decode_share": 0.7,
    "decode_low_rate": 20.0,
    # at concurrency 2, the later request's ttft grows by this share of a whole first request
    "queue_share": 0.6,
    "queue_min_s": 0.05,
    # ... unless its own decode took less than this share of the first's (it arrived in one burst)
    "collapsed_share": 0.25,
    # overlapping requests generate at less than this share of the warm rate
    "shared_rate_share": 0.7,
    # share of the warm trials the instrumentation found buffered
    "buffered_share": 0.5,
    # pages swapped in plus out on the host during the trials (the cold step excluded): 1,024
    # pages is 4 MiB of 4 KiB pages, above the odd idle page a calm host swaps out now and then
    # and far below what a model whose working set does not fit moves in a few generations
    "swap_pages": 1024,
    # a trial's prompt fills more than this share of the context length the runtime reports
    "context_share": CONTEXT_PRESSURE,
    # major page faults on the host during the trials (the cold step excluded): a resident model
    # takes none; an mmap'd model (llama.cpp, Ollama) whose pages the kernel dropped for lack of
    # memory reads them back from disk, thousands per generation. A few hundred come from
    # programs starting on a cold page cache: not pressure
    "major_faults": 1000,
}

# trial errors that a runtime going away gives: refused connection, reset or broken stream
CONNECTION_ERRORS = ("unreachable", "error")
# the readings around deliberate cold resets (a --cold command may restart the runtime on purpose)
_DELIBERATE = ("before cold trials", "after cold trials")

EXPLAIN = {
    "unreachable": "A connection refusal means no reachable listener answered at that address and port.",
    "http_error": "An HTTP error means a listener did answer: inspect the status, response body, "
                  "request route, authentication and server logs.",
    "auth_missing": "The listener answered but refused the caller: credentials are missing or rejected.",
}


@dataclass
class Verdict:
    code: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _reachability(result: TargetResult) -> Verdict | None:
    first = result.reachable
    if first is None or first.ok:
        return None
    if first.error in ("unreachable", "timeout", "error") and first.status is None:
        code = "unreachable"
        summary = f"no listener answered at {result.url}" if first.error == "unreachable" \
            else f"the request to {result.url} failed ({first.error})"
        return Verdict(code, summary + ". " + EXPLAIN["unreachable"],
                       {"error": first.error, "detail": first.detail},
                       "start the runtime or fix the address and port (check the listener it actually bound)")
    status = first.status
    evidence = {"status": status, "body": first.detail, "auth_sent": result.auth_sent}
    if status in (401, 403):
        how = "the credentials sent were rejected" if result.auth_sent else "no credentials were sent"
        return Verdict("auth_missing", f"HTTP {status}: {how}. " + EXPLAIN["auth_missing"], evidence,
                       "pass --auth-env VAR naming an environment variable that holds a valid token"
                       if not result.auth_sent else "check the token in the environment variable and the "
                       "gateway's authorization rules")
    remedy = "inspect the server logs for this request"
    summary = f"HTTP {status}. " + EXPLAIN["http_error"]
    if status == 404:
        summary = "HTTP 404: wrong route or model. " + EXPLAIN["http_error"]
        remedy = f"check the route for --api {result.api} and that model {result.model!r} exists on the server"
    return Verdict("http_error", summary, evidence, remedy)


def _cold(result: TargetResult, warm: list[Trial]) -> Verdict | None:
    """From the deliberate cold trials (--cold) when there are any, else from the first request."""
    deliberate = [t for t in result.cold_trials if t.ok]
    cold_set = deliberate or ([result.cold] if result.cold is not None else [])
    cold_ttft = median(t.ttft for t in cold_set)
    load = median(t.load for t in cold_set)
    warm_ttft = median(t.ttft for t in warm)
    if cold_ttft is None or warm_ttft is None:
        return None
    excess = cold_ttft - warm_ttft
    by_timing = excess >= THRESHOLDS["cold_excess_s"] and cold_ttft >= THRESHOLDS["cold_factor"] * warm_ttft
    if not by_timing:
        return None
    evidence = {"cold_ttft_s": _r(cold_ttft), "warm_median_ttft_s": _r(warm_ttft), "excess_s": _r(excess),
                "cold_trials": len(cold_set)}
    if load is not None:
        evidence["native_load_duration_s"] = _r(load)
    which = f"the {len(deliberate)} cold trials" if deliberate else "the first request"
    summary = f"{which} waited {excess:.2f} s longer for the first token than warm ones"
    if load is not None and load >= 0.5 * excess:
        summary += f" (the runtime reported {load:.2f} s of model loading)"
    return Verdict("cold_start", summary, evidence, "model loading; keep the model resident "
                   "(raise the runtime's keep-alive / idle unload time, or warm it up before use)")


def _prefill(warm: list[Trial]) -> Verdict | None:
    ttft = median(t.ttft for t in warm)
    prefill = median(t.prompt_eval for t in warm)
    if ttft is None or prefill is None or ttft < THRESHOLDS["prefill_min_ttft_s"]:
        return None
    share = prefill / ttft
    if share < THRESHOLDS["prefill_share"]:
        return None
    return Verdict("prefill_bound", f"prompt evaluation takes {share:.0%} of the {ttft:.2f} s to the first token",
                   {"warm_median_ttft_s": _r(ttft), "native_prompt_eval_s": _r(prefill), "share": _r(share),
                    "prompt_tokens": median(t.prompt_tokens for t in warm)},
                   "shorten the prompt (history, documents, tool schemas), reuse the prefix cache, or use "
                   "faster prompt processing (GPU offload, batch size) in the runtime's documented settings")


def _decode(warm: list[Trial]) -> Verdict | None:
    total = median(t.total for t in warm)
    decode = median(t.decode for t in warm)
    rate = median(t.native_rate if t.native_rate is not None else t.client_rate for t in warm)
    if total is None or decode is None or total <= 0 or rate is None:
        return None
    share = decode / total
    if share <= THRESHOLDS["decode_share"] or rate >= THRESHOLDS["decode_low_rate"]:
        return None
    return Verdict("decode_bound", f"token generation takes {share:.0%} of the call at {rate:.1f} tokens/s",
                   {"warm_median_total_s": _r(total), "warm_median_decode_s": _r(decode), "share": _r(share),
                    "generation_rate_tps": _r(rate, 1)},
                   "generation is compute/memory-bandwidth bound: use a smaller or more quantized model, "
                   "offload more layers to the accelerator, or ask for fewer output tokens")


def _level(result: TargetResult, level: int) -> list[Trial]:
    return [t for t in result.concurrency.get(level, []) if t.ok]


def _queueing(result: TargetResult, warm: list[Trial]) -> Verdict | None:
    pair = _level(result, 2)
    if len(pair) < 2 or any(t.ttft is None for t in pair):
        return None
    first, second = sorted(pair, key=lambda t: t.ttft or 0.0)[:2]
    whole = first.total if first.total is not None else median(t.total for t in warm)
    if whole is None or first.ttft is None or second.ttft is None:
        return None
    growth = second.ttft - first.ttft
    if growth < THRESHOLDS["queue_min_s"] or growth < THRESHOLDS["queue_share"] * whole:
        return None
    if _collapsed(second, first):
        return None  # its tokens all arrived at once: when they were generated cannot be told
    evidence = {"first_ttft_s": _r(first.ttft), "second_ttft_s": _r(second.ttft), "growth_s": _r(growth),
                "first_request_total_s": _r(whole), "growth_share": _r(growth / whole if whole else None)}
    if second.queue is not None:
        evidence["native_queue_s"] = _r(second.queue)
    return Verdict("queueing", f"with 2 concurrent requests the second waited {growth:.2f} s more for its first "
                   f"token, about a whole first request ({whole:.2f} s)", evidence,
                   "the runtime serializes; raise its parallel slots or queue deliberately")


def _collapsed(trial: Trial, reference: Trial) -> bool:
    """The trial's stream arrived (nearly) all at once while the reference streamed: a frontend
    starved of CPU (vLLM's API server on a busy host) sends what the engine generated meanwhile
    in one burst, so its late first token is no evidence of a queue."""
    if trial.decode is None or reference.decode is None or reference.decode <= 0:
        return False
    return trial.decode < THRESHOLDS["collapsed_share"] * reference.decode


def _shared(result: TargetResult, warm: list[Trial]) -> Verdict | None:
    levels = sorted(level for level in result.concurrency if level >= 2 and len(_level(result, level)) >= 2)
    base = median(t.client_rate for t in warm)
    if not levels or base is None or base <= 0:
        return None
    level = levels[-1]
    rate = median(t.client_rate for t in _level(result, level))
    if rate is None or rate >= THRESHOLDS["shared_rate_share"] * base:
        return None
    return Verdict("shared_compute", f"at concurrency {level} each request generates at {rate:.1f} tokens/s, "
                   f"{rate / base:.0%} of the {base:.1f} tokens/s of a lone request",
                   {"concurrency": level, "rate_tps": _r(rate, 1), "warm_rate_tps": _r(base, 1),
                    "share": _r(rate / base)},
                   "concurrent requests share compute/memory bandwidth: limit concurrency, or add capacity")


def _buffering(warm: list[Trial]) -> Verdict | None:
    judged = [t for t in warm if t.stream_buffered is not None]
    if not judged:
        return None
    buffered = [t for t in judged if t.stream_buffered]
    if len(buffered) / len(judged) < THRESHOLDS["buffered_share"] or not buffered:
        return None
    gap = median(t.max_chunk_gap for t in warm)
    shares = {key: median(getattr(t, key) / t.total for t in buffered if getattr(t, key) is not None and t.total)
              for key in ("ttfb", "ttft")}
    per_chunk = median(t.output_tokens / t.chunks for t in buffered if t.output_tokens and t.chunks)
    headers = buffered[0].response_headers
    evidence = {"buffered_trials": len(buffered), "judged_trials": len(judged), "median_max_chunk_gap_s": _r(gap),
                "first_byte_share_of_total": _r(shares["ttfb"]), "first_token_share_of_total": _r(shares["ttft"]),
                "tokens_per_chunk": _r(per_chunk, 1), "response_headers": headers}
    held = shares["ttft"] is not None and shares["ttft"] >= 0.9
    how = ("every token arrived at the end, with the response head" if held and (shares["ttfb"] or 0) >= 0.9
           else "every token arrived at the end" if held else
           f"streams arrived in bursts after silences (median longest gap {gap or 0:.3f} s)")
    return Verdict("buffering", f"{len(buffered)} of {len(judged)} warm streams: {how}; an intermediary buffers "
                   f"the stream{_buffering_cause(headers)}", evidence,
                   "an intermediary buffers the stream: disable response buffering in the proxy/gateway "
                   "(nginx: proxy_buffering off and no proxy_ignore_headers X-Accel-Buffering; no gzip of "
                   "text/event-stream), or read the stream incrementally in the client")


def _buffering_cause(headers: dict[str, str]) -> str:
    """What the response headers say about the intermediary, as a clause (or "")."""
    found = []
    if headers.get("content-encoding") and "event-stream" in headers.get("content-type", ""):
        found.append(f"the event stream is compressed (Content-Encoding: {headers['content-encoding']})")
    if headers.get("via"):
        found.append(f"it passed {headers['via']} (Via)")
    if headers.get("server"):
        found.append(f"the answer came from {headers['server']} (Server)")
    return f": {'; '.join(found)}" if found else ""


def _segments(readings: list[HostReading]) -> list[tuple[HostReading, HostReading]]:
    """Consecutive pairs of readings, without the one across the deliberate cold resets."""
    return [(a, b) for a, b in zip(readings, readings[1:]) if (a.step, b.step) != _DELIBERATE]


def _restarted(result: TargetResult) -> Verdict | None:
    """The runtime's process changed between two readings: it was restarted (or replaced)."""
    changed = next(((a, b) for a, b in _segments(result.host_readings)
                    if a.pid is not None and b.pid is not None and a.pid != b.pid), None)
    if changed is None:
        return None
    before, after = changed
    failed = [t for t in result.all_trials() if t.error in CONNECTION_ERRORS]
    evidence = {"pid_before": before.pid, "pid_after": after.pid, "between": f"{before.step} .. {after.step}",
                "failed_trials": len(failed),
                "failures": [f"{t.kind} #{t.index + 1}: {t.error} {t.detail or ''}".rstrip() for t in failed[:5]]}
    how = (f"{len(failed)} trial(s) failed on a refused or broken connection" if failed
           else "no trial failed (it fell between two of them)")
    return Verdict("runtime_restarted", f"the runtime's process changed during the trials (pid {before.pid} -> "
                   f"{after.pid}): it was restarted; {how}", evidence,
                   "find out why it restarted: its own log, the kernel log (dmesg: an OOM kill) and its "
                   "supervisor's restart policy; timings across a restart mix a cold runtime with a warm one")


def _memory_pressure(result: TargetResult) -> Verdict | None:
    """The host swapped, or read pages back from disk, while the trials ran."""
    deltas = {"swap_in_pages": 0, "swap_out_pages": 0, "major_faults": 0}
    seen = False
    for before, after in _segments(result.host_readings):
        for key, name in (("pswpin", "swap_in_pages"), ("pswpout", "swap_out_pages"), ("pgmajfault", "major_faults")):
            if key in before.vmstat and key in after.vmstat:
                deltas[name] += max(0, after.vmstat[key] - before.vmstat[key])
                seen = True
    if not seen:
        return None
    swapped = deltas["swap_in_pages"] + deltas["swap_out_pages"]
    if swapped < THRESHOLDS["swap_pages"] and deltas["major_faults"] < THRESHOLDS["major_faults"]:
        return None
    evidence = {**deltas, "swap_pages_threshold": THRESHOLDS["swap_pages"],
                "major_faults_threshold": THRESHOLDS["major_faults"]}
    return Verdict("memory_pressure", f"the host ran short of memory during the trials: {deltas['swap_in_pages']} "
                   f"pages swapped in, {deltas['swap_out_pages']} out, {deltas['major_faults']} major page faults "
                   "(/proc/vmstat)", evidence,
                   "free memory on the host (other processes), or use a smaller or more quantized model or a "
                   "smaller context; a model paged to swap or re-read from disk runs at disk speed")


def _partial_offload(result: TargetResult) -> Verdict | None:
    """Ollama put only part of the model in VRAM (/api/ps size_vram < size): the layers left in
    system RAM run on the CPU, and decode slows to its pace."""
    info = result.model_info
    if info is None or not info.partial_offload or not info.size or info.size_vram is None:
        return None
    share = info.size_vram / info.size
    rate = median(t.client_rate for t in result.ok_warm())
    evidence = {"size_bytes": info.size, "size_vram_bytes": info.size_vram, "vram_share": _r(share),
                "source": info.source, "warm_median_rate_tps": _r(rate, 1)}
    return Verdict("partial_offload", f"only {share:.0%} of the model ({info.size_vram / 2**30:.2f} of "
                   f"{info.size / 2**30:.2f} GiB) is in VRAM; the rest runs from system RAM on the CPU", evidence,
                   "free GPU memory (other models, processes), use a smaller or more quantized model or a "
                   "smaller context (num_ctx), or set num_gpu to the layers that fit")


def _context_pressure(result: TargetResult) -> Verdict | None:
    """A trial's prompt took most of the context the runtime reports (its metadata route)."""
    info = result.model_info
    context = info.context_length if info is not None else None
    sized = [t for t in result.all_trials() if t.ok and t.input_tokens]
    if not context or not sized:
        return None
    over = [t for t in sized if t.input_tokens / context > THRESHOLDS["context_share"]]  # type: ignore[operator]
    if not over:
        return None
    worst = max(over, key=lambda t: t.input_tokens or 0)
    share = (worst.input_tokens or 0) / context
    evidence = {"context_length": context, "source": info.source if info else None,
                "input_tokens": worst.input_tokens, "share": _r(share), "trial": f"{worst.kind} #{worst.index + 1}",
                "trials_over": len(over), "trials_sized": len(sized), "threshold": THRESHOLDS["context_share"]}
    return Verdict("context_pressure", f"the prompt of {worst.kind} trial #{worst.index + 1} filled {share:.0%} of the "
                   f"model's {context}-token context ({len(over)} of {len(sized)} trials over "
                   f"{THRESHOLDS['context_share']:.0%})", evidence,
                   "give the model a larger context (llama.cpp divides -c among its -np slots; vLLM "
                   "--max-model-len; Ollama num_ctx), or send less: history, documents and tool schemas resent "
                   "on every turn grow the prompt until the runtime truncates or refuses it")


def verdicts(result: TargetResult) -> list[Verdict]:
    """Verdicts for one target, the primary (most decisive) first; ``healthy`` when nothing is found."""
    failed = _reachability(result)
    if failed is not None:
        return [failed]
    warm = result.ok_warm()
    found = [v for v in (_restarted(result), _memory_pressure(result), _cold(result, warm),
                         _queueing(result, warm), _buffering(warm), _partial_offload(result), _prefill(warm),
                         _decode(warm),
                         _shared(result, warm), _context_pressure(result)) if v is not None]
    if found:
        return found
    ttft = median(t.ttft for t in warm)
    rate = median(t.client_rate for t in warm)
    return [Verdict("healthy", "no problem found: warm, concurrent and streamed calls behave",
                    {"warm_trials": len(warm), "warm_median_ttft_s": _r(ttft), "warm_median_rate_tps": _r(rate, 1)},
                    "nothing to change")]
