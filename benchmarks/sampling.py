"""Sampling decided after the call, at volume: what is kept, what is missed, what it costs.

Thousands of streamed calls to the simulator (Ollama's ``/api/chat``, which reports its load
time) with outliers injected among them (``--outliers`` of the calls: a tenfold time to first
token, an HTTP 503, or a cold start after the model was unloaded), once per sample rate. For each
rate it prints the spans exported, the calls kept by reason, the injected outliers missed (must be
0), the sum of the kept calls' adjusted counts (an estimate of the calls made), the calls the
duration metric counted (every one), otel_llm's CPU per call and the process's memory growth.

    python benchmarks/sampling.py [--calls 3000] [--rates off,1,0.1,0.01] [--outliers 0.01]

``off`` is otel_llm without ``sample_rate`` (every call recorded). The last line compares the
spans exported at the lowest rate with ``off``. CPU per call is the process's CPU time over the
calls (client, otel_llm and exporter; the simulator runs in its own process), so compare rates
within one run; ``instructions.py --seam --sample-rate 0`` gives otel_llm's own cost exactly.
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "testing")]

import httpx  # noqa: E402
from opentelemetry.context import Context  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

import otel_llm  # noqa: E402
from otel_llm import semconv as sc  # noqa: E402
from otel_llm.tools.sim import SimProcess  # noqa: E402

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
FIRST_TOKEN = 0.004
SLOW_FACTOR = 10
COLD_DELAY = 0.3


@dataclass
class Tally(SpanProcessor):
    """Counts what reaches the exporter: every span, and each call span's reasons and children."""

    spans: int = 0
    calls: dict[int, tuple[tuple[str, ...], float]] = field(default_factory=dict)
    children: collections.Counter[int] = field(default_factory=collections.Counter)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        self.spans += 1
        attrs = span.attributes or {}
        if span.kind == SpanKind.CLIENT:
            reasons = attrs.get(sc.LLM_SAMPLING_REASON) or ("all",)
            count = attrs.get(sc.LLM_SAMPLING_ADJUSTED_COUNT, 1.0)
            self.calls[span.context.trace_id] = (tuple(str(r) for r in reasons),  # type: ignore[union-attr]
                                                 float(count))  # type: ignore[arg-type]
        elif span.parent is not None:
            self.children[span.parent.trace_id] += 1

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def injected(index: int, share: float) -> str | None:
    """Which outlier call ``index`` is: one in 1/share calls, taking turns (slow, failed, cold)."""
    every = max(1, round(1 / share)) if share > 0 else 0
    if not every or index % every != every - 1:
        return None
    return ("slow", "failed", "cold")[(index // every) % 3]


def run(base_url: str, rate: float | None, calls: int, share: float) -> dict[str, object]:
    tally = Tally()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(tally)
    reader = InMemoryMetricReader()
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]),
                        console_summary=False, host_metrics=False, gpu_metrics=False, runtime_metrics=False,
                        sample_rate=rate)
    outliers: dict[int, str] = {}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = time.process_time()
    try:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            for index in range(calls):
                kind = injected(index, share)
                headers = {}
                if kind == "slow":
                    headers["x-sim-first-token-delay"] = str(FIRST_TOKEN * SLOW_FACTOR)
                elif kind == "failed":
                    headers["x-sim-error-status"] = "503"
                elif kind == "cold":
                    client.post("/sim/unload")
                with client.stream("POST", "/api/chat", json=BODY, headers=headers) as response:
                    response.read()
                    if kind:
                        outliers[int(response.request.headers["traceparent"].split("-")[1], 16)] = kind
        cpu = (time.process_time() - cpu) / calls
    finally:
        otel_llm.uninstrument()
    counted = sum(point.count for rm in reader.get_metrics_data().resource_metrics for scope in rm.scope_metrics
                  for metric in scope.metrics if metric.name == sc.METRIC_OPERATION_DURATION
                  for point in metric.data.data_points)
    missed = [kind for trace_id, kind in outliers.items()
              if trace_id not in tally.calls or tally.children[trace_id] < 3]
    reasons = collections.Counter(reason for kept, _ in tally.calls.values() for reason in kept)
    return {"rate": "off" if rate is None else f"{rate:g}", "spans": tally.spans, "kept": len(tally.calls),
            "reasons": dict(sorted(reasons.items())), "outliers": len(outliers), "missed": len(missed),
            "estimate": sum(count for _, count in tally.calls.values()), "counted": counted, "cpu_ms": cpu * 1e3,
            "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rates", default="off,1,0.1,0.01", help="comma-separated; off: no sample_rate")
    parser.add_argument("--outliers", type=float, default=0.01, help="share of calls injected as outliers")
    args = parser.parse_args(argv)
    rates = [None if r.strip() == "off" else float(r) for r in args.rates.split(",")]
    rows = []
    with SimProcess(runtime="ollama", tokens=8, first_token_delay=FIRST_TOKEN, token_interval=0.002,
                    cold_delay=COLD_DELAY) as sim:
        for rate in rates:
            row = run(sim.base_url, rate, args.calls, args.outliers)
            rows.append(row)
            reasons = " ".join(f"{k} {v}" for k, v in row["reasons"].items())  # type: ignore[attr-defined]
            print(f"rate {row['rate']:>5}: {row['spans']:6d} spans, {row['kept']:5d} calls kept ({reasons}); "
                  f"outliers missed {row['missed']} of {row['outliers']}; adjusted counts sum {row['estimate']:.0f} "
                  f"for {args.calls} calls; metrics counted {row['counted']}; "
                  f"CPU {row['cpu_ms']:.3f} ms/call; RSS +{row['rss_kib']} KiB", flush=True)
    full = next((r for r in rows if r["rate"] == "off"), rows[0])
    lowest = rows[-1]
    if lowest is not full and lowest["spans"]:
        print(f"spans exported at rate {lowest['rate']}: {full['spans'] / lowest['spans']:.1f}x fewer than "  # type: ignore[operator]
              f"at {full['rate']}; CPU per call {lowest['cpu_ms'] / full['cpu_ms']:.2f}x")  # type: ignore[operator]
    return 1 if any(r["missed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
