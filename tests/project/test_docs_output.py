"""The documentation shows real output: each ``docs/snippets/*.txt`` is what its commands print when
run against the simulator, and the tests here run them again and compare.

A snippet starts with the command line(s) as a user types them (``$ ...``), the simulator's URL
written as a stable one (``http://127.0.0.1:11434``, Ollama's port; the gateway on
``127.0.0.1:8080``), then what the command printed. The comparison normalizes both sides first
(numbers, ids, bar lengths and column padding do not matter; the lines, words, phase names and
verdicts do). When a command's output changes on purpose, rewrite the snippets from a fresh run::

    OTEL_LLM_UPDATE_DOCS=1 .venv/bin/pytest tests/project/test_docs_output.py

The pages include the files with pymdownx.snippets (``--8<-- "NAME.txt"``, base path docs/snippets).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from otel_llm_testing.subprocesses import clean_env
from otel_llm_testing.net import free_port

# the tests marked timing compare output whose verdicts and bars come from measured times, on a shared
# 2-core machine: one bad scheduling moment (a first request slow enough to look like a cold start, a
# level slower than the next) is not a change in what the commands print

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
OTEL_LLM = str(Path(sys.executable).with_name("otel-llm"))
UPDATE_VARIABLE = "OTEL_LLM_UPDATE_DOCS"
UPDATE = os.environ.get(UPDATE_VARIABLE, "") not in ("", "0")
HINT = (f"if the change is intended, rewrite the snippets from a fresh run:\n"
        f"    {UPDATE_VARIABLE}=1 .venv/bin/pytest tests/project/test_docs_output.py")

# the stable addresses the snippets show: the simulator as Ollama on its usual port, the gateway
# on its default listen address
SIM_URL = "http://127.0.0.1:11434"
GATEWAY_ADDRESS = "127.0.0.1:8080"
PROXY_ADDRESS = "127.0.0.1:8081"  # the proxy's default listen address
# where a command's working directory shows (diagnose prints the traces file's absolute path)
PROJECT_DIR = "/home/you/project"
KEY_PLACEHOLDER = "<key>"
MODEL = "llama3.2"
# what makes each snippet worth showing; checked in the stored file and in every fresh run
MEANINGFUL = {
    "demo-sim.txt": ["$ make demo-sim", "$ otel-llm view --last 4 otel-llm-traces.jsonl", "otel-llm  chat llama3.2",
                     "llm.server_wait", "llm.first_token", "llm.decode", "http.download", "runtime.load",
                     "runtime.prefill", "runtime.decode", "cold start", "runtime llama.cpp"],
    "view.txt": ["$ otel-llm view --last 2 otel-llm-traces.jsonl", "text_completion llama3.2", "chat llama3.2",
                 "cold start", "runtime.load", "llm.server_wait", "http.download", "llm.first_token", "llm.decode",
                 "runtime.prefill", "runtime.decode"],
    "diagnose.txt": [f"$ otel-llm diagnose {SIM_URL} --model {MODEL} --quick", "[1] reachability",
                     "[5] concurrency sweep", "[PRIMARY queueing]", "the runtime serializes",
                     f"primary verdicts: {SIM_URL} -> queueing", f"trials traced to {PROJECT_DIR}/"],
    "bench.txt": [f"$ otel-llm bench {SIM_URL} --model {MODEL}", "concurrency 1 ", "concurrency 2 ", "TTFT p50",
                  "meets SLO", "highest load meeting the SLO", "): concurrency 1"],
    "proxy.txt": ["$ otel-llm proxy --upstream http://127.0.0.1:11434", "listening on http://127.0.0.1:8081",
                  "no authentication: loopback only", "$ curl -sS -N http://127.0.0.1:8081/v1/chat/completions",
                  "data: [DONE]", "otel-llm  chat llama3.2", "$ otel-llm view otel-llm-traces.jsonl",
                  "via otel-llm proxy  caller curl/", "head written", "first token written", "runtime.prefill"],
    "gateway.txt": ["$ otel-llm gateway keygen alice --routes '/v1/*' >> keys.toml", KEY_PLACEHOLDER,
                    f"--listen {GATEWAY_ADDRESS}", f"listening on http://{GATEWAY_ADDRESS} -> {SIM_URL}",
                    "$ curl -sS -i", f"Bearer {KEY_PLACEHOLDER}", "HTTP/1.1 200 OK", "server-timing: auth;dur=",
                    "upstream;desc=", '"key_id":"alice"', '"status":200', '"trace_id":'],
}

# the simulator's timings, fixed so that the structure of every output is (bars, verdicts, which
# measurements appear); far from any threshold the commands apply
VIEW_SIM = ["--runtime", "ollama", "--model", MODEL, "--cold-delay", "0.5", "--headers-delay", "0.02",
            "--first-token-delay", "0.1", "--token-interval", "0.02", "--tokens", "24"]
# serialized: one generation at a time, the second of two concurrent requests waits a whole first one
DIAGNOSE_SIM = ["--runtime", "ollama", "--model", MODEL, "--concurrency", "serialized",
                "--first-token-delay", "0.15", "--token-interval", "0.02"]
# serialized: at concurrency 2 each request waits for the other's whole answer (0.5 s), past the
# TTFT objective (0.4 s) that a lone request meets with room to spare (0.05 s)
BENCH_SIM = ["--runtime", "ollama", "--model", MODEL, "--concurrency", "serialized",
             "--first-token-delay", "0.05", "--token-interval", "0.03"]
GATEWAY_SIM = ["--runtime", "ollama", "--model", MODEL, "--first-token-delay", "0.1", "--token-interval", "0.02"]
# llama.cpp's OpenAI-compatible stream carries its timings: the view shows the runtime's rows too
PROXY_SIM = ["--runtime", "llama.cpp", "--model", MODEL, "--first-token-delay", "0.1", "--token-interval", "0.04",
             "--tokens", "6"]

# --- normalization -------------------------------------------------------------------------------

_BAR_ROW = re.compile(r"([│|])(.*)\1$")
# lines a run prints or not by chance, left out on both sides: the simulator's prompt evaluation
# does not grow with the prompt, so whether diagnose's prompt-size sweep fits a (meaningless,
# barely positive) prefill rate depends on a millisecond of jitter; bench's knee at a runtime that
# serializes is where the throughput stops growing by 10 %, and four requests a level on a busy
# machine can make the second level look 11 % faster
_OPTIONAL_LINE = re.compile(r"^\s*(fitted prefill rate \(|knee: )")
_BAR_CHARS = "█▒#=*"


def _bar(match: re.Match[str]) -> str:
    """The cells of a waterfall bar: each run of one character as one, the margins dropped."""
    edge, cells = match[1], match[2]
    cells = re.sub(r"(.)\1+", r"\1", cells).strip()
    return f"{edge}{cells}{edge}"


def normalize(text: str) -> str:
    """What must stay the same between a snippet and a fresh run: the words and the shape."""
    text = text.replace("\r\n", "\n")
    text = re.sub(r"olk_[A-Za-z0-9_-]+", KEY_PLACEHOLDER, text)
    # NVML's view of this machine (no GPU here, one in CI's device runs)
    text = text.replace("; GPU memory from NVML", "; no GPU seen by NVML")
    lines = []
    for line in text.split("\n"):
        if _OPTIONAL_LINE.match(line):
            continue
        line = line.rstrip()
        line = re.sub(r"\b[0-9a-f]{16,}\b", "<hex>", line)  # trace and span ids, hashes
        # timings (their unit too: 975 ms may come out as 1.004 s), sizes, dates, counts, pids, ports
        line = re.sub(r"\d+(?:\.\d+)?(?:(?:ms|µs|us|ns|s)(?![A-Za-z]))?", "0", line)
        line = _BAR_ROW.sub(_bar, line)
        line = re.sub(f"([{re.escape(_BAR_CHARS)}])\\1+", r"\1", line)
        line = re.sub(r"-{3,}", "---", line)  # table rules as wide as their columns
        line = re.sub(r"[ \t]+", " ", line).strip()  # column padding
        lines.append(line)
    return "\n".join(lines).strip("\n") + "\n"


def test_normalize_keeps_words_and_drops_timings_and_bar_lengths() -> None:
    one = ("chat llama3.2  127.0.0.1:11434  200  2026-12-05 01:05:30.321  total 1.922s\n"
           "  llm.server_wait     +2.1ms   824.6ms │█████████████████████████           │  \n"
           '{"trace_id":"1986f535b9e9649c818e93396e12965c","key":"olk_AbC-12_x"}\r\n')
    two = ("chat llama3.2  127.0.0.1:39667  200  2026-12-06 11:15:31.001  total 1.9s\n"
           "  llm.server_wait    +12.1ms    24.6ms │███████████████████████             │\n"
           '{"trace_id":"ffffffffffffffff0000000000000000","key":"olk_zzz"}\n')
    assert normalize(one) == normalize(two)
    assert normalize(one) != normalize(two.replace("server_wait", "first_token"))
    assert normalize(one) == normalize(two.replace("total 1.9s", "total 975.0ms"))
    assert normalize("2.84/s 45 tok/s in 13 out 40 tok 1 key(s) 30 s") == "0/s 0 tok/s in 0 out 0 tok 0 key(s) 0 s\n"
    assert normalize("│   ███▒▒  │") == normalize("│█▒│") != normalize("│▒█│")


# --- running the commands ------------------------------------------------------------------------


def _env() -> dict[str, str]:
    # no OTel settings, proxies or PYTHON* variables from this shell; this checkout's otel_llm;
    # unbuffered, so stdout and stderr interleave as in a terminal; the view's default width
    return clean_env(COLUMNS="100", LC_ALL="C.UTF-8")



def _first_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"{proc.args!r} printed nothing within {timeout} s"
    return proc.stdout.readline()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def _sim(options: Sequence[str], cwd: Path) -> Iterator[str]:
    """``otel-llm sim`` on a free port; yields its URL."""
    proc = subprocess.Popen([OTEL_LLM, "sim", "--port", "0", *options], cwd=cwd, env=_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        line = _first_line(proc)
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        yield match[1]
    finally:
        _stop(proc)


def _run(argv: Sequence[str], cwd: Path, timeout: float = 60) -> str:
    """Run a command; its stdout and stderr together, as a terminal shows them."""
    done = subprocess.run(argv, cwd=cwd, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}"
    return done.stdout


def _stable(text: str, cwd: Path, urls: dict[str, str]) -> str:
    """The output as the snippet shows it: stable addresses (URL or host:port), no temporary directory."""
    for real, stable in urls.items():
        text = re.sub(re.escape(_authority(real)) + r"(?!\d)", _authority(stable), text)
    for path in {str(cwd), os.path.realpath(cwd)}:
        text = text.replace(path, PROJECT_DIR)
    return text


def _command(argv: Sequence[str]) -> str:
    """``argv`` as typed: ``otel-llm ...`` for the console script."""
    words = list(argv)
    if words[0] == OTEL_LLM:
        words[0] = "otel-llm"
    return "$ " + shlex.join(words)


def _authority(url: str) -> str:
    """``host:port`` of a URL (or of an address already)."""
    return url.removeprefix("http://").rstrip("/")


def _assert_meaningful(name: str, text: str, where: str) -> None:
    missing = [needle for needle in MEANINGFUL[name] if needle not in text]
    assert not missing, f"{where} lacks {missing!r}:\n{text}"


def check_snippet(name: str, fresh: str) -> None:
    """Compare the fresh output with docs/snippets/NAME (or rewrite it, with OTEL_LLM_UPDATE_DOCS=1)."""
    fresh = fresh.replace("\r\n", "\n")
    fresh = "\n".join(line.rstrip() for line in fresh.strip("\n").split("\n")) + "\n"
    _assert_meaningful(name, fresh, "the fresh output")
    path = SNIPPETS / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh, encoding="utf-8")
        return
    assert path.exists(), f"{path.relative_to(ROOT)} is missing; {HINT}"
    stored = path.read_text(encoding="utf-8")
    _assert_meaningful(name, stored, str(path.relative_to(ROOT)))
    expected, actual = normalize(stored), normalize(fresh)
    if expected != actual:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), actual.splitlines(),
                                              f"{name} (normalized)", "fresh output (normalized)", lineterm=""))
        pytest.fail(f"docs/snippets/{name} no longer matches what the commands print:\n{diff}\n\n"
                    f"the fresh output:\n{fresh}\n{HINT}", pytrace=False)


# --- the snippets --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timing(reruns=1)
def test_demo_sim(tmp_path: Path) -> None:
    """``make demo-sim``: examples/demo_sim.py's four calls, summary lines and waterfalls."""
    out = _run([sys.executable, str(ROOT / "examples" / "demo_sim.py")], tmp_path, timeout=120)
    match = re.search(r"simulator on (http://\S+?);", out)
    assert match, out
    check_snippet("demo-sim.txt", "$ make demo-sim\n" + _stable(out, tmp_path, {match[1]: SIM_URL}))


# the calls the view shows, made with the ollama client through the simulator at sys.argv[1]
CALLS = """
import sys
import ollama
import otel_llm

otel_llm.instrument(service_name="docs", traces_file="otel-llm-traces.jsonl")
client = ollama.Client(host=sys.argv[1])
client.generate(model="llama3.2", prompt="Why is the sky blue?")  # the model is cold: it loads first
for _ in client.chat(model="llama3.2", messages=[{"role": "user", "content": "And the sea?"}], stream=True):
    pass
otel_llm.uninstrument()
"""


@pytest.mark.slow
@pytest.mark.timing(reruns=1)
def test_view(tmp_path: Path) -> None:
    """``otel-llm view`` over two calls: a cold one not streamed, a warm streamed one."""
    with _sim(VIEW_SIM, tmp_path) as url:
        _run([sys.executable, "-c", CALLS, url], tmp_path)
        argv = [OTEL_LLM, "view", "--last", "2", "otel-llm-traces.jsonl"]
        out = _run(argv, tmp_path)
        check_snippet("view.txt", _stable(f"{_command(argv)}\n{out}", tmp_path, {url: SIM_URL}))


@pytest.mark.slow
@pytest.mark.timing(reruns=1)
def test_diagnose(tmp_path: Path) -> None:
    """``otel-llm diagnose --quick`` finds a runtime that serves one request at a time."""
    with _sim(DIAGNOSE_SIM, tmp_path) as url:
        argv = [OTEL_LLM, "diagnose", url, "--model", MODEL, "--quick"]
        out = _run(argv, tmp_path, timeout=120)
    check_snippet("diagnose.txt", _stable(f"{_command(argv)}\n{out}", tmp_path, {url: SIM_URL}))


@pytest.mark.slow
@pytest.mark.timing(reruns=1)
def test_bench(tmp_path: Path) -> None:
    """``otel-llm bench`` at two levels against a runtime that serializes: the SLO holds at one."""
    with _sim(BENCH_SIM, tmp_path) as url:
        argv = [OTEL_LLM, "bench", url, "--model", MODEL, "--concurrency", "1,2", "--requests", "4",
                "--output-tokens", "16", "--slo", "ttft=0.4,tpot=0.05"]
        out = _run(argv, tmp_path, timeout=120)
    check_snippet("bench.txt", _stable(f"{_command(argv)}\n{out}", tmp_path, {url: SIM_URL}))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the snippet shows a curl call")
def test_gateway(tmp_path: Path) -> None:
    """``otel-llm gateway``: a key, the gateway in front of the simulator, a call through it."""
    keygen = [OTEL_LLM, "gateway", "keygen", "alice", "--routes", "/v1/*"]
    made = subprocess.run(keygen, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    (tmp_path / "keys.toml").write_text(made.stdout)
    key = made.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"olk_[A-Za-z0-9_-]+", key), made.stderr
    shown = [f"{_command(keygen)} >> keys.toml", made.stderr.rstrip("\n").replace(key, KEY_PLACEHOLDER)]

    listen = f"127.0.0.1:{free_port()}"
    with _sim(GATEWAY_SIM, tmp_path) as url:
        serve = [OTEL_LLM, "gateway", "--upstream", url, "--listen", listen, "--keys", "keys.toml"]
        log = tmp_path / "gateway.log"
        gateway, started = _serve(serve, log)
        try:
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
            curl = ["curl", "-sS", "-i", f"http://{listen}/v1/chat/completions",
                    "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json", "-d", body]
            answer = _run(curl, tmp_path)
            logged = _wait_for(log, lambda text: '"trace_id"' in text, gateway)
        finally:
            _stop(gateway)
    access = logged[len(started):]
    urls = {url: SIM_URL, listen: GATEWAY_ADDRESS}
    shown += [_command(serve), started.rstrip("\n"), "",
              "# in a second terminal, with the key in place of <key>:",
              _command(curl).replace(key, KEY_PLACEHOLDER), answer.replace("\r\n", "\n").rstrip("\n"), "",
              "# meanwhile, the gateway's access log line for that call (its stderr, in the first terminal):",
              access.strip("\n")]
    check_snippet("gateway.txt", _stable("\n".join(shown) + "\n", tmp_path, urls))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the snippet shows a curl call")
@pytest.mark.timing(reruns=1)
def test_proxy(tmp_path: Path) -> None:
    """``otel-llm proxy``: curl streams through it, the proxy prints the call's summary line, and
    ``otel-llm view`` draws the call with the caller's side."""
    listen = f"127.0.0.1:{free_port()}"
    with _sim(PROXY_SIM, tmp_path) as url:
        serve = [OTEL_LLM, "proxy", "--upstream", url, "--listen", listen]
        log = tmp_path / "proxy.log"
        proxy, started = _serve(serve, log)
        try:
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "stream": True})
            curl = ["curl", "-sS", "-N", f"http://{listen}/v1/chat/completions",
                    "-H", "Content-Type: application/json", "-d", body]
            answer = _run(curl, tmp_path)
            logged = _wait_for(log, lambda text: "otel-llm  chat" in text, proxy)
        finally:
            _stop(proxy)  # the spans are in the traces file once it stopped
    view = [OTEL_LLM, "view", "otel-llm-traces.jsonl"]
    drawn = _run(view, tmp_path)
    shown = [_command(serve).replace(f" --listen {listen}", ""), started.rstrip("\n"), "",
             "# in a second terminal:", _command(curl), answer.rstrip("\n"), "",
             "# the proxy's summary line for that call (its stderr, in the first terminal):",
             logged[len(started):].strip("\n"), "", "# once the proxy has stopped:", _command(view), drawn]
    check_snippet("proxy.txt", _stable("\n".join(shown) + "\n", tmp_path, {url: SIM_URL, listen: PROXY_ADDRESS}))


def _serve(argv: Sequence[str], log: Path) -> tuple[subprocess.Popen[str], str]:
    """Start a server in ``log``'s folder, its output to ``log``; the process and its first line(s),
    once it says it is listening."""
    with log.open("w") as log_file:
        proc = subprocess.Popen(argv, cwd=log.parent, env=_env(), text=True, stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:
        return proc, _wait_for(log, lambda text: "listening on" in text, proc)
    except BaseException:
        _stop(proc)
        raise


def _wait_for(path: Path, ready: Callable[[str], bool], proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text()
        if ready(text):
            return text
        assert proc.poll() is None, f"{proc.args!r} exited {proc.returncode}:\n{text}"
        assert time.monotonic() < deadline, f"{proc.args!r}: not ready within {timeout} s:\n{text}"
        time.sleep(0.05)


# --- the stored snippets themselves (fast) -------------------------------------------------------


def test_each_snippet_is_stored_and_reads_as_a_terminal_session() -> None:
    """Every snippet a test here produces is there, begins with a command, and shows no temporary
    path, ephemeral port or key."""
    missing = sorted(name for name in MEANINGFUL if not (SNIPPETS / name).is_file())
    assert not missing, f"docs/snippets lacks {missing}; {HINT}"
    for name in sorted(MEANINGFUL):
        text = (SNIPPETS / name).read_text(encoding="utf-8")
        assert text.startswith("$ "), name
        _assert_meaningful(name, text, name)
        ports = set(re.findall(r"127\.0\.0\.1:(\d+)", text))
        assert ports <= {_authority(a).rsplit(":", 1)[1] for a in (SIM_URL, GATEWAY_ADDRESS, PROXY_ADDRESS)}, \
            (name, ports)
        for temporary in ("/tmp/", "pytest-of-", "olk_"):
            assert temporary not in text, (name, temporary)
        assert all(line == line.rstrip() for line in text.splitlines()), name
