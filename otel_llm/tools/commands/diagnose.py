"""``otel-llm diagnose URL [URL ...] --model NAME``: argument parsing and the run's steps."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from otel_llm.tools.auth import add_auth_argument, read_auth
from otel_llm.tools.view import format_bytes
from otel_llm.parse.runtimes import ModelInfo, ollama

from otel_llm.tools.diagnose import sweep
from otel_llm.tools.diagnose.authcheck import auth_check, auth_findings, auth_verdicts
from otel_llm.tools.diagnose.cold import ColdControl, cold_trials
from otel_llm.tools.detect import Detection, detect, loaded_model, server_root
from otel_llm.tools.diagnose.hoststate import read_host
from otel_llm.tools.diagnose.memory import MemoryEstimate, estimate
from otel_llm.tools.diagnose.netpath import network_path_verdicts
from otel_llm.tools.diagnose.trials import APIS, TargetResult, TrialRunner, sweep_prompt
from otel_llm.tools.diagnose.verdicts import EXPLAIN, Verdict, median, verdicts
from otel_llm.tools.diagnose import report

__all__ = ["add_arguments", "parse_args", "run"]

QUICK = {"trials": 2, "max_concurrency": 2, "max_tokens": 16}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URL", help="base URL of each target, e.g. http://127.0.0.1:11434")
    parser.add_argument("--model", required=True, help="model name sent in every request")
    parser.add_argument("--api", choices=("auto", *APIS), default="auto",
                        help="request flavour: openai (/v1/chat/completions), ollama (/api/chat), "
                             "llamacpp (/completion); default auto: detected from side-effect-free routes, "
                             "else openai")
    parser.add_argument("--cold", metavar="CONTROL",
                        help="run cold trials, each from a reset state: 'ollama' (unload with keep_alive 0) "
                             "or a shell command that returns the runtime to its cold state")
    parser.add_argument("--cold-trials", type=_positive_int, default=2, metavar="N",
                        help="cold trials with --cold (default 2)")
    parser.add_argument("--auth-check", action="store_true",
                        help="check that unauthenticated and invalid callers are rejected before inference, "
                             "a diagnostic route is refused and a burst over the limit is answered predictably")
    parser.add_argument("--trials", type=_positive_int, default=None, metavar="N", help="warm trials (default 5)")
    parser.add_argument("--max-tokens", type=_positive_int, default=None, metavar="N",
                        help="output token limit per request (default 32)")
    parser.add_argument("--max-concurrency", type=_positive_int, default=None, metavar="N",
                        help="concurrency sweep 1..N (default 2)")
    parser.add_argument("--quick", action="store_true", help="2 warm trials, concurrency up to 2, 16 tokens")
    parser.add_argument("--json", metavar="FILE", help="write the run's configuration, results and verdicts here")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (charts) here")
    add_auth_argument(parser)
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="per-request timeout (default 120)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="otel-llm diagnose")
    add_arguments(parser)
    return parser.parse_intermixed_args(argv)


def _settings(args: argparse.Namespace) -> dict[str, int]:
    defaults = dict(QUICK) if args.quick else {"trials": 5, "max_concurrency": 2, "max_tokens": 32}
    for name in defaults:
        if getattr(args, name, None) is not None:
            defaults[name] = getattr(args, name)
    return defaults


def run(args: argparse.Namespace) -> int:
    import otel_llm

    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    auth = read_auth(args, "otel-llm diagnose")
    if auth is None:
        return 2
    secret, redact = auth.secret, auth.redact
    if otel_llm.is_instrumented():
        print("otel-llm diagnose: otel_llm is already instrumented in this process", file=sys.stderr)
        return 2
    settings = _settings(args)
    headers = auth.headers

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm import current_session

    # what each target is, from side-effect-free routes; a runtime proven there (vLLM, whose
    # answers do not say) is named to the instrumentation, so every trial carries it
    detections = {url: detect(url, headers, model=args.model) for url in args.urls}
    runtimes = {server_root(url): d.runtime for url, d in detections.items() if d.runtime}
    # the session's providers, as any instrumented application gets them (the traces file, or
    # OTLP where configured); the trials read their spans back from memory too
    otel_llm.instrument(console_summary=False, host_metrics=False, gpu_metrics=False, runtime_metrics=False,
                        runtimes=runtimes)
    session = current_session()
    tracer_provider = session.tracer_provider if session is not None else None
    if session is None or not isinstance(tracer_provider, TracerProvider):
        otel_llm.uninstrument()
        print("otel-llm diagnose: needs the OpenTelemetry SDK's tracer provider (another one is set globally)",
              file=sys.stderr)
        return 2
    exporter = InMemorySpanExporter()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced_to = session.providers.traces_to or os.path.abspath(session.options.traces_file)
    started = time.perf_counter()
    results: list[TargetResult] = []
    found: list[list[Verdict]] = []
    try:
        for url in args.urls:
            api = args.api if args.api != "auto" else (detections[url].api or "openai")
            runner = TrialRunner(tracer_provider, exporter, url=url, api=api, model=args.model,
                                 max_tokens=settings["max_tokens"], headers=headers, timeout=args.timeout,
                                 redact=redact)
            try:
                result = _diagnose(runner, url, args, settings, bool(secret), say, detections[url])
            finally:
                runner.close()
            results.append(result)
            found.append(verdicts(result))
            if args.auth_check and result.cold is not None:
                found[-1] = _auth_step(url, runner.api, args.model, secret, found[-1], say, redact)
            say(f"verdicts for {url}:")
            for line in report.verdict_lines(found[-1]):
                say(redact(line))
            say("")
        _add_network_path(results, found, say, redact)
    finally:
        otel_llm.uninstrument()  # flushes and shuts down the session's providers
    elapsed = time.perf_counter() - started
    say("summary (warm median [min-max]):")
    for line in report.summary_table(results):
        say(redact(line))
    say("")
    say("primary verdicts: " + ", ".join(f"{r.url} -> {v[0].code}" for r, v in zip(results, found)))
    say(f"done in {elapsed:.1f} s; trials traced to {traced_to}")
    if args.json or args.html:
        config: dict[str, Any] = {
            "model": args.model, "api": args.api, "urls": list(args.urls), "trials": settings["trials"],
            "max_tokens": settings["max_tokens"], "max_concurrency": settings["max_concurrency"],
            "quick": bool(args.quick), "client_host": socket.gethostname(),
            "auth_env": args.auth_env, "auth_sent": bool(secret),
            "runtimes": [{"url": r.url, "name": r.runtime_name, "version": r.runtime_version} for r in results],
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - elapsed)),
            "duration_s": round(elapsed, 3), "traces_file": os.path.abspath(session.options.traces_file),
        }
        record = report.json_record(config, results, found, redact)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(record + "\n")
            say(f"JSON record written to {args.json}")
        if args.html:
            from otel_llm.tools.diagnose.html import write_html

            write_html(json.loads(record), args.html)
            say(f"HTML report written to {args.html}")
    failed = any(v and v[0].code in ("unreachable", "http_error", "auth_missing") for v in found)
    return 1 if failed else 0


def _progress(done: int, total: int, label: str) -> None:
    """A progress bar on stderr while a long step runs, only on a terminal (logs stay clean)."""
    if sys.stderr.isatty():
        print("\r" + report.progress_bar(done, total, label) + "\x1b[K", end="\r", file=sys.stderr, flush=True)


def _auth_step(url: str, api: str, model: str, secret: str | None, found: list[Verdict],
               say: Callable[[str], None], redact: Callable[[str], str]) -> list[Verdict]:
    """Step 7: unauthenticated and invalid callers, a diagnostic route, a burst over the limit."""
    say("[7] authentication check")
    checked = auth_check(url, api, model, secret)
    for line in auth_findings(checked):
        say("    " + redact(line))
    missing = auth_verdicts(checked)
    if not missing:
        return found
    return missing + [v for v in found if v.code != "healthy"]


def _add_network_path(results: list[TargetResult], found: list[list[Verdict]], say: Callable[[str], None],
                      redact: Callable[[str], str]) -> None:
    """Targets of the same service compared side by side: a slower path on identical native timings."""
    for verdict in network_path_verdicts(results):
        index = next((i for i, r in enumerate(results) if r.url == verdict.evidence.get("url")), None)
        if index is None:
            continue
        found[index] = [v for v in found[index] if v.code != "healthy"] + [verdict]
        say(f"verdicts for {results[index].url} (compared with the other targets):")
        for line in report.verdict_lines([verdict]):
            say(redact(line))
        say("")


def _say_offload(info: ModelInfo | None, say: Callable[[str], None]) -> None:
    if info is not None and info.size and info.size_vram is not None:
        say(f"    model in memory: {info.size_vram / info.size:.0%} of {info.size / 2**30:.2f} GiB in VRAM "
            f"({info.source})")


def _say_memory(memory: MemoryEstimate, say: Callable[[str], None]) -> None:
    parts = []
    if memory.weights_bytes is not None:
        parts.append(f"model {format_bytes(memory.weights_bytes)} ({memory.weights_source})")
    if memory.runtime_rss_bytes is not None:
        parts.append(f"runtime resident {format_bytes(memory.runtime_rss_bytes)} (pid "
                     f"{', '.join(map(str, memory.runtime_pids))})")
    if parts:
        say("    memory: " + "; ".join(parts))


def _diagnose(runner: TrialRunner, url: str, args: argparse.Namespace, settings: dict[str, int],
              auth_sent: bool, say: Callable[[str], None], detection: Detection) -> TargetResult:
    result = TargetResult(url=url, api=runner.api, model=args.model, auth_sent=auth_sent)
    _read_host(result, url, "start")
    detected = " (detected)" if args.api == "auto" else ""
    say(f"== {url} ({runner.api}{detected}, model {args.model}) -> {runner.url}")
    say("[1] reachability and correctness: one request (recorded as the cold trial)")
    first = runner.one("cold")
    result.reachable = first
    if not first.ok:
        code = verdicts(result)[0].code
        say(f"    FAIL {code}: " + report.trial_line(first))
        say("    " + EXPLAIN.get(code, EXPLAIN["http_error"]) + " Stopping this target.")
        return result
    result.runtime_name = detection.runtime or first.runtime
    result.runtime_version = detection.version
    result.model_info = detection.model
    runtime = f"{result.runtime_name or 'unknown'}" + (f" {result.runtime_version}" if result.runtime_version else "")
    say(f"    ok HTTP {first.status}, runtime {runtime}; " + report.trial_line(first))
    if detection.model is not None and detection.model.context_length:
        say(f"    context length {detection.model.context_length} tokens per request ({detection.model.source})")

    say(f"[2] warm-up (not recorded), then {settings['trials']} warm trials, one at a time")
    warmup = runner.one("warmup")
    if not warmup.ok:
        say("    warm-up failed: " + report.trial_line(warmup))
    for i in range(settings["trials"]):
        _progress(i, settings["trials"], "    warm trials")
        trial = runner.one("warm", i)
        result.warm.append(trial)
        say("    " + report.trial_line(trial))
    if result.runtime_name == ollama.NAME:  # /api/ps lists the model now that it is loaded
        result.model_info = loaded_model(url, result.runtime_name, runner.api, args.model, runner.headers) \
            or result.model_info
        _say_offload(result.model_info, say)
    memory = estimate(result.model_info, url)
    result.memory = memory.to_dict()
    _say_memory(memory, say)
    stats = report.phase_stats(result.ok_warm())
    say("    warm median: " + ", ".join(
        f"{label} {report._fmt(s['median'], unit)}" for (label, _a, unit), s in
        zip(report.PHASES, stats.values()) if s["median"] is not None))

    if args.cold:
        say(f"[3] cold trials ({args.cold_trials}), each from a reset state")
        try:
            control = ColdControl.parse(args.cold)
        except ValueError as exc:
            say(f"    not run: {exc}")
        else:
            _read_host(result, url, "before cold trials")  # a cold command may restart the runtime
            result.cold_trials = cold_trials(runner, args.cold_trials, control, url, args.model,
                                             on_trial=lambda trial: say("    " + report.trial_line(trial)))
            _read_host(result, url, "after cold trials")

    say(f"[4] prompt-size sweep, output limit fixed at {settings['max_tokens']} tokens")
    context = result.model_info.context_length if result.model_info is not None else None
    planned = sweep.QUICK_SIZES if args.quick else sweep.SIZES
    sizes = sweep.within_context(planned, context, settings["max_tokens"])
    if sizes != planned:
        say(f"    sizes {', '.join(map(str, sizes))} sentences: the largest prompt and the output limit stay within "
            f"{sweep.CONTEXT_SHARE:.0%} of the context length ({context} tokens)")
    for done, sentences in enumerate(sizes):
        _progress(done, len(sizes), "    prompt sizes")
        if context and result.prompt_sweep:  # the sizes measured so far say what a sentence costs here
            sentences = sweep.refit(sentences, result.prompt_sweep, context, settings["max_tokens"])
        trial = runner.one("prompt", sentences, prompt=sweep_prompt(sentences, uuid.uuid4().hex[:8]))
        result.prompt_sweep.append(trial)
        size = f" ({format_bytes(trial.request_bytes)} request)" if trial.request_bytes is not None else ""
        say(f"    {trial.input_tokens or trial.prompt_tokens or '?'} prompt tokens{size}: " + report.trial_line(trial))
    fitted = sweep.fit(result.prompt_sweep)
    for label in ("native", "client"):
        if fitted.get(label):
            say(f"    fitted prefill rate ({label}): {fitted[label]['tokens_per_second']:.0f} tokens/s, "
                f"{fitted[label]['fixed_s'] * 1000:.0f} ms fixed")

    say(f"[5] concurrency sweep 1..{settings['max_concurrency']}")
    for level in range(1, settings["max_concurrency"] + 1):
        trials = runner.concurrent(level)
        result.concurrency[level] = trials
        for trial in sorted(trials, key=lambda t: t.start):
            say("    " + report.trial_line(trial))

    say("[6] streaming check (warm trials)")
    judged = [t for t in result.warm if t.stream_buffered is not None]
    buffered = sum(1 for t in judged if t.stream_buffered)
    gap = median(t.max_chunk_gap for t in result.warm)
    if judged:
        state = "BUFFERED" if buffered * 2 >= len(judged) and buffered else "incremental"
        say(f"    {state}: {buffered}/{len(judged)} streams arrived in bursts; median longest chunk gap "
            f"{report._fmt(gap, 's')}")
    else:
        say(f"    not judged (streams too short); median longest chunk gap {report._fmt(gap, 's')}")
    _read_host(result, url, "end")
    readings = result.host_readings
    if readings:
        pids = " -> ".join(pid for pid, _ in itertools.groupby(str(r.pid or "none seen") for r in readings))
        say(f"    runtime process on this host: pid {pids}")
    return result


def _read_host(result: TargetResult, url: str, step: str) -> None:
    """The runtime's PID and the host's paging counters now (a server on this host only)."""
    reading = read_host(url, step)
    if reading is not None:
        result.host_readings.append(reading)
