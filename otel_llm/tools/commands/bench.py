"""``otel-llm bench URL --model NAME``: sweep concurrency or arrival rate, one table row per level."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from otel_llm.tools.bench.load import Level, LevelResult, run_level
from otel_llm.tools.bench.memory import MemoryWatch
from otel_llm.tools.bench.native import NativeCollector
from otel_llm.tools.bench.stats import knee, parse_slo, summarize
from otel_llm.tools.bench.transport import CLIENTS, resolve_client
from otel_llm.tools.bench.workload import APIS, OPENAI_APIS, Workload, prompt_with
from otel_llm.tools.auth import Auth, add_auth_argument, read_auth

__all__ = ["add_arguments", "run"]

LAG_WARN = 0.025  # s of p90 send lag: the generator did not keep the schedule
CPU_WARN = 0.9  # share of one core: the generator itself is busy


def _levels(text: str, kind: type) -> list[Any]:
    try:
        values = [math.inf if v.strip() == "inf" else kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("every level must be > 0")
    return values


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _slo(text: str) -> dict[str, float]:
    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="base URL of the model server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="model name sent in every request")
    parser.add_argument("--api", choices=("auto", *APIS), default="auto",
                        help="request flavour: openai (chat completions), openai-completions (/v1/completions, the "
                             "default workload of vllm bench serve), ollama, llamacpp (default auto: detected from "
                             "side-effect-free routes, else openai)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=lambda t: _levels(t, int), metavar="N,N,...",
                      help="closed loop: requests in flight per level (default 1,2,4,8)")
    load.add_argument("--rate", type=lambda t: _levels(t, float), metavar="R,R,...",
                      help="open loop: Poisson arrivals per second per level; inf sends all at once")
    parser.add_argument("--max-concurrency", type=_positive_int, metavar="N",
                        help="open loop: requests in flight at most (default unbounded)")
    parser.add_argument("--requests", type=_positive_int, default=32, metavar="N",
                        help="requests per level (default 32)")
    parser.add_argument("--seconds", type=float, default=120.0, metavar="S",
                        help="time limit per level; requests in flight then get 30 s (default 120)")
    parser.add_argument("--warmup", type=int, default=2, metavar="N",
                        help="requests sent before the first level, not recorded (default 2)")
    parser.add_argument("--prompt-tokens", type=_positive_int, default=128, metavar="N",
                        help="prompt length, about (the runtime's count is recorded; default 128)")
    parser.add_argument("--output-tokens", type=_positive_int, default=64, metavar="N",
                        help="output length: ignore_eos where the runtime supports it, "
                             "else the limit (the actual count is recorded; default 64)")
    parser.add_argument("--slo", type=_slo, metavar="ttft=S,tpot=S,e2el=S",
                        help="service level objective in seconds: goodput and the highest load that meets it")
    parser.add_argument("--slo-attainment", type=float, default=0.9, metavar="SHARE",
                        help="share of a level's requests that must meet the SLO (default 0.9)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the open loop's arrivals (default 0)")
    parser.add_argument("--json", metavar="FILE", help="write the configuration and every request's figures here")
    parser.add_argument("--html", metavar="FILE",
                        help="write a self-contained HTML report: latency and throughput against load, the knee "
                             "and the SLO marked")
    add_auth_argument(parser)
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="per-request timeout (default 120)")
    parser.add_argument("--http-client", choices=CLIENTS, default="auto",
                        help="the client the load is sent with: aiohttp (auto, where installed: the cheaper one "
                             "per stream, as vllm bench serve uses) or httpx")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = (f"{'level':<16} {'ok':>4} {'fail':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} {'p99':>8} "
          f"{'TPOT p50':>9} {'p99':>7} {'ITL p99':>8} {'E2EL p50':>9}")


def row(s: dict[str, Any]) -> str:
    line = (f"{s['level']:<16} {s['completed']:>4} {s['failed']:>4} {_num(s['request_throughput'], 2):>7} "
            f"{_num(s['output_throughput']):>9} {_ms(s['ttft']['p50']):>9} {_ms(s['ttft']['p99']):>8} "
            f"{_ms(s['tpot']['p50']):>9} {_ms(s['tpot']['p99']):>7} {_ms(s['itl']['p99']):>8} "
            f"{_ms(s['e2el']['p50']):>9}")
    native = s.get("native") or {}
    rate, acceptance = native.get("generation_rate"), native.get("draft_acceptance_rate")
    if rate:
        line += f"  runtime {_num(rate['p50'])} tok/s"
    if acceptance:
        line += f"  draft accepted {acceptance['p50']:.0%}"
    memory = s.get("runtime_memory") or {}
    rss, gpu = memory.get("peak_rss_bytes"), memory.get("peak_gpu_memory_bytes")
    if rss:
        line += f"  peak RSS {rss / 2**20:.0f} MiB"
    if gpu is not None:
        line += f"  GPU {gpu / 2**20:.0f} MiB"
    if "goodput" in s:
        line += f"  goodput {_num(s['goodput'], 2)}/s {'meets SLO' if s['meets_slo'] else 'misses SLO'}"
    burst = s.get("bursts") or {}
    if burst.get("burst"):
        line += f"  bursts {burst['burst']}/{burst['judged']}" + ("" if s.get("stream_timing_trusted", True) else " !")
    return line


def _ms_max(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _burst_warning(s: dict[str, Any]) -> str | None:
    """The plain statement of a level whose streams reached the bench in bursts, with the cause
    (stats.bursts) and what the generator measured of itself."""
    burst, loop = s.get("bursts") or {}, s.get("generator_loop") or {}
    cause = burst.get("cause")
    if cause is None:
        return None
    head = (f"{s['level']}: {burst['burst']} of {burst['judged']} streams reached the bench in bursts, so their "
            "TTFT, TPOT and ITL are not the server's timing")
    stalls = (f"its event loop stalled {loop.get('stalls', 0)} time(s) (longest {_ms_max(loop.get('loop_late_max'))}"
              f" late), {burst['burst_during_stalls']} of the {burst['burst']} during a stall")
    own = _generator_limits(s)
    if cause == "upstream":
        return (f"{head}: the bench read on time (its loop at most {_ms_max(loop.get('loop_late_max'))} late), so the "
                "server or an intermediary released them in bursts (buffering: see otel-llm diagnose)" + own)
    if cause == "generator_cpu":
        share = loop.get("runqueue_share")
        why = (f"waiting for a CPU ({loop.get('stall_runqueue_share', 0):.0%} of the stalled time in Linux's run "
               f"queue; {share or 0:.0%} of the level): the machine's CPUs were busy, the server's among them")
        fix = "run the bench on CPUs the server does not use (taskset -c) or on another machine"
    elif cause == "generator_busy":
        why = (f"busy with its own work ({loop.get('stall_runqueue_share', 0):.0%} of the stalled time in Linux's "
               "run queue; the rest the process itself)")
        fix = "lower the load per bench process or run several"
    else:
        why = "(this system's scheduler statistics cannot tell whether it waited for a CPU or worked)"
        fix = "run the bench on CPUs the server does not use or on another machine"
    return f"{head}: the load generator was the limit: {stalls}, {why}{own}; {fix}"


def self_report(s: dict[str, Any]) -> str:
    """One line of what the generator measured of itself during a level: its streams in bursts, how
    late its event loop woke, how long it waited for a CPU, its CPU share."""
    burst, loop = s.get("bursts") or {}, s.get("generator_loop") or {}
    parts = [f"{burst.get('burst', 0)} of {burst.get('judged', 0)} streams in bursts"]
    if loop.get("loop_late_p99") is not None:
        parts.append(f"event loop late p99 {_ms(loop['loop_late_p99'])} ms, max {_ms(loop['loop_late_max'])} ms, "
                     f"{loop['stalls']} stall(s)")
    if loop.get("runqueue_share") is not None:
        parts.append(f"{loop['runqueue_share']:.0%} of the level waiting for a CPU")
    parts.append(f"{s['generator_cpu_share']:.0%} of a core")
    return f"{s['level']}: " + "; ".join(parts)


def _generator_limits(s: dict[str, Any]) -> str:
    """The generator's own CPU share and lag, where they were at their limits."""
    parts = []
    if s["generator_cpu_share"] > CPU_WARN:
        parts.append(f"it used {s['generator_cpu_share']:.0%} of a core")
    lag = s["lag"]["p90"]
    if lag is not None and lag > LAG_WARN:
        parts.append(f"its p90 send lag was {_ms(lag)} ms")
    return "; " + " and ".join(parts) if parts else ""


def warnings(s: dict[str, Any]) -> list[str]:
    """What the reader must know before trusting a level's figures."""
    out = []
    burst = _burst_warning(s)
    if burst:
        out.append(burst)
    lag = s["lag"]["p90"]
    if s["rate"] is not None and lag is not None and lag > LAG_WARN:
        out.append(f"{s['level']}: the load generator fell behind its schedule (p90 send lag {_ms(lag)} ms): "
                   "the figures understate the load asked for")
    elif s["rate"] is None and lag is not None and lag > LAG_WARN:
        out.append(f"{s['level']}: the load generator took {_ms(lag)} ms (p90) between a response's end and the "
                   "next request: the server idled meanwhile, so the figures understate the load asked for")
    if s["generator_cpu_share"] > CPU_WARN:
        out.append(f"{s['level']}: the load generator used {s['generator_cpu_share']:.0%} of a core: it may be "
                   "the bottleneck (run it on another machine, or lower the load)")
    if s["failures"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(s["failures"].items()))
        out.append(f"{s['level']}: failures: {kinds}")
    if s.get("retries"):
        out.append(f"{s['level']}: {s['retries']} request(s) sent again after the server closed its kept-alive "
                   "connection without answering (each figure is from its first send)")
    if s["unfinished"]:
        out.append(f"{s['level']}: {s['unfinished']} request(s) still running when the level was cut short")
    return out


CALIBRATION_WORDS = (16, 160)  # filler words of the two calibration requests


def calibrate(workload: Workload, headers: dict[str, str], tracer: Any, seconds: float,
              http_client: str = "auto") -> tuple[Workload, str]:
    """Fit the runtime's tokens per filler word from two short unrecorded requests, so the
    prompt has about ``prompt_tokens`` tokens as the runtime counts them (chat template included).
    Without a prompt count from the runtime, the estimate stays (said so)."""
    counts = []
    for words in CALIBRATION_WORDS:
        probe = dataclasses.replace(workload, prompt=prompt_with(words), output_tokens=2, exact_output=False)
        record = run_level(Level(concurrency=1, requests=1, seconds=seconds), probe, headers, tracer=tracer,
                           http_client=http_client).records
        counts.append(record[0].input_tokens if record else None)
    (n1, n2), (c1, c2) = CALIBRATION_WORDS, counts
    if c1 is None or c2 is None or c2 <= c1:
        return workload, "prompt length: not calibrated (the runtime reports no prompt token count)"
    per = (c2 - c1) / (n2 - n1)
    calibrated = dataclasses.replace(workload, word_tokens=per, base_tokens=c1 - n1 * per)
    return calibrated, (f"prompt length: calibrated on the runtime's own counts ({per:.2f} tokens per filler "
                        f"word, {c1 - n1 * per:.0f} for the rest)")


def _progress(label: str, total: int, out: Any) -> Callable[[int], None]:
    if not getattr(out, "isatty", lambda: False)():
        return lambda done: None

    def show(done: int) -> None:
        width = 24
        filled = round(width * done / total)
        out.write(f"\r{label:<16} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            out.write("\r" + " " * (width + 40) + "\r")
        out.flush()

    return show


def _levels_of(args: argparse.Namespace) -> list[Level]:
    if args.rate:
        return [Level(rate=r, requests=args.requests, seconds=args.seconds, max_concurrency=args.max_concurrency)
                for r in args.rate]
    return [Level(concurrency=c, requests=args.requests, seconds=args.seconds)
            for c in (args.concurrency or [1, 2, 4, 8])]


class _Session(NamedTuple):
    """What one run sends with and records into."""

    workload: Workload
    detection: Any
    runtime: str | None  # proven by the server's routes and spoken to in its API, else None
    auth: Auth
    tracer: Any
    natives: NativeCollector
    memory: MemoryWatch


def run(args: argparse.Namespace) -> int:
    import otel_llm
    from otel_llm.config import resolve
    from otel_llm.export.providers import build_providers

    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    auth = read_auth(args, "otel-llm bench")
    if auth is None:
        return 2
    if otel_llm.is_instrumented():
        print("otel-llm bench: otel_llm is already instrumented in this process", file=sys.stderr)
        return 2
    options = {"console_summary": False, "host_metrics": False, "gpu_metrics": False}
    providers = build_providers(resolve(options))
    started = time.time()
    session = _instrument(args, auth, providers, options)
    results: list[LevelResult] = []
    try:
        session = _prepare(args, session, say)
        _levels_run(args, session, say, results)
    except KeyboardInterrupt:  # between two levels, or in the warm-up
        if results:
            results[-1].interrupted = True
    finally:
        otel_llm.uninstrument()
        providers.shutdown()
        session.memory.close()
    return _report(args, session, started, results, say)


def _instrument(args: argparse.Namespace, auth: Auth, providers: Any, options: dict[str, Any]) -> _Session:
    """Detect the server, instrument this process as an application would be, and find the
    server's processes to watch."""
    import otel_llm
    from otel_llm.tools.detect import detect, server_root

    detection = detect(args.url, auth.headers)
    api = args.api if args.api != "auto" else (detection.api or "openai")
    workload = Workload(args.url, api, args.model, args.prompt_tokens, args.output_tokens, timeout=args.timeout)
    # a runtime proven by its routes (vLLM, whose answers do not say) is named to the instrumentation,
    # unless --api says the server is spoken to as something else than what was detected
    same = detection.api == api or (detection.api in OPENAI_APIS and api in OPENAI_APIS)
    proven = detection.runtime if detection.runtime and same else None
    runtimes = {server_root(args.url): proven} if proven else None
    otel_llm.instrument(**options, tracer_provider=providers.tracer_provider,
                        meter_provider=providers.meter_provider, runtimes=runtimes)  # None: as if not passed
    natives = NativeCollector()
    if hasattr(providers.tracer_provider, "add_span_processor"):  # an SDK provider: the runtime's figures
        providers.tracer_provider.add_span_processor(natives)
    tracer = providers.tracer_provider.get_tracer("otel_llm.bench")
    return _Session(workload, detection, proven, auth, tracer, natives, MemoryWatch.of_server(args.url))


def _prepare(args: argparse.Namespace, session: _Session, say: Callable[[str], None]) -> _Session:
    say(f"otel-llm bench {args.url} (api {session.workload.api}, runtime {session.runtime or 'not proven'}, model "
        f"{args.model}): prompt ~{args.prompt_tokens} tokens, output {args.output_tokens} tokens, streamed, "
        f"sent with {resolve_client(args.http_client)}")
    say(f"runtime memory: {session.memory.describe()}")
    workload, note = calibrate(session.workload, session.auth.headers, session.tracer, args.seconds,
                               args.http_client)
    say(note)
    if args.warmup:
        run_level(Level(concurrency=1, requests=args.warmup, seconds=args.seconds), workload,
                  session.auth.headers, tracer=session.tracer, http_client=args.http_client)
    return session._replace(workload=workload)


def _levels_run(args: argparse.Namespace, session: _Session, say: Callable[[str], None],
                results: list[LevelResult]) -> None:
    """Each level in turn, a row printed as each ends, appended to ``results`` as it ends (so a
    Ctrl-C between two levels keeps the ones measured)."""
    say(HEADER)
    for level in _levels_of(args):
        session.memory.start()
        try:
            result = run_level(level, session.workload, session.auth.headers, seed=args.seed, tracer=session.tracer,
                               progress=_progress(level.label, level.requests, sys.stderr),
                               http_client=args.http_client)
        finally:
            peak = session.memory.stop()
        result.memory = peak.to_dict()
        for record in result.records:
            record.native = session.natives.take(record.trace_id)
            if record.detail:
                record.detail = session.auth.redact(record.detail)
        results.append(result)
        say(row(summarize(result, args.slo, args.slo_attainment)))
        if result.interrupted:
            break


def _report(args: argparse.Namespace, session: _Session, started: float, results: list[LevelResult],
            say: Callable[[str], None]) -> int:
    interrupted = bool(results) and results[-1].interrupted
    if interrupted:
        say("interrupted: the levels measured so far are reported")
    summaries = [summarize(r, args.slo, args.slo_attainment) for r in results]
    for summary in summaries:
        say("load generator: " + self_report(summary))
    for line in [w for s in summaries for w in warnings(s)]:
        say("warning: " + line)
    _conclusions(summaries, args, say)
    doc = _document(args, session, started, results, summaries)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(doc, out, indent=1, default=str)
        say(f"wrote {args.json}")
    if args.html:
        from otel_llm.tools.bench.html import write_html

        write_html(doc, args.html)
        say(f"wrote {args.html}")
    return 130 if interrupted else 0


def _conclusions(summaries: list[dict[str, Any]], args: argparse.Namespace, say: Callable[[str], None]) -> None:
    at = knee(summaries)
    if at is not None:
        say(f"knee: {summaries[at]['level']} (output throughput grows less than 10 % beyond it)")
    if args.slo:
        meeting = [s for s in summaries if s["meets_slo"]]
        limits = ", ".join(f"{k} <= {v * 1000:g} ms" for k, v in args.slo.items())
        say(f"highest load meeting the SLO ({limits}, {args.slo_attainment:.0%} of requests): "
            + (meeting[-1]["level"] if meeting else "none"))


def _document(args: argparse.Namespace, session: _Session, started: float, results: list[LevelResult],
              summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """What --json writes (and --html draws): the configuration, each level and its requests."""
    workload, detection = session.workload, session.detection
    return {
        "tool": "otel-llm bench", "started": started,
        "configuration": {
            "url": args.url, "api": workload.api, "model": args.model, "runtime": detection.runtime,
            "runtime_version": detection.version, "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens, "exact_output": workload.exact_output,
            "mode": "rate" if args.rate else "concurrency", "requests_per_level": args.requests,
            "seconds_per_level": args.seconds, "warmup": args.warmup, "seed": args.seed,
            "max_concurrency": args.max_concurrency, "slo": args.slo, "slo_attainment": args.slo_attainment,
            "prompt_word_tokens": workload.word_tokens, "prompt_base_tokens": workload.base_tokens,
            "runtime_processes": session.memory.describe(),
            "http_client": resolve_client(args.http_client),
            "definitions": "vllm bench serve: TTFT to the first content chunk, ITL every gap between content "
                           "chunks, TPOT = (E2EL - TTFT) / (output tokens - 1), goodput = requests/s meeting "
                           "every SLO",
        },
        "levels": [{**summary, "warnings": warnings(summary), "requests": [r.to_dict() for r in result.records]}
                   for summary, result in zip(summaries, results)],
        "knee": knee(summaries),
    }
