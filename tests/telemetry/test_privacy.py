"""Secrets (credentials in headers, query and user info) never reach any exported signal; prompt
and completion text only do when content capture is switched on."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest

import otel_llm
from otel_llm import semconv as sc
from otel_llm._log import reset_log_once
from otel_llm.export.jsonl import read_jsonl
from otel_llm_testing.otel import Otel, make_otel
from otel_llm_testing.simulator import configure_sim
from otel_llm_testing.subprocesses import clean_env, run_python
from otel_llm_testing.collectors import walk_strings
from otel_llm_testing.net import free_port

MARKER = "PROMPT-MARKER-q7Zx41"
SECRETS = ("SECRET1", "SECRET2", "SECRET3", "SECRET4", "SECRET5", "SECRET6")
HEADERS = {"Authorization": "Bearer sk-SECRET1", "api-key": "SECRET2", "x-api-key": "SECRET3"}
# Basic auth built by httpx from the URL's user info must not leak in encoded form either.
FORBIDDEN = (*SECRETS, "sk-", base64.b64encode(b"user:SECRET6").decode())
COMPLETION = "tok0 tok1 tok2 tok3"


def _secret_url(base_url: str) -> str:
    """``http://user:SECRET6@127.0.0.1:PORT/v1/chat/completions?key=SECRET4&api_key=SECRET5&x=1``."""
    return base_url.replace("http://", "http://user:SECRET6@") + "/v1/chat/completions?key=SECRET4&api_key=SECRET5&x=1"


def _body(stream: bool, model: str = "m") -> dict[str, Any]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": f"please {MARKER} now"}]}


def _leaks(texts: Any, forbidden: tuple[str, ...] = (*FORBIDDEN, MARKER)) -> list[str]:
    return sorted({f"{word!r} in {text[:200]!r}" for text in walk_strings(texts) for word in forbidden if word in text})


def _make_calls(base_url: str) -> int:
    """Secret-carrying model calls through httpx (sync, streamed and not), httpx2 (async) and openai."""
    url = _secret_url(base_url)
    with httpx.Client(headers=HEADERS, timeout=10) as client:
        assert client.post(url, json=_body(False)).status_code == 200
        with client.stream("POST", url, json=_body(True)) as response:
            assert response.status_code == 200
            assert b"tok0" in response.read()

    async def async_call() -> None:
        async with httpx2.AsyncClient(headers=HEADERS, timeout=10) as client:
            assert (await client.post(url, json=_body(False))).status_code == 200

    asyncio.run(async_call())
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-SECRET1", max_retries=0,
                           default_headers={"api-key": "SECRET2", "x-api-key": "SECRET3"},
                           default_query={"key": "SECRET4", "api_key": "SECRET5", "x": "1"})
    chunks = list(client.chat.completions.create(model="m", messages=_body(True)["messages"], stream=True))
    assert chunks
    # error paths: an HTTP 401 (status message from the body) and a refused connection (exception)
    with httpx.Client(headers={**HEADERS, "x-sim-error-status": "401"}, timeout=10) as client:
        assert client.post(url, json=_body(False)).status_code == 401
        with pytest.raises(httpx.ConnectError):
            client.post(_secret_url(f"http://127.0.0.1:{free_port()}"), json=_body(False))
    return 6



def _check_url_full(url_full: str) -> None:
    assert "key=REDACTED" in url_full and "api_key=REDACTED" in url_full and "x=1" in url_full, url_full
    assert "@" not in url_full and "user" not in url_full, url_full


def test_default_options_export_no_secret_and_no_prompt(sim, otel: Otel) -> None:
    """Spans (every field, via the SDK's JSON dump) and metric points carry neither secrets nor the prompt."""
    configure_sim(sim, tokens=4, first_token_delay=0.005, token_interval=0.001)
    expected = _make_calls(sim.base_url)
    calls = otel.calls()
    assert len(calls) == expected
    for call in calls:
        _check_url_full(call.attributes[sc.URL_FULL])
        assert sc.GEN_AI_INPUT_MESSAGES not in call.attributes
        assert sc.GEN_AI_OUTPUT_MESSAGES not in call.attributes
        assert otel.children(call), call.name
    assert sorted(str(c.attributes.get(sc.ERROR_TYPE)) for c in calls if not c.status.is_ok) == [
        "401", "httpx.ConnectError"]
    assert all(c.status.description for c in calls if not c.status.is_ok)
    dumps = [json.loads(span.to_json()) for span in otel.spans()]
    assert _leaks(dumps) == []
    data = otel.reader.get_metrics_data()
    assert data is not None and otel.metrics()
    assert _leaks(json.loads(data.to_json())) == []


def test_embedded_default_file_and_summary_have_no_secret(sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The embedded default (JSONL file + summary lines) leaks nothing either. Under pytest the
    summary lines go to its log capture (a handler on the root logger), not to stderr."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    configure_sim(sim, tokens=4, first_token_delay=0.005, token_interval=0.001)
    path = tmp_path / "traces.jsonl"
    reset_log_once()
    otel_llm.instrument(traces_file=str(path))
    try:
        expected = _make_calls(sim.base_url)
    finally:
        otel_llm.uninstrument()
    text = path.read_text()
    spans = list(read_jsonl(path))
    calls = [s for s in spans if s["kind"] == 3]
    assert len(calls) == expected
    for call in calls:
        _check_url_full(call["attributes"][sc.URL_FULL])
    assert _leaks([text]) == []
    err = capfd.readouterr().err
    summaries = [r.getMessage() for r in caplog.records if r.name == "otel_llm.summary"]
    assert len(summaries) == expected and all(line.startswith("otel-llm") for line in summaries), summaries
    assert _leaks([err, *summaries]) == []


def test_capture_content_records_messages_but_no_secret(sim) -> None:
    """capture_content=True: prompt in gen_ai.input.messages, completion in gen_ai.output.messages."""
    configure_sim(sim, tokens=4, first_token_delay=0.005, token_interval=0.001)
    state = make_otel()
    reset_log_once()
    otel_llm.instrument(tracer_provider=state.tracer_provider, meter_provider=state.meter_provider,
                        capture_content=True)
    try:
        with httpx.Client(headers=HEADERS, timeout=10) as client:
            assert client.post(_secret_url(sim.base_url), json=_body(False)).status_code == 200
    finally:
        otel_llm.uninstrument()
    call, _ = state.one_call()
    assert MARKER in call.attributes[sc.GEN_AI_INPUT_MESSAGES]
    assert COMPLETION in call.attributes[sc.GEN_AI_OUTPUT_MESSAGES]
    _check_url_full(call.attributes[sc.URL_FULL])
    assert _leaks([json.loads(s.to_json()) for s in state.spans()], FORBIDDEN) == []
    data = state.reader.get_metrics_data()
    assert _leaks(json.loads(data.to_json()), (*FORBIDDEN, MARKER)) == []


_ENV_SCRIPT = """
import sys, httpx, otel_llm
otel_llm.instrument()
url, body, headers = sys.argv[1], {body!r}, {headers!r}
with httpx.Client(headers=headers, timeout=10) as client:
    client.post(url, json=body).raise_for_status()
"""


def test_standard_capture_variable_in_subprocess(sim, tmp_path: Path) -> None:
    """OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true alone switches capture on."""
    configure_sim(sim, tokens=4, first_token_delay=0.005, token_interval=0.001)
    script = _ENV_SCRIPT.format(body=_body(False), headers=HEADERS)
    env = clean_env(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
    result = run_python(script, tmp_path, env, _secret_url(sim.base_url))
    assert result.returncode == 0, result.stderr
    path = tmp_path / "otel-llm-traces.jsonl"
    calls = [s for s in read_jsonl(path) if s["kind"] == 3]
    assert len(calls) == 1
    attrs = calls[0]["attributes"]
    assert MARKER in attrs[sc.GEN_AI_INPUT_MESSAGES]
    assert COMPLETION in attrs[sc.GEN_AI_OUTPUT_MESSAGES]
    _check_url_full(attrs[sc.URL_FULL])
    assert _leaks([path.read_text(), result.stderr, result.stdout], FORBIDDEN) == []


def test_a_credential_echoed_in_an_error_body_is_masked(otel: Otel) -> None:
    """A server that quotes the caller's key back in its error JSON ("invalid key sk-...") leaves no
    key on the span: every credential the request carried is masked in the recorded message, for
    httpx's and requests' header containers alike."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    class Echo(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            quoted = " ".join(str(self.headers.get(h)) for h in ("Authorization", "api-key", "x-api-key"))
            body = json.dumps({"error": {"message": f"invalid credentials: {quoted}"}}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1/chat/completions"
    try:
        with httpx.Client(headers=HEADERS, timeout=10) as client:
            assert client.post(url, json=_body(False)).status_code == 401
        assert requests.post(url, json=_body(False), headers=HEADERS, timeout=10).status_code == 401
    finally:
        server.shutdown()
    calls = otel.calls()
    assert len(calls) == 2
    for call in calls:
        assert call.status.description == "invalid credentials: *** *** ***", call.status.description
    assert _leaks([json.loads(span.to_json()) for span in otel.spans()], SECRETS[:3]) == []
