"""The GPU check's model server (the check's script with ``--serve``): a random-weight model
generating on the GPU behind an OpenAI-compatible HTTP server on 127.0.0.1, the chat-completion
wire format the simulator writes for an OpenAI-compatible runtime (a role chunk, one content chunk
per token, a finish chunk, the usage chunk when asked, ``[DONE]``). Nothing is downloaded; it
needs torch (and transformers for the Llama), nothing of otel_llm."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from otel_llm_testing.gpu_check.judges import GIB

__all__ = ["MAX_OUTPUT_TOKENS", "MAX_PROMPT_TOKENS", "MODEL_NAME", "SIZES", "WORDS", "serve"]

MODEL_NAME = "gpu-check-llama"
SIZES = {
    # hidden size, layers, attention heads, MLP size, vocabulary: about 480 M parameters, 1 GB in
    # bf16, a few milliseconds of GPU work per token
    "medium": {"hidden": 2048, "layers": 8, "heads": 16, "intermediate": 5632, "vocab": 32000},
    # for a trial run on a CPU (--allow-cpu)
    "small": {"hidden": 256, "layers": 2, "heads": 4, "intermediate": 512, "vocab": 4096},
}
MAX_PROMPT_TOKENS = 1024
MAX_OUTPUT_TOKENS = 1024
WORDS = ("the model streams one token at a time while the device works through every layer of the "
          "network and the observer reads how busy it is").split()


class _HfStepper:
    """Greedy decoding with transformers' Llama and its KV cache (``past_key_values`` in
    transformers up to 5.2x, ``cache`` after)."""

    def __init__(self, torch: Any, model: Any, device: Any) -> None:
        import inspect

        self.torch, self.model, self.device = torch, model, device
        self.cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _step(self, ids: list[list[int]], past: Any) -> tuple[Any, int]:
        cache = {self.cache_name: past} if past is not None else {}
        out = self.model(input_ids=self.torch.tensor(ids, device=self.device), use_cache=True, **cache)
        past = out[self.cache_name] if self.cache_name in out else out.get("past_key_values")
        return past, int(out.logits[0, -1].argmax())

    def start(self, ids: list[int]) -> tuple[Any, int]:
        return self._step([ids], None)

    def next(self, past: Any, token: int) -> tuple[Any, int]:
        return self._step([[token]], past)


class _PlainStepper:
    """A residual MLP stack over the last token: GPU work per token without transformers."""

    def __init__(self, torch: Any, spec: Mapping[str, int], device: Any, dtype: Any) -> None:
        nn = torch.nn
        hidden, inter = spec["hidden"], spec["intermediate"]
        self.torch = torch
        self.device = device
        self.embed = nn.Embedding(spec["vocab"], hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, inter), nn.GELU(),
                                                  nn.Linear(inter, hidden)) for _ in range(spec["layers"] * 3))
        self.head = nn.Linear(hidden, spec["vocab"], bias=False)
        self.model = nn.ModuleList([self.embed, self.blocks, self.head]).to(device=device, dtype=dtype).eval()

    def _logits(self, ids: list[int]) -> Any:
        x = self.embed(self.torch.tensor(ids, device=self.device))
        for block in self.blocks:
            x = x + block(x)
        return self.head(x[-1])

    def start(self, ids: list[int]) -> tuple[Any, int]:
        return None, int(self._logits(ids).argmax())

    def next(self, past: Any, token: int) -> tuple[Any, int]:
        return None, int(self._logits([token]).argmax())


class _Engine:
    """The model on its device, one decoding step at a time for every request (a lock between)."""

    def __init__(self, torch: Any, device: Any, size: str, ballast_gib: float) -> None:
        self.torch, self.device = torch, device
        self.spec = SIZES[size]
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens = 0
        self.note: str | None = None
        cuda = device.type == "cuda"
        dtype = torch.bfloat16 if cuda else torch.float32
        torch.manual_seed(0)
        with torch.inference_mode():
            try:
                self.stepper: Any = self._llama(dtype)
                self.kind = "transformers LlamaForCausalLM, random weights"
                self.stepper.start([1, 2, 3])  # proves it runs here
            except Exception as exc:  # a transformers this code does not fit: plain torch still works the GPU
                self.note = f"transformers' Llama could not run here ({type(exc).__name__}: {exc}); plain torch"
                self.stepper = _PlainStepper(torch, self.spec, device, dtype)
                self.kind = "torch residual MLP, random weights"
                self.stepper.start([1, 2, 3])
        self.parameters = sum(p.numel() for p in self.stepper.model.parameters())
        # a known block of memory beside the model, so NVML's readings have something large to agree on
        self.ballast = torch.ones(int(ballast_gib * GIB) // 2, dtype=torch.float16, device=device) \
            if ballast_gib > 0 else None
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()  # the float32 build's blocks: reserved is what the model holds now

    def _llama(self, dtype: Any) -> _HfStepper:
        from transformers import LlamaConfig, LlamaForCausalLM

        spec = self.spec
        config = LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
                             intermediate_size=spec["intermediate"], num_hidden_layers=spec["layers"],
                             num_attention_heads=spec["heads"], num_key_value_heads=spec["heads"],
                             max_position_embeddings=MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS + 64,
                             tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        with self.device:  # the random weights are made on the device itself
            model = LlamaForCausalLM(config)
        model = model.to(device=self.device, dtype=dtype).eval()
        return _HfStepper(self.torch, model, self.device)

    def tokens_of(self, prompt: str) -> list[int]:
        vocab = self.spec["vocab"]
        ids = [3 + byte % (vocab - 3) for byte in prompt.encode()[:MAX_PROMPT_TOKENS]]
        return ids or [1]

    def generate(self, ids: list[int], count: int) -> Iterable[str]:
        """``count`` pieces of text, one GPU step each."""
        self.requests += 1
        past: Any = None
        token = 0
        for index in range(count):
            with self.lock, self.torch.inference_mode():
                past, token = self.stepper.start(ids) if index == 0 else self.stepper.next(past, token)
            self.tokens += 1
            yield WORDS[token % len(WORDS)] + " "

    def stats(self) -> dict[str, Any]:
        torch, cuda = self.torch, self.device.type == "cuda"
        reserved = allocated = peak = None
        if cuda:
            reserved = int(torch.cuda.memory_reserved(self.device))
            allocated = int(torch.cuda.memory_allocated(self.device))
            peak = int(torch.cuda.max_memory_reserved(self.device))
        return {"pid": os.getpid(), "cuda": cuda, "memory_reserved": reserved, "memory_allocated": allocated,
                "max_memory_reserved": peak, "model": self.kind, "parameters": self.parameters,
                "ballast_bytes": 0 if self.ballast is None else self.ballast.numel() * self.ballast.element_size(),
                "requests": self.requests, "tokens_generated": self.tokens, "note": self.note}


def _prompt_of(body: Mapping[str, Any]) -> str:
    parts = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "\n".join(parts)


def _handler(engine: _Engine) -> type:
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gpu-check/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._json(200, {"status": "ok"})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "gpu-check"}]})
            elif path == "/gpu-check/torch":
                self._json(200, engine.stats())
            else:
                self._json(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?", 1)[0] != "/v1/chat/completions":
                self._json(404, {"error": {"message": "only /v1/chat/completions"}})
                return
            try:
                body = json.loads(raw or b"{}")
                count = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
            except (ValueError, TypeError, AttributeError):
                self._json(400, {"error": {"message": "not a chat completion request"}})
                return
            count = max(1, min(count, MAX_OUTPUT_TOKENS))
            ids = engine.tokens_of(_prompt_of(body))
            created = int(time.time())
            ident = f"chatcmpl-gpu{engine.requests + 1}"
            usage = {"prompt_tokens": len(ids), "completion_tokens": count, "total_tokens": len(ids) + count}
            try:
                if body.get("stream"):
                    self._stream(ids, count, ident, created, usage,
                                 bool((body.get("stream_options") or {}).get("include_usage")))
                else:
                    text = "".join(engine.generate(ids, count))
                    self._json(200, {"id": ident, "object": "chat.completion", "created": created,
                                     "model": MODEL_NAME, "usage": usage, "choices": [
                                         {"index": 0, "logprobs": None, "finish_reason": "length",
                                          "message": {"role": "assistant", "content": text}}]})
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _stream(self, ids: list[int], count: int, ident: str, created: int, usage: dict[str, int],
                    with_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(choices: list[Any], **extra: Any) -> None:
                frame = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": MODEL_NAME,
                         "choices": choices, **extra}
                self._chunk(b"data: " + json.dumps(frame).encode() + b"\n\n")

            def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

            event([choice({"role": "assistant", "content": ""})])
            for piece in engine.generate(ids, count):
                event([choice({"content": piece})])
            event([choice({}, "length")])
            if with_usage:
                event([], usage=usage)
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def _end_with_parent() -> None:
    """Exit when the process that started this server is gone (the server has a session of its own,
    so nothing else would end it)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="gpu-check-parent-watch", daemon=True).start()


def serve(args: argparse.Namespace) -> int:
    """The model server: JSON lines on stdout ({"event": "torch"...}, then {"event": "ready"...})."""
    def emit(**fields: Any) -> None:
        print(json.dumps(fields, default=str), flush=True)

    _end_with_parent()
    try:
        import torch
    except Exception as exc:
        emit(event="torch", importable=False, cuda=False, reason=f"{type(exc).__name__}: {exc}")
        return 3
    report: dict[str, Any] = {"importable": True, "torch": torch.__version__,
                              "cuda_runtime": getattr(torch.version, "cuda", None)}
    try:
        cuda = bool(torch.cuda.is_available())
        reason = None if cuda else "torch.cuda.is_available() is False"
    except Exception as exc:
        cuda, reason = False, f"{type(exc).__name__}: {exc}"
    if not cuda and not args.allow_cpu:
        emit(event="torch", cuda=False, reason=reason, **report)
        return 3
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        props = torch.cuda.get_device_properties(device)
        uuid = getattr(props, "uuid", None)
        report.update(device_name=props.name, device_uuid=f"GPU-{uuid}" if uuid is not None else None,
                      device_memory=int(props.total_memory))
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except Exception as exc:
        report["transformers"] = f"not importable ({type(exc).__name__})"
    emit(event="torch", cuda=cuda, reason=reason, **report)
    started = time.monotonic()
    engine = _Engine(torch, device, args.size if cuda else "small", args.ballast_gib if cuda else 0.0)
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(engine))
    server.daemon_threads = True
    emit(event="ready", port=server.server_address[1], build_seconds=time.monotonic() - started,
         **engine.stats())
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0
