"""Options: keywords over environment over defaults; bad values are reported, not raised."""

from __future__ import annotations

import logging

import pytest

from otel_llm.config import DEFAULT_TRACES_FILE, resolve


def test_defaults() -> None:
    options = resolve({}, environ={})
    assert options.capture_content is False
    assert options.console_summary is True
    assert options.traces_file == DEFAULT_TRACES_FILE
    assert options.endpoint is None


def test_environment_and_keyword_precedence() -> None:
    env = {"OTEL_LLM_SERVICE_NAME": "from-env", "OTEL_LLM_CAPTURE_CONTENT": "true",
           "OTEL_LLM_RUNTIMES": "http://a:11434=ollama, http://b:8000=vllm",
           "OTEL_LLM_LLM_ROUTES": "/my/infer,other", "OTEL_LLM_PROTOCOL": "grpc"}
    options = resolve({"service_name": "from-kwarg"}, environ=env)
    assert options.service_name == "from-kwarg"
    assert options.capture_content is True
    assert options.runtimes == {"http://a:11434": "ollama", "http://b:8000": "vllm"}
    assert options.llm_routes == ("/my/infer", "/other")
    assert options.protocol == "grpc"


def test_standard_genai_content_switch() -> None:
    assert resolve({}, environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "TRUE"}).capture_content
    # otel_llm's own variable wins over the shared one
    env = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true", "OTEL_LLM_CAPTURE_CONTENT": "false"}
    assert resolve({}, environ=env).capture_content is False


def test_bad_values_are_logged_and_ignored(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        options = resolve({"protocol": "carrier-pigeon", "capture_content": "maybe", "colour": "red"},
                          environ={"OTEL_LLM_RUNTIMES": "nonsense"})
    assert options.protocol is None and options.capture_content is False and options.runtimes == {}
    text = caplog.text
    assert "carrier-pigeon" in text and "maybe" in text and "unknown option" in text and "BASE_URL=RUNTIME" in text


def test_observer_switches_and_interval() -> None:
    options = resolve({"gpu_metrics": False},
                      environ={"OTEL_LLM_HOST_METRICS": "off", "OTEL_LLM_SAMPLE_INTERVAL": "0.5"})
    assert (options.host_metrics, options.gpu_metrics, options.runtime_metrics) == (False, False, True)
    assert options.sample_interval == 0.5
    assert resolve({"sample_interval": "nan"}, environ={}).sample_interval == 1.0
    assert resolve({"sample_interval": 0}, environ={}).sample_interval == 1.0


def test_poll_runtimes_values(caplog) -> None:
    assert resolve({}, environ={}).poll_runtimes == "local"
    assert resolve({}, environ={"OTEL_LLM_POLL_RUNTIMES": " ALL "}).poll_runtimes == "all"
    assert resolve({"poll_runtimes": "configured"},
                   environ={"OTEL_LLM_POLL_RUNTIMES": "all"}).poll_runtimes == "configured"
    with caplog.at_level(logging.WARNING, logger="otel_llm"):
        assert resolve({"poll_runtimes": "everything"}, environ={}).poll_runtimes == "local"
    assert "poll_runtimes='everything'" in caplog.text and "configured, local, all" in caplog.text


def test_instrument_takes_exactly_the_options_as_keywords() -> None:
    """``instrument()``'s keywords are the options (so a misspelt one is a TypeError, as for any
    Python function), each defaulting to None: "read the environment, else the default"."""
    import dataclasses
    import inspect

    import otel_llm
    from otel_llm.config import Options

    parameters = inspect.signature(otel_llm.instrument).parameters
    assert list(parameters) == [f.name for f in dataclasses.fields(Options)]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is None for p in parameters.values())
    with pytest.raises(TypeError, match="servce_name"):
        otel_llm.instrument(servce_name="typo")  # type: ignore[call-arg]
    assert not otel_llm.is_instrumented()


def test_instrument_hands_only_the_given_options_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_llm
    from otel_llm import _core

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(_core, "instrument", lambda **kwargs: seen.append(kwargs))
    otel_llm.instrument(service_name="svc", capture_content=False, sample_interval=0.5)
    assert seen == [{"service_name": "svc", "capture_content": False, "sample_interval": 0.5}]
