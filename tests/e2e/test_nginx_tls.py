"""The seed's remote-access path, all real: an instrumented client -> Debian's nginx with TLS
(the shipped deploy/nginx/otel-llm-gateway.conf, a certificate from a local CA) -> otel-llm
gateway -> llama.cpp's server with Gemma 3 270M.

One trace: the client's DNS lookup of a name that resolves to loopback, its TCP connect and TLS
handshake (real protocol and cipher), then the gateway's SERVER span and, under it, the upstream
call with llama.cpp's own timings. The stream comes through nginx token by token.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from otel_llm import semconv as sc
from otel_llm.tools.gateway.process import GatewayProcess
from otel_llm_testing import LlamaServer
from otel_llm_testing.nginx import SHIPPED_CONF, NginxProxy
from otel_llm_testing.otel import Otel
from otel_llm_testing.collectors import OtlpHttpCollector, attributes_of
from otel_llm_testing.subprocesses import clean_env
from otel_llm_testing.net import wait_for

pytestmark = [pytest.mark.timeout(900), pytest.mark.runtime, pytest.mark.backend]

TOKENS = 24
# too few for a burst pattern (diagnosis.MIN_TOKENS_FOR_BUFFERING), judged by llama.cpp's own
# generation time, which must reach diagnosis.HELD_MIN_SECONDS: 4 tokens took 48 to 68 ms on an
# idle 2-core machine (a KeyError in CI below 50 ms), 7 took 108 to 192 ms
SHORT = 7


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    with LlamaServer(slots=1, context=2048) as server:
        yield server


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpHttpCollector]:
    with OtlpHttpCollector() as running:
        yield running


@pytest.fixture(scope="module")
def gateway(llama: LlamaServer, collector: OtlpHttpCollector,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {"OTEL_LLM_HOST_METRICS": "false", "OTEL_LLM_RUNTIME_METRICS": "false",
           "OTEL_LLM_TRACES_FILE": str(tmp_path_factory.mktemp("nginx") / "unused.jsonl"),
           "OTEL_LLM_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    # behind nginx every connection comes from nginx's address
    with GatewayProcess(llama.base_url, {"app": {"routes": ["/v1/*"]}}, env=env,
                        max_connections_per_client=512) as running:
        yield running


@pytest.fixture(scope="module")
def certificate(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    where = tmp_path_factory.mktemp("cert")
    issued = ca.issue_cert("localhost")
    cert, key = where / "localhost.pem", where / "localhost.key"
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


@pytest.fixture(scope="module")
def nginx(gateway: GatewayProcess, certificate: tuple[str, str]) -> Iterator[NginxProxy]:
    with NginxProxy(gateway.url.removeprefix("http://"), *certificate) as proxy:
        yield proxy


def _trust(ca: Any) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def _chat(url: str, key: str, ca: Any, tokens: int = TOKENS) -> str:
    body = {"model": "gemma", "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex}] Tell me about the sea."}]}
    text = []
    with httpx.Client(verify=_trust(ca), timeout=120) as client:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                           headers={"authorization": f"Bearer {key}"}) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                text.append(line)
    return "\n".join(text)


def test_the_shipped_configuration_is_what_runs(nginx: NginxProxy) -> None:
    """Only the port, certificate and upstream address differ from the file in deploy/."""
    shipped = [line for line in SHIPPED_CONF.read_text().splitlines()]
    running = nginx.site.splitlines()
    changed = [(a.strip(), b.strip()) for a, b in zip(shipped, running) if a != b]
    assert len(shipped) == len(running) and len(changed) == 4, changed
    assert {a.split()[0] for a, _ in changed} == {"server", "listen", "ssl_certificate", "ssl_certificate_key"}
    for directive in ("proxy_buffering off;", "proxy_request_buffering off;", "gzip off;",
                      "proxy_read_timeout 600s;", "proxy_http_version 1.1;"):
        assert directive in nginx.site


def test_one_trace_from_the_client_through_nginx_and_the_gateway_to_llama_cpp(
        otel: Otel, nginx: NginxProxy, gateway: GatewayProcess, collector: OtlpHttpCollector, ca: Any) -> None:
    received = _chat(nginx.url, gateway.secrets["app"], ca)
    assert "[DONE]" in received

    call, phases = otel.one_call()
    names = [p.name for p in phases if p.name != sc.SPAN_POOL_WAIT]
    assert names[:4] == [sc.SPAN_DNS, sc.SPAN_CONNECT, sc.SPAN_TLS, sc.SPAN_UPLOAD], names
    kids = {p.name: p for p in phases}
    assert kids[sc.SPAN_DNS].attributes[sc.DNS_QUESTION_NAME] == "localhost"
    tls = kids[sc.SPAN_TLS].attributes
    assert tls[sc.TLS_PROTOCOL_VERSION] == "TLSv1.3" and tls[sc.TLS_CIPHER], dict(tls)
    assert call.attributes[sc.SERVER_ADDRESS] == "localhost"
    assert call.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200

    # token by token through nginx: the first token long before the last
    ttft = call.attributes[sc.LLM_CLIENT_TIME_TO_FIRST_TOKEN]
    total = (call.end_time - call.start_time) / 1e9
    assert call.attributes[sc.LLM_CLIENT_CHUNKS] >= TOKENS // 2
    assert ttft < 0.8 * total, (ttft, total)
    assert not call.attributes.get(sc.LLM_DIAGNOSIS_STREAM_BUFFERED)

    trace_id = call.context.trace_id.to_bytes(16, "big")

    def gateway_spans() -> list[Any]:
        return [span for _, span in collector.received.spans() if span.trace_id == trace_id]

    assert wait_for(lambda: any(s.kind == 2 for s in gateway_spans()) and any(s.kind == 3 for s in gateway_spans()), 15)
    exported = gateway_spans()
    server = next(s for s in exported if s.kind == 2)
    assert server.parent_span_id == call.context.span_id.to_bytes(8, "big"), "the SERVER span under the client call"
    upstream = next(s for s in exported if s.kind == 3 and s.parent_span_id == server.span_id)
    up = attributes_of(upstream.attributes)
    assert up[sc.LLM_RUNTIME_NAME] == "llama.cpp"  # llama.cpp's own timings on the gateway's upstream call
    assert up[sc.LLM_RUNTIME_GENERATION_TOKENS] == TOKENS and up[sc.LLM_RUNTIME_PROMPT_EVAL_DURATION] > 0
    assert attributes_of(server.attributes)[sc.LLM_GATEWAY_OUTCOME] == "allowed"


# --- buffering by real nginx configurations ---------------------------------------------------


def _location(*directives: str) -> Callable[[str], str]:
    """The shipped configuration with its buffering and gzip lines replaced by ``directives``."""
    def edit(site: str) -> str:
        for line in ("        proxy_buffering off;\n", "        gzip off;\n"):
            assert line in site
            site = site.replace(line, "")
        return site.replace("    location / {\n", "    location / {\n" + "".join(f"        {d}\n" for d in directives))
    return edit


_GZIP_SSE = ("gzip on;", "gzip_types text/event-stream;", "gzip_min_length 0;")
# Found on nginx 1.22: proxy_buffering on is overridden by the gateway's X-Accel-Buffering: no, and
# gzip of the event stream is flushed chunk by chunk while buffering is off; only ignoring the
# header makes nginx hold the stream (with or without gzip), head included.
NGINX_CONFIGS: dict[str, tuple[Callable[[str], str] | None, bool]] = {
    "shipped": (None, False),
    "buffering_on_header_honoured": (_location("proxy_buffering on;", "gzip off;"), False),
    "gzip_event_stream_unbuffered": (_location("proxy_buffering off;", *_GZIP_SSE), False),
    "buffering_on_header_ignored": (_location("proxy_buffering on;", "proxy_ignore_headers X-Accel-Buffering;",
                                              "gzip off;"), True),
    "gzip_and_buffering_header_ignored": (_location("proxy_buffering on;", "proxy_ignore_headers X-Accel-Buffering;",
                                                    *_GZIP_SSE), True),
}


def test_no_false_alarm_on_the_direct_path(otel: Otel, llama: LlamaServer) -> None:
    for tokens in (TOKENS, SHORT):
        otel.clear()
        body = {"model": "gemma", "max_tokens": tokens, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex}] Tell me about the sea."}]}
        with httpx.Client(timeout=120) as client, client.stream("POST", f"{llama.base_url}/v1/chat/completions",
                                                               json=body) as response:
            for _ in response.iter_bytes():
                pass
        call, _ = otel.one_call()
        assert call.attributes[sc.LLM_DIAGNOSIS_STREAM_BUFFERED] is False, tokens


@pytest.mark.parametrize("config", list(NGINX_CONFIGS))
def test_buffering_by_real_nginx_configurations(otel: Otel, gateway: GatewayProcess, certificate: tuple[str, str],
                                                ca: Any, config: str) -> None:
    """Each call span says whether this nginx held the stream back: 24 tokens and 7 (too few for
    a burst pattern: judged by llama.cpp's own generation time against the client's)."""
    edit, buffers = NGINX_CONFIGS[config]
    with NginxProxy(gateway.url.removeprefix("http://"), *certificate, edit=edit) as proxy:
        for tokens in (TOKENS, SHORT):
            otel.clear()
            assert "[DONE]" in _chat(proxy.url, gateway.secrets["app"], ca, tokens)
            call, _ = otel.one_call()
            attrs = call.attributes
            assert attrs[sc.LLM_DIAGNOSIS_STREAM_BUFFERED] is buffers, (config, tokens, dict(attrs))
            if buffers and tokens == TOKENS:  # the generation happened inside the wait: buffering, not queue
                assert attrs[sc.LLM_DIAGNOSIS_BOTTLENECK] == "buffering", dict(attrs)


def test_diagnose_names_buffering_and_the_slower_path_only_where_they_are(
        llama: LlamaServer, gateway: GatewayProcess, certificate: tuple[str, str], ca: Any, tmp_path: Path) -> None:
    """Direct, the gateway, nginx+TLS as shipped, nginx holding the stream, and nginx reaching the
    gateway over a link with 100 ms each way: buffering is named on the one, network_path on the
    other, and nothing of either on the three healthy paths."""
    from otel_llm_testing.lab import DelayingProxy

    host, port = gateway.url.removeprefix("http://").split(":")
    delayed_link = DelayingProxy(host, int(port), 0.1).start()
    buffered_edit = NGINX_CONFIGS["buffering_on_header_ignored"][0]
    try:
        with NginxProxy(gateway.url.removeprefix("http://"), *certificate) as shipped, \
                NginxProxy(gateway.url.removeprefix("http://"), *certificate, edit=buffered_edit) as holding, \
                NginxProxy(f"127.0.0.1:{delayed_link.port}", *certificate) as far:
            cafile = tmp_path / "ca.pem"
            ca.cert_pem.write_to_path(str(cafile))
            urls = [llama.base_url, gateway.url, shipped.url, holding.url, far.url]
            out = tmp_path / "diagnose.json"
            env = clean_env(GATEWAY_KEY=gateway.secrets["app"], SSL_CERT_FILE=str(cafile),
                            OTEL_LLM_TRACES_FILE=str(tmp_path / "t.jsonl"))
            done = subprocess.run([sys.executable, "-m", "otel_llm.tools.main", "diagnose", *urls, "--model", "gemma",
                                   "--quick", "--trials", "5", "--max-concurrency", "1", "--auth-env", "GATEWAY_KEY",
                                   "--json", str(out)],
                                  capture_output=True, text=True, timeout=600, env=env, check=False)
    finally:
        delayed_link.stop()
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads(out.read_text())
    codes = {target["url"]: [v["code"] for v in target["verdicts"]] for target in doc["targets"]}
    assert "buffering" in codes[holding.url], (codes, done.stdout)
    assert "network_path" in codes[far.url], (codes, done.stdout)
    for url in (llama.base_url, gateway.url, shipped.url):
        assert not {"buffering", "network_path"} & set(codes[url]), (url, codes, done.stdout)
    assert "network_path" not in codes[holding.url]  # its late first byte is the buffering
    held = next(v for t in doc["targets"] if t["url"] == holding.url for v in t["verdicts"] if v["code"] == "buffering")
    assert held["evidence"]["response_headers"]["server"].startswith("nginx")
    assert held["evidence"]["first_token_share_of_total"] >= 0.9
    assert "the answer came from nginx" in held["summary"]
