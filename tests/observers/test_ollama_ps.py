"""Ollama's /api/ps answer: the loaded models, their sizes and expiry."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_llm.observers._ollama_ps import NotItsFormat, parse_ps

FIXTURES = Path(__file__).parents[1] / "fixtures" / "observers"


def test_loaded_models_with_sizes_expiry_and_metadata() -> None:
    gemma, qwen = parse_ps((FIXTURES / "ollama_ps.json").read_bytes())
    assert (gemma.name, gemma.size, gemma.size_vram) == ("gemma3:270m", 550199296, 412649472)
    assert gemma.expires_at == pytest.approx(4102444800.123456)  # nine fractional digits read as six
    assert gemma.info is not None and gemma.info.context_length == 4096 and gemma.info.quantization == "Q8_0"
    assert qwen.size_vram == 0 and qwen.expires_at is not None and qwen.expires_at < gemma.expires_at


def test_odd_entries_and_values_are_dropped() -> None:
    (model,) = parse_ps(b'{"models": [7, {"size": 1}, {"model": "m", "size": -1, "size_vram": true, '
                        b'"expires_at": "soon"}]}')
    assert (model.name, model.size, model.size_vram, model.expires_at) == ("m", None, None, None)


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"models": {}}'])
def test_what_is_not_an_api_ps_answer_raises(body: bytes) -> None:
    with pytest.raises(NotItsFormat):
        parse_ps(body)
