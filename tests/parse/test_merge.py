"""The merge state and value checks every response reader shares: ``Merge``/``ResponseInfo`` defaults,
``Merge.last``, and the helpers that turn what a server sent into counts, texts and attributes."""

from __future__ import annotations

import math

import pytest

from otel_llm.parse import _merge as m
from otel_llm.parse._merge import INT64_MAX, MAX_ERROR_CHARS, Merge, ResponseInfo


def test_response_info_says_nothing_by_default() -> None:
    info = ResponseInfo()
    assert (info.response_id, info.response_model, info.finish_reasons, info.input_tokens, info.output_tokens,
            info.cached_input_tokens, info.reasoning_output_tokens, info.error, info.output_text,
            info.runtime) == (None,) * 10
    assert info.native == {}
    assert ResponseInfo().native is not info.native  # no dict shared between answers


def test_merge_starts_empty_and_owns_its_state() -> None:
    a, b = Merge("openai.chat"), Merge("openai.chat")
    assert a.info == ResponseInfo() and a.choice_reasons == {}
    assert a.info is not b.info and a.choice_reasons is not b.choice_reasons
    assert (a.reason, a.alt_reason, a.a_input, a.a_cache_read, a.a_cache_write, a.fb_input, a.fb_output,
            a.fb_cached) == (None,) * 8
    a.choice_reasons[0] = "stop"
    assert b.choice_reasons == {}


def test_last_replaces_with_a_later_count_and_none_leaves_it() -> None:
    acc = Merge("openai.chat")
    acc.last("output_tokens", 3)
    acc.last("output_tokens", None)
    assert acc.info.output_tokens == 3
    acc.last("output_tokens", 0)  # a later zero is a count too
    assert acc.info.output_tokens == 0
    acc.last("input_tokens", 7)
    assert (acc.info.input_tokens, acc.info.output_tokens) == (7, 0)


def test_slots_catch_a_misspelled_field() -> None:
    acc = Merge("openai.chat")
    with pytest.raises(AttributeError):
        acc.last("output_token", 3)  # not a ResponseInfo field
    with pytest.raises(AttributeError):
        acc.reasons = "stop"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0), (5, 5), (INT64_MAX, INT64_MAX), (-1, None), (INT64_MAX + 1, None), (2**80, None),
    (3.0, 3), (0.0, 0), (-0.0, 0), (3.5, None), (-2.0, None), (1e30, None),
    (math.inf, None), (-math.inf, None), (math.nan, None),
    (True, None), (False, None), ("3", None), (None, None), ([3], None), ({"n": 3}, None),
])
def test_count(value: object, expected: int | None) -> None:
    out = m.count(value)
    assert out == expected and (out is None or type(out) is int)


@pytest.mark.parametrize(("value", "expected"), [("x", "x"), (" ", " "), ("", None), (None, None), (3, None),
                                                 (b"x", None), (["x"], None)])
def test_text(value: object, expected: str | None) -> None:
    assert m.text(value) == expected


def test_as_dict() -> None:
    d = {"a": 1}
    assert m.as_dict(d) is d
    assert m.as_dict(None) == {} and m.as_dict([("a", 1)]) == {} and m.as_dict("a") == {}


def test_keep_prefers_the_new_value_unless_none() -> None:
    assert m.keep(2, 1) == 2 and m.keep(0, 1) == 0 and m.keep(None, 1) == 1 and m.keep(None, None) is None


def test_clean_keeps_scalars_and_drops_what_attributes_cannot_hold() -> None:
    d = {"f": 1.5, "i": -3, "s": "x", "b": True, "n": None, "inf": math.inf, "nan": math.nan,
         "big": INT64_MAX + 1, "low": -INT64_MAX - 1, "too_low": -INT64_MAX - 2, "list": [1, 2],
         "tuple": (1,), "obj": object()}
    assert m.clean(d) == {"f": 1.5, "i": -3, "s": "x", "b": True, "n": None, "low": -INT64_MAX - 1}


def test_clean_goes_two_dicts_deep() -> None:
    d = {"a": {"x": 1, "b": {"y": 2, "c": {"z": 3}, "l": [1]}, "inf": -math.inf}}
    assert m.clean(d) == {"a": {"x": 1, "b": {"y": 2}}}


def test_clean_copies() -> None:
    inner = {"x": 1}
    d = {"a": inner}
    out = m.clean(d)
    out["a"]["x"] = 2
    assert inner == {"x": 1}


@pytest.mark.parametrize(("msg", "expected"), [
    (None, None), ("", None), ("short", "short"), ("e" * (MAX_ERROR_CHARS + 50), "e" * MAX_ERROR_CHARS),
])
def test_truncate(msg: str | None, expected: str | None) -> None:
    assert m.truncate(msg) == expected


def test_header_reads_str_and_bytes_and_nothing_else() -> None:
    headers: dict[str, object] = {"a": "1", "b": b"caf\xe9", "c": bytearray(b"2"), "d": 3, "e": ["x"]}
    assert m.header(headers, "a") == "1"  # type: ignore[arg-type]
    assert m.header(headers, "b") == "café"  # type: ignore[arg-type]
    assert m.header(headers, "c") == "2"  # type: ignore[arg-type]
    assert m.header(headers, "d") is None and m.header(headers, "e") is None  # type: ignore[arg-type]
    assert m.header(headers, "missing") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "expected"), [
    ("12", 12), ("0", 0), (" 7 ", 7), (str(INT64_MAX), INT64_MAX), (str(INT64_MAX + 1), None),
    ("-1", None), ("1.5", None), ("", None), ("abc", None), (None, None), ("9" * 21, None),
])
def test_int_str(value: str | None, expected: int | None) -> None:
    assert m.int_str(value) == expected
