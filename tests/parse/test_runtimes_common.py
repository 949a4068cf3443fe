"""runtime_counters: dispatch, value checks, derived values, and the never-raise property."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otel_llm

from otel_llm.parse import response as resp
from otel_llm.parse.response import ResponseInfo
from otel_llm.parse.runtimes import KNOWN_RUNTIMES, SOURCES, RuntimeCounters, runtime_counters
from otel_llm.parse.runtimes import _common, llamacpp, lmstudio, ollama, sglang, tgi, vllm
from otel_llm_testing.runtime_fixtures import FIELDS, expect

LOGGER = "otel_llm.parse.runtimes"


def assert_sane(c: RuntimeCounters) -> None:
    """Every value is None or a plausible, correctly typed number."""
    for name in FIELDS:
        v = getattr(c, name)
        if v is None:
            continue
        if name == "runtime":
            assert v in KNOWN_RUNTIMES
        elif name == "finish_reasons":
            assert isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
        elif name == "truncated":
            assert isinstance(v, bool)
        elif name.endswith("tokens") or name.endswith("accepted"):
            assert type(v) is int and 0 <= v <= _common.MAX_TOKENS, (name, v)
        elif name.endswith("rate"):
            assert type(v) is float and 0 <= v <= _common.MAX_RATE, (name, v)
        else:
            assert type(v) is float and math.isfinite(v) and 0 <= v <= _common.MAX_SECONDS


# --- public surface -------------------------------------------------------------------------


def test_known_runtimes_and_sources() -> None:
    assert KNOWN_RUNTIMES == ("ollama", "llama.cpp", "vllm", "tgi", "sglang", "lmstudio")
    assert list(SOURCES) == [*KNOWN_RUNTIMES, "openai-compatible"]
    assert all(isinstance(v, str) and v and "\n" not in v for v in SOURCES.values())


def test_sources_name_the_fields_read() -> None:
    """Each SOURCES line mentions every wire key its adapter reads."""
    tables = {
        "ollama": ollama._FIELDS, "llama.cpp": llamacpp._TIMINGS, "sglang": sglang._META,
        "lmstudio": lmstudio._STATS, "tgi": tgi._HEADERS + tgi._DETAILS,
        "vllm": vllm._METRICS + vllm._SPECULATIVE,
    }
    for runtime, table in tables.items():
        for _, key, _ in table:
            assert key in SOURCES[runtime], (runtime, key)
    assert "prompt_tokens" in SOURCES["sglang"] and "truncated" in SOURCES["llama.cpp"]


def test_empty_info_gives_all_none() -> None:
    expect(runtime_counters(ResponseInfo()))
    expect(runtime_counters(ResponseInfo(), {}))


# --- dispatch -------------------------------------------------------------------------------


@pytest.mark.parametrize("key, runtime", [
    ("ollama", "ollama"), ("llamacpp.timings", "llama.cpp"),
    (llamacpp.NATIVE_TRUNCATED, "llama.cpp"),
    ("tgi.headers", "tgi"), ("tgi.details", "tgi"), ("sglang.meta_info", "sglang"),
    ("lmstudio.stats", "lmstudio"), ("vllm.metrics", "vllm"),
])
def test_dispatch_on_native_key(key: str, runtime: str) -> None:
    assert runtime_counters(ResponseInfo(native={key: {}})).runtime == runtime


@pytest.mark.parametrize("runtime", KNOWN_RUNTIMES)
def test_dispatch_on_info_runtime(runtime: str) -> None:
    assert runtime_counters(ResponseInfo(runtime=runtime)).runtime == runtime


def test_native_beats_info_runtime() -> None:
    info = ResponseInfo(runtime="vllm", native={"sglang.meta_info": {"e2e_latency": 0.5}})
    expect(runtime_counters(info), runtime="sglang", total_duration=0.5)


def test_unknown_runtime_name_is_not_reported() -> None:
    info = ResponseInfo(runtime="mystery", input_tokens=3)
    expect(runtime_counters(info), prompt_tokens=3)


def test_dispatch_on_tgi_headers_any_case() -> None:
    c = runtime_counters(ResponseInfo(), {"X-Queue-Time": "12", "Content-Type": "x"})
    expect(c, runtime="tgi", queue_duration=0.012)
    assert runtime_counters(ResponseInfo(), {"content-type": "application/json"}).runtime is None


# --- value checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, want", [
    (1500000000, 1.5), (1.5e9, 1.5), ("1500000000", 1.5), (b"3000000000", 3.0), (0, 0.0),
    (None, None), (True, None), (False, None), (-1, None), (float("nan"), None),
    (float("inf"), None), ("nan", None), ("1e400", None), ("12 s", None), ("", None),
    ("\u0663", None), ("9" * 50, None), (10**20, None), (2e16, None), ([1], None), ({}, None),
])
def test_ns_values(value: object, want: float | None) -> None:
    assert _common.ns("x", value) == want


@pytest.mark.parametrize("value, want", [
    (0, 0), (7, 7), (7.0, 7), ("7", 7), (7.5, None), ("7.5", None), (-1, None), (True, None),
    (10**9, 10**9), (10**9 + 1, None), (2**64, None), (float("nan"), None), ("x", None),
])
def test_token_values(value: object, want: int | None) -> None:
    got = _common.tokens("x", value)
    assert got == want and type(got) is type(want)


def test_rate_and_seconds_bounds() -> None:
    assert _common.rate("x", 1e9) == 1e9 and _common.rate("x", 1e9 + 1) is None
    assert _common.seconds("x", 1e7) == 1e7 and _common.seconds("x", 1.0000001e7) is None
    assert _common.ms("x", 1e10) == 1e7 and _common.ms("x", 1e11) is None
    assert _common.flag("x", True) is True and _common.flag("x", 1) is None


def test_dropped_values_are_logged_missing_are_not(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    info = ResponseInfo(native={"ollama": {"eval_duration": -5, "load_duration": None}})
    expect(runtime_counters(info), runtime="ollama")
    text = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("ollama.eval_duration=-5" in t and "negative" in t for t in text), text
    assert any("ollama.load_duration=None" in t for t in text), text
    assert not any("total_duration" in t for t in text)  # absent: not logged
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == LOGGER)


# --- usage merge and derived values ---------------------------------------------------------


def test_usage_fills_what_the_runtime_lacks() -> None:
    info = ResponseInfo(input_tokens=21, output_tokens=2, cached_input_tokens=16)
    expect(runtime_counters(info), prompt_tokens=5, cached_tokens=16, generation_tokens=2)
    info = ResponseInfo(input_tokens=21, output_tokens=2)
    expect(runtime_counters(info), prompt_tokens=21, generation_tokens=2)


def test_usage_cached_above_total_drops_prompt() -> None:
    info = ResponseInfo(input_tokens=3, cached_input_tokens=5)
    expect(runtime_counters(info), cached_tokens=5)


def test_usage_never_overrides_the_runtime() -> None:
    info = ResponseInfo(
        input_tokens=100, output_tokens=100, cached_input_tokens=100,
        native={"llamacpp.timings": {"prompt_n": 2, "cache_n": 10, "predicted_n": 8}},
    )
    expect(runtime_counters(info), runtime="llama.cpp", prompt_tokens=2, cached_tokens=10,
           generation_tokens=8)


def test_derived_only_when_both_positive() -> None:
    zero = {"prompt_eval_count": 0, "prompt_eval_duration": 0, "eval_count": 4,
            "eval_duration": 0}
    expect(runtime_counters(ResponseInfo(native={"ollama": zero})), runtime="ollama",
           prompt_tokens=0, prompt_eval_duration=0.0, generation_tokens=4,
           generation_duration=0.0)
    tiny = {"eval_count": 10**9, "eval_duration": 1}  # 1e18 tokens/s: not plausible
    expect(runtime_counters(ResponseInfo(native={"ollama": tiny})), runtime="ollama",
           generation_tokens=10**9, generation_duration=1e-9, time_per_output_token=1e-18)


def test_reported_rate_wins_over_derived() -> None:
    timings = {"predicted_n": 40, "predicted_ms": 749.906, "predicted_per_second": 52.0}
    c = runtime_counters(ResponseInfo(native={"llamacpp.timings": timings}))
    assert c.generation_rate == 52.0 and c.time_per_output_token == pytest.approx(0.749906 / 40)


# --- finish reasons -------------------------------------------------------------------------


@pytest.mark.parametrize("reasons, want", [
    (["end_turn"], ["stop"]), (["stop_sequence"], ["stop"]), (["max_tokens"], ["length"]),
    (["tool_use"], ["tool_calls"]), (["max_output_tokens"], ["length"]),
    (["stop", "length", "tool_calls", "content_filter"], ["stop", "length", "tool_calls",
                                                          "content_filter"]),
    (["pause_turn"], ["pause_turn"]), ([], None), (["", None, 3], None), ("end_turn", None),
])
def test_common_finish_reasons(reasons: Any, want: list[str] | None) -> None:
    assert runtime_counters(ResponseInfo(finish_reasons=reasons)).finish_reasons == want


# --- never raises ---------------------------------------------------------------------------


class _Hostile(dict):
    def get(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError("boom")

    def __contains__(self, key: object) -> bool:
        raise RuntimeError("boom")


class _BadHeaders(Mapping):
    def __getitem__(self, key: str) -> str:
        raise KeyError(key)

    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("info", [
    None, object(), 42, ResponseInfo(native=[1, 2]),  # type: ignore[arg-type]
    ResponseInfo(native=_Hostile()), ResponseInfo(native={"ollama": _Hostile()}),
    ResponseInfo(runtime=["ollama"]),  # type: ignore[arg-type]
    ResponseInfo(input_tokens=-1, output_tokens=2**80,
                 cached_input_tokens="x"),  # type: ignore[arg-type]
])
def test_junk_info_never_raises(info: Any) -> None:
    assert_sane(runtime_counters(info))


@pytest.mark.parametrize("headers", [None, {}, [], "x-total-time", _BadHeaders(), {1: 2},
                                     {b"X-Total-Time": b"5"}, {"x-total-time": None}])
def test_junk_headers_never_raise(headers: Any) -> None:
    assert_sane(runtime_counters(ResponseInfo(), headers))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=20,
)
_NATIVE_KEYS = [
    resp.NATIVE_OLLAMA, resp.NATIVE_LLAMACPP_TIMINGS, llamacpp.NATIVE_TRUNCATED,
    resp.NATIVE_TGI_HEADERS, resp.NATIVE_TGI_DETAILS, resp.NATIVE_SGLANG_META,
    resp.NATIVE_LMSTUDIO_STATS, resp.NATIVE_VLLM_METRICS,
]
# The wire keys the adapters read, so generated dicts hit them often.
_WIRE_KEYS = sorted(
    {key for table in (ollama._FIELDS, llamacpp._TIMINGS, tgi._HEADERS, tgi._DETAILS,
                       sglang._META, lmstudio._STATS, vllm._METRICS, vllm._SPECULATIVE)
     for _, key, _ in table}
    | {"prompt_tokens", "finish_reason", "stop_reason", "type"}
)
_counters = st.dictionaries(st.sampled_from(_WIRE_KEYS) | st.text(max_size=8), _json, max_size=8)
_native = st.dictionaries(st.sampled_from(_NATIVE_KEYS) | st.text(max_size=8),
                          _counters | _json, max_size=4)
_anything = st.none() | st.integers() | st.text(max_size=5) | _json


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(native=_native, runtime=st.sampled_from([*KNOWN_RUNTIMES, None, "x"]) | _anything,
       reasons=_anything, usage=st.tuples(_anything, _anything, _anything),
       headers=st.none() | st.dictionaries(st.sampled_from(["x-total-time", "X-Prompt-Tokens",
                                                            "x-compute-time"]) | st.text(),
                                           st.text(max_size=12) | _anything, max_size=4))
@pytest.mark.slow
def test_never_raises_on_arbitrary_native(native: dict, runtime: Any, reasons: Any,
                                          usage: tuple, headers: Any) -> None:
    info = ResponseInfo(native=native, runtime=runtime, finish_reasons=reasons,
                        input_tokens=usage[0], output_tokens=usage[1],
                        cached_input_tokens=usage[2])
    assert_sane(runtime_counters(info, headers))


def test_each_runtime_module_declares_what_the_observers_know() -> None:
    """Recognition, probes and metric names live in the runtime's own module; the observers'
    tables are built from those declarations, so each series belongs to the runtime it names."""
    from otel_llm.observers import processes, runtime_state
    from otel_llm.parse.runtimes import KNOWN_RUNTIMES
    from otel_llm.runtimes import OBSERVED

    assert tuple(OBSERVED) == KNOWN_RUNTIMES
    state_keys = {runtime_state.STATE_REQUESTS_RUNNING, runtime_state.STATE_REQUESTS_WAITING,
                  runtime_state.STATE_KV_CACHE_USAGE}
    for name, observed in OBSERVED.items():
        assert set(observed.normalized) <= state_keys, name
        for series in (s for sources in observed.normalized.values() for s in sources):
            assert observed.metric_prefix and series.startswith(observed.metric_prefix), (name, series)
            assert runtime_state._infer_runtime([(series, "gauge", {}, 1.0, "")]) == name
        assert runtime_state._PATHS[name] == observed.state_paths
        for exe in observed.executables + observed.executable_names:
            assert processes.runtime_for_name(exe) == name, exe
        for module in observed.python_modules:
            assert processes.runtime_for_name("python3", ["python3", "-m", f"{module}.server"]) == name
    assert processes.runtime_for_name("VLLM::EngineCore") == "vllm"


# --- each runtime's knowledge lives in its module ------------------------------------------------
_OWNED = {  # a wire name only one runtime uses -> the module that owns it
    "x-compute-type": "tgi", "x-queue-time": "tgi",
    "default_generation_settings": "llamacpp", "/props": "llamacpp", "predicted_per_second": "llamacpp",
    "stopped_eos": "llamacpp", "owned_by": "vllm", "vllm:num_requests_running": "vllm",
    "prompt_eval_count": "ollama", "done_reason": "ollama", "/api/version": "ollama",
    "Ollama is running": "ollama", "meta_info": "sglang", "model_instance_id": "lmstudio",
    "time_to_first_token_seconds": "lmstudio", "queue_time_ms": "vllm", "mean_itl_ms": "vllm",
    "num_accepted_draft_tokens": "vllm",
}

# diagnose's cold trials drive Ollama's own unload lifecycle (a request otel_llm sends, not an answer
# it reads): the one place outside the runtime's module that has to know its answer
_CONTROL = {("tools/diagnose/cold.py", "done_reason")}


def _code_strings(path: Path) -> set[str]:
    """The string constants of a module's code (docstrings left out: prose may name anything)."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_each_runtimes_wire_names_are_written_in_its_module_only() -> None:
    """Reading a runtime's answers and normalizing its counters (its module in parse/runtimes/),
    recognizing and probing it (its module in runtimes/): the names its wire format uses appear in
    its own two modules, nowhere else in the library (the simulator, which imitates the runtimes,
    aside)."""
    root = Path(otel_llm.__file__).parent
    owners = {name: (root / "parse" / "runtimes" / f"{module}.py", root / "runtimes" / f"{module}.py")
              for name, module in _OWNED.items()}
    for name, owned in owners.items():
        assert any(name in s for path in owned for s in _code_strings(path)), (name, owned[0].name)
    for path in root.rglob("*.py"):
        if "sim" in path.relative_to(root).parts or path.name == "semconv_reference.py":
            continue  # the simulator imitates the runtimes; the names' reference is prose for users
        strings = _code_strings(path)
        for name, owned in owners.items():
            if path not in owned and (path.relative_to(root).as_posix(), name) not in _CONTROL:
                assert not any(name in s for s in strings), f"{name!r} written in {path.relative_to(root)}"
