"""Helpers for trying otel_llm against real runtimes (tests, demo, examples), and the helpers the
test suite shares (one module per topic).

The names below load on first use: importing a light module of this package (``gpu_check`` on a
GPU machine that has neither OpenTelemetry nor this package installed) must not import otel_llm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_llm_testing.llama_server import LlamaServer, LlamaServerError, model_path

__all__ = ["LlamaServer", "LlamaServerError", "model_path"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from otel_llm_testing import llama_server

        return getattr(llama_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
