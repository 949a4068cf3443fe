"""Helpers for trying otel_llm against real runtimes (tests, demo, examples)."""

from otel_llm_testing.llama_server import LlamaServer, LlamaServerError, model_path

__all__ = ["LlamaServer", "LlamaServerError", "model_path"]
