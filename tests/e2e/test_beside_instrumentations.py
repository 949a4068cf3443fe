"""otel_llm beside real third-party GenAI instrumentations of the openai client: the official
OpenTelemetry one (opentelemetry-instrumentation-genai-openai, openai 3.x) and openlit's (openai
2.x), each installed in a virtualenv of its own (otel_llm_testing.beside).

Under another instrumentation's GenAI CLIENT span, otel_llm adds no second call span: each call
has one span with ``gen_ai.operation.name``, theirs, and under it otel_llm's transport view
(``POST /v1/chat/completions``, CLIENT, ``llm.beside.instrumentation`` naming them, no
``gen_ai.*`` attribute) with the phases under that; every ``gen_ai.*`` metric is recorded by one
scope only, theirs, while otel_llm's ``llm.*`` metrics go on; their own telemetry and the
application's answers are the same as without otel_llm.

Each app run makes four calls (sync and async, streamed with usage and not) twice: with no
instrumentation at all, then under the setup; on the simulator (llama.cpp's flavour, so the
runtime's spans and metrics come too), and once on the real llama.cpp server. The first run
installs each virtualenv under ~/.cache/otel-llm (15-25 s each with a warm pip cache); then each
app run takes two or three seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.tools.sim import SimProcess
from otel_llm_testing.beside import CALLS, INSTRUMENTATIONS, Instrumentation, Run, beside_python, run_calls

pytestmark = [pytest.mark.timeout(900), pytest.mark.backend]

NAMES = sorted(INSTRUMENTATIONS)
TRANSPORT = "POST /v1/chat/completions"
GENAI_CLIENT_METRICS = (sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_TIME_TO_FIRST_CHUNK,
                        sc.METRIC_TIME_PER_OUTPUT_CHUNK)
# phases that depend on whether the call opened its connection (the same in every run, but
# nothing here is about them)
CONNECTION_PHASES = {sc.SPAN_POOL_WAIT, sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS}


@pytest.fixture(scope="module")
def upstream() -> Iterator[SimProcess]:
    # llama.cpp's flavour: its answers carry native timings, so runtime.* spans come too
    with SimProcess(runtime="llama.cpp", tokens=6, first_token_delay=0.02, token_interval=0.005) as sim:
        yield sim


@pytest.fixture(scope="module", params=NAMES)
def setups(request: pytest.FixtureRequest, upstream: SimProcess,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[Instrumentation, dict[str, Run]]:
    """One instrumentation and its runs on the simulator: otel_llm alone, theirs alone, both."""
    name = request.param
    python = beside_python(name)
    workdir = tmp_path_factory.mktemp(f"beside-{name}")
    return INSTRUMENTATIONS[name], {setup: run_calls(python, upstream.base_url, name, setup, workdir)
                                    for setup in ("alone", "theirs", "beside")}


def _their_call(run: Run, spec: Instrumentation, label: str) -> dict[str, Any]:
    found = [s for s in run.named(f"chat m-{label}") if s["scope"] == spec.scope]
    assert len(found) == 1, run.shape()
    return found[0]


def _descendants(run: Run, span: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for child in run.children(span):
        found += [child, *_descendants(run, child)]
    return found


def _phases(run: Run, call: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The call's phases in time order, and its synthesized runtime spans (which overlap them)."""
    kids = run.children(call)
    return ([s["name"] for s in kids if not s["attributes"].get(sc.LLM_SYNTHESIZED) and s["name"] not in
             CONNECTION_PHASES], sorted(s["name"] for s in kids if s["attributes"].get(sc.LLM_SYNTHESIZED)))


def check_one_call_span_per_call(run: Run, alone: Run, spec: Instrumentation, same_phases: bool = True) -> None:
    """Theirs is the call's only span with gen_ai.operation.name; ours is its transport view, with
    the phases under it (``same_phases``: the same as otel_llm alone gives the call: on the
    simulator, whose timing is planned; a real server's may leave out a phase in one run)."""
    shape = run.shape()
    calls = [s for s in run.spans if sc.GEN_AI_OPERATION_NAME in s["attributes"]]
    assert sorted(s["name"] for s in calls) == sorted(f"chat m-{label}" for label, _, _ in CALLS), (
        f"not one span with {sc.GEN_AI_OPERATION_NAME} a call:\n{shape}")
    assert {(s["scope"], s["kind"]) for s in calls} == {(spec.scope, "CLIENT")}, shape
    ours_seen = []
    for label, _, _ in CALLS:
        theirs = _their_call(run, spec, label)
        assert theirs["parent_id"] is None, shape  # the application opened no span of its own
        ours = [s for s in run.children(theirs) if s["scope"] == sc.INSTRUMENTATION_NAME]
        assert len(ours) == 1, shape
        transport = ours[0]
        assert transport["name"] == TRANSPORT and transport["kind"] == "CLIENT", shape
        attrs = transport["attributes"]
        assert attrs.get(sc.LLM_BESIDE_INSTRUMENTATION) == spec.scope, attrs
        assert not [key for key in attrs if key.startswith("gen_ai.")], attrs
        # otel_llm's own view of the call is all there
        assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200 and attrs[sc.LLM_API] == "openai.chat", attrs
        assert theirs["start"] <= transport["start"] <= transport["end"] <= theirs["end"], (theirs, transport)
        # the phases (and the runtime's spans) are the ones otel_llm gives the same call alone
        alone_call = alone.named(f"chat m-{label}")
        assert len(alone_call) == 1, alone.shape()
        phases, synthesized = _phases(run, transport)
        assert sc.SPAN_SERVER_WAIT in phases and synthesized == _phases(alone, alone_call[0])[1], shape
        if same_phases:
            assert phases == _phases(alone, alone_call[0])[0], shape
        under = _descendants(run, transport)
        assert all(s["scope"] == sc.INSTRUMENTATION_NAME and s["trace_id"] == theirs["trace_id"] for s in under)
        ours_seen += [transport, *under]
    # no span of otel_llm's anywhere else
    assert sorted(s["span_id"] for s in run.spans if s["scope"] == sc.INSTRUMENTATION_NAME) == sorted(
        s["span_id"] for s in ours_seen), shape


def check_genai_metrics_counted_once(run: Run, alone: Run, theirs: Run) -> None:
    """Each gen_ai.* metric from one scope only: the gen_ai.client.* ones from theirs, counted as
    they count them without otel_llm (one operation.duration record a call); otel_llm's own llm.*
    metrics all still there, and of its gen_ai.* ones only what they do not record."""
    scopes, their_scopes, alone_scopes = run.metric_scopes(), theirs.metric_scopes(), alone.metric_scopes()
    twice = {name: found for name, found in scopes.items() if name.startswith("gen_ai.") and len(found) > 1}
    assert not twice, f"recorded by more than one scope: {twice}\n{run.shape()}"
    for name in GENAI_CLIENT_METRICS:
        assert sc.INSTRUMENTATION_NAME in alone_scopes[name]  # otel_llm records it alone...
        assert scopes[name] == their_scopes[name] != [sc.INSTRUMENTATION_NAME], run.shape()  # ...theirs beside
    assert run.count(sc.METRIC_OPERATION_DURATION) == len(CALLS), run.shape()
    for name, found in their_scopes.items():  # theirs, exactly as without otel_llm
        for scope in found:
            assert scope in scopes.get(name, []) and run.count(name, scope) == theirs.count(name, scope), name
    ours = {name for name, found in scopes.items() if sc.INSTRUMENTATION_NAME in found}
    ours_alone = {name for name, found in alone_scopes.items() if sc.INSTRUMENTATION_NAME in found}
    assert {name for name in ours_alone if not name.startswith("gen_ai.")} <= ours <= ours_alone, run.shape()
    assert sc.METRIC_PHASE_DURATION in ours
    assert run.count(sc.METRIC_PHASE_DURATION) == alone.count(sc.METRIC_PHASE_DURATION)


def check_answers_unchanged(run: Run) -> None:
    assert run.doc["instrumented"] == run.doc["plain"]
    assert set(run.doc["plain"]) == {label for label, _, _ in CALLS}


def test_one_call_span_per_call_and_ours_beneath(setups: tuple[Instrumentation, dict[str, Run]]) -> None:
    spec, by_setup = setups
    check_one_call_span_per_call(by_setup["beside"], by_setup["alone"], spec)


def test_each_genai_metric_counted_once(setups: tuple[Instrumentation, dict[str, Run]]) -> None:
    by_setup = setups[1]
    check_genai_metrics_counted_once(by_setup["beside"], by_setup["alone"], by_setup["theirs"])


def test_their_spans_are_as_without_otel_llm(setups: tuple[Instrumentation, dict[str, Run]]) -> None:
    """otel_llm changes nothing of the other instrumentation's spans: names, kinds, attributes."""
    spec, by_setup = setups
    for label, _, _ in CALLS:
        beside, alone = _their_call(by_setup["beside"], spec, label), _their_call(by_setup["theirs"], spec, label)
        assert (beside["kind"], beside["status"]) == (alone["kind"], alone["status"])
        assert sorted(beside["attributes"]) == sorted(alone["attributes"]), label
    assert sorted(s["name"] for s in by_setup["beside"].spans if s["scope"] != sc.INSTRUMENTATION_NAME) == sorted(
        s["name"] for s in by_setup["theirs"].spans)


def test_the_application_gets_the_same_answers(setups: tuple[Instrumentation, dict[str, Run]]) -> None:
    for run in setups[1].values():
        check_answers_unchanged(run)


def test_the_request_goes_out_under_their_span(setups: tuple[Instrumentation, dict[str, Run]]) -> None:
    """What otel_llm finds current when a call's request goes out: their CLIENT span, already
    named ``chat <model>`` and carrying gen_ai.operation.name (openlit sets its attributes just
    after starting the span, the official one at the start); nothing without instrumentation."""
    spec, by_setup = setups
    run = by_setup["beside"]
    for label, _, _ in CALLS:
        theirs = _their_call(run, spec, label)
        (request,) = run.doc["seen"][label]
        assert request["path"] == "/v1/chat/completions"
        current = request["current"]
        assert current is not None and current["span_id"] == theirs["span_id"], request
        assert (current["name"], current["scope"], current["kind"]) == (f"chat m-{label}", spec.scope, "CLIENT")
        assert current["attributes"][sc.GEN_AI_OPERATION_NAME] == "chat"
        assert current["attributes"][sc.GEN_AI_REQUEST_MODEL] == f"m-{label}"
        assert [r["current"] for r in run.doc["plain_seen"][label]] == [None]


@pytest.mark.runtime
@pytest.mark.parametrize("name", NAMES)
def test_beside_on_llama_server(name: str, tmp_path: Path) -> None:
    """The same beside the real llama.cpp server (Gemma 3 270M, greedy, no prompt cache, so both
    rounds of calls get the same text)."""
    from otel_llm_testing import LlamaServer

    spec = INSTRUMENTATIONS[name]
    python = beside_python(name)
    extra = {"max_tokens": 8, "temperature": 0, "seed": 1, "extra_body": {"cache_prompt": False}}
    with LlamaServer(slots=1, context=2048) as server:
        alone = run_calls(python, server.base_url, name, "alone", tmp_path, extra=extra)
        theirs = run_calls(python, server.base_url, name, "theirs", tmp_path, extra=extra)
        beside = run_calls(python, server.base_url, name, "beside", tmp_path, extra=extra)
    for run in (alone, theirs, beside):
        check_answers_unchanged(run)
        assert all(answer["content"] for answer in run.doc["plain"].values()), run.doc["plain"]
    check_one_call_span_per_call(beside, alone, spec, same_phases=False)
    check_genai_metrics_counted_once(beside, alone, theirs)
    # the runtime's own account of the calls hangs under otel_llm's transport view
    transports = beside.named(TRANSPORT)
    assert transports and all(
        sc.SPAN_RUNTIME_DECODE in [s["name"] for s in beside.children(t)] for t in transports), beside.shape()
