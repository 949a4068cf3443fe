"""Route table: which wire answers which path, listings, and the /sim/* control endpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .scenario import SimConfig
from .engine import SimState, generate
from .formats import anthropic, llamacpp, lmstudio, ollama, openai, sglang, tgi
from .formats.base import Wire
from .httpio import Request, Responder

__all__ = ["dispatch"]

_GENERATION: dict[str, type[Wire]] = {
    "/v1/chat/completions": openai.ChatWire,
    "/v1/completions": openai.CompletionWire,
    "/v1/responses": openai.ResponsesWire,
    "/v1/messages": anthropic.MessagesWire,
    "/api/chat": ollama.ChatWire,
    "/api/generate": ollama.GenerateWire,
    "/completion": llamacpp.CompletionWire,
    "/generate": tgi.GenerateWire,
    "/generate_stream": tgi.StreamWire,
    "/api/v0/chat/completions": lmstudio.V0ChatWire,
    "/api/v0/completions": lmstudio.V0CompletionWire,
    "/api/v1/chat": lmstudio.V1ChatWire,
}
_OLLAMA_NATIVE = ("/api/chat", "/api/generate")
_HEALTHY = {"status": "ok"}

_LISTINGS: dict[str, Callable[[SimState], Any]] = {
    "/v1/models": lambda state: openai.models(state.config),
    "/api/v0/models": lambda state: lmstudio.models_v0(state.config.model, state.loaded),
    "/api/tags": lambda state: ollama.tags(state.config),
    "/api/ps": lambda state: ollama.ps(state.config, state.loaded),
    "/api/version": lambda state: {"version": ollama.VERSION},
    "/health": lambda state: _HEALTHY,
    "/v1/health": lambda state: _HEALTHY,
    "/sim/config": lambda state: state.config.to_dict(),
    "/sim/stats": lambda state: state.stats.to_dict(),
}


def _wire_class(path: str, cfg: SimConfig) -> type[Wire] | None:
    # /generate is both TGI's and SGLang's native route; the runtime flavour decides (TGI by default).
    if path == "/generate" and cfg.runtime == "sglang":
        return sglang.GenerateWire
    return _GENERATION.get(path)


async def dispatch(state: SimState, request: Request, responder: Responder) -> None:
    """Answer one request; malformed input gets a 400, unknown routes a 404."""
    if not request.path.startswith("/sim/"):
        state.stats.requests += 1
        state.stats.routes[f"{request.method} {request.path}"] += 1
    method = "GET" if request.method == "HEAD" else request.method
    try:
        await _route(state, request, method, responder)
    except ValueError as exc:  # includes json.JSONDecodeError and bad x-sim-* values
        if responder.started:
            raise
        await responder.send_json(400, {"error": {"message": str(exc), "type": "invalid_request_error", "code": 400}})


async def _route(state: SimState, request: Request, method: str, responder: Responder) -> None:
    path = request.path
    if method == "GET" and path in _LISTINGS:
        await responder.send_json(200, _LISTINGS[path](state))
    elif method == "GET" and path == "/props" and state.config.runtime == "llama.cpp":
        await responder.send_json(200, llamacpp.props(state.config.model, state.config.concurrency == "serialized"))
    elif method == "GET" and path == "/":
        await responder.send(200, b"Ollama is running", "text/plain; charset=utf-8")
    elif method == "POST" and path.startswith("/sim/"):
        await _control(state, request, responder)
    elif method == "POST" and path == "/api/show":
        await responder.send_json(*ollama.show(state.config, request.json()))
    elif method == "POST" and path in _GENERATION:
        await _generation(state, request, responder)
    elif path in _GENERATION or path in _LISTINGS:
        await responder.send_json(405, {"error": {"message": f"method {request.method} not allowed", "code": 405}})
    else:
        await responder.send_json(404, {"error": {"message": f"no route {request.method} {path}", "code": 404}})


async def _control(state: SimState, request: Request, responder: Responder) -> None:
    if request.path == "/sim/config":
        updates = request.json()
        if not isinstance(updates, dict):
            raise ValueError("/sim/config expects a JSON object")
        state.config = state.config.merged(updates)
        await responder.send_json(200, state.config.to_dict())
    elif request.path == "/sim/reset":
        state.reset()
        await responder.send_json(200, state.config.to_dict())
    elif request.path == "/sim/unload":
        state.unload()
        await responder.send_json(200, {"loaded": False})
    else:
        await responder.send_json(404, {"error": {"message": f"no control route {request.path}", "code": 404}})


async def _generation(state: SimState, request: Request, responder: Responder) -> None:
    cfg = state.config.with_headers(request.headers)
    body = request.json()
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    wire_class = _wire_class(request.path, cfg)
    assert wire_class is not None
    wire = wire_class(body, cfg, request.arrival, state.next_seq())
    if request.path in _OLLAMA_NATIVE and _is_lifecycle(request.path, body):
        await _ollama_lifecycle(state, request.path, wire, responder)
        return
    responder.encoding = _negotiated(cfg.compression, request.headers.get("accept-encoding", ""))
    await generate(state, responder, wire)
    if request.path in _OLLAMA_NATIVE and ollama.unloads_after(body):
        state.unload()


def _negotiated(compression: str, accept: str) -> str:
    """The configured Content-Encoding if the client accepts it (as a real server decides)."""
    if compression == "off":
        return ""
    accepted = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return compression if compression in accepted or "*" in accepted else ""


def _is_lifecycle(path: str, body: dict[str, Any]) -> bool:
    """Ollama treats an empty prompt (no messages) as a pure load/unload request."""
    return not body.get("messages") if path == "/api/chat" else not body.get("prompt")


async def _ollama_lifecycle(state: SimState, path: str, wire: Wire, responder: Responder) -> None:
    if ollama.unloads_after(wire.body):
        state.unload()
        reason = "unload"
    else:
        await state.ensure_loaded(wire.cfg)
        reason = "load"
    await responder.send_json(200, ollama.lifecycle(path, wire.model, reason))

